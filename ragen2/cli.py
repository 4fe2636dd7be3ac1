"""The `ragen2` command: one subcommand per job, each in the module that owns it."""

from __future__ import annotations

import argparse
import sys

from ragen2 import envs_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragen2",
        description="Multi-turn RL for LLM agents: environments, training, SNR filtering, collapse audits.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    envs_cli.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
