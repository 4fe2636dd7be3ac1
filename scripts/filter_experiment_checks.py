"""Checks on the committed claim-1 cells (issue 50, item 5's corrections), from their files only:

    python scripts/filter_experiment_checks.py [docs/experiments/filter-comparison-bandit] \
        [--out docs/benchmarks/filter_experiment_checks.json]

* which commit each seed's cells ran on, and whether the tree was clean (bench_cell.json's `code`):
  seed 0's cells were recorded by hand, on trees with uncommitted changes;
* the paired differences of final validation success against `none`, over all seeds and without
  seed 0 (ragen2.bench.stats.paired_comparison, as `ragen2 bench report` computes them);
* how often the pre-clip gradient norm (actor/grad_norm) exceeded optim.grad_clip: when it does, the
  clipped update has the clip's size whatever the filter kept, so the arms differ in direction only;
* the two token counts the report prints: rollout tokens (rollout/num_tokens: prompt + response of
  every row) and sampled tokens (response tokens only: response_tokens_mean x trajectories).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import yaml

from ragen2 import metric_names as names
from ragen2.bench.stats import paired_comparison

BASELINE = "none"


def cell_rows(cell: Path) -> list[dict]:
    return [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", nargs="?", type=Path, default=Path("docs/experiments/filter-comparison-bandit"))
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/filter_experiment_checks.json"))
    args = parser.parse_args(argv)
    final: dict[str, dict[int, float]] = {}
    clip: dict[str, list[int]] = {}  # arm -> [steps over the clip, steps with a norm]
    limits: set[float] = set()
    norms: dict[str, list[float]] = {}
    tokens: dict[str, list[float]] = {}  # arm -> [rollout tokens, sampled tokens] summed over cells
    code: dict[int, dict[str, dict]] = {}
    for cell in sorted((args.bench / "runs").glob("*")):
        if not (cell / "summary.json").is_file():
            continue
        config = yaml.safe_load((cell / "config.yaml").read_text())
        arm, seed = cell.name.split("--")[2], int(config["trainer"]["seed"])
        final.setdefault(arm, {})[seed] = json.loads((cell / "summary.json").read_text())["final_val_success_rate"]
        limit = float(config["optim"]["grad_clip"])
        limits.add(limit)
        rows = cell_rows(cell)
        grad = [r[names.ACTOR_GRAD_NORM] for r in rows if r.get(names.ACTOR_GRAD_NORM) is not None]
        counts = clip.setdefault(arm, [0, 0])
        counts[0] += sum(g > limit for g in grad)
        counts[1] += len(grad)
        norms.setdefault(arm, []).extend(grad)
        t = tokens.setdefault(arm, [0.0, 0.0])
        t[0] += sum(r[names.ROLLOUT_NUM_TOKENS] for r in rows)
        t[1] += sum(r[names.ROLLOUT_RESPONSE_TOKENS_MEAN] * r[names.ROLLOUT_NUM_TRAJECTORIES] for r in rows)
        bench_cell = json.loads((cell / "bench_cell.json").read_text())
        code.setdefault(seed, {})[arm] = {"commit": bench_cell["code"]["commit"][:7],
                                          "tracked_files_changed": bench_cell["code"].get("tracked_files_changed"),
                                          "note": bench_cell["code"].get("note")}
    comparisons = {}
    for arm in sorted(final):
        if arm == BASELINE:
            continue
        everyone = paired_comparison(final[BASELINE], final[arm])
        later = {s: v for s, v in final[BASELINE].items() if s != 0}
        without0 = paired_comparison(later, {s: v for s, v in final[arm].items() if s != 0})
        comparisons[f"{arm} - {BASELINE}"] = {
            key: {k: part[k] for k in ("n", "mean", "t_ci", "bootstrap_ci", "sign_flip_p")}
            for key, part in (("all_seeds", everyone), ("without_seed_0", without0))}
    clipped = {arm: {"steps_over_clip": c[0], "steps": c[1], "fraction": c[0] / c[1],
                     "median_pre_clip_norm": statistics.median(norms[arm])} for arm, c in sorted(clip.items())}
    total = [sum(c[0] for c in clip.values()), sum(c[1] for c in clip.values())]
    result = {"command": "python scripts/filter_experiment_checks.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "bench": str(args.bench), "code_by_seed": {str(s): v for s, v in sorted(code.items())},
              "final_val_success_differences": comparisons,
              "grad_clip": {"limit": sorted(limits), "by_arm": clipped, "all_arms_fraction": total[0] / total[1]},
              "tokens": {arm: {"rollout_tokens_prompt_and_response": int(t[0]), "sampled_tokens_response_only": int(t[1]),
                               "sampled_share": t[1] / t[0]} for arm, t in sorted(tokens.items())}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for name, c in comparisons.items():
        for key, part in c.items():
            lo, hi = part["t_ci"]
            print(f"{name:24s} {key:15s} n {part['n']} mean {part['mean']:+.3f} t CI [{lo:+.3f}, {hi:+.3f}] "
                  f"sign-flip p {part['sign_flip_p']:.3g}")
    for arm, c in clipped.items():
        print(f"{arm:14s} pre-clip norm over the clip in {c['steps_over_clip']}/{c['steps']} steps "
              f"({c['fraction']:.1%}), median {c['median_pre_clip_norm']:.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
