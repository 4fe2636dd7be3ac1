"""The rollout phase of a multi-turn step, today's code against an older commit's; prints JSON.

    python benchmarks/rollout.py [--env sokoban] [--groups 4] [--group-size 8] [--turns 5]
                                 [--new-tokens 96] [--threads 0] [--old-commit afa7b6f] [--skip-old]

Both sides run `rollout` on the bundled SmolLM2-135M-Instruct (fp32) with the same seeds and a
generator seeded alike, one after the other in this process. "old" is the rollout package as
it was at `--old-commit` (default afa7b6f, before the fast backend: every turn re-prefills each
episode's whole history through the model's own forward), loaded from `git show` into a
temporary directory; "new" is the working tree (the model's forward over kv_rows, each episode's KV
cache kept across turns).
Sampling makes the two runs' texts differ slightly (1e-6 logit noise can move a draw), so
the report gives each side's sampled tokens and tokens/s beside the seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import envs
from ragen2 import models as model_lib
from ragen2.bench.machine import machine_info
from ragen2.metric_names import ROLLOUT
from ragen2.rollout import RolloutConfig, rollout

ROOT = Path(__file__).resolve().parents[1]  # the git checkout the old code is read from


def old_rollout_module(commit: str, workdir: Path):
    """ragen2/rollout/{generation,agent_loop}.py at `commit`, importable as standalone modules."""
    names = {"generation": "old_generation", "agent_loop": "old_agent_loop"}
    for name, alias in names.items():  # generation first: agent_loop imports it
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:ragen2/rollout/{name}.py"],
                                check=True, capture_output=True, text=True).stdout
        source = source.replace("from ragen2.rollout.generation import", "from old_generation import")
        (workdir / f"{alias}.py").write_text(source)
        spec = importlib.util.spec_from_file_location(alias, workdir / f"{alias}.py")
        module = importlib.util.module_from_spec(spec)
        # registered before it runs: dataclasses look their module up here, and `from old_generation
        # import` finds it here without the folder on sys.path
        sys.modules[alias] = module
        spec.loader.exec_module(module)
    return module


def timed_rollout(fn, config_cls, model, tokenizer, args) -> dict:
    config = config_cls(group_size=args.group_size, max_turns=args.turns, max_new_tokens=args.new_tokens,
                        temperature=1.0)
    seeds = list(range(100, 100 + args.groups))
    started = time.perf_counter()
    batch = fn(model, tokenizer, lambda: envs.make(args.env), seeds, config, torch.Generator().manual_seed(0))
    seconds = time.perf_counter() - started
    tokens = batch.num_response_tokens
    return {"seconds": round(seconds, 2), "sampled_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
            "turns_mean": round(batch.metrics()[ROLLOUT + "turns_mean"], 2),
            "row_tokens_max": int(batch.attention_mask.sum(-1).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--old-commit", default="afa7b6f", help="a commit from before the fast backend and per-episode KV caches")
    parser.add_argument("--skip-old", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = model_lib.load_policy("bundled").eval(), model_lib.load_tokenizer("bundled")
    report = {"model": "SmolLM2-135M-Instruct (bundled, fp32)",
              "env": args.env, "groups_x_size": f"{args.groups}x{args.group_size}", "max_turns": args.turns,
              "max_new_tokens": args.new_tokens, "load_avg_at_start": os.getloadavg()[0]}
    report["new"] = timed_rollout(rollout, RolloutConfig, model, tokenizer, args)
    print(f"new: {report['new']}", file=sys.stderr, flush=True)
    if not args.skip_old:
        with tempfile.TemporaryDirectory() as workdir:
            old = old_rollout_module(args.old_commit, Path(workdir))
            report["old"] = timed_rollout(old.rollout, old.RolloutConfig, model, tokenizer, args)
        print(f"old: {report['old']}", file=sys.stderr, flush=True)
        report["speedup"] = round(report["old"]["seconds"] / report["new"]["seconds"], 2)
        report["speedup_tokens_per_s"] = round(report["new"]["tokens_per_s"] / report["old"]["tokens_per_s"], 2)
        report["target_speedup"] = 3.0
    report["load_avg_at_end"] = os.getloadavg()[0]
    report["machine"] = machine_info()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
