"""RAGEN-2's claim (3) from the `grad-vs-spread` suite's cells: per algorithm, the slope of log
task-gradient norm against log in-group reward std over groups with spread (and the same for the
task norm per sampled token and the entropy term scaled by its coefficient), each with a
cluster-bootstrap 95% CI over (seed, step); then the secondary fit pre-registered in
configs/bench/grad-vs-spread.yaml.

    python scripts/grad_vs_spread.py [docs/experiments/grad-vs-spread] [--out docs/benchmarks/grad_vs_spread.json]

A cell's metrics hold, at every decomposed step, one bucket per group (`grad/bucket_k/...`):
its reward std, task norm (also per sampled token), scaled entropy norm and sampled tokens. Groups
of one (seed, step) share the policy and the batch's normalisation, so they are resampled together.

"Zero" is a floor, not `> 0`. A group of identical replies whose rewards still differ (Bandit's
random payoff) has mean-centred advantages summing to zero over one and the same gradient: its
task gradient is zero in exact arithmetic, and float32 leaves a residue of order eps32 times the
size of an uncancelled group gradient (docs/benchmarks/grad_floor.json measures it on a tiny model:
float32 vs float64 on the same rows). The floor is FLOOR_RELATIVE x the arm's median norm of groups
with spread, far above that residue and far below any real group gradient; points under it are
reported (count, largest), not fitted. Zero-variance groups are reported too: their task norm must
be zero to rounding (that is the mechanism the claim rests on).

Secondary fit (pre-registered in the suite file): per seed, ordinary least squares of ln task norm
on ln reward std, ln sampled tokens and one indicator per step (per-(seed, step) effects: the
policy drifts between steps); the per-seed slopes on ln std are tested one-sided for a positive
mean (t-test) and a positive majority (sign test) across seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import yaml

from ragen2.bench.stats import cluster_bootstrap_slope
from ragen2.metric_names import GRAD

SERIES = ("task_norm", "task_norm_per_token", "entropy_scaled_norm")
# 1e-4 of the arm's median: on the bundled model a cancelled group's float32 residue is at most 6.4e-7 of
# its uncancelled norm (docs/benchmarks/grad_floor.json), so residue stays ~100x under the floor even for a
# group several times the median, while a real group gradient sits orders of magnitude above it.
FLOOR_RELATIVE = 1e-4


def points(run_dir: Path) -> list[dict]:
    """(step, reward std, norms, sampled tokens) of every decomposed group of a cell."""
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        metrics = json.loads(line)
        for key, value in metrics.items():
            if key.startswith(f"{GRAD}/bucket_") and key.endswith("/reward_std_mean"):
                bucket = key[: -len("/reward_std_mean")]
                if metrics.get(f"{bucket}/num_groups") != 1.0:
                    continue  # one group per bucket is what this analysis reads
                rows.append({"step": metrics["step"], "reward_std": float(value),
                             "task_norm": float(metrics[f"{bucket}/task_norm"]),
                             # per sampled token: a group of long replies has a larger summed gradient
                             # at the same spread (Dr.GRPO sums over tokens), which the raw norm mixes in
                             "task_norm_per_token": float(metrics.get(f"{bucket}/task_norm_per_token", "nan")),
                             "entropy_scaled_norm": float(metrics.get(f"{bucket}/entropy_scaled_norm", "nan")),
                             "tokens": float(metrics.get(f"{bucket}/num_tokens", "nan"))})
    return rows


def floor_of(values: list[float]) -> float:
    """FLOOR_RELATIVE x the median of the finite positive values (0 when there are none)."""
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return FLOOR_RELATIVE * statistics.median(finite) if finite else 0.0


def floor_report(rows: list[dict], series: str = "task_norm") -> dict:
    """The floor of one series over groups with spread, what falls under it, and the gap it sits in."""
    spread = [r[series] for r in rows if r["reward_std"] > 0 and math.isfinite(r[series])]
    floor = floor_of(spread)
    below, above = [v for v in spread if v <= floor], [v for v in spread if v > floor]
    zero_var = [r[series] for r in rows if r["reward_std"] == 0 and math.isfinite(r[series])]
    return {"floor": floor, "floor_relative_to_median": FLOOR_RELATIVE, "median": floor / FLOOR_RELATIVE,
            "spread_groups_below_floor": len(below), "largest_below_floor": max(below, default=None),
            "smallest_above_floor": min(above, default=None),
            "zero_variance_groups": len(zero_var), "zero_variance_task_norm_max": max(zero_var, default=None)}


def secondary_fit(runs: list[tuple[int, list[dict]]], floor: float) -> dict:
    """Per seed: OLS of ln task norm on ln std + ln tokens + step indicators; slopes tested across seeds."""
    from scipy.stats import binomtest, t as t_dist

    slopes, without_tokens, token_coefs = {}, [], []
    for seed, rows in runs:
        kept = [r for r in rows if r["reward_std"] > 0 and r["task_norm"] > floor and r["tokens"] > 0]
        steps = sorted({r["step"] for r in kept})
        if len({r["reward_std"] for r in kept}) < 2:
            continue  # no spread contrast in this seed: no slope
        design = np.array([[math.log(r["reward_std"]), math.log(r["tokens"])] +
                           [float(r["step"] == s) for s in steps] for r in kept])
        if np.linalg.matrix_rank(design) < design.shape[1]:
            design = np.delete(design, 1, axis=1)  # ln tokens constant within steps: the effects hold it
            without_tokens.append(seed)
        if len(kept) <= design.shape[1] or np.linalg.matrix_rank(design) < design.shape[1]:
            continue  # too few points for the effects, or ln std collinear with them
        y = np.array([math.log(r["task_norm"]) for r in kept])
        coef = np.linalg.lstsq(design, y, rcond=None)[0]
        slopes[seed] = float(coef[0])
        if design.shape[1] == len(steps) + 2:
            token_coefs.append(float(coef[1]))
    values = list(slopes.values())
    n = len(values)
    out = {"model": "per seed: ln task_norm ~ ln reward_std + ln tokens + step indicators (OLS)",
           "per_seed_slope": {str(s): v for s, v in sorted(slopes.items())}, "seeds": n,
           "seeds_without_token_covariate": without_tokens,
           "mean_tokens_coefficient": statistics.fmean(token_coefs) if token_coefs else None}
    if n >= 2:
        mean, sd = statistics.fmean(values), statistics.stdev(values)
        t = mean / (sd / math.sqrt(n)) if sd > 0 else math.inf
        half = float(t_dist.ppf(0.975, n - 1)) * sd / math.sqrt(n)
        positive = sum(v > 0 for v in values)
        out.update(mean_slope=mean, ci95=[mean - half, mean + half], t=t,
                   p_one_sided_t=float(t_dist.sf(t, n - 1)), positive=positive,
                   p_one_sided_sign=float(binomtest(positive, n, 0.5, alternative="greater").pvalue))
    return out


def per_step_slopes(runs: list[tuple[int, list[dict]]], floor: float) -> dict:
    """Pooled slope of ln task norm on ln std at each step over seeds (descriptive: the policy drifts)."""
    out = {}
    for step in sorted({r["step"] for _, rows in runs for r in rows}):
        pts = [(math.log(r["reward_std"]), math.log(r["task_norm"])) for _, rows in runs for r in rows
               if r["step"] == step and r["reward_std"] > 0 and r["task_norm"] > floor]
        x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        if len(pts) > 2 and np.ptp(x) > 0:
            out[str(step)] = float(np.polyfit(x, y, 1)[0])
    return out


def analyse(cells: dict[str, list[tuple[int, list[dict]]]]) -> dict:
    """cells: algo -> [(seed, points)]; per algo the floored slopes, the floor and the secondary fit."""
    out = {}
    for algo, runs in sorted(cells.items()):
        rows = [row for _, rs in runs for row in rs]
        result = {"floors": {series: floor_report(rows, series) for series in SERIES}}
        for series in SERIES:
            floor = result["floors"][series]["floor"]
            clusters = {}
            for seed, rs in runs:
                for row in rs:
                    if row["reward_std"] > 0 and row[series] > floor and math.isfinite(row[series]):
                        cx, cy = clusters.setdefault((seed, row["step"]), ([], []))
                        cx.append(math.log(row["reward_std"]))
                        cy.append(math.log(row[series]))
            xs = [x for cx, _ in clusters.values() for x in cx]
            if len(clusters) >= 2 and max(xs) > min(xs):
                result[series] = cluster_bootstrap_slope(list(clusters.values()))
        task_floor = result["floors"]["task_norm"]["floor"]
        # Bandit's 4-rollout stds fall in two clusters (a coin flip decides which): is there a slope
        # within each, or is the pooled one only the contrast between them?
        for name, inside in (("within_std_below_0.3", lambda v: v < 0.3), ("within_std_from_0.3", lambda v: v >= 0.3)):
            clusters = {}
            for seed, rs in runs:
                for row in rs:
                    if row["reward_std"] > 0 and inside(row["reward_std"]) and row["task_norm"] > task_floor:
                        cx, cy = clusters.setdefault((seed, row["step"]), ([], []))
                        cx.append(math.log(row["reward_std"]))
                        cy.append(math.log(row["task_norm"]))
            if len(clusters) >= 2 and np.ptp([x for cx, _ in clusters.values() for x in cx]) > 0:
                result[f"task_norm_{name}"] = cluster_bootstrap_slope(list(clusters.values()))
        result["per_step_task_slope"] = per_step_slopes(runs, task_floor)
        result["secondary"] = secondary_fit(runs, task_floor)
        result["groups_without_spread"] = sum(row["reward_std"] == 0 for row in rows)
        result["seeds"] = sorted(seed for seed, _ in runs)
        out[algo] = result
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", nargs="?", type=Path, default=Path("docs/experiments/grad-vs-spread"))
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/grad_vs_spread.json"))
    args = parser.parse_args(argv)
    cells: dict[str, list] = {}
    finished = 0
    for cell in sorted((args.bench / "runs").glob("*")):
        if not (cell / "summary.json").is_file():
            continue  # only finished cells: a half-run cell would weigh its early steps
        config = yaml.safe_load((cell / "config.yaml").read_text())
        cells.setdefault(config["algo"]["name"], []).append((int(config["trainer"]["seed"]), points(cell)))
        finished += 1
    if not finished:
        print(f"error: no finished cell under {args.bench / 'runs'}", file=sys.stderr)
        return 2
    result = {"command": "python scripts/grad_vs_spread.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "bench": str(args.bench), "finished_cells": finished, "by_algo": analyse(cells)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for algo, r in result["by_algo"].items():
        f = r["floors"]["task_norm"]
        print(f"{algo}: floor {f['floor']:.3g}; {f['spread_groups_below_floor']} groups with spread under it "
              f"(largest {f['largest_below_floor']}); {f['zero_variance_groups']} zero-variance groups, task norm max "
              f"{f['zero_variance_task_norm_max']}")
        for series in SERIES:
            if series in r:
                s = r[series]
                print(f"  {series:20s} slope {s['slope']:+.2f} [{s['ci95'][0]:+.2f}, {s['ci95'][1]:+.2f}] "
                      f"over {s['points']} groups in {s['clusters']} (seed, step) clusters")
        for name in ("within_std_below_0.3", "within_std_from_0.3"):
            if f"task_norm_{name}" in r:
                w = r[f"task_norm_{name}"]
                print(f"  task norm {name}: slope {w['slope']:+.2f} [{w['ci95'][0]:+.2f}, {w['ci95'][1]:+.2f}] "
                      f"over {w['points']} groups")
        s = r["secondary"]
        if "mean_slope" in s:
            print(f"  secondary: mean per-seed slope {s['mean_slope']:+.2f} [{s['ci95'][0]:+.2f}, {s['ci95'][1]:+.2f}] "
                  f"over {s['seeds']} seeds, one-sided t p {s['p_one_sided_t']:.2g}, "
                  f"{s['positive']}/{s['seeds']} positive (sign p {s['p_one_sided_sign']:.2g})")
        print("  per-step slopes " + ", ".join(f"{k}: {v:+.2f}" for k, v in r["per_step_task_slope"].items()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
