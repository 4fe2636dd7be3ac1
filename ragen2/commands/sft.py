"""`ragen2 sft --demos FILE.jsonl`: a supervised warm start on expert demonstrations.

    ragen2 demos --env frozen_lake --reasoning grounded --episodes 256 --out demos.jsonl
    ragen2 sft --demos demos.jsonl --steps 60           # -> runs/NAME (checkpoints, metrics, RUN/model)
    ragen2 train --env frozen_lake --model runs/NAME    # RL from the warm start

The config is `ragen2 train`'s (the demos' env preset, their env settings, `sft.*` for the SFT
itself: `--explain sft` lists them), so validation meets the instances a later `ragen2 train`
validates on. A bad demos file (empty, other roles, no assistant turn, another env's text) exits 2
with one line before any model loads. The engine is ragen2/engines/local/sft.py.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from ragen2.commands import COMMANDS


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "sft", help=COMMANDS["sft"],
        description="Fine-tune on the assistant tokens of every demo turn (exactly what an RL update of that "
                    "trajectory trains). The run directory is a model: --model RUN in train, eval and audit.")
    parser.add_argument("--demos", help="a JSONL file written by `ragen2 demos`")
    parser.add_argument("--model", help="'bundled' (SmolLM2-135M-Instruct, the default), a hub id or a local path")
    parser.add_argument("--out", help="parent folder for the run directory (default runs/)")
    parser.add_argument("--steps", type=int, help="optimiser steps (sft.steps)")
    parser.add_argument("--seed", type=int, help="trainer seed: the row order and validation instances")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue an SFT run from its latest checkpoint")
    parser.add_argument("--explain", metavar="KEY", help="print a config key's meaning (e.g. sft, sft.lr) and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted config overrides: sft.lr=1e-4 sft.batch_episodes=16 model.lora_rank=16 …")
    parser.set_defaults(run=run)


def compose(args, demos: list[dict]):
    """The config: the demos' env preset and settings, then the flags and overrides."""
    from ragen2.config import ConfigError, load_config

    env = demos[0]["env"]
    overrides = [f"env.overrides.{key}={_yaml(value)}" for key, value in (demos[0].get("env_args") or {}).items()]
    rules = demos[0].get("rollout") or {}  # the turn rules the demos were rendered under: validation uses them
    overrides += [f"rollout.{key}={_yaml(rules[key])}" for key in ("max_turns", "max_response_words") if key in rules]
    overrides.append(f"sft.demos={Path(args.demos).resolve()}")
    flags = {"model.name": args.model, "trainer.out": args.out, "trainer.seed": args.seed, "sft.steps": args.steps}
    overrides += [f"{key}={value}" for key, value in flags.items() if value is not None]
    overrides += list(args.overrides)
    try:
        cfg = load_config(env=env, overrides=overrides)
    except ConfigError:
        cfg = load_config(overrides=[f"env.name={env}", *overrides])
    if cfg.algo.uses_critic or cfg.algo.kl_coef > 0:
        raise ConfigError("ragen2 sft trains the policy alone: algo settings with a critic or a KL term do not apply")
    return cfg


def _yaml(value) -> str:
    import json

    return json.dumps(value) if isinstance(value, (list, dict, bool)) or value is None else str(value)


def run_directory(cfg) -> Path:
    env = cfg.env.name.rpartition(":")[2]
    return Path(cfg.trainer.out) / (cfg.trainer.run_name or f"{time.strftime('%Y%m%d-%H%M%S')}-sft-{env}-s{cfg.trainer.seed}")


def train_command(cfg, run_dir: Path) -> str:
    """`ragen2 train` on the warm start, with the env settings and turn rules the demos had."""
    import shlex

    preset = load_preset_env(cfg.env.name)
    parts = ["ragen2", "train", "--env", cfg.env.name, "--model", str(run_dir)]
    for key, value in cfg.env.overrides.items():
        if preset.get("overrides", {}).get(key) != value and not (key == "require_think" and value is True):
            parts += ["--env-arg", f"{key}={_yaml(value).lower() if isinstance(value, bool) else _yaml(value)}"]
    return shlex.join(parts)


def load_preset_env(name: str) -> dict:
    from ragen2.config import ConfigError, load_config

    try:
        return {"overrides": dict(load_config(env=name).env.overrides)}
    except ConfigError:
        return {"overrides": {}}


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run(args) -> int:
    from ragen2.config import ConfigError, saved_config
    from ragen2.demos import DemosError, read_demos
    from ragen2.run_dir import CONFIG_FILE, has_run

    if args.explain:
        from ragen2.commands.train import _explain

        return _explain(args.explain)
    try:
        if args.resume:
            run_dir = Path(args.resume)
            if not (run_dir / CONFIG_FILE).is_file():
                raise ConfigError(f"--resume {run_dir}: no {CONFIG_FILE} there (is it an SFT run directory?)")
            cfg = saved_config(run_dir / CONFIG_FILE, list(args.overrides))
            demos = read_demos(cfg.sft.demos)
        else:
            if not args.demos:
                raise ConfigError("--demos FILE is required (write one with `ragen2 demos --env ENV --out FILE`)")
            demos = read_demos(args.demos)
            cfg = compose(args, demos)
            run_dir = run_directory(cfg)
            if has_run(run_dir):
                raise ConfigError(f"{run_dir} already holds a run; continue it with --resume {run_dir}")
        if cfg.sft.max_demos:
            demos = demos[:cfg.sft.max_demos]
        from ragen2.commands.train import preflight

        preflight(cfg, run_dir, resume=bool(args.resume))
    except (ConfigError, DemosError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from ragen2.engines.local import sft  # the engine this command runs, as `train` runs the trainer
    from ragen2.models import ModelSourceError

    print(f"run directory: {run_dir}\nSFT on {len(demos)} demos of {cfg.env.name} {dict(cfg.env.overrides)} | "
          f"{cfg.sft.steps} steps x {cfg.sft.batch_episodes} episodes | lr {cfg.sft.lr} | model {cfg.model.name}",
          file=sys.stderr)
    try:
        run = sft.setup(cfg, demos, run_dir, resume=bool(args.resume), quiet=args.quiet)
    except (ModelSourceError, DemosError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    summary = sft.train(run, quiet=args.quiet)
    if summary.get("interrupted"):
        print(summary["message"], file=sys.stderr)
        return 130
    summary["demos_sha256"] = file_digest(cfg.sft.demos)
    from ragen2.run_dir import write_summary

    write_summary(run_dir, summary)
    success = summary.get("val_success_rate")
    print(f"done: {run_dir} | loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f} | val success "
          f"{success if success is None else round(success, 3)} | {summary['wall_s'] / 60:.1f} min\n"
          f"next: {train_command(cfg, run_dir)}", file=sys.stderr)
    return 0
