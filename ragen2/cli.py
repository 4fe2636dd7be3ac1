"""The `ragen2` command: one subcommand per job, each in its module under ragen2.commands.

Only the module of the command being run is imported; the others appear in the parser by name
and one-line help, so `ragen2 --help` and `ragen2 envs list` start without torch or matplotlib.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

from ragen2.commands import COMMANDS, module_name


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the options of the command `argv` names (or of every command, for None)."""
    parser = argparse.ArgumentParser(
        prog="ragen2",
        description="Multi-turn RL for LLM agents: environments, training, SNR filtering, collapse audits.",
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    chosen = set(COMMANDS) if argv is None else {next((item for item in argv if not item.startswith("-")), None)}
    for name, one_line in COMMANDS.items():
        if name in chosen:
            importlib.import_module(module_name(name)).add_parser(commands)
        else:  # listed by `ragen2 --help`; its options are built only when it runs
            commands.add_parser(name, help=one_line)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # only `--version` reads it

    try:
        return version("ragen2")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _Version(argparse.Action):
    """argparse's "version" action, with the version looked up only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"ragen2 {_version()}")
        parser.exit()


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
    argv = sys.argv[1:] if argv is None else list(argv)
    # `--env mymodule:MyEnv` names a module in this folder, as `python -m` would find it; appended,
    # so an installed package of the same name still wins
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    parser = build_parser(argv)
    # KEY=VALUE overrides may come after options (`show sokoban --seed 1 dim_x=8`), where
    # argparse no longer fills a positional list: collect them here.
    args, extra = parser.parse_known_args(argv)
    stray = [item for item in extra if "=" not in item or item.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}{_flag_hint(parser, args, stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return code
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ragen2 ... | head`: the reader left; say nothing more, as a Unix tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's final flush would raise again
        return 141  # 128 + SIGPIPE


def entry() -> int:
    """The console script: `main` in a process of its own, whose allocator keeps freed memory
    (ragen2.heap; process-wide, so not done by `main`, which tests and callers run in-process)."""
    from ragen2 import heap

    heap.keep_freed_memory()
    return main()


if __name__ == "__main__":
    sys.exit(entry())
