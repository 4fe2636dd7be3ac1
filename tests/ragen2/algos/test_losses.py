"""Losses against hand-computed values (ragen2/algos/losses.py)."""

import math

import pytest
import torch

from ragen2.algos import losses
from ragen2.algos.losses import (
    aggregate_token_loss,
    clipped_value_loss,
    kl_estimate,
    kl_loss,
    kl_reward_penalty,
    ppo_clip_policy_loss,
)

NAN = float("nan")
LN2 = math.log(2.0)


def t(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype)


# ----------------------------------------------------------------------------- aggregation

# Ragged: row 0 has 3 tokens, row 1 has 1, row 2 none. Masked slots hold NaN and inf.
AGG_LOSS = t([[1.0, 2.0, 3.0, NAN], [4.0, NAN, float("inf"), 0.0], [NAN, NAN, NAN, NAN]])
AGG_MASK = t([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], torch.bool)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),  # 2.5
        ("seq-mean-token-mean", (6 / 3 + 4 / 1) / 2),  # 3.0; the empty row is not a sequence
        ("seq-mean-token-sum", (6 + 4) / 2),  # 5.0
        ("seq-mean-token-sum-norm", (6 + 4) / 2 / 4),  # / seq_len
    ],
)
def test_aggregation_modes_on_ragged_mask(mode, expected):
    assert aggregate_token_loss(AGG_LOSS, AGG_MASK, mode).item() == pytest.approx(expected, abs=1e-12)


def test_aggregation_norm_length_empty_mask_and_bad_mode():
    assert aggregate_token_loss(AGG_LOSS, AGG_MASK, "seq-mean-token-sum-norm", norm_length=10).item() == 0.5
    empty = torch.zeros(2, 3, dtype=torch.bool)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        assert aggregate_token_loss(torch.full((2, 3), NAN), empty, mode).item() == 0.0
    with pytest.raises(ValueError, match="unknown aggregation mode 'token-sum'"):
        aggregate_token_loss(AGG_LOSS, AGG_MASK, "token-sum")
    with pytest.raises(ValueError, match="norm_length must be positive"):
        aggregate_token_loss(AGG_LOSS, AGG_MASK, "seq-mean-token-sum-norm", norm_length=0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_totals_make_accumulated_loss_equal_the_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(6, 5, generator=g) > 0.3
    mask[:, 0] = True
    full = aggregate_token_loss(loss, mask, mode)
    tokens, seqs = int(mask.sum()), int((mask.sum(-1) > 0).sum())
    parts = sum(
        aggregate_token_loss(loss[s], mask[s], mode, total_tokens=tokens, total_sequences=seqs)
        for s in (slice(0, 2), slice(2, 6))
    )
    assert parts.item() == pytest.approx(full.item(), abs=1e-12)


# ----------------------------------------------------------------------------- PPO clipped policy loss


def _policy_case(ratios, advs, **kw):
    ratio = t([ratios])
    old = torch.zeros_like(ratio)
    log_prob = ratio.log().requires_grad_(True)
    mask = torch.ones_like(ratio, dtype=torch.bool)
    # token-mean over one row of n tokens = mean, so per-token losses are checked one at a time
    per_token = []
    for i in range(len(ratios)):
        m = torch.zeros_like(mask)
        m[0, i] = True
        loss, _ = ppo_clip_policy_loss(log_prob, old, t([advs]), m, **kw)
        per_token.append(loss.item())
    loss, metrics = ppo_clip_policy_loss(log_prob, old, t([advs]), mask, **kw)
    loss.backward()
    return per_token, loss, metrics, log_prob.grad[0].tolist()


def test_clip_higher_on_both_sides_of_both_bounds():
    # eps_low 0.2, eps_high 0.28: clip interval [0.8, 1.28]
    ratios = [0.5, 1.1, 1.25, 1.5, 0.5, 0.9, 1.5]
    advs = [1.0, 1.0, 2.0, 1.0, -1.0, -1.0, -1.0]
    per_token, loss, metrics, grad = _policy_case(ratios, advs, clip_low=0.2, clip_high=0.28)
    expected = [
        -0.5,  # A>0, r below 1-eps_low: no clip for a positive advantage (pessimistic min)
        -1.1,  # inside
        -2.5,  # A=2, r=1.25 inside [0.8, 1.28]; symmetric 0.2 would clip to -2.4
        -1.28,  # A>0, r above 1+eps_high: clipped
        0.8,  # A<0, r below 1-eps_low: clipped to -A*0.8
        0.9,  # inside
        1.5,  # A<0, r above 1+eps_high: not clipped (pessimistic max)
    ]
    assert per_token == pytest.approx(expected, abs=1e-12)
    assert loss.item() == pytest.approx(sum(expected) / 7, abs=1e-12)
    # d(-A r)/d log r = -A r / n where unclipped, 0 where clipped
    expected_grad = [-0.5 / 7, -1.1 / 7, -2.5 / 7, 0.0, 0.0, 0.9 / 7, 1.5 / 7]
    assert grad == pytest.approx(expected_grad, abs=1e-12)
    assert metrics["clipfrac_high"].item() == pytest.approx(1 / 7)
    assert metrics["clipfrac_low"].item() == pytest.approx(1 / 7)
    assert metrics["clipfrac_dual"].item() == 0.0
    assert metrics["ratio_min"].item() == pytest.approx(0.5)
    assert metrics["ratio_max"].item() == pytest.approx(1.5)
    assert metrics["ratio_mean"].item() == pytest.approx(sum(ratios) / 7)
    log_r = [math.log(r) for r in ratios]
    assert metrics["approx_kl"].item() == pytest.approx(-sum(log_r) / 7)
    assert metrics["approx_kl_k3"].item() == pytest.approx(sum(r - 1 - lr for r, lr in zip(ratios, log_r)) / 7)


def test_symmetric_clip_clips_the_same_token_clip_higher_lets_through():
    per_token, _, metrics, _ = _policy_case([1.25], [2.0], clip_low=0.2, clip_high=0.2)
    assert per_token == pytest.approx([-2.4]) and metrics["clipfrac_high"].item() == 1.0


def test_dual_clip_caps_negative_advantage_loss():
    ratios = [4.0, 2.0, 4.0]
    advs = [-1.0, -1.0, 1.0]
    per_token, _, metrics, grad = _policy_case(ratios, advs, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    # A<0, r=4 > c=3: min(max(4, 1.28), 3) = 3 (no gradient); r=2 < c: 2; A>0 untouched: -1.28
    assert per_token == pytest.approx([3.0, 2.0, -1.28], abs=1e-12)
    assert grad == pytest.approx([0.0, 2.0 / 3, 0.0], abs=1e-12)
    assert metrics["clipfrac_dual"].item() == pytest.approx(1 / 3)
    without, _, _, _ = _policy_case(ratios, advs, clip_low=0.2, clip_high=0.28)
    assert without == pytest.approx([4.0, 2.0, -1.28], abs=1e-12)


def test_policy_loss_aggregation_modes_on_ragged_mask():
    mask = t([[1, 1, 1], [1, 0, 0]], torch.bool)
    adv = t([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    zeros = torch.zeros(2, 3, dtype=torch.float64)  # ratio 1: per-token loss = -A
    expect = {
        "token-mean": -10 / 4,
        "seq-mean-token-mean": -(2 + 4) / 2,
        "seq-mean-token-sum": -(6 + 4) / 2,
        "seq-mean-token-sum-norm": -(6 + 4) / 2 / 3,
    }
    for mode, value in expect.items():
        loss, _ = ppo_clip_policy_loss(zeros, zeros, adv, mask, agg_mode=mode)
        assert loss.item() == pytest.approx(value, abs=1e-12), mode


def test_policy_loss_nan_at_masked_positions_changes_nothing_and_grads_stay_finite():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(3, 6, generator=g) > 0.4
    lp = (torch.randn(3, 6, generator=g) * 0.3).double()
    old = (torch.randn(3, 6, generator=g) * 0.3).double()
    adv = torch.randn(3, 6, generator=g).double()
    dirty = lambda x: torch.where(mask, x, torch.full_like(x, NAN))  # noqa: E731
    results = []
    for a, b, c in ((lp, old, adv), (dirty(lp), dirty(old), dirty(adv))):
        leaf = a.clone().requires_grad_(True)
        loss, metrics = ppo_clip_policy_loss(leaf, b, c, mask, clip_high=0.28, dual_clip=3.0)
        loss.backward()
        results.append((loss.item(), leaf.grad.clone(), {k: v.item() for k, v in metrics.items()}))
    assert results[0][0] == results[1][0]
    assert torch.isfinite(results[1][1]).all() and torch.equal(results[0][1], results[1][1])
    assert results[0][2] == results[1][2]
    assert (results[1][1][~mask] == 0).all()


def test_policy_loss_nan_on_assistant_token_propagates_and_validation():
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, _ = ppo_clip_policy_loss(t([[NAN, 0.0]]), torch.zeros(1, 2), torch.ones(1, 2), mask)
    assert math.isnan(loss.item())
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="clip_low must be in"):
        ppo_clip_policy_loss(z, z, z, mask, clip_low=1.0)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_clip_policy_loss(z, z, z, mask, dual_clip=0.5)
    with pytest.raises(ValueError, match="old_log_prob has shape"):
        ppo_clip_policy_loss(z, torch.zeros(1, 3), z, mask)
    with pytest.raises(ValueError, match="only 0 and 1"):
        ppo_clip_policy_loss(z, z, z, t([[1.0, 2.0]]))
    loss, metrics = ppo_clip_policy_loss(z, z, z, torch.zeros(1, 2, dtype=torch.bool))
    assert loss.item() == 0.0 and metrics["ratio_min"].item() == 1.0


# ----------------------------------------------------------------------------- KL


@pytest.mark.parametrize(
    "log_r, k1, k2, k3",
    [
        (LN2, LN2, 0.5 * LN2**2, 0.5 - 1 + LN2),  # k3 = exp(-log r) - 1 + log r
        (-LN2, -LN2, 0.5 * LN2**2, 2.0 - 1 - LN2),
        (0.0, 0.0, 0.0, 0.0),
    ],
)
def test_kl_estimators_at_known_log_ratios(log_r, k1, k2, k3):
    lp, ref = t([log_r - 1.0]), t([-1.0])
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(k1, abs=1e-12)
    assert kl_estimate(lp, ref, "kl").item() == pytest.approx(k1, abs=1e-12)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(k2, abs=1e-12)
    assert kl_estimate(lp, ref, "mse").item() == pytest.approx(k2, abs=1e-12)
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(k3, abs=1e-12)
    assert kl_estimate(lp, ref, "low_var_kl").item() == pytest.approx(k3, abs=1e-12)


def test_k3_is_clamped_and_unknown_estimator_raises():
    assert kl_estimate(t([-30.0]), t([0.0]), "k3").item() == 10.0  # exp(20) - 21 clamped to 10
    assert kl_estimate(t([30.0]), t([0.0]), "k3").item() == 10.0  # exp(-20) + 19 clamped to 10
    assert kl_estimate(t([5.0]), t([0.0]), "k3").item() == pytest.approx(math.exp(-5) - 1 + 5)  # below the cap
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_estimate(t([0.0]), t([0.0]), "k4")


def test_kl_loss_and_reward_penalty_masked():
    mask = t([[1, 1, 0]], torch.bool)
    lp = t([[LN2, -LN2, NAN]]).requires_grad_(True)
    ref = t([[0.0, 0.0, NAN]])
    loss = kl_loss(lp, ref, mask, "k3")
    assert loss.item() == pytest.approx(((0.5 - 1 + LN2) + (2.0 - 1 - LN2)) / 2)
    loss.backward()
    # d k3 / d log r = 1 - exp(-log r): 1 - 1/2 and 1 - 2, averaged over 2 tokens
    assert lp.grad[0].tolist() == pytest.approx([0.25, -0.5, 0.0])
    penalty = kl_reward_penalty(lp, ref, mask, beta=0.1)
    assert penalty[0].tolist() == pytest.approx([0.1 * LN2, -0.1 * LN2, 0.0])
    assert not penalty.requires_grad
    with pytest.raises(ValueError, match="beta must be >= 0"):
        kl_reward_penalty(lp, ref, mask, beta=-1.0)


# ----------------------------------------------------------------------------- value loss


def test_clipped_value_loss_cases():
    # old value 0, return 1, clip 0.2 (V_clip in [-0.2, 0.2])
    values = t([[0.1, 0.5, -0.5, 1.5, NAN]]).requires_grad_(True)
    old = t([[0.0, 0.0, 0.0, 0.0, NAN]])
    ret = t([[1.0, 1.0, 1.0, 1.0, NAN]])
    mask = t([[1, 1, 1, 1, 0]], torch.bool)
    per_token = []
    for i in range(4):
        m = torch.zeros_like(mask)
        m[0, i] = True
        per_token.append(clipped_value_loss(values, old, ret, m, clip_range=0.2)[0].item())
    assert per_token == pytest.approx(
        [
            0.5 * 0.81,  # inside the clip range: both terms (0.1 - 1)^2
            0.5 * 0.64,  # moved 0.5 towards R: clipped to 0.2, (0.2 - 1)^2 = 0.64 > 0.25
            0.5 * 2.25,  # moved away from R: unclipped (1.5)^2 = 2.25 > (1.2)^2
            0.5 * 0.64,  # overshot R: clipped term (0.8)^2 = 0.64 > 0.25
        ],
        abs=1e-12,
    )
    loss, metrics = clipped_value_loss(values, old, ret, mask, clip_range=0.2)
    assert loss.item() == pytest.approx(sum(per_token) / 4)
    assert metrics["vf_clipfrac"].item() == pytest.approx(2 / 4)
    loss.backward()
    # gradient (v - R)/4 where the unclipped term is active, 0 where clipped
    assert values.grad[0].tolist() == pytest.approx([-0.9 / 4, 0.0, -1.5 / 4, 0.0, 0.0], abs=1e-12)
    plain, m2 = clipped_value_loss(values.detach(), old, ret, mask, clip_range=None)
    assert plain.item() == pytest.approx(0.5 * (0.81 + 0.25 + 2.25 + 0.25) / 4)
    assert m2["vf_clipfrac"].item() == 0.0
    with pytest.raises(ValueError, match="clip_range must be > 0"):
        clipped_value_loss(values, old, ret, mask, clip_range=0.0)


def test_value_clipfrac_does_not_count_rounding_inside_the_range():
    # float32: V = 0.1, V_old = -0.2, R = 0, c = 0.5. |V - V_old| = 0.3 < 0.5, so nothing is
    # clipped; V_old + (V - V_old) is 1 ulp above 0.1 in float32, which made the clipped term
    # look larger and counted the token as clipped.
    v, old, ret = torch.tensor([[0.1]]), torch.tensor([[-0.2]]), torch.tensor([[0.0]])
    assert (old + (v - old)).item() != v.item()  # the rounding this guards against
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, metrics = clipped_value_loss(v, old, ret, mask, clip_range=0.5)
    assert metrics["vf_clipfrac"].item() == 0.0
    assert loss.item() == (0.5 * v.square()).item()  # exactly the unclipped 0.5 (V - R)^2
    # |V - V_old| = 0.7 > 0.5 towards R = 1: the clipped term (-0.2 + 0.5 - 1)^2 = 0.49 wins
    loss, metrics = clipped_value_loss(torch.tensor([[0.5]]), old, torch.tensor([[1.0]]), mask, clip_range=0.5)
    assert metrics["vf_clipfrac"].item() == 1.0 and loss.item() == pytest.approx(0.5 * 0.49)


def test_defaults_are_ragen2s_dual_clip_3_and_value_clip_0_5():
    # RAGEN-2 trains through veRL: clip_ratio_c = 3.0 always, critic cliprange_value = 0.5.
    from ragen2.config import CONFIG_DIR, Config, load_config

    algo = Config().algo
    assert (algo.dual_clip, algo.value_clip, algo.value_coef) == (3.0, 0.5, 1.0)
    paper = load_config(env="sokoban", extra=[CONFIG_DIR / "paper" / "ragen2-main.yaml"])
    assert (paper.algo.dual_clip, paper.algo.value_clip, paper.algo.entropy_coef) == (3.0, 0.5, 0.001)
    assert (paper.filter.strategy, paper.filter.top_p_mode, paper.filter.value) == ("top_p", "softmax", 0.9)
    assert paper.filter.metric == "reward_std" and paper.filter.include_zero and paper.trainer.total_steps == 400
    # One token, A = -2, ratio e^1.5 = 4.48: PPO clip alone gives max(-A r, -A clip(r)) = 2 * 4.48 = 8.96;
    # the default dual clip caps it at -A c = 6.
    lp, old, adv = t([[1.5]]), t([[0.0]]), t([[-2.0]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    default, _ = ppo_clip_policy_loss(lp, old, adv, mask, algo.clip_low, algo.clip_high, algo.dual_clip)
    plain, _ = ppo_clip_policy_loss(lp, old, adv, mask, algo.clip_low, algo.clip_high, None)
    assert default.item() == pytest.approx(6.0) and plain.item() == pytest.approx(2 * math.exp(1.5))
    assert Config(algo={"dual_clip": None}).algo.dual_clip is None  # the option for plain PPO


@pytest.mark.parametrize("preset, advantage, loss_agg", [
    ("ppo", "gae", "token-mean"), ("ragen2-dapo", "gae", "token-mean"),
    ("ragen2-grpo", "grpo", "seq-mean-token-mean"), ("ragen2-dr-grpo", "dr_grpo", "seq-mean-token-sum")])
def test_main_table_algo_presets_are_ragen2s(preset, advantage, loss_agg):
    # RAGEN-2's run_main_table_diff_algo.sh: every algo on base.yaml's clip 0.2/0.28, entropy
    # 0.001, use_kl_loss=False, veRL's dual clip 3; PPO and DAPO with a critic (gae).
    from ragen2.config import load_config

    algo = load_config(algo=preset).algo
    assert (algo.advantage, algo.loss_agg) == (advantage, loss_agg)
    assert (algo.clip_low, algo.clip_high, algo.kl_coef, algo.entropy_coef, algo.dual_clip) == (0.2, 0.28, 0.0, 0.001, 3.0)


# ----------------------------------------------------------------------------- the actor loss, one definition


def test_actor_loss_terms_and_their_combination_by_hand():
    log_probs = torch.tensor([[-1.0, -2.0, -3.0]])
    mask = torch.tensor([[True, True, False]])
    advantages = torch.tensor([[1.0, -0.5, 2.0]])
    entropy = torch.tensor([[0.3, 0.5, 9.0]])
    ref = log_probs - torch.tensor([[0.1, 0.2, 0.0]])
    settings = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg_mode="token-mean", kl_estimator="k3")
    terms, metrics = losses.actor_loss_terms(log_probs, entropy, log_probs.clone(), advantages, mask, ref, **settings)
    assert list(terms) == ["task", "entropy", "kl"]
    assert terms["task"].item() == pytest.approx(-0.25)  # ratio 1: -(1 - 0.5) / 2
    assert terms["entropy"].item() == pytest.approx(0.4)
    kl = ((math.exp(-0.1) - 1 + 0.1) + (math.exp(-0.2) - 1 + 0.2)) / 2
    assert terms["kl"].item() == pytest.approx(kl, rel=1e-5)
    assert metrics["ratio_max"].item() == pytest.approx(1.0)
    coefficients = losses.actor_loss_coefficients(entropy_coef=0.01, kl_coef=0.1, task_scale=2.0)
    assert coefficients == {"task": 2.0, "entropy": -0.01, "kl": 0.1}
    combined = losses.combine_actor_loss(terms, coefficients)
    assert combined.item() == pytest.approx(2 * -0.25 - 0.01 * 0.4 + 0.1 * kl, rel=1e-6)
    without_ref, _ = losses.actor_loss_terms(log_probs, entropy, log_probs, advantages, mask, None, **settings)
    assert "kl" not in without_ref


def test_without_entropy_the_actor_loss_has_no_entropy_term():
    # the supervised warm start takes no entropy: no term, not a zero one (its forward skips the cost)
    log_probs, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[True, True]])
    terms, _ = losses.actor_loss_terms(log_probs, None, log_probs, torch.ones(1, 2), mask, None, clip_low=0.2,
                                       clip_high=0.28, dual_clip=None, agg_mode="token-mean")
    assert list(terms) == ["task"] and terms["task"].item() == pytest.approx(-1.0)  # -A * ratio, ratio 1


def test_an_unknown_advantage_estimator_is_an_error_not_dr_grpo():
    from ragen2.algos.estimators import compute_advantages
    from ragen2.config import load_config

    cfg = load_config()
    object.__setattr__(cfg.algo, "advantage", "rloo")  # past the config's check, as a new estimator would be
    with pytest.raises(ValueError, match="algo.advantage='rloo' has no estimator"):
        compute_advantages(cfg.algo, _grpo_batch(), None, None, None)


def _grpo_batch():
    from types import SimpleNamespace

    mask = torch.tensor([[False, True], [False, True]])
    return SimpleNamespace(token_rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0]]), turn_rewards=None,
                           response_mask=mask, group_ids=torch.tensor([0, 0]))
