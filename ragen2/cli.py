"""The `ragen2` command: one subcommand per job, each in the module that owns it."""

from __future__ import annotations

import argparse
import sys

from ragen2 import audit, bench, envs_cli, eval_cli, plot, train_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragen2",
        description="Multi-turn RL for LLM agents: environments, training, SNR filtering, collapse audits.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    envs_cli.add_parser(commands)
    train_cli.add_parser(commands)
    plot.add_parser(commands)
    audit.add_parser(commands)
    bench.add_parser(commands)
    eval_cli.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # KEY=VALUE overrides may come after options (`show sokoban --seed 1 dim_x=8`), where
    # argparse no longer fills a positional list: collect them here.
    args, extra = parser.parse_known_args(argv)
    stray = [item for item in extra if "=" not in item or item.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
