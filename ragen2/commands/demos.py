"""`ragen2 demos --env ENV --episodes N --out FILE.jsonl`: expert trajectories for a warm start.

The env's expert (`envs/experts.py`) plays N episodes and each is written as the chat the policy
would see in a rollout of the env's training preset (`ragen2/demos.py`). No model loads: this takes
seconds. `ragen2 sft --demos FILE.jsonl` fine-tunes on them.
"""

from __future__ import annotations

import sys
import time

from ragen2.commands import COMMANDS

DEFAULT_EPISODES = 256


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demos", help=COMMANDS["demos"],
        description="Write expert episodes as chat JSONL (system/user/assistant), rendered with the turn protocol "
                    "of the env's training preset, for `ragen2 sft`, TRL's SFTTrainer or OpenRLHF's SFT.")
    parser.add_argument("--env", required=True, help="an env of `ragen2 envs list`, or module.path:Class")
    parser.add_argument("--episodes", type=int, default=DEFAULT_EPISODES,
                        help=f"episodes to write (default {DEFAULT_EPISODES})")
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the instances (a stream apart from training's and validation's; default 0)")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="env config key, repeatable (as in train): --env-arg success_rate=1.0")
    parser.add_argument("--reasoning", default="none", choices=("none", "grounded", "template"),
                        help="none: answer-only demos; grounded: <think> states facts of the observation the action "
                             "depends on; template: one fixed <think> text for every input (default none)")
    parser.add_argument("--only-success", action="store_true",
                        help="keep only episodes the expert won (on slippery ice an optimal expert still falls)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="rollout settings the demos follow, as in train: rollout.max_turns=4 (an env of your "
                             "own has no preset: give the turns it needs)")
    parser.set_defaults(run=run)


def compose(args):
    """(DemoSpec, seeds) from the arguments, checked before any episode is played."""
    import envs
    from ragen2 import demos, seeding
    from ragen2.config import load_config
    from ragen2.presets import ConfigError, key_values

    if args.episodes < 1:
        raise demos.DemosError(f"--episodes must be >= 1, got {args.episodes}")
    if args.seed < 0:
        raise demos.DemosError(f"--seed must be >= 0, got {args.seed}")
    overrides = list(getattr(args, "overrides", None) or [])
    try:
        cfg = load_config(env=args.env, overrides=overrides)
    except ConfigError:  # an env of the user's own has no preset: the base turn rules apply
        cfg = load_config(overrides=[f"env.name={args.env}", *overrides])
    entry = envs.spec(cfg.env.name)  # cfg's: --env may be a preset file of the user's own
    given = envs.coerce_overrides(entry, key_values(args.env_arg, "--env-arg", "--env-arg success_rate=1.0"))
    settings = demos.settings_for(args.reasoning, {**cfg.env.overrides, **given})
    # module.path:Class stays the reference: the name its module registers exists only once it is
    # imported, and `ragen2 sft` rebuilds the env from this field in a new process
    name = cfg.env.name if ":" in cfg.env.name else entry.name
    spec = demos.DemoSpec(name, demos.env_args_of(name, settings), cfg.rollout.max_turns,
                          cfg.rollout.max_response_words)
    spec.make_env()  # a bad setting fails here, with the env's own message
    return spec, seeding.demo_seeds(args.seed, args.episodes)


def run(args) -> int:
    import envs
    from ragen2 import demos
    from ragen2.presets import ConfigError

    try:
        spec, seeds = compose(args)
        from envs.experts import NoExpertError, has_expert

        if not has_expert(spec.make_env()):
            raise NoExpertError(f"env {spec.env!r} has no expert (envs/experts.py); an env of your own: "
                                "see docs/custom_env.md, 'warm start'")
    except (demos.DemosError, envs.EnvConfigError, ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    started, written, wins = time.perf_counter(), [], 0
    for i, seed in enumerate(seeds):
        demo = demos.render_demo(spec, seed, 0, args.reasoning)
        wins += demo["success"]
        if demo["success"] or not args.only_success:
            written.append(demo)
        if sys.stderr.isatty() and (i + 1) % 16 == 0:
            print(f"\r{i + 1}/{len(seeds)} episodes", end="", file=sys.stderr, flush=True)
    demos.write_demos(args.out, written)
    turns = sum(len(demos.assistant_texts(d)) for d in written)
    print(f"\rwrote {len(written)} demos ({turns} assistant turns) of {spec.env} {spec.env_args} to {args.out}; "
          f"expert success {wins}/{len(seeds)} ({time.perf_counter() - started:.1f}s)", file=sys.stderr)
    return 0
