"""RAGEN-2's claim (3) from the `grad-vs-spread` suite's cells: per algorithm, the slope of log
task-gradient norm against log in-group reward std over groups with spread, and the same for the
entropy term scaled by its coefficient, each with a cluster-bootstrap 95% CI over (seed, step).

    python scripts/grad_vs_spread.py [docs/experiments/grad-vs-spread] [--out docs/benchmarks/grad_vs_spread.json]

A cell's metrics hold, at every decomposed step, one bucket per group (`grad/bucket_k/...`):
its reward std, task norm (also per sampled token) and scaled entropy norm. Groups of one (seed, step) share the policy
and the batch's normalisation, so they are resampled together.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import yaml

from ragen2.bench.stats import cluster_bootstrap_slope
from ragen2.metric_names import GRAD

SERIES = ("task_norm", "task_norm_per_token", "entropy_scaled_norm")


def points(run_dir: Path) -> list[dict]:
    """(step, reward std, task norm, scaled entropy norm) of every decomposed group of a cell."""
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
                             "entropy_scaled_norm": float(metrics.get(f"{bucket}/entropy_scaled_norm", "nan"))})
    return rows


def analyse(cells: dict[str, list[tuple[int, list[dict]]]]) -> dict:
    """cells: algo -> [(seed, points)]; per algo the task and entropy slopes."""
    out = {}
    for algo, runs in sorted(cells.items()):
        result = {}
        for series in SERIES:
            clusters = {}
            for seed, rows in runs:
                for row in rows:
                    if row["reward_std"] > 0 and row[series] > 0 and math.isfinite(row[series]):
                        cx, cy = clusters.setdefault((seed, row["step"]), ([], []))
                        cx.append(math.log(row["reward_std"]))
                        cy.append(math.log(row[series]))
            xs = [x for cx, _ in clusters.values() for x in cx]
            if len(clusters) >= 2 and max(xs) > min(xs):
                result[series] = cluster_bootstrap_slope(list(clusters.values()))
        result["groups_without_spread"] = sum(row["reward_std"] == 0 for _, rows in runs for row in rows)
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
        for series in SERIES:
            if series in r:
                s = r[series]
                print(f"{algo:16s} {series:20s} slope {s['slope']:+.2f} [{s['ci95'][0]:+.2f}, {s['ci95'][1]:+.2f}] "
                      f"over {s['points']} groups in {s['clusters']} (seed, step) clusters")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
