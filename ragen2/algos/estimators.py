"""The advantage estimator a config names (`algo.advantage`), dispatched in one place.

Both the update and the gradient decomposition take their advantages from here, so they can
never disagree; an unknown estimator raises instead of running another one.
"""

from __future__ import annotations

from ragen2.algos import advantages as adv_lib
from ragen2.algos import losses

ESTIMATORS = ("gae", "bilevel_gae", "grpo", "dr_grpo")


def compute_advantages(algo, batch, values, old_log_probs, ref_log_probs):
    """(advantages, returns) for `algo` (the config's algo section) on `batch` (token_rewards,
    turn_rewards, response_mask, group_ids); returns is None for the critic-free estimators."""
    token_rewards, turn_rewards = batch.token_rewards, batch.turn_rewards
    if ref_log_probs is not None and algo.kl_mode == "reward":
        penalty = losses.kl_reward_penalty(old_log_probs, ref_log_probs, batch.response_mask, algo.kl_coef,
                                           algo.kl_estimator)
        token_rewards, turn_rewards = token_rewards - penalty, turn_rewards - penalty
    if algo.advantage == "gae":
        return adv_lib.gae_advantages(token_rewards, values, batch.response_mask, algo.gamma, algo.lam)
    if algo.advantage == "bilevel_gae":
        return adv_lib.bi_level_gae_advantages(turn_rewards, values, batch.response_mask, algo.turn_gamma,
                                               algo.turn_lam, algo.gamma, algo.lam)
    if algo.advantage == "grpo":
        return adv_lib.grpo_advantages(token_rewards, batch.response_mask, batch.group_ids,
                                       eps=algo.grpo_std_eps), None
    if algo.advantage == "dr_grpo":  # the group mean removed, no division by std (so no eps)
        return adv_lib.dr_grpo_advantages(token_rewards, batch.response_mask, batch.group_ids), None
    raise ValueError(f"algo.advantage={algo.advantage!r} has no estimator here; known: {', '.join(ESTIMATORS)}")
