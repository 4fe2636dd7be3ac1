"""Where a supervised warm start puts the bundled model on a multi-turn env: success, groups with
reward spread and valid actions against SFT steps, beside a random valid-action policy.

    python scripts/warm_start_calibration.py --env frozen_lake --reasoning none
    python scripts/warm_start_calibration.py --env sokoban --reasoning grounded --steps 45 --val-every 15

Each setting runs the two commands a user runs (`ragen2 demos`, then `ragen2 sft` with validation on
trainer.val_groups x rollout.group_size episodes every --val-every steps and a checkpoint there) and
merges one object into --json (key `results`, one per env x reasoning). Its `calibrated` entry is the
first validated step whose success lies in [0.2, 0.7] with at least 30% of groups showing spread,
within the 15-minute SFT budget; the `warm_start_command` there rebuilds that model bit for bit (the
learning rate is constant after the warm-up, so the first N steps of a longer run are an N-step run).
The random baseline plays uniformly random valid actions (max_actions_per_turn a turn) on the same
validation instances and rollout indices. A PNG of success against SFT steps per env is written beside.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import envs
from envs.parsing import format_response
from ragen2 import metric_names as names
from ragen2.bench.machine import machine_info
from ragen2.config import saved_config
from ragen2.engines.local.sft import weights_digest
from ragen2.rollout.agent_loop import spread_share, valid_action_share
from ragen2.rollout.batch import TrajectoryRecord
from ragen2.run_dir import read_steps
from ragen2.seeding import validation_seeds

BUDGET_S = 15 * 60  # the warm-start budget on 2 cores
SUCCESS_RANGE, MIN_SPREAD = (0.2, 0.7), 0.3


def run(command: list[str]) -> None:
    print("$ " + shlex.join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def random_policy(run_dir: Path, seed: int = 0) -> dict:
    """Uniformly random valid actions on the run's validation instances (group members = rollout indices)."""
    cfg = saved_config(run_dir / "config.yaml", [])
    entry = envs.spec(cfg.env.name)
    env_config = entry.make_config(**cfg.env.overrides)
    rng = np.random.default_rng(seed)
    trajectories = []
    for g, instance in enumerate(validation_seeds(cfg)):
        for member in range(cfg.rollout.group_size):
            env = entry.env_cls(env_config)
            env.reset(seed=instance, options={"rollout_index": member})
            record = TrajectoryRecord(group=g, member=member, seed=instance)
            for _ in range(cfg.rollout.max_turns):
                count = int(rng.integers(1, env.config.max_actions_per_turn + 1))
                actions = [env.sample_action(rng) for _ in range(count)]
                think = "" if env.config.require_think else None
                _, reward, terminated, truncated, info = env.step(format_response(actions, think=think))
                record.turn_rewards.append(float(reward))
                record.actions.append({"executed": info["actions_executed"], "num_invalid": info["parse"]["num_invalid"]})
                record.success = bool(info["success"])
                if terminated or truncated:
                    break
            trajectories.append(record)
    return {"success": float(np.mean([t.success for t in trajectories])), "spread_share": spread_share(trajectories),
            "valid_action_share": valid_action_share(trajectories), "episodes": len(trajectories)}


def curve(run_dir: Path) -> list[dict]:
    points, seconds = [], 0.0
    for row in read_steps(run_dir):
        seconds += row.get(names.TIME_STEP_S, 0.0)
        if names.VAL_SUCCESS_RATE in row:
            points.append({"sft_steps": row["step"] + 1, "sft_seconds": round(seconds, 1),
                           "success": row[names.VAL_SUCCESS_RATE], "spread_share": row.get(names.VAL_SPREAD_SHARE),
                           "valid_action_share": row.get(names.VAL_VALID_ACTION_SHARE),
                           "episodes": int(row[names.VAL_NUM_GROUPS]) * 4, "loss": row.get("sft/loss"),
                           "validation_seconds": row.get(names.TIME_VALIDATION_S)})
    return points


def in_range(point: dict) -> bool:
    return (SUCCESS_RANGE[0] <= point["success"] <= SUCCESS_RANGE[1] and (point["spread_share"] or 0) >= MIN_SPREAD
            and point["sft_seconds"] <= BUDGET_S)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_names = sorted({r["env"] for r in results})
    fig, axes = plt.subplots(1, len(env_names), figsize=(5 * len(env_names), 3.6), squeeze=False)
    for ax, env in zip(axes[0], env_names):
        for r in (r for r in results if r["env"] == env):
            xs = [p["sft_steps"] for p in r["curve"]]  # no step 0: the untrained model was not validated here
            ys = [p["success"] for p in r["curve"]]
            line, = ax.plot(xs, ys, marker="o", label=f"{r['reasoning']}")
            ax.axhline(r["random"]["success"], color=line.get_color(), linestyle=":", linewidth=1)
        ax.axhspan(*SUCCESS_RANGE, color="green", alpha=0.08, label="target 20-70%")
        ax.set_title(f"{env}: validation success after SFT")
        ax.set_xlabel("SFT steps")
        ax.set_xlim(0, None)
        ax.set_ylabel("success (dotted: random valid actions)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(path: Path) -> str:
    """The calibration as the markdown table docs/warm_start.md shows (`--table`)."""
    rows = ["| env | reasoning | SFT steps | SFT s | success | groups with spread | valid actions | episodes "
            "| random: success | random: spread | load avg | calibrated |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in json.loads(path.read_text())["results"]:
        rows.append(f"| {r['env']} | {r['reasoning']} | {r['sft_steps']} | {r['sft_seconds']} | {r['success']:.3f} | "
                    f"{r['spread_share']:.3f} | {r['valid_action_share']:.3f} | {r['episodes']} | "
                    f"{r['random']['success']:.3f} | {r['random']['spread_share']:.3f} | "
                    f"{r['cpu']['load_avg'][0]} | {'yes' if r['calibrated'] else 'no'} |")
    return "\n".join(rows)


def main() -> int:
    committed = Path("docs/benchmarks/warm_start_calibration.json")
    if sys.argv[1:] == ["--table"]:
        print(table(committed))
        return 0
    if sys.argv[1:] == ["--plot"]:  # redraw the PNG from the committed results
        plot(json.loads(committed.read_text())["results"], committed.with_suffix(".png"))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--reasoning", default="none", choices=("none", "grounded", "template"))
    parser.add_argument("--episodes", type=int, default=320, help="demos written")
    parser.add_argument("--demo-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=45)
    parser.add_argument("--val-every", type=int, default=15)
    parser.add_argument("--val-groups", type=int, default=32, help="x group_size 4 = validation episodes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sft-arg", action="append", default=[], help="extra KEY=VALUE for ragen2 sft")
    parser.add_argument("--root", type=Path, default=Path("runs/calibration"))
    parser.add_argument("--json", type=Path, default=Path("docs/benchmarks/warm_start_calibration.json"))
    args = parser.parse_args()

    name = f"{args.env}-{args.reasoning}"
    demos = args.root / f"{name}.jsonl"
    demos_cmd = ["ragen2", "demos", "--env", args.env, "--reasoning", args.reasoning, "--episodes",
                 str(args.episodes), "--seed", str(args.demo_seed), "--out", str(demos)]
    run_dir = args.root / name
    finished = (run_dir / "summary.json").is_file()  # then only the analysis runs again
    if not finished:
        run(demos_cmd)
    sft_args = ["trainer.val_before=false", f"trainer.val_groups={args.val_groups}",
                f"trainer.val_every={args.val_every}", f"trainer.save_every={args.val_every}", "trainer.keep_last=20",
                f"trainer.num_threads={args.threads}", *args.sft_arg]
    if not any(a.startswith("sft.padding_free=") for a in sft_args):  # named, so a rebuild runs the same passes
        sft_args.append("sft.padding_free=true")
    sft_cmd = ["ragen2", "sft", "--demos", str(demos), "--steps", str(args.steps), "--quiet",
               "trainer.out=" + str(args.root), "trainer.run_name=" + name, *sft_args]
    started = time.time()
    if not finished:
        run(sft_cmd)
    elif json.loads((run_dir / "summary.json").read_text())["steps"] < args.steps:
        # a longer curve: the run continues (constant learning rate after warm-up: one run, as if uninterrupted)
        run(["ragen2", "sft", "--resume", str(run_dir), f"sft.steps={args.steps}", "--quiet"])
    points = curve(run_dir)
    chosen = next((p for p in points if in_range(p)), None)
    result = {"env": args.env, "reasoning": args.reasoning, "demos": args.episodes, "demo_command": shlex.join(demos_cmd),
              "sft_command": shlex.join(sft_cmd), "curve": points, "random": random_policy(run_dir),
              "calibrated": chosen is not None, "wall_s": round(time.time() - started, 1),
              "cpu": machine_info(with_torch=True)}
    final = chosen or points[-1]
    result.update({k: final[k] for k in ("sft_steps", "sft_seconds", "success", "spread_share", "valid_action_share",
                                         "episodes")})
    policy = run_dir / "checkpoints" / f"step_{final['sft_steps']:06d}" / "policy" / "model.safetensors"
    result["checkpoint_sha256"] = weights_digest(policy) if policy.is_file() else None
    steps_flag = ["--steps", str(final["sft_steps"])]
    result["warm_start_command"] = shlex.join([*demos_cmd[:-1], str(demos)]) + " && " + shlex.join(
        [*sft_cmd[:4], *steps_flag, *sft_cmd[6:]])
    results = json.loads(args.json.read_text())["results"] if args.json.is_file() else []
    results = [r for r in results if (r["env"], r["reasoning"]) != (args.env, args.reasoning)] + [result]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"command": "python scripts/warm_start_calibration.py --env ENV --reasoning R",
                                     "results": results}, indent=1) + "\n")
    plot(results, args.json.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("env", "reasoning", "sft_steps", "success", "spread_share",
                                             "valid_action_share", "calibrated")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
