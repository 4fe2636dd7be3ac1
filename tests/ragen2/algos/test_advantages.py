"""Advantage estimators against hand-computed values (ragen2/algos/advantages.py)."""

import math

import pytest
import torch

from ragen2.algos.advantages import (
    as_bool_mask,
    bi_level_gae_advantages,
    dr_grpo_advantages,
    gae_advantages,
    group_normalized_scores,
    grpo_advantages,
    masked_whiten,
    rewards_at_turn_ends,
    turn_end_mask,
    turn_index,
)

NAN = float("nan")


def t(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype)


# ----------------------------------------------------------------------------- masks and turn structure


def test_turn_index_and_ends_mark_each_assistant_span():
    mask = t([[1, 1, 0, 0, 1, 1, 0], [0, 1, 0, 1, 0, 1, 1]], torch.bool)
    assert turn_index(mask).tolist() == [[0, 0, -1, -1, 1, 1, -1], [-1, 0, -1, 1, -1, 2, 2]]
    assert turn_end_mask(mask).long().tolist() == [[0, 1, 0, 0, 0, 1, 0], [0, 1, 0, 1, 0, 0, 1]]


def test_mask_accepts_bool_int_float_01_and_rejects_others():
    assert as_bool_mask(t([[1, 0]], torch.long)).tolist() == [[True, False]]
    assert as_bool_mask(t([[1.0, 0.0]], torch.float32)).tolist() == [[True, False]]
    with pytest.raises(ValueError, match="only 0 and 1"):
        as_bool_mask(t([[1.0, 0.5]]))
    with pytest.raises(ValueError, match="2-D"):
        as_bool_mask(torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="torch.Tensor"):
        as_bool_mask([[1, 0]])
    with pytest.raises(ValueError, match="expected"):
        as_bool_mask(torch.ones(2, 3, dtype=torch.bool), shape=(2, 4))


def test_rewards_at_turn_ends_trajectory_reward_goes_to_last_assistant_token():
    mask = t([[1, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], torch.bool)
    out = rewards_at_turn_ends(mask, t([2.0, -1.0, 0.0]))
    assert out.tolist() == [[0, 0, 0, 0, 2, 0], [-1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]


def test_rewards_at_turn_ends_per_turn_rewards_go_to_each_span_end():
    mask = t([[1, 1, 0, 1, 1, 0], [0, 1, 0, 0, 0, 0]], torch.bool)
    out = rewards_at_turn_ends(mask, t([[0.5, 1.0], [-0.1, 0.0]]))
    assert out.tolist() == [[0, 0.5, 0, 0, 1.0, 0], [0, -0.1, 0, 0, 0, 0]]


def test_rewards_at_turn_ends_refuses_to_drop_rewards():
    mask = t([[1, 0, 1], [0, 0, 0]], torch.bool)
    with pytest.raises(ValueError, match="row 1 has reward 3.0 but no assistant token"):
        rewards_at_turn_ends(mask, t([1.0, 3.0]))
    with pytest.raises(ValueError, match="row 0 has 2 assistant spans but rewards has only 1"):
        rewards_at_turn_ends(mask, t([[1.0], [0.0]]))
    with pytest.raises(ValueError, match="nonzero reward for turn 2"):
        rewards_at_turn_ends(mask, t([[1.0, 1.0, 4.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"shape \[2\]"):
        rewards_at_turn_ends(mask, t([1.0, 2.0, 3.0]))


# ----------------------------------------------------------------------------- GAE

# One sequence: turn 1 = tokens 0-1, env tokens 2-3, turn 2 = tokens 4-5.
GAE_MASK = t([[1, 1, 0, 0, 1, 1]], torch.bool)
GAE_VALUES = t([[0.5, 0.6, 9.0, 9.0, 0.7, 0.8]])
GAE_REWARDS = t([[0.0, 0.2, 5.0, 0.0, 0.0, 1.0]])  # 5.0 sits on an env token: ignored


def test_gae_by_hand_with_env_tokens_in_the_middle():
    # gamma=0.9, lam=0.8 (gamma*lam = 0.72), over assistant tokens 0,1,4,5 only:
    # t5: delta = 1.0 - 0.8 = 0.2                          A = 0.2
    # t4: delta = 0.9*0.8 - 0.7 = 0.02                     A = 0.02 + 0.72*0.2 = 0.164
    # t1: delta = 0.2 + 0.9*0.7 - 0.6 = 0.23 (bootstraps from token 4 across the env tokens)
    #                                                      A = 0.23 + 0.72*0.164 = 0.34808
    # t0: delta = 0.9*0.6 - 0.5 = 0.04                     A = 0.04 + 0.72*0.34808 = 0.2906176
    adv, ret = gae_advantages(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.8, whiten=False)
    expected = [0.2906176, 0.34808, 0.0, 0.0, 0.164, 0.2]
    assert adv[0].tolist() == pytest.approx(expected, abs=1e-12)
    assert ret[0].tolist() == pytest.approx([0.7906176, 0.94808, 0.0, 0.0, 0.864, 1.0], abs=1e-12)


def test_gae_ignores_anything_at_masked_positions_including_nan():
    rewards, values = GAE_REWARDS.clone(), GAE_VALUES.clone()
    rewards[0, 2:4] = NAN
    values[0, 2:4] = float("inf")
    a1, r1 = gae_advantages(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.8, whiten=False)
    a2, r2 = gae_advantages(rewards, values, GAE_MASK, gamma=0.9, lam=0.8, whiten=False)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)
    a3, _ = gae_advantages(rewards, values, GAE_MASK, gamma=0.9, lam=0.8, whiten=True)
    assert torch.isfinite(a3).all()


def test_gae_nan_on_an_assistant_token_is_not_hidden():
    rewards = GAE_REWARDS.clone()
    rewards[0, 5] = NAN
    adv, _ = gae_advantages(rewards, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.8, whiten=False)
    assert torch.isnan(adv[0, [0, 1, 4, 5]]).all()


def test_gae_gamma_lambda_one_is_reward_to_go_minus_value():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(4, 12, generator=g) > 0.4
    mask[3] = False  # a row with no assistant token
    rewards = torch.randn(4, 12, generator=g, dtype=torch.float64)
    values = torch.randn(4, 12, generator=g, dtype=torch.float64)
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0, whiten=False)
    masked_rewards = torch.where(mask, rewards, torch.zeros(()))
    reward_to_go = masked_rewards.flip(-1).cumsum(-1).flip(-1)
    expected = torch.where(mask, reward_to_go - values, torch.zeros(()))
    assert torch.allclose(adv, expected, atol=1e-12)
    assert torch.allclose(ret, torch.where(mask, reward_to_go, torch.zeros(())), atol=1e-12)


def test_gae_lambda_zero_is_one_step_td_error():
    adv, _ = gae_advantages(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=0.5, lam=0.0, whiten=False)
    # t0: 0.5*0.6-0.5 ; t1: 0.2+0.5*0.7-0.6 ; t4: 0.5*0.8-0.7 ; t5: 1-0.8
    assert adv[0].tolist() == pytest.approx([-0.2, -0.05, 0.0, 0.0, -0.3, 0.2], abs=1e-12)


def test_gae_whitening_is_masked_zero_mean_unit_unbiased_variance():
    adv, _ = gae_advantages(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.8, whiten=True)
    raw = torch.tensor([0.2906176, 0.34808, 0.164, 0.2], dtype=torch.float64)
    expected = (raw - raw.mean()) / raw.std()  # torch.std is unbiased
    assert adv[0, [0, 1, 4, 5]].tolist() == pytest.approx(expected.tolist(), abs=1e-6)
    assert adv[0, 2:4].tolist() == [0.0, 0.0]


def test_masked_whiten_single_token_gives_zero_not_nan():
    out = masked_whiten(t([[3.0, NAN]]), t([[1, 0]], torch.bool))
    assert out.tolist() == [[0.0, 0.0]]


def test_gae_validates_inputs():
    with pytest.raises(ValueError, match="gamma must be in"):
        gae_advantages(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=1.5)
    with pytest.raises(ValueError, match="values has shape"):
        gae_advantages(GAE_REWARDS, GAE_VALUES[:, :5], GAE_MASK)
    with pytest.raises(TypeError, match="floating dtype"):
        gae_advantages(GAE_REWARDS.long(), GAE_VALUES, GAE_MASK)


# ----------------------------------------------------------------------------- bi-level GAE

BI_MASK = t([[1, 1, 0, 1, 1]], torch.bool)
BI_VALUES = t([[0.1, 0.2, NAN, 0.4, 0.5]])
BI_REWARDS = t([[0.0, 0.5, 7.0, 0.0, 1.0]])


def test_bi_level_gae_two_turns_by_hand():
    # Turn level (turn_gamma 0.9, turn_lam 0.8), turn values = values at span ends: V1=0.2, V2=0.5.
    #   turn 2: delta = 1.0 - 0.5 = 0.5 -> A2 = 0.5, G2 = 1.0
    #   turn 1: delta = 0.5 + 0.9*0.5 - 0.2 = 0.75 -> A1 = 0.75 + 0.72*0.5 = 1.11, G1 = 1.31
    # Token level (token_gamma 1, token_lam 0.5), no bootstrapping across turns:
    #   t4 (end): 1.0 - 0.5 = 0.5 ; t3: delta = 0.5 - 0.4 = 0.1 -> 0.1 + 0.5*0.5 = 0.35
    #   t1 (end): 1.31 - 0.2 = 1.11 ; t0: delta = 0.2 - 0.1 = 0.1 -> 0.1 + 0.5*1.11 = 0.655
    adv, ret = bi_level_gae_advantages(
        BI_REWARDS, BI_VALUES, BI_MASK, turn_gamma=0.9, turn_lam=0.8, token_gamma=1.0, token_lam=0.5, whiten=False
    )
    assert adv[0].tolist() == pytest.approx([0.655, 1.11, 0.0, 0.35, 0.5], abs=1e-12)
    assert ret[0].tolist() == pytest.approx([0.755, 1.31, 0.0, 0.75, 1.0], abs=1e-12)


def test_bi_level_gae_counts_a_zero_reward_turn_as_a_turn():
    # RAGEN finds turns by nonzero rewards; we use spans, so turn 1 (reward 0) still bootstraps.
    rewards = t([[0.0, 0.0, 0.0, 0.0, 1.0]])
    adv, _ = bi_level_gae_advantages(rewards, BI_VALUES, BI_MASK, turn_gamma=0.9, turn_lam=1.0, whiten=False)
    # turn 2: A2 = 0.5, G2 = 1.0; turn 1: delta = 0.9*0.5 - 0.2 = 0.25, A1 = 0.25 + 0.9*0.5 = 0.7
    assert adv[0, 1].item() == pytest.approx(0.7, abs=1e-12)


def test_bi_level_gae_single_turn_equals_plain_gae():
    g = torch.Generator().manual_seed(1)
    mask = torch.zeros(3, 10, dtype=torch.bool)
    mask[0, 2:9] = True
    mask[1, 0:4] = True
    rewards = torch.randn(3, 10, generator=g, dtype=torch.float64)
    values = torch.randn(3, 10, generator=g, dtype=torch.float64)
    rewards = torch.where(turn_end_mask(mask), rewards, torch.zeros(()))
    a_gae, r_gae = gae_advantages(rewards, values, mask, gamma=0.95, lam=0.7, whiten=False)
    a_bi, r_bi = bi_level_gae_advantages(
        rewards, values, mask, turn_gamma=0.3, turn_lam=0.2, token_gamma=0.95, token_lam=0.7, whiten=False
    )
    assert torch.allclose(a_gae, a_bi, atol=1e-12) and torch.allclose(r_gae, r_bi, atol=1e-12)


def test_bi_level_gae_empty_mask_and_whitening():
    empty = torch.zeros(2, 4, dtype=torch.bool)
    adv, ret = bi_level_gae_advantages(torch.zeros(2, 4), torch.zeros(2, 4), empty)
    assert adv.abs().sum() == 0 and ret.abs().sum() == 0
    adv, _ = bi_level_gae_advantages(BI_REWARDS, BI_VALUES, BI_MASK, whiten=True)
    valid = adv[0, [0, 1, 3, 4]]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert valid.std().item() == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="token_lam must be in"):
        bi_level_gae_advantages(BI_REWARDS, BI_VALUES, BI_MASK, token_lam=-0.1)


# ----------------------------------------------------------------------------- GRPO / Dr.GRPO


def test_group_scores_known_group_unbiased_and_population():
    scores = t([1.0, 0.0, 0.0, 1.0])
    ids = torch.tensor([7, 7, 7, 7])
    # mean 0.5; unbiased std = sqrt(4*0.25/3) = 1/sqrt(3); population std = 0.5
    unbiased = group_normalized_scores(scores, ids)
    expected = 0.5 * math.sqrt(3) / (1 + 1e-6 * math.sqrt(3))
    assert unbiased.tolist() == pytest.approx([expected, -expected, -expected, expected], abs=1e-12)
    population = group_normalized_scores(scores, ids, unbiased_std=False)
    p = 0.5 / (0.5 + 1e-6)
    assert population.tolist() == pytest.approx([p, -p, -p, p], abs=1e-12)


def test_group_scores_singletons_equal_groups_and_interleaved_ids():
    scores = t([3.0, 1.0, 2.0, 5.0, 2.0, 4.0])
    ids = [0, 1, 2, 1, 2, 3]  # group 0 and 3 are singletons, group 2 all equal
    out = group_normalized_scores(scores, ids, scale_by_std=False)
    assert out.tolist() == [0.0, -2.0, 0.0, 2.0, 0.0, 0.0]
    scaled = group_normalized_scores(scores, ids)
    s = 2.0 / (math.sqrt(8.0) + 1e-6)  # group 1: [1, 5], unbiased std = sqrt(8)
    assert scaled.tolist() == pytest.approx([0.0, -s, 0.0, s, 0.0, 0.0], abs=1e-12)


def test_group_scores_nan_poisons_only_its_group():
    out = group_normalized_scores(t([NAN, 1.0, 0.0, 1.0]), [0, 0, 1, 1])
    assert torch.isnan(out[:2]).all() and torch.isfinite(out[2:]).all()
    assert torch.isnan(group_normalized_scores(t([NAN]), [0])).all()


def test_grpo_broadcasts_to_assistant_tokens_and_ignores_masked_rewards():
    mask = t([[1, 1, 0, 1], [1, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1]], torch.bool)
    rewards = t([[0, 0, NAN, 1.0], [0, 9.0, 0, 0], [0, 0, 0, -7.0], [0, 0, 0.5, 0.5]])
    # assistant-token sums: [1, 0, 0, 1] -> the known group
    adv = grpo_advantages(rewards, mask, torch.tensor([0, 0, 0, 0]))
    a = 0.5 * math.sqrt(3) / (1 + 1e-6 * math.sqrt(3))
    expected = torch.tensor([[a, a, 0, a], [-a, 0, 0, 0], [0, -a, -a, 0], [a, a, a, a]], dtype=torch.float64)
    assert torch.allclose(adv, expected, atol=1e-12)


def test_dr_grpo_is_mean_centered_only():
    mask = torch.ones(4, 2, dtype=torch.bool)
    rewards = t([[0, 1.0], [0, 0], [0, 0], [0, 1.0]])
    adv = dr_grpo_advantages(rewards, mask, [3, 3, 3, 3])
    assert adv.tolist() == [[0.5, 0.5], [-0.5, -0.5], [-0.5, -0.5], [0.5, 0.5]]


def test_the_engines_dr_grpo_advantage_is_dr_grpo_advantages(monkeypatch):
    """algo.advantage=dr_grpo reaches the tested function (the estimator had its own call of
    grpo_advantages), and gives its numbers."""
    from types import SimpleNamespace

    from ragen2.algos import advantages as adv_lib
    from ragen2.algos.estimators import compute_advantages
    from ragen2.config import load_config

    algo = load_config(overrides=["algo.advantage=dr_grpo", "algo.kl_coef=0"]).algo
    batch = SimpleNamespace(token_rewards=t([[0, 1.0], [0, 0], [0, 0], [0, 1.0]]), turn_rewards=None,
                            response_mask=torch.ones(4, 2, dtype=torch.bool), group_ids=torch.tensor([3, 3, 3, 3]))
    advantages, returns = compute_advantages(algo, batch, None, None, None)
    assert returns is None and advantages.tolist() == [[0.5, 0.5], [-0.5, -0.5], [-0.5, -0.5], [0.5, 0.5]]
    calls = []
    monkeypatch.setattr(adv_lib, "dr_grpo_advantages", lambda *args: calls.append(args) or advantages)
    compute_advantages(algo, batch, None, None, None)
    assert len(calls) == 1


def test_grpo_validates_group_ids():
    mask = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(TypeError, match="group_ids must be integers"):
        grpo_advantages(torch.zeros(2, 2), mask, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"group_ids must have shape \[2\]"):
        grpo_advantages(torch.zeros(2, 2), mask, [0, 1, 2])
