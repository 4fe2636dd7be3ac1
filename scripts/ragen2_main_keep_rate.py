"""How many groups RAGEN-2's main-table filter keeps on simulated 0/1-reward batches.

    python scripts/ragen2_main_keep_rate.py --out docs/benchmarks/ragen2_main_keep_rate.json

Each batch has `groups` groups of `group_size` rollouts; a group's rewards are Bernoulli draws
with its own success probability, drawn per group from the scenario's distribution. Every
batch goes through the ragen2-main preset (top-p 0.9, softmax over the reward std, zero-spread
groups kept) and, for comparison, snr-top-p (linear over the variance, zero-spread dropped),
snr-top-p-std and starpo-s. Softmax over stds that lie in [0, 0.52] is nearly uniform, so
ragen2-main keeps about 0.9 of the groups whatever their spread: the question is how close.
Writes a JSON (distribution of groups kept, skipped batches, mean kept fraction per preset).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

import snr

PRESETS = ("ragen2-main", "snr-top-p", "snr-top-p-std", "starpo-s")
# per-group success probability: uniform on [0, 1], or every group the same p
SCENARIOS = {"p~U(0,1)": None, "p=0.1": 0.1, "p=0.5": 0.5, "p=0.9": 0.9}


def simulate(batches: int, groups: int, group_size: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    configs = {name: snr.load_preset(name) for name in PRESETS}
    out = {}
    for scenario, p in SCENARIOS.items():
        kept = {name: Counter() for name in PRESETS}
        for _ in range(batches):
            probs = rng.uniform(0, 1, size=(groups, 1)) if p is None else np.full((groups, 1), p)
            rewards = torch.from_numpy((rng.uniform(size=(groups, group_size)) < probs).astype(np.float64))
            for name, cfg in configs.items():
                kept[name][int(snr.select_groups(rewards, cfg).kept.numel())] += 1
        out[scenario] = {name: {"groups_kept": {str(k): counts[k] for k in sorted(counts)},
                                "skipped_batches": counts[0],
                                "mean_kept_fraction": sum(k * n for k, n in counts.items()) / batches / groups}
                         for name, counts in kept.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=8, help="groups per batch (the main table's 8)")
    parser.add_argument("--group-sizes", default="16,4", help="rollouts per group, comma-separated "
                                                              "(16: the main table; 4: the CPU suites)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    result = {"command": " ".join(["python scripts/ragen2_main_keep_rate.py", *argv]),
              "batches": args.batches, "groups": args.groups, "seed": args.seed,
              "rewards": "0/1, Bernoulli with a per-group success probability (scenario)",
              "by_group_size": {str(g): simulate(args.batches, args.groups, g, args.seed)
                                for g in map(int, args.group_sizes.split(","))}}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
