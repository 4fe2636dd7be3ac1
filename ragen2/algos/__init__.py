"""Pure torch advantage estimators and losses (no model, no trainer).

Both engines call these; see ``advantages`` and ``losses`` for the tensor conventions.
"""

from ragen2.algos.advantages import (
    as_bool_mask,
    bi_level_gae_advantages,
    dr_grpo_advantages,
    gae_advantages,
    group_normalized_scores,
    grpo_advantages,
    masked_mean,
    masked_whiten,
    rewards_at_turn_ends,
    turn_end_mask,
    turn_index,
)
from ragen2.algos.losses import (
    AGG_MODES,
    KL_ESTIMATORS,
    aggregate_token_loss,
    clipped_value_loss,
    kl_estimate,
    kl_loss,
    kl_reward_penalty,
    ppo_clip_policy_loss,
)

__all__ = [
    "AGG_MODES",
    "KL_ESTIMATORS",
    "aggregate_token_loss",
    "as_bool_mask",
    "bi_level_gae_advantages",
    "clipped_value_loss",
    "dr_grpo_advantages",
    "gae_advantages",
    "group_normalized_scores",
    "grpo_advantages",
    "kl_estimate",
    "kl_loss",
    "kl_reward_penalty",
    "masked_mean",
    "masked_whiten",
    "ppo_clip_policy_loss",
    "rewards_at_turn_ends",
    "turn_end_mask",
    "turn_index",
]
