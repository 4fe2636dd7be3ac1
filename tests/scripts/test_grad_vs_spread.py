"""scripts/grad_vs_spread.py: the floor keeps float residue out of the fit, zero-variance groups are
reported, and the pre-registered per-seed fit recovers a known slope; scripts/grad_floor.py's residue
is rounding (it shrinks with precision)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synthetic_runs(slope: float, seeds: int = 6, residue: bool = True) -> list[tuple[int, list[dict]]]:
    """norm = exp(step effect) * std^slope * tokens^0.5 * noise, plus residue groups and flat groups."""
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(seeds):
        rows = []
        for step in range(4):
            effect = rng.normal(0, 1.0)  # the policy drifts: each (seed, step) has its own level
            for _ in range(6):
                std, tokens = float(rng.uniform(0.05, 0.6)), float(rng.integers(10, 60))
                norm = math.exp(effect) * std ** slope * tokens ** 0.5 * math.exp(rng.normal(0, 0.1))
                rows.append({"step": step, "reward_std": std, "task_norm": norm, "tokens": tokens,
                             "task_norm_per_token": norm / tokens, "entropy_scaled_norm": 0.5})
            if residue:  # identical replies, coin-flip rewards: a norm of float rounding at a large std
                rows.append({"step": step, "reward_std": 0.5, "task_norm": 3e-6, "tokens": 20.0,
                             "task_norm_per_token": 1.5e-7, "entropy_scaled_norm": 0.5})
            rows.append({"step": step, "reward_std": 0.0, "task_norm": 0.0, "tokens": 20.0,
                         "task_norm_per_token": 0.0, "entropy_scaled_norm": 0.5})
        runs.append((seed, rows))
    return runs


def test_floor_excludes_residue_and_reports_zero_variance_groups():
    gvs = load("grad_vs_spread")
    runs = synthetic_runs(1.0)
    rows = [r for _, rs in runs for r in rs]
    report = gvs.floor_report(rows)
    assert report["spread_groups_below_floor"] == 24 and report["largest_below_floor"] == 3e-6
    assert report["zero_variance_groups"] == 24 and report["zero_variance_task_norm_max"] == 0.0
    assert report["largest_below_floor"] < report["floor"] < report["smallest_above_floor"]
    floored = gvs.analyse({"dr": runs})["dr"]
    unfloored = gvs.analyse({"dr": synthetic_runs(1.0, residue=False)})["dr"]
    # with the floor the residue points leave the fit: the same points as without them at all
    assert floored["task_norm"]["points"] == unfloored["task_norm"]["points"] == 6 * 4 * 6
    assert floored["task_norm"]["slope"] == pytest.approx(unfloored["task_norm"]["slope"])


def test_secondary_fit_recovers_the_slope_under_step_effects_and_tests_it_one_sided():
    gvs = load("grad_vs_spread")
    up = gvs.secondary_fit(synthetic_runs(1.0), floor=1e-3)
    assert up["seeds"] == 6 and all(abs(s - 1.0) < 0.15 for s in up["per_seed_slope"].values())
    assert up["mean_tokens_coefficient"] == pytest.approx(0.5, abs=0.1)
    assert up["p_one_sided_t"] < 1e-4 and up["positive"] == 6 and up["p_one_sided_sign"] == pytest.approx(1 / 64)
    down = gvs.secondary_fit(synthetic_runs(-0.5), floor=1e-3)
    assert down["mean_slope"] < 0 and down["p_one_sided_t"] > 0.99  # one-sided: a falling norm is no support


def test_float32_residue_of_a_cancelled_group_is_rounding(tmp_path):
    floor = load("grad_floor")
    out = tmp_path / "floor.json"
    assert floor.main(["--out", str(out)]) == 0
    import json

    worst = json.loads(out.read_text())["max_ratio"]
    assert 0 < worst["float32"] < 1e-5  # a few float32 epsilons of the group's uncancelled norm
    assert worst["float64"] < worst["float32"] / 3  # more precision, less residue: rounding, not signal
