"""The `ragen2` command: one subcommand per job, each in the module that owns it."""

from __future__ import annotations

import argparse
import difflib
import sys

from ragen2 import audit, export, plot
from ragen2.commands import bench as bench_cli
from ragen2.commands import envs as envs_cli
from ragen2.commands import eval as eval_cli
from ragen2.commands import train as train_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragen2",
        description="Multi-turn RL for LLM agents: environments, training, SNR filtering, collapse audits.",
    )
    parser.add_argument("--version", action="version", version=f"ragen2 {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    envs_cli.add_parser(commands)
    train_cli.add_parser(commands)
    plot.add_parser(commands)
    audit.add_parser(commands)
    bench_cli.add_parser(commands)
    eval_cli.add_parser(commands)
    export.add_parser(commands)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ragen2")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _flag_hint(parser: argparse.ArgumentParser, args, stray: list[str]) -> str:
    """`--stpes` -> " (did you mean --steps?)", from the flags of the subcommand that was run."""
    flags = [item.partition("=")[0] for item in stray if item.startswith("--")]
    if not flags:
        return ""
    command = next((action.choices[args.command] for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction) and args.command in action.choices), parser)
    known = [option for action in command._actions for option in action.option_strings if option.startswith("--")]
    hints = [match[0] for flag in flags if (match := difflib.get_close_matches(flag, known, n=1, cutoff=0.6))]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # KEY=VALUE overrides may come after options (`show sokoban --seed 1 dim_x=8`), where
    # argparse no longer fills a positional list: collect them here.
    args, extra = parser.parse_known_args(argv)
    stray = [item for item in extra if "=" not in item or item.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}{_flag_hint(parser, args, stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
