"""mi_probe estimators, ZScoreEMA and the collapse detector on hand-built inputs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mi_probe import Alert, CollapseDetector, CollapseDetectorConfig, ZScoreEMA, mi_metrics, mi_metrics_both


# ---------------------------------------------------------------- estimators
def test_reasoning_tied_to_its_prompt_gives_log_n_and_perfect_retrieval():
    # 4 prompts, 2 rows each; own prompt scores 0, every other prompt -50 (very separated).
    owner = [0, 0, 1, 1, 2, 2, 3, 3]
    L = torch.full((8, 4), -50.0)
    L[torch.arange(8), torch.tensor(owner)] = 0.0
    m = mi_metrics(L, owner)
    assert m["mi_upper_bound"] == pytest.approx(math.log(4))
    assert abs(m["mi_estimate"] - math.log(4)) < 1e-3
    assert m["conditional_entropy_est"] == pytest.approx(0.0)
    assert m["reasoning_entropy_est"] == pytest.approx(math.log(4), abs=1e-3)
    for k, chance in ((1, 0.25), (2, 0.5), (4, 1.0), (8, 1.0)):  # chance k/4 capped at 1
        assert m[f"retrieval_accuracy@{k}"] == 1.0
        assert m[f"retrieval_chance_level@{k}"] == chance
        assert m[f"retrieval_above_chance@{k}"] == pytest.approx(1.0 - chance)
    assert (m["num_rows"], m["num_prompts"], m["num_distinct_prompts"]) == (8.0, 4.0, 4.0)


def test_reasoning_independent_of_prompt_gives_zero_mi_and_chance_retrieval():
    # Each row scores the same under every prompt (rows differ from each other).
    row_values = torch.tensor([-1.0, -2.0, -3.0, -4.0, -2.5])
    L = row_values.unsqueeze(1).expand(5, 4).clone()
    owner = [0, 1, 2, 3, 0]
    m = mi_metrics(L, owner)
    assert m["mi_estimate"] == pytest.approx(0.0, abs=1e-12)
    assert m["mi_zscore"] == pytest.approx(0.0, abs=1e-9)
    assert m["conditional_entropy_est"] == pytest.approx(2.5)
    assert m["reasoning_entropy_est"] == pytest.approx(2.5)
    # Ties count as expected chance: all 4 prompts tie, so a row scores k/4 at k.
    for k in (1, 2, 4, 8):
        assert m[f"retrieval_accuracy@{k}"] == pytest.approx(min(1.0, k / 4))
        assert m[f"retrieval_above_chance@{k}"] == pytest.approx(0.0)


def test_hand_computed_2x2():
    L = [[-1.0, -2.0], [-3.0, -1.0]]
    m = mi_metrics(L, [0, 1])
    # marginal_0 = log((e^-1 + e^-2)/2) = -1.3798854930, marginal_1 = log((e^-3 + e^-1)/2) = -1.5662191695
    m0, m1 = -1.3798854930417224, -1.5662191695169727
    assert m["matched_log_prob_mean"] == pytest.approx(-1.0)
    assert m["marginal_log_prob_mean"] == pytest.approx((m0 + m1) / 2, abs=1e-12)
    assert m["mi_estimate"] == pytest.approx(0.47305233127934754, abs=1e-12)
    sigma = 0.09316683823762517  # population std of two values = half their distance
    assert m["marginal_std"] == pytest.approx(sigma, abs=1e-12)
    assert m["mi_zscore"] == pytest.approx(0.47305233127934754 / (sigma + 1e-3), abs=1e-9)
    assert m["retrieval_accuracy@1"] == 1.0
    assert m["retrieval_chance_level@1"] == 0.5
    assert m["retrieval_accuracy@2"] == 1.0 and m["retrieval_chance_level@2"] == 1.0


def test_hand_computed_3x3_with_ties_and_misses():
    L = np.array(
        [
            [-1.0, -1.0, -2.0],  # owner 0 ties with prompt 1 at the top
            [-3.0, -1.0, -3.0],  # owner 0: one prompt above, prompt 2 tied with it
            [-1.0, -2.0, -0.5],  # owner 2: strictly best
        ]
    )
    m = mi_metrics(L, np.array([0, 0, 2]))
    # row 0: @1 1/2, @2 1;  row 1: @1 0, @2 (2-1)/2 = 1/2, @4 1;  row 2: 1 everywhere
    assert m["retrieval_accuracy@1"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert m["retrieval_accuracy@2"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert m["retrieval_accuracy@4"] == pytest.approx(1.0)
    assert m["retrieval_chance_level@1"] == pytest.approx(1 / 3)
    assert m["retrieval_chance_level@2"] == pytest.approx(2 / 3)
    marginal = [math.log(sum(math.exp(v) for v in row) / 3) for row in L]
    matched = [-1.0, -3.0, -0.5]
    expected_mi = sum(a - b for a, b in zip(matched, marginal)) / 3
    assert m["mi_estimate"] == pytest.approx(expected_mi, abs=1e-12)
    assert m["conditional_entropy_est"] == pytest.approx(1.5)
    assert m["reasoning_entropy_est"] == pytest.approx(-sum(marginal) / 3, abs=1e-12)


def test_tie_tolerance_treats_near_ties_as_ties():
    L = [[-1.0, -1.0 + 1e-9, -5.0]]
    assert mi_metrics(L, [0])["retrieval_accuracy@1"] == 0.0  # exact: prompt 1 is strictly above
    assert mi_metrics(L, [0], tie_tol=1e-6)["retrieval_accuracy@1"] == pytest.approx(0.5)


def test_duplicate_prompts_are_one_prompt_for_retrieval():
    # Columns 0 and 2 hold the same prompt tokens, so their scores are identical.
    L = [[-1.0, -5.0, -1.0], [-4.0, -1.0, -4.0], [-2.0, -6.0, -2.0]]
    owner = [0, 1, 2]
    column_ids = [[5, 6], [7], [5, 6]]
    merged = mi_metrics(L, owner, column_ids=column_ids)
    assert merged["num_distinct_prompts"] == 2.0
    assert merged["retrieval_accuracy@1"] == 1.0  # row 2 owns column 2 == column 0's prompt
    assert merged["retrieval_chance_level@1"] == 0.5
    unmerged = mi_metrics(L, owner)
    assert unmerged["retrieval_accuracy@1"] == pytest.approx((0.5 + 1.0 + 0.5) / 3)  # tie with the twin column
    # The MI still averages over all 3 columns (the batch's empirical prompt distribution).
    assert merged["mi_estimate"] == unmerged["mi_estimate"]
    assert merged["mi_upper_bound"] == pytest.approx(math.log(3))
    # Any hashable identities work; tensors compare by their tokens.
    assert mi_metrics(L, owner, column_ids=["a", "b", "a"])["retrieval_accuracy@1"] == 1.0
    ids = [torch.tensor([5, 6]), torch.tensor([7]), torch.tensor([5, 6])]
    assert mi_metrics(L, owner, column_ids=ids)["num_distinct_prompts"] == 2.0


def test_single_row_has_zero_sigma():
    m = mi_metrics([[-1.0, -3.0]], [0])
    assert m["marginal_std"] == 0.0
    assert m["mi_zscore"] == pytest.approx(m["mi_estimate"] / 1e-3)


def test_both_adds_seq_variants_with_suffix():
    L = torch.tensor([[-1.0, -2.0], [-3.0, -1.0], [-2.0, -2.5]])
    lengths = torch.tensor([[3.0], [1.0], [10.0]])
    L_sum = L * lengths
    m = mi_metrics_both(L, L_sum, [0, 1, 0])
    seq_alone = mi_metrics(L_sum, [0, 1, 0])
    assert m["mi_estimate"] == mi_metrics(L, [0, 1, 0])["mi_estimate"]
    assert m["mi_estimate_seq"] == seq_alone["mi_estimate"]
    assert m["mi_zscore_seq"] == seq_alone["mi_zscore"]
    assert m["marginal_std_seq"] == seq_alone["marginal_std"]
    assert m["conditional_entropy_est_seq"] == pytest.approx(-(-3.0 - 1.0 - 20.0) / 3)
    # Scaling a row by its length keeps the ranking, so retrieval agrees.
    for k in (1, 2, 4, 8):
        assert m[f"retrieval_accuracy_seq@{k}"] == m[f"retrieval_accuracy@{k}"]
    assert "num_rows_seq" not in m
    with pytest.raises(ValueError, match="same shape"):
        mi_metrics_both(L, L_sum[:, :1], [0, 1, 0])
    with pytest.raises(ValueError, match="L_sum has a non-finite entry"):
        mi_metrics_both(L, L_sum * float("nan"), [0, 1, 0])


@pytest.mark.parametrize(
    ("L", "owner", "kwargs", "error", "match"),
    [
        ([[-1.0, float("nan")]], [0], {}, ValueError, "non-finite"),
        ([[-1.0, float("-inf")]], [0], {}, ValueError, "non-finite"),
        ([-1.0, -2.0], [0], {}, ValueError, "2-D"),
        (np.zeros((0, 3)), [], {}, ValueError, "no rows"),
        ([[-1.0, -2.0]], [2], {}, ValueError, r"owner indices must lie in \[0, 2\)"),
        ([[-1.0, -2.0]], [0, 1], {}, ValueError, "owner has 2 entries but L has 1 rows"),
        ([[-1.0, -2.0]], [0.0], {}, TypeError, "integer column indices"),
        ([[-1.0, -2.0]], [0], {"column_ids": [1]}, ValueError, "column_ids has 1 entries"),
        ([[-1.0, -2.0]], [0], {"column_ids": [{}, {}]}, TypeError, "not hashable"),
        ([[-1.0, -2.0]], [0], {"ks": (0,)}, ValueError, "int >= 1"),
        ([[-1.0, -2.0]], [0], {"std_eps": 0.0}, ValueError, "std_eps"),
        ([["a", "b"]], [0], {}, TypeError, "2-D array of numbers"),
    ],
)
def test_bad_input_is_a_specific_error(L, owner, kwargs, error, match):
    with pytest.raises(error, match=match):
        mi_metrics(L, owner, **kwargs)


# ---------------------------------------------------------------- ZScoreEMA
def test_zscore_ema_sequence_by_hand():
    ema = ZScoreEMA(decay=0.9)
    probes = [(2.0, 1.0), (1.0, 0.8), (0.5, 0.2)]  # (marginal_std, mi_estimate)
    expected_sigma = [2.0, 0.9 * 2.0 + 0.1 * 1.0, 0.9 * 1.9 + 0.1 * 0.5]  # 2.0, 1.9, 1.76
    for (sigma, mi), want in zip(probes, expected_sigma):
        out = ema.update({"marginal_std": sigma, "mi_estimate": mi})
        assert out["marginal_std_ema"] == pytest.approx(want)
        assert out["mi_zscore_ema"] == pytest.approx(mi / (want + 1e-3))
    assert ema.sigma() == pytest.approx(1.76)


def test_zscore_ema_first_probe_equals_plain_zscore_and_seq_is_separate():
    L = [[-1.0, -2.0], [-3.0, -1.0], [-2.0, -2.5]]
    m = mi_metrics_both(L, [[-3.0, -6.0], [-3.0, -1.0], [-20.0, -25.0]], [0, 1, 0])
    out = ZScoreEMA().update(m)
    assert out["mi_zscore_ema"] == pytest.approx(m["mi_zscore"])
    assert out["mi_zscore_ema_seq"] == pytest.approx(m["mi_zscore_seq"])
    assert out["marginal_std_ema_seq"] == pytest.approx(m["marginal_std_seq"])


def test_zscore_ema_state_dict_resumes_exactly():
    stream = [{"marginal_std": s, "mi_estimate": 0.5, "marginal_std_seq": 3 * s, "mi_estimate_seq": 2.0}
              for s in (1.0, 0.4, 0.7, 0.2)]
    straight = ZScoreEMA(decay=0.8)
    expected = [straight.update(m) for m in stream]
    first = ZScoreEMA(decay=0.8)
    for m in stream[:2]:
        first.update(m)
    resumed = ZScoreEMA()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.decay == 0.8
    assert [resumed.update(m) for m in stream[2:]] == expected[2:]


def test_zscore_ema_rejects_bad_input():
    with pytest.raises(ValueError, match="decay"):
        ZScoreEMA(decay=1.0)
    ema = ZScoreEMA()
    with pytest.raises(ValueError, match="finite number >= 0"):
        ema.update({"marginal_std": -1.0, "mi_estimate": 0.1})
    with pytest.raises(KeyError, match="need both"):
        ema.update({"marginal_std": 1.0})
    with pytest.raises(KeyError, match="neither"):
        ema.update({"something": 1.0})
    with pytest.raises(RuntimeError, match="call update first"):
        ema.zscore(0.3)
    with pytest.raises(ValueError, match="not a ZScoreEMA state dict"):
        ema.load_state_dict({"decay": 0.9})
    with pytest.raises(ValueError, match="decay"):
        ema.load_state_dict({"decay": 2.0, "eps": 1e-3, "sigma": {}, "num_updates": {}})


# ---------------------------------------------------------------- collapse detector
def _feed(detector, series):
    """series: list of (step, kwargs); returns all alerts."""
    alerts = []
    for step, values in series:
        alerts += detector.update(step, **values)
    return alerts


MI_COLLAPSE = [4.0, 4.0, 4.0, 3.5, 1.5, 1.5, 1.5, 1.0, 1.0]  # early level 4, threshold 2


def test_template_collapse_fires_once_when_entropy_holds():
    det = CollapseDetector(CollapseDetectorConfig(mi_baseline=3, mi_ratio=0.5, mi_patience=3))
    series = [(10 * i, {"mi_zscore_ema": v, "entropy": 2.0}) for i, v in enumerate(MI_COLLAPSE)]
    alerts = _feed(det, series)
    assert len(alerts) == 1
    alert = alerts[0]
    assert isinstance(alert, Alert)
    assert (alert.kind, alert.step) == ("template_collapse", 60)  # third low probe in a row
    assert alert.numbers["mi_early_level"] == 4.0 and alert.numbers["mi_threshold"] == 2.0
    assert alert.numbers["entropy"] == 2.0 and "template collapse" in alert.message
    # Recovery re-arms; a second excursion fires again.
    again = _feed(det, [(90, {"mi_zscore_ema": 3.0}), (100, {"mi_zscore_ema": 1.0}),
                        (110, {"mi_zscore_ema": 1.0}), (120, {"mi_zscore_ema": 1.0})])
    assert [(a.kind, a.step) for a in again] == [("template_collapse", 120)]
    assert len(det.alerts) == 2


def test_no_template_alert_when_entropy_falls_too():
    det = CollapseDetector(CollapseDetectorConfig(mi_baseline=3, mi_ratio=0.5, mi_patience=3,
                                                  entropy_ratio=0.7))
    entropies = [2.0, 2.0, 2.0, 1.8, 1.0, 0.8, 0.6, 0.5, 0.5]  # falls below 0.7 x 2.0 = 1.4
    series = [(i, {"mi_zscore_ema": v, "entropy": e}) for i, (v, e) in enumerate(zip(MI_COLLAPSE, entropies))]
    assert _feed(det, series) == []


def test_template_alert_without_entropy_says_so_and_needs_positive_early_level():
    det = CollapseDetector(CollapseDetectorConfig(mi_patience=2))
    alerts = _feed(det, [(i, {"mi_zscore_ema": v}) for i, v in enumerate([2.0, 2.0, 2.0, 0.1, 0.1])])
    assert [a.step for a in alerts] == [4] and "entropy unknown" in alerts[0].message
    flat = CollapseDetector(CollapseDetectorConfig(mi_patience=1))
    assert _feed(flat, [(i, {"mi_zscore_ema": v}) for i, v in enumerate([0.0, -0.1, 0.1, -5.0])]) == []


def test_reward_std_cliff_against_running_max():
    det = CollapseDetector(CollapseDetectorConfig(reward_std_baseline=3, reward_std_ratio=0.25))
    values = [1.0, 1.2, 1.1, 1.3, 0.9, 0.2, 0.1, 0.5, 0.3]
    alerts = _feed(det, [(i, {"reward_std": v}) for i, v in enumerate(values)])
    # step 5: 0.2 < 0.25 x 1.3; step 6 stays low (no repeat); step 7 recovers; step 8: 0.3 < 0.325
    assert [(a.kind, a.step) for a in alerts] == [("reward_std_cliff", 5), ("reward_std_cliff", 8)]
    assert alerts[0].numbers["reference"] == 1.3 and alerts[0].numbers["threshold"] == pytest.approx(0.325)


def test_reward_std_cliff_against_early_level_with_consecutive_steps():
    cfg = CollapseDetectorConfig(reward_std_baseline=2, reward_std_ratio=0.5, reward_std_reference="early",
                                 reward_std_patience=2)
    det = CollapseDetector(cfg)
    values = [1.0, 2.0, 5.0, 0.7, 0.9, 0.6, 0.6]  # early level 1.5, threshold 0.75 (the 5.0 is ignored)
    alerts = _feed(det, [(i, {"reward_std": v}) for i, v in enumerate(values)])
    assert [a.step for a in alerts] == [6]  # step 3 low once, step 4 above again, steps 5-6 low twice
    assert alerts[0].numbers["reference"] == pytest.approx(1.5)


def test_grad_norm_spike_against_running_median():
    det = CollapseDetector(CollapseDetectorConfig(grad_norm_ratio=5.0, grad_norm_min_history=5))
    values = [1.0, 100.0]  # too little history to judge: no alert
    values += [1.2, 0.8, 1.0, 6.0, 7.0, 1.0, 30.0]
    alerts = _feed(det, [(i, {"grad_norm": v}) for i, v in enumerate(values)])
    # step 5: median of [1, 100, 1.2, 0.8, 1] = 1.0, 6 > 5; step 6 still high (no repeat); step 8 again
    assert [(a.kind, a.step) for a in alerts] == [("grad_norm_spike", 5), ("grad_norm_spike", 8)]
    assert alerts[0].numbers["running_median"] == 1.0
    assert det.update(9, grad_norm=1.0) == []  # back to normal: re-armed
    inf_alert = det.update(10, grad_norm=float("inf"))
    assert [a.kind for a in inf_alert] == ["grad_norm_spike"] and "non-finite" in inf_alert[0].message


def test_detector_state_dict_resumes_exactly():
    cfg = CollapseDetectorConfig(mi_baseline=3, mi_patience=3)
    series = [(i, {"mi_zscore_ema": mi, "entropy": 2.0, "reward_std": rs, "grad_norm": g})
              for i, (mi, rs, g) in enumerate(zip(MI_COLLAPSE, [1, 1, 1, 1, 1, 0.1, 0.1, 1, 0.1],
                                                  [1, 1, 1, 1, 1, 9, 1, 1, 1]))]
    straight = CollapseDetector(cfg)
    expected = _feed(straight, series)
    first = CollapseDetector(cfg)
    _feed(first, series[:5])
    resumed = CollapseDetector(cfg)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert _feed(resumed, series[5:]) == expected
    assert resumed.alerts == straight.alerts
    assert {a.kind for a in expected} == {"template_collapse", "reward_std_cliff", "grad_norm_spike"}


def test_detector_rejects_bad_input():
    det = CollapseDetector()
    det.update(5, reward_std=1.0)
    with pytest.raises(ValueError, match="backwards"):
        det.update(4, reward_std=1.0)
    with pytest.raises(ValueError, match="mi_zscore_ema must be finite"):
        det.update(6, mi_zscore_ema=float("nan"))
    with pytest.raises(ValueError, match="reward_std must be >= 0"):
        det.update(6, reward_std=-0.1)
    with pytest.raises(TypeError, match="entropy must be a number"):
        det.update(6, entropy="high")
    with pytest.raises(ValueError, match="not a CollapseDetector state dict"):
        det.load_state_dict({"last_step": 3})
    for bad in ({"mi_ratio": 1.5}, {"mi_patience": 0}, {"reward_std_reference": "median"},
                {"grad_norm_ratio": 1.0}, {"grad_norm_min_history": 60, "grad_norm_window": 50}):
        with pytest.raises(ValueError):
            CollapseDetectorConfig(**bad)
