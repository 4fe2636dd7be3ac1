"""Does training move the bundled model? PPO and GRPO on Bandit (answer-only); prints JSON.

    python scripts/learning_check.py [--algos ppo grpo] [--steps 10] [--lr 2e-5] [--threads 1] [KEY=VALUE ...]

Each algo trains SmolLM2-135M-Instruct (bundled) from the same start with `trainer.setup` /
`trainer.train` on configs/base.yaml + the algo preset, filter none (every group trains), and
the flags below. Bandit success = pulling the high-risk arm, the one with the higher expected
payoff (0.25 vs 0.1), so the success rate IS the high-risk-arm choice rate; the safe-arm and
invalid-answer rates are counted beside it from each step's trajectories (reward 0.1 = safe arm,
the -0.1 format penalty = no valid arm named).

Printed per algo: the per-step series (reward mean, success = high-risk rate, safe rate, invalid
rate), their first-k and last-k means and least-squares slope per step, and validation
(`trainer.validate`: trainer.val_groups x G episodes at trainer.val_temperature, the same
instances and sampling seed every time) before the first step, every --val-every steps and
after the last. `rose` says whether the last-k mean beat the first-k mean and validation after
beat validation before; the binomial standard errors are printed so a rise can be read against
the noise. A run directory that already holds a finished run with the same config is read, not
re-run (delete it to train again).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import time
from pathlib import Path

import torch

from ragen2 import metric_names as names
from ragen2.engines.local import trainer
from ragen2.bench.machine import machine_info
from ragen2.config import load_config
from ragen2.run_dir import CONFIG_FILE, SUMMARY_FILE, read_metrics, read_summary

SAFE_PAYOFF, FORMAT_PENALTY = 0.1, -0.1  # Bandit's defaults (envs/bandit.py, envs/base.py)
ARMS_FILE, VAL_BEFORE_FILE = "arms.jsonl", "val_before.json"


def record_arms(run_dir: Path, run: trainer.Run):
    """A `trainer.train(on_step=...)` callback: appends each training step's arm counts (its rollout
    batch; validation's episodes are not in it) to arms.jsonl."""
    def record(result: trainer.StepResult) -> None:
        trajs = result.batch.trajectories
        invalid = sum(1 for t in trajs if not t.success and math.isclose(t.reward, FORMAT_PENALTY))
        safe = sum(1 for t in trajs if not t.success and math.isclose(t.reward, SAFE_PAYOFF))
        line = {"step": run.state.step, "n": len(trajs), "high_risk": sum(t.success for t in trajs), "safe": safe,
                "invalid": invalid}
        with (run_dir / ARMS_FILE).open("a") as f:
            f.write(json.dumps(line) + "\n")

    return record


def train_one(cfg, run_dir: Path) -> float:
    """Train from scratch (validation first); returns wall seconds."""
    if run_dir.exists():
        shutil.rmtree(run_dir)  # an unfinished run: start over (checkpoints are only written at the end)
    started = time.time()
    run = trainer.setup(cfg, run_dir, quiet=True)
    before = trainer.validate(run)
    (run_dir / VAL_BEFORE_FILE).write_text(json.dumps(before))
    trainer.train(run, on_step=record_arms(run_dir, run))
    return time.time() - started


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def slope(values) -> float | None:
    """Least-squares change per step."""
    n = len(values)
    if n < 2:
        return None
    x_mean, y_mean = (n - 1) / 2, sum(values) / n
    return sum((i - x_mean) * (v - y_mean) for i, v in enumerate(values)) / sum((i - x_mean) ** 2 for i in range(n))


def binomial_se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


def summarise_run(run_dir: Path, k: int, wall_s: float | None, val_n: int) -> dict:
    rows = read_metrics(run_dir)
    arms = {a["step"]: a for a in map(json.loads, (run_dir / ARMS_FILE).read_text().splitlines())}
    before = json.loads((run_dir / VAL_BEFORE_FILE).read_text())
    summary = read_summary(run_dir)
    series = {
        "reward_mean": [r[names.ROLLOUT_REWARD_MEAN] for r in rows],
        "success_rate": [r[names.ROLLOUT_SUCCESS_RATE] for r in rows],
        "high_risk_rate": [arms[r["step"]]["high_risk"] / arms[r["step"]]["n"] for r in rows],
        "safe_rate": [arms[r["step"]]["safe"] / arms[r["step"]]["n"] for r in rows],
        "invalid_rate": [arms[r["step"]]["invalid"] / arms[r["step"]]["n"] for r in rows],
        "response_tokens_mean": [r[names.ROLLOUT_RESPONSE_TOKENS_MEAN] for r in rows],
    }
    trend = {name: {"first_k": mean(v[:k]), "last_k": mean(v[-k:]), "slope_per_step": slope(v)}
             for name, v in series.items()}
    n_train = arms[rows[0]["step"]]["n"]
    val_rows = [{"after_step": r["step"] + 1, "success_rate": r[names.VAL_SUCCESS_RATE],
                 "reward_mean": r[names.VAL_REWARD_MEAN], "format_ok_fraction": r[names.VAL_FORMAT_OK_FRACTION]}
                for r in rows if names.VAL_SUCCESS_RATE in r]
    val_before = {"after_step": 0, "success_rate": before[names.VAL_SUCCESS_RATE],
                  "reward_mean": before[names.VAL_REWARD_MEAN], "format_ok_fraction": before[names.VAL_FORMAT_OK_FRACTION]}
    after = val_rows[-1]
    return {
        "run_dir": str(run_dir),
        "wall_s": round(wall_s, 1) if wall_s is not None else summary.get("wall_s_this_session"),
        "steps": len(rows), "episodes_per_step": n_train,
        "seconds_per_step_mean": round(mean([r[names.TIME_STEP_S] for r in rows]), 1),
        "series": {name: [round(x, 4) for x in v] for name, v in series.items()},
        "trend": trend,
        "trend_k": k,
        "success_se_first_k": binomial_se(trend["success_rate"]["first_k"], k * n_train),
        "validation": [val_before, *val_rows],
        "validation_episodes": val_n,
        "validation_success_se_before": binomial_se(val_before["success_rate"], val_n),
        "rose": {
            "reward_last_k_above_first_k": trend["reward_mean"]["last_k"] > trend["reward_mean"]["first_k"],
            "success_last_k_above_first_k": trend["success_rate"]["last_k"] > trend["success_rate"]["first_k"],
            "val_success_after_above_before": after["success_rate"] > val_before["success_rate"],
            "val_reward_after_above_before": after["reward_mean"] > val_before["reward_mean"],
        },
    }


def dumps(obj) -> str:
    """Indented JSON with lists of plain values kept on one line."""
    text = json.dumps(obj, indent=1)
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=["ppo", "grpo"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--num-groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-5, help="actor learning rate")
    parser.add_argument("--mini-batch", type=int, default=4, help="trajectories per optimiser step")
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--val-groups", type=int, default=8)
    parser.add_argument("--first-k", type=int, default=3, help="steps averaged at each end of the series")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 is faster on a loaded machine)")
    parser.add_argument("--out", default="runs/learning_check")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="more config overrides")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    results = {}
    for algo in args.algos:
        overrides = [f"trainer.total_steps={args.steps}", f"rollout.num_groups={args.num_groups}",
                     f"rollout.group_size={args.group_size}", f"rollout.max_new_tokens={args.max_new_tokens}",
                     f"optim.actor_lr={args.lr}", f"optim.mini_batch_size={args.mini_batch}",
                     f"optim.micro_batch_size={min(4, args.mini_batch)}", f"trainer.val_every={args.val_every}",
                     f"trainer.val_groups={args.val_groups}", f"trainer.seed={args.seed}", "probe.every=0",
                     f"trainer.run_name={algo}", f"trainer.out={args.out}", *args.overrides]
        cfg = load_config(algo=algo, filter="none", overrides=overrides)
        run_dir = Path(args.out) / algo
        saved = run_dir / CONFIG_FILE
        done = (run_dir / SUMMARY_FILE).exists() and saved.exists() and saved.read_text() == cfg.to_yaml()
        wall = None if done else train_one(cfg, run_dir)
        results[algo] = summarise_run(run_dir, args.first_k, wall, cfg.trainer.val_groups * cfg.rollout.group_size)
        results[algo]["config"] = {"algo": cfg.algo.name, "advantage": cfg.algo.advantage,
                                   "kl_coef": cfg.algo.kl_coef, "actor_lr": cfg.optim.actor_lr,
                                   "critic_lr": cfg.optim.critic_lr if cfg.algo.uses_critic else None,
                                   "groups_x_size": [cfg.rollout.num_groups, cfg.rollout.group_size],
                                   "max_new_tokens": cfg.rollout.max_new_tokens,
                                   "mini_batch_size": cfg.optim.mini_batch_size, "steps": cfg.trainer.total_steps,
                                   "val_temperature": cfg.trainer.val_temperature, "reused": done}
        print(f"{algo}: done ({results[algo]['wall_s']} s)", file=sys.stderr)
    print(dumps({"machine": machine_info(), "env": "bandit (answer-only, configs/base.yaml)", "runs": results}))


if __name__ == "__main__":
    main()
