"""`ragen2 eval CKPT [--env NAME]`: a checkpoint (or any model) on held-out env variants.

CKPT is a checkpoint folder (`RUN/checkpoints/step_NNNNNN`), a run directory (its latest
checkpoint), or a model: a local Hugging Face folder, a hub id, or `bundled`. A checkpoint is
rebuilt the way its run built it (the run's config.yaml: base model, dtype, LoRA) and its
policy weights loaded on top; a model gets the env's training preset (configs/envs/NAME.yaml,
as `ragen2 train --env NAME`). Episodes are rolled out with the training rollout code
(ragen2.rollout), on instance seeds drawn from their own stream, apart from the training and
validation seeds, so "held out" holds for the instances as well as the variant. Without
`--env`, a checkpoint or run is evaluated on its run's own env and env settings; a model needs one.

Generalisation variants: bandit_rev (misleading arm names), bandit_test (held-out word pairs),
larger_sokoban, sokoban_different_grid_vocab; any registered env works (`ragen2 envs list`).

Standard errors are over instances (groups), not episodes: the G episodes of one instance
share its start and are not independent draws.

Bad arguments fail before torch and transformers load (seconds): the model, checkpoint and
rollout modules are imported inside the functions that need them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import time
from pathlib import Path

import envs
from ragen2.commands import COMMANDS
from ragen2.config import ConfigError, load_config, saved_config
from ragen2.presets import key_values
from ragen2.run_dir import CHECKPOINT_STATE_FILE, CHECKPOINTS_DIR, CONFIG_FILE, EVAL_DIR, POLICY_DIR, latest_checkpoint
from ragen2.seeding import eval_sampling_seed, eval_seeds


class EvalError(ValueError):
    pass


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help=COMMANDS["eval"],
        description="Success rate, pass@G and reward (± standard errors over instances) of a checkpoint, a run "
                    "directory's latest checkpoint, or a model, on an env such as bandit_rev, bandit_test, "
                    "larger_sokoban or sokoban_different_grid_vocab. Writes JSON.")
    parser.add_argument("target", metavar="CKPT",
                        help="checkpoint folder, run directory, model folder, hub id or 'bundled'")
    parser.add_argument("--env", help="env to evaluate on (ragen2 envs list; default: a run's own env, with its "
                                      "settings)")
    parser.add_argument("--episodes", type=int, default=64, help="episodes in all (rounded up to whole groups)")
    parser.add_argument("--group-size", type=int, help="episodes per instance, for pass@G (default: the run's)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the instances and the sampling")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default: the run's validation one)")
    parser.add_argument("--max-turns", type=int, help="default: the run's rollout.max_turns (a model: the env preset's)")
    parser.add_argument("--max-new-tokens", type=int, help="default: the run's rollout.max_new_tokens (a model: the env preset's)")
    parser.add_argument("--env-arg", "--env-override", dest="env_override", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="env config key (repeatable; as in train, audit, envs); the run's own env overrides "
                             "carry over where they fit")
    parser.add_argument("--device", help="cpu, cuda, cuda:N (default: the run's model.device)")
    parser.add_argument("--out", type=Path, help="JSON path (default RUN/eval/<checkpoint>-<env>.json, or "
                                                 "eval/<model>-<env>.json)")
    parser.set_defaults(run=run)


# --- what to load ----------------------------------------------------------------------------


def resolve_target(target: str, env: str | None = None):
    """(config, checkpoint folder or None, label) for a checkpoint, a run directory or a model.

    A checkpoint or run keeps its run's settings; a model takes `env`'s training preset
    (configs/envs: turns, token budget, think mode), as `ragen2 train --env` does, not base.yaml's
    single answer-only turn of 32 tokens."""

    path = Path(target)
    if path.is_dir():
        if (path / CHECKPOINT_STATE_FILE).is_file() and (path / POLICY_DIR).is_dir():
            run_dir = path.parent.parent
            return _run_config(run_dir, path), path, f"{run_dir.name}-{path.name}"
        if (path / CONFIG_FILE).is_file():
            latest = latest_checkpoint(path)
            if latest is None:
                raise EvalError(f"{path}: a run directory without a complete checkpoint in {path}/{CHECKPOINTS_DIR} "
                                f"(bench cells delete theirs when done unless the suite sets "
                                f"keep_final_checkpoint: true)")
            return _run_config(path, latest), latest, f"{path.name}-{latest.name}"
        if not (path / "config.json").is_file():
            raise EvalError(f"{path}: not a checkpoint (no {CHECKPOINT_STATE_FILE} + {POLICY_DIR}/), run directory "
                            f"(no {CONFIG_FILE}) or Hugging Face model folder (no config.json)")
    # A model: the env's training preset over the base config, this model.
    from ragen2.models import ModelSourceError, check_model_source  # transformers (see the module doc)

    try:
        check_model_source(target)
    except ModelSourceError as error:
        if path.is_absolute() or len(path.parts) > 1:
            raise EvalError(f"{target}: no such run directory, checkpoint or model folder") from None
        raise EvalError(str(error)) from None
    return load_config(env=env, overrides=[f"model.name={target}"]), None, re.sub(r"[^A-Za-z0-9_.+-]", "_",
                                                                         path.name or target)


def _run_config(run_dir: Path, checkpoint: Path):
    saved = run_dir / CONFIG_FILE
    if not saved.is_file():
        raise EvalError(f"{checkpoint}: its run directory {run_dir} has no {CONFIG_FILE}, so the base model is unknown")
    return saved_config(saved)


def env_overrides(cfg, env_name: str, extra: list[str]) -> dict:
    """The run's env overrides where the eval env accepts them (answer-only stays answer-only), plus `extra`."""
    entry = envs.spec(env_name)
    carried = {}
    for key, value in cfg.env.overrides.items():
        try:
            entry.make_config(**{key: value})
            carried[key] = value
        except (envs.EnvConfigError, TypeError):
            continue  # a key of the training env that this env does not have
    raw = key_values(extra, "--env-override", "--env-override size=6")
    overrides = {**carried, **envs.coerce_overrides(entry, raw)}
    entry.make_config(**overrides)  # fail here, naming the key, not mid-rollout
    return overrides


# --- statistics ------------------------------------------------------------------------------


def _mean_se(values: list[float]) -> dict:
    """Mean and its standard error (sample std / sqrt(n)); se is None for fewer than two values."""
    n = len(values)
    mean = sum(values) / n if n else None
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else None
    return {"mean": mean, "se": se, "n": n}


def episode_statistics(trajectories) -> dict:
    """Success, pass@G and reward over instances: each group's mean (or any-success) is one value."""
    groups: dict[int, list] = {}
    for t in trajectories:
        groups.setdefault(t.group, []).append(t)
    order = sorted(groups)
    success = [sum(t.success for t in groups[g]) / len(groups[g]) for g in order]
    passed = [float(any(t.success for t in groups[g])) for g in order]
    reward = [sum(t.reward for t in groups[g]) / len(groups[g]) for g in order]
    format_ok = [ok for t in trajectories for ok in t.format_ok]
    return {"success_rate": _mean_se(success), "pass_at_g": _mean_se(passed), "reward": _mean_se(reward),
            "format_ok_fraction": sum(format_ok) / len(format_ok) if format_ok else None,
            "episodes": len(trajectories), "instances": len(order)}


def evaluate_policy(policy, tokenizer, env_name: str, overrides: dict, rollout_cfg, num_groups: int,
                    seed: int) -> dict:
    import torch  # see the module doc

    from ragen2.rollout import rollout

    entry = envs.spec(env_name)
    env_config = entry.make_config(**overrides)
    seeds = eval_seeds(seed, num_groups)
    generator = torch.Generator().manual_seed(eval_sampling_seed(seed))
    batch = rollout(policy, tokenizer, lambda: entry.env_cls(env_config), seeds, rollout_cfg, generator)
    return {**episode_statistics(batch.trajectories), "instance_seeds": seeds}


# --- the command -----------------------------------------------------------------------------


def _fmt(stat: dict) -> str:
    if stat["mean"] is None:
        return "n/a"
    return f"{stat['mean']:.3f}" + ("" if stat["se"] is None else f" ± {stat['se']:.3f}")


def run(args) -> int:
    try:
        if args.episodes < 1 or (args.group_size is not None and args.group_size < 1):
            raise EvalError("--episodes and --group-size must be at least 1")
        cfg, checkpoint, label = resolve_target(args.target, args.env)
        if args.env is None:
            if checkpoint is None:
                raise EvalError(f"{args.target} is a model, not a run: name the env to evaluate on with --env "
                                f"(ragen2 envs list)")
            args.env = cfg.env.name  # the run's env; its overrides carry over below
        overrides = env_overrides(cfg, args.env, args.env_override)
        rollout_overrides = {"group_size": args.group_size, "max_turns": args.max_turns,
                             "max_new_tokens": args.max_new_tokens}
        cfg.rollout = dataclasses.replace(cfg.rollout, **{k: v for k, v in rollout_overrides.items() if v is not None})
        if args.device:
            cfg.model.device = args.device
    except (EvalError, ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from ragen2 import models as model_lib  # see the module doc

    group_size = cfg.rollout.group_size
    num_groups = math.ceil(args.episodes / group_size)
    temperature = cfg.trainer.val_temperature if args.temperature is None else args.temperature
    print(f"loading {cfg.model.name}" + (f" + weights of {checkpoint}" if checkpoint else "") + " …", file=sys.stderr)
    try:
        policy, tokenizer = model_lib.build_policy(cfg.model, model_lib.pick_device(cfg.model.device),
                                                   checkpoint / POLICY_DIR if checkpoint is not None else None)
    except (model_lib.ModelSourceError, model_lib.ModelWeightsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    stats = evaluate_policy(policy, tokenizer, args.env, overrides,
                            dataclasses.replace(cfg.rollout, temperature=temperature), num_groups, args.seed)
    result = {"target": args.target, "checkpoint": str(checkpoint) if checkpoint else None, "model": cfg.model.name,
              "env": args.env, "env_overrides": overrides, "group_size": group_size, "seed": args.seed,
              "temperature": temperature, "max_turns": cfg.rollout.max_turns,
              "max_new_tokens": cfg.rollout.max_new_tokens, "wall_s": round(time.perf_counter() - started, 1),
              **stats}
    env_label = re.sub(r"[^A-Za-z0-9_.+-]", "_", args.env.rpartition(":")[2])  # module:Class -> Class
    out = args.out or ((checkpoint.parent.parent / EVAL_DIR if checkpoint else Path(EVAL_DIR))
                       / f"{label}-{env_label}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"{args.env}: {stats['episodes']} episodes on {stats['instances']} instances (G={group_size}), "
          f"T={temperature:g}\n"
          f"  success rate  {_fmt(stats['success_rate'])}\n"
          f"  pass@{group_size:<8} {_fmt(stats['pass_at_g'])}\n"
          f"  reward        {_fmt(stats['reward'])}\n"
          f"  (± standard error over instances)\n"
          f"wrote {out}")
    return 0
