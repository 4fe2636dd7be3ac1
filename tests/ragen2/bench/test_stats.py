"""ragen2.bench.stats and the report's budget checks, on cases worked out by hand."""

import math

import pytest

from ragen2.bench import comparisons
from ragen2.bench.stats import bootstrap_interval, paired, paired_comparison, sign_flip_p_value, t_interval


def test_pairs_are_the_seeds_both_arms_finished():
    seeds, diffs = paired({0: 0.1, 1: 0.2, 2: None, 4: 0.0}, {0: 0.3, 1: 0.1, 2: 0.5, 3: 0.5})
    assert seeds == [0, 1] and diffs == pytest.approx([0.2, -0.1])  # b − a


def test_t_interval_by_hand():
    # [1, 2, 3]: mean 2, sd 1, se 1/√3; t(0.975, 2 df) = 4.303 (tables) → 2 ± 2.484
    low, high = t_interval([1.0, 2.0, 3.0])
    assert (low, high) == pytest.approx((2 - 4.3027 / math.sqrt(3), 2 + 4.3027 / math.sqrt(3)), abs=1e-3)
    # [0.1, 0.3, 0.2, 0.4]: mean 0.25, sd √(0.05/3) = 0.1291, se 0.06455; t(0.975, 3) = 3.182 → ± 0.2054
    assert t_interval([0.1, 0.3, 0.2, 0.4]) == pytest.approx((0.25 - 0.2054, 0.25 + 0.2054), abs=2e-4)
    assert t_interval([0.5]) is None  # no spread from one seed


def test_sign_flip_p_value_enumerates_every_sign_assignment():
    # [1, 2, 3]: the 8 signed sums are ±6, ±4, ±2, 0, 0; |sum| >= 6 in 2 of them → p = 0.25
    assert sign_flip_p_value([1.0, 2.0, 3.0]) == (0.25, True)
    # [3, 1, -1]: sums ±5, ±3, ±3, ±1; |sum| >= 3 (the observed 3) in 6 of 8 → 0.75
    assert sign_flip_p_value([3.0, 1.0, -1.0]) == (0.75, True)
    # 8 seeds all +0.2 (a tie at the extreme, up to round-off): only all-plus and all-minus → 2 / 256
    assert sign_flip_p_value([0.3 - 0.1] * 4 + [0.2] * 4) == (2 / 256, True)
    assert sign_flip_p_value([1.0, -1.0]) == (1.0, True)  # mean 0: every assignment is as extreme
    assert sign_flip_p_value([]) is None


def test_sign_flip_beyond_exact_is_a_seeded_monte_carlo_estimate():
    p, exact = sign_flip_p_value([1.0, 2.0, 3.0], max_exact=2, resamples=20_000, seed=3)
    assert not exact and p == pytest.approx(0.25, abs=0.01)
    assert sign_flip_p_value([1.0, 2.0, 3.0], max_exact=2, resamples=20_000, seed=3) == (p, False)


def test_bootstrap_interval_is_seeded_and_right_on_small_cases():
    # [0, 1]: resampled means are 0, 0.5, 1 with probability 1/4, 1/2, 1/4: the 2.5% and 97.5%
    # quantiles are 0 and 1.
    assert bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap_interval([0.25, 0.25, 0.25]) == pytest.approx((0.25, 0.25))
    values = [0.0, 0.1, 0.5, 0.9, 1.3]
    assert bootstrap_interval(values, seed=1) == bootstrap_interval(values, seed=1)
    # few resamples, so the quantiles move with the draws (10,000 settle on the same grid points)
    assert bootstrap_interval(values, resamples=200, seed=1) != bootstrap_interval(values, resamples=200, seed=2)
    low, high = bootstrap_interval(values)
    assert 0.0 < low < sum(values) / 5 < high < 1.3
    assert bootstrap_interval([0.5]) is None


def test_paired_comparison_collects_it_all():
    result = paired_comparison({0: 0.5, 1: 0.25, 2: 0.5}, {0: 0.75, 1: 0.5, 2: 0.75})
    assert result["n"] == 3 and result["seeds"] == [0, 1, 2] and result["mean"] == pytest.approx(0.25)
    assert result["sd"] == pytest.approx(0.0) and result["t_ci"] == pytest.approx((0.25, 0.25))
    assert (result["sign_flip_p"], result["p_exact"]) == (0.25, True)  # 2 of 8


def _cell(name, treatment, seed):
    return {"name": name, "matrix": "m", "env": "bandit", "row": "algo", "treatment": treatment, "seed": seed,
            "baseline": "none"}


def _result(name, final, episodes, steps, trained):
    return {"name": name, "status": "done", "final_val_success": final, "env_episodes": episodes,
            "response_tokens": 100, "update_tokens": 50, "optimizer_steps": steps, "steps_trained": trained,
            "optimizer_steps_per_trained_step": None if steps is None else steps / trained}


def test_arms_that_differ_in_a_declared_budget_get_a_warning():
    cells = [_cell(f"{t}-{s}", t, s) for s in (0, 1) for t in ("none", "snr")]
    results = [_result("none-0", 0.5, 32, 4, 4), _result("snr-0", 0.75, 32, 3, 3),
               _result("none-1", 0.5, 32, 4, 4), _result("snr-1", 0.5, 32, None, 4)]
    [compared] = comparisons.compare(cells, results, ["env_episodes", "optimizer_steps",
                                                      "optimizer_steps_per_trained_step"])
    assert (compared["a"], compared["b"], compared["n"]) == ("none", "snr", 2)
    assert compared["differences"] == pytest.approx([0.25, 0.0])
    # episodes equal; optimiser steps 3 vs 4 on seed 0, not recorded on seed 1; per trained step
    # 1 = 1 on seed 0 (the filter skipped a step: fewer steps, the same per trained step)
    assert compared["budget_differences"] == [
        {"budget": "optimizer_steps", "seeds": [0, 1], "values": [[4, 3], [4, None]]},
        {"budget": "optimizer_steps_per_trained_step", "seeds": [1], "values": [[1.0, None]]}]
    assert comparisons.warnings([compared])[0] == (
        "m / bandit / algo: `snr` vs `none` differ in optimizer_steps, which the suite declares equal "
        "(seed 0: 4 vs 3, seed 1: 4 vs not recorded)")
    assert comparisons.compare(cells, results, ["env_episodes"])[0]["budget_differences"] == []


def test_cluster_bootstrap_slope_by_hand():
    from ragen2.bench.stats import cluster_bootstrap_slope

    # y = 2x + 1 exactly: every resample has slope 2
    exact = cluster_bootstrap_slope([([0.0, 1.0], [1.0, 3.0]), ([2.0, 3.0], [5.0, 7.0])], resamples=200)
    assert exact["slope"] == pytest.approx(2.0) and exact["ci95"] == pytest.approx([2.0, 2.0])
    assert (exact["points"], exact["clusters"]) == (4, 2)
    # two clusters with slopes 0 and 2 around the same x: the pooled slope is 1, and resampling
    # whole clusters gives draws of 0, 1 and 2 (all-one-cluster resamples have one slope each)
    mixed = cluster_bootstrap_slope([([0.0, 1.0], [0.0, 0.0]), ([0.0, 1.0], [0.0, 2.0])], resamples=2000)
    assert mixed["slope"] == pytest.approx(1.0)
    assert mixed["ci95"][0] == pytest.approx(0.0) and mixed["ci95"][1] == pytest.approx(2.0)
