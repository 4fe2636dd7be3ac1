"""`ragen2 train`: compose the config, fail fast on bad input, train, print where results are.

Bad input fails before torch and transformers load (seconds): the trainer, the model checks and
the checkpoints are imported inside the functions that need them, once the config is known good.

From Python, `ragen2.train` (here: `train`) does the same with a config from `ragen2.load_config`:

    import ragen2
    cfg = ragen2.load_config(env="mypkg.envs:MyEnv", algo="grpo", overrides=["trainer.total_steps=20"])
    summary = ragen2.train(cfg)          # the run directory, metrics and summary as the CLI writes them
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path


from ragen2.commands import COMMANDS
from ragen2.config import ConfigError, load_config, saved_config
from ragen2.presets import key_value, key_values
from ragen2.engines.openrlhf import launch as openrlhf_launch
from ragen2.run_dir import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, RunDirectoryGone, has_run

GROUP_KEYS = ("env", "algo", "filter")  # `env=frozen_lake` picks a preset; `env.name=…` sets a key


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help=COMMANDS["train"],
        description="Train with StarPO rollouts and PPO/GRPO. Overrides: KEY=VALUE, e.g. "
                    "env=frozen_lake algo=grpo trainer.total_steps=50 rollout.group_size=8")
    parser.add_argument("--env", help="an env of `ragen2 envs list` (its preset in configs/envs, or its family's), or "
                                      "module.path:Class for an env of your own (default: base.yaml's env)")
    parser.add_argument("--algo", help="algo preset in configs/algos: ppo, grpo, dr-grpo, dapo, starpo, starpo-s, …")
    parser.add_argument("--filter", help="filter preset in snr/presets: none, starpo-s, snr-top-p, ragen2-main, …")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="env config key, repeatable (as in eval, audit, envs): --env-arg dim_x=8 is "
                             "env.overrides.dim_x=8")
    parser.add_argument("--config", action="append", default=[], metavar="YAML",
                        help="extra YAML merged after the presets: a file, or a bundled config's name "
                             "(paper/ragen2-main, paper/starpo-s); repeatable")
    parser.add_argument("--explain", metavar="KEY",
                        help="print a config key's type, default and meaning (or a section's keys) and exit; "
                             "every key: docs/config.md")
    parser.add_argument("--model", help="'bundled' (SmolLM2-135M-Instruct), a hub id or a local path")
    parser.add_argument("--out", help="parent folder for run directories (default runs/)")
    parser.add_argument("--seed", type=int, help="trainer seed")
    parser.add_argument("--steps", type=int, help="total training steps")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    parser.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    parser.add_argument("--show-completions", action="store_true",
                        help="print the step's recorded trajectories (trainer.log_completions) under each step "
                             "line: trainer.print_completions=true")
    parser.add_argument("--engine", choices=("local", "openrlhf"), default="local",
                        help="local: this process (CPU or one GPU); openrlhf: OpenRLHF 0.11.2 on a Ray cluster "
                             "(docs/distributed.md)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check everything, print the resolved config and what would run, train nothing "
                             "(--engine openrlhf: also write the run's files and print the exact command)")
    openrlhf_launch.add_arguments(parser)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    parser.set_defaults(run=run)


def compose(args):
    """Build and validate the config (before any model loads); returns (config, run_dir, resume)."""
    presets = {key: getattr(args, key) for key in GROUP_KEYS}
    overrides = []
    for item in args.overrides:  # `env=sokoban` picks a preset as --env does; the rest are dotted overrides
        key, value = key_value(item)
        if key in GROUP_KEYS:
            presets[key] = value
        else:
            overrides.append(item)
    for key, value in key_values(getattr(args, "env_arg", []), "--env-arg", "--env-arg dim_x=8").items():
        overrides.append(f"env.overrides.{key}={value}")
    flags = {"model.name": args.model, "trainer.out": args.out, "trainer.seed": args.seed,
             "trainer.total_steps": args.steps,
             "trainer.print_completions": True if getattr(args, "show_completions", False) else None}
    overrides += [f"{key}={value}" for key, value in flags.items() if value is not None]

    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / CONFIG_FILE).is_file():
            raise ConfigError(f"--resume {run_dir}: no {CONFIG_FILE} there (is it a run directory?)")
        if any(presets.values()) or args.config:
            raise ConfigError("--resume continues a run with its saved config; presets cannot change")
        cfg = saved_config(run_dir / CONFIG_FILE, overrides)
        _check_resumable(run_dir, cfg)
        return cfg, run_dir, True

    cfg = load_config(env=presets["env"], algo=presets["algo"], filter=presets["filter"], overrides=overrides,
                      extra=list(args.config))
    return cfg, run_directory(cfg), False


def run_directory(cfg) -> Path:
    """trainer.out / trainer.run_name, or a name made of the time, env, algo, filter and seed."""
    env = re.sub(r"[^A-Za-z0-9_.+-]", "_", cfg.env.name.rpartition(":")[2])  # module:Class -> Class
    name = cfg.trainer.run_name or (
        f"{time.strftime('%Y%m%d-%H%M%S')}-{env}-{cfg.algo.name}-{cfg.filter_preset}-s{cfg.trainer.seed}")
    return Path(cfg.trainer.out) / name


class AlreadyFinished(ConfigError):
    """--resume of a run that has done all its steps: nothing to train, and how to extend it."""


def _check_resumable(run_dir: Path, cfg) -> None:
    from ragen2.engines.local import checkpoint as ckpt  # torch (see the module doc)

    done = ckpt.complete_checkpoints(run_dir)
    if not done:
        raise ConfigError(f"--resume {run_dir}: no complete checkpoint there, nothing to resume from (the run "
                          f"stopped before its first save); start it again without --resume")
    try:
        step = ckpt.read_state(done[0])["step"]
    except ckpt.CheckpointDamaged:
        return  # the trainer falls back to an older one and says so
    if step >= cfg.trainer.total_steps:
        raise AlreadyFinished(f"{run_dir} already finished its {cfg.trainer.total_steps} steps; to train further: "
                              f"ragen2 train --resume {run_dir} trainer.total_steps={step + cfg.trainer.total_steps}")


def preflight(cfg, run_dir: Path, resume: bool, dry_run: bool = False) -> None:
    """What would otherwise fail after the model loads (or leave a half-made run directory)."""
    device = cfg.model.device
    if device.startswith("cuda"):
        import torch  # see the module doc

        if not torch.cuda.is_available():
            raise ConfigError(f"model.device={device}: no CUDA device here (torch {torch.__version__}); "
                              "use model.device=cpu or auto")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"model.device={device}: only {torch.cuda.device_count()} CUDA device(s) here")
    from ragen2.models import ModelSourceError, check_model_source  # transformers (see the module doc)

    try:
        check_model_source(cfg.model.name)
    except ModelSourceError as error:
        raise ConfigError(f"model.name: {error}") from None
    parent = run_dir if resume else run_dir.parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"trainer.out: cannot write into {existing}")
    if not dry_run:  # root passes os.access everywhere; only making the folder tells (e.g. under /proc)
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"trainer.out: cannot create {parent}: {error.strerror or error}") from None
    if not resume and has_run(run_dir):
        raise ConfigError(f"{run_dir} already holds a run; continue it with --resume {run_dir}, "
                          "or pick another trainer.run_name")


def warm_start_note(cfg) -> str | None:
    """A note when `--model` is a `ragen2 sft` run fine-tuned on other env settings than this run's
    (think mode after answer-only demos, another env): its warm start then barely applies."""
    import envs

    folder = Path(cfg.model.name).expanduser()
    if not ((folder / "model" / "config.json").is_file() and (folder / CONFIG_FILE).is_file()):
        return None
    try:
        tuned = saved_config(folder / CONFIG_FILE, [])
        ours = envs.spec(cfg.env.name).make_config(**cfg.env.overrides)
        theirs = envs.spec(tuned.env.name).make_config(**tuned.env.overrides)
    except (ConfigError, envs.EnvConfigError, OSError):
        return None
    if tuned.env.name == cfg.env.name and ours == theirs:
        return None
    return (f"note: {folder} was fine-tuned on {tuned.env.name} {dict(tuned.env.overrides)}, this run trains "
            f"{cfg.env.name} {dict(cfg.env.overrides)}; pass the same --env-arg settings to start where it left off")


# Multi-turn games the bundled model never wins from scratch (docs/evidence.md): RL there starts from
# a supervised warm start (docs/warm_start.md)
COLD_START_ENVS = ("frozen_lake", "frozen_lake_coord", "sokoban", "larger_sokoban", "sokoban_coord",
                   "sokoban_different_grid_vocab")


def cold_start_note(cfg) -> str | None:
    """For the bundled model on a multi-turn game: how to warm-start it first."""
    import envs
    from ragen2.models import BUNDLED_NAMES

    if cfg.model.name.strip().lower() not in BUNDLED_NAMES:
        return None
    try:
        name = envs.spec(cfg.env.name).name
    except envs.EnvConfigError:
        return None
    if name not in COLD_START_ENVS:
        return None
    return (f"note: the bundled model alone never wins {name} (every group flat, nothing to learn: docs/evidence.md); "
            f"warm-start it first: ragen2 demos --env {name} --out demos.jsonl && ragen2 sft --demos demos.jsonl "
            f"trainer.run_name=warm, then --model runs/warm (docs/warm_start.md)")


def _print_plan(cfg, run_dir: Path, resume: bool) -> None:
    print(f"run directory: {run_dir}" + (" (resume)" if resume else ""), file=sys.stderr)
    for note in (warm_start_note(cfg), cold_start_note(cfg)):
        if note:
            print(note, file=sys.stderr)
    print(f"env {cfg.env.name} | algo {cfg.algo.name} ({cfg.algo.advantage} advantage) | filter {cfg.filter_preset} | "
          f"{cfg.rollout.num_groups} groups x {cfg.rollout.group_size}, up to {cfg.rollout.max_turns} turn(s) of "
          f"{cfg.rollout.max_new_tokens} tokens | {cfg.trainer.total_steps} steps | model {cfg.model.name} "
          f"({cfg.model.dtype}, {cfg.model.device})", file=sys.stderr)
    sampled = cfg.rollout.num_groups * cfg.rollout.group_size * cfg.rollout.max_turns * cfg.rollout.max_new_tokens
    if sampled > CPU_NOTE_TOKENS and _on_cpu(cfg.model.device):
        print(f"note: a step samples up to {sampled} tokens (groups x G x turns x tokens), trains on them and "
              f"validates: expect minutes a step on a CPU (model.device=cuda on a GPU)", file=sys.stderr)


CPU_NOTE_TOKENS = 1500  # above this a CPU step takes minutes (the default Bandit job samples 512)


def _on_cpu(device: str) -> bool:
    if device != "auto":
        return device == "cpu"
    import torch  # loaded by preflight already

    return not (torch.cuda.is_available() or torch.backends.mps.is_available())


def train(config=None, *, run_dir: str | Path | None = None, quiet: bool = True, **compose) -> dict:
    """Train with the local engine and return the run's summary (also in RUN_DIR/summary.json).

    `config` is a `ragen2.config.Config` (from `ragen2.load_config`); without one, the keyword
    arguments of `load_config` build it (env=, algo=, filter=, overrides=[...], extra=[...]).
    `run_dir` defaults to trainer.out / trainer.run_name (or a name made of the time and the
    settings). Bad input raises `ConfigError` before any model loads, as the CLI fails.
    """
    if config is None:
        config = load_config(**compose)
    elif compose:
        raise TypeError(f"give a config or load_config's arguments, not both: {sorted(compose)}")
    run_dir = Path(run_dir) if run_dir is not None else run_directory(config)
    preflight(config, run_dir, resume=False)
    from ragen2.engines.local import trainer  # see the module doc

    run = trainer.setup(config, run_dir, quiet=quiet)
    return trainer.train(run)


def run(args) -> int:
    if getattr(args, "explain", None):
        return _explain(args.explain)
    engine = getattr(args, "engine", "local")
    if engine == "openrlhf" and args.resume:
        print("error: --resume is for the local engine; the OpenRLHF engine does not resume runs yet", file=sys.stderr)
        return 2
    try:
        cfg, run_dir, resume = compose(args)
        if engine == "local":
            preflight(cfg, run_dir, resume, dry_run=getattr(args, "dry_run", False))
    except AlreadyFinished as done:
        print(str(done), file=sys.stderr)
        return 0
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if engine == "openrlhf":
        return openrlhf_launch.run(cfg, run_dir, args)
    _print_plan(cfg, run_dir, resume)
    if getattr(args, "dry_run", False):
        print(cfg.to_yaml(), end="")
        print("dry run: the config is valid and nothing was written", file=sys.stderr)
        return 0
    from ragen2.engines.local import trainer  # see the module doc
    from ragen2.models import BUNDLED_NAMES, ModelSourceError

    bundled = cfg.model.name.strip().lower() in BUNDLED_NAMES
    first_run = " (the first run dequantises the bundled GGUF once, about a minute on 2 cores; later runs read the cache)"
    print("loading models" + (first_run if bundled else "") + " …", file=sys.stderr)
    try:
        run = trainer.setup(cfg, run_dir, resume=resume, quiet=args.quiet)
    except (ModelSourceError, trainer.ResumeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        summary = trainer.train(run)
    except RunDirectoryGone as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if summary.get("interrupted"):
        return _report_interrupt(summary)
    print_summary(summary)
    return 0


def _explain(key: str) -> int:
    from ragen2 import config_reference  # reads the config models' source: only when asked

    try:
        print(config_reference.explain(key))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def _report_interrupt(summary: dict) -> int:
    if summary["resume_command"]:
        print(f"\ninterrupted ({summary['interrupted']}) after step {summary['steps']}; checkpoint saved. "
              f"Continue with:\n  {summary['resume_command']}", file=sys.stderr)
    else:
        print(f"\ninterrupted ({summary['interrupted']}) before the first step finished: nothing to resume",
              file=sys.stderr)
    return 128 + int(getattr(signal, summary["interrupted"]))


def _fmt(value) -> str:
    return "n/a" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))


def _signed(value) -> str:
    return "n/a" if value is None else f"{value:+.3f}"


def headline(summary: dict) -> str:
    """The measure a run is judged by: validation success before → after training (paired: the
    same instances and sampling seeds), else the final one alone and how to get the baseline."""
    config = summary.get("config") or {}
    what = " ".join(p for p in (config.get("algo") and f"{config['algo']}",
                                config.get("env") and f"on {config['env']}") if p)
    after, before = summary.get("final_val_success_rate"), summary.get("val_before_success_rate")
    if before is not None and after is not None:
        measure = (f"validation success {_fmt(before)} → {_fmt(after)} ({_signed(summary.get('val_success_change'))}), "
                   f"untrained vs trained on the same instances")
    else:
        measure = (f"validation success {_fmt(after)} at the end (best {_fmt(summary.get('best_val_success_rate'))}); "
                   f"not measured before training (trainer.val_before=true would)")
    return f"  {what + ': ' if what else ''}{measure}"


def print_summary(summary: dict) -> None:
    run_dir = summary["run_dir"]
    lines = [
        "",
        f"results: {run_dir}",
        headline(summary),
        f"  steps {summary['steps']} (trained {summary['steps_trained']}, skipped {summary['steps_skipped']})"
        + (f", stopped: {summary['stop_reason']}" if summary["stop_reason"] else ""),
        # a training batch's reward carries the format penalty and the sampling temperature: context, not the verdict
        f"  training batches, first → last step: success {_fmt(summary['first_success_rate'])} → "
        f"{_fmt(summary['last_success_rate'])}, reward {_fmt(summary['first_reward_mean'])} → "
        f"{_fmt(summary['last_reward_mean'])} (one step's batch each: noisy)",
        f"  metrics  {run_dir}/{METRICS_FILE}   summary {run_dir}/{SUMMARY_FILE}   config {run_dir}/{CONFIG_FILE}",
        f"  plots: ragen2 plot {run_dir}   audit: ragen2 audit {run_dir}",
    ]
    print("\n".join(lines))
