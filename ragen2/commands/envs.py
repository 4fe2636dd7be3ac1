"""`ragen2 envs list | show | play`: look at the environments the way the model does."""

from __future__ import annotations

import dataclasses
import sys

from rich.console import Console
from rich.table import Table

import envs
from envs.base import EnvConfig, EnvConfigError, TextEnv
from envs.parsing import ANSWER_OPEN, format_response
from envs.prompt import after_turn, first_turn_messages, render_messages
from ragen2.commands import COMMANDS
from ragen2.presets import ConfigError, key_values

DEFAULT_ENV = "sokoban"
SHARED_FIELDS = {f.name for f in dataclasses.fields(EnvConfig)}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("envs", help=COMMANDS["envs"])
    parser.set_defaults(run=run)
    sub = parser.add_subparsers(dest="envs_command", metavar="ACTION")
    sub.required = True

    sub.add_parser("list", help="a table of every registered env")
    for action, helper in (
        ("show", "print the prompt the model sees for one instance"),
        ("play", "play an instance in the terminal"),
    ):
        command = sub.add_parser(action, help=helper)
        command.add_argument("name", nargs="?", default=DEFAULT_ENV,
                             help=f"env name (see `ragen2 envs list`; default {DEFAULT_ENV})")
        command.add_argument("--seed", type=int, default=0, help="instance seed (default 0)")
        command.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", dest="env_args",
                             help="env config key, repeatable (as in train, eval, audit), e.g. --env-arg dim_x=8")
        command.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                             help="the same as --env-arg: dim_x=8 max_actions_per_turn=3")


def run(args) -> int:
    return ACTIONS[args.envs_command](args)


def _describe_config(config: EnvConfig) -> str:
    own = [f"{f.name}={getattr(config, f.name)}" for f in dataclasses.fields(config) if f.name not in SHARED_FIELDS]
    budget = f"actions {config.max_actions_per_turn}/turn, {config.max_actions_per_traj}/traj"
    return ", ".join([budget, *own[:4]]) + (" …" if len(own) > 4 else "")


def run_list(args) -> int:
    table = Table(title="ragen2 environments", show_lines=False)
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("description")
    table.add_column("key defaults")
    for entry in envs.specs():
        table.add_row(entry.name, entry.description, _describe_config(entry.config))
    Console().print(table)
    return 0


def _make_env(args) -> TextEnv:
    name, overrides = args.name, [*getattr(args, "env_args", []), *args.overrides]
    if "=" in name:  # `ragen2 envs show dim_x=8`: an override, not a name
        name, overrides = DEFAULT_ENV, [name, *overrides]
    try:
        raw = key_values(overrides, "override", "dim_x=8")
    except ConfigError as error:
        raise EnvConfigError(str(error)) from None
    entry = envs.spec(name)
    return entry.env_cls(entry.make_config(**envs.coerce_overrides(entry, raw)))


def _with_env(run):
    """Turn config errors into one clear line and exit status 2, not a traceback."""

    def wrapped(args) -> int:
        try:
            env = _make_env(args)
            return run(args, env)
        except EnvConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2

    return wrapped


def _action_limit_note(env: TextEnv, prompt: str) -> None:
    """RAGEN-2's system prompt says "up to N actions" with N the trajectory's budget (10 in Sokoban),
    while the parser runs at most max_actions_per_turn (2) a turn: kept for fidelity, said here."""
    config = env.config
    if (config.prompt_action_limit == "per_traj" and config.max_actions_per_turn < config.max_actions_per_traj
            and f"You can make up to {config.max_actions_per_traj} actions" in prompt):
        print(f"note: \"up to {config.max_actions_per_traj} actions\" is RAGEN-2's wording for the whole episode's "
              f"budget; each turn runs at most {config.max_actions_per_turn} (the rest are dropped). "
              f"prompt_action_limit=per_turn states the per-turn limit instead (docs/fidelity.md)", file=sys.stderr)


@_with_env
def run_show(args, env: TextEnv) -> int:
    obs, _ = env.reset(seed=args.seed)
    prompt = render_messages(first_turn_messages(env, obs))
    print(prompt)
    _action_limit_note(env, prompt)
    return 0


def enable_line_editing(stdin=None) -> bool:
    """Arrow keys and history for `input()` where the terminal has them (readline); without it an
    arrow key typed escape codes into the turn, and the turn was spent on them."""
    stdin = sys.stdin if stdin is None else stdin
    if not stdin.isatty():  # piped input: nothing to edit, and readline may write escape codes
        return False
    try:
        import readline  # noqa: F401  (importing it is what turns line editing on for input())
    except ImportError:  # Windows without pyreadline
        return False
    return True


def _as_response(line: str, env: TextEnv) -> str:
    """People may type the model's format or bare actions (`Up || Left`)."""
    if ANSWER_OPEN in line:
        return line
    actions = [piece.strip() for piece in line.split("||")]
    return format_response(actions, think="" if env.config.require_think else None)


@_with_env
def run_play(args, env: TextEnv) -> int:
    obs, _ = env.reset(seed=args.seed)
    messages = first_turn_messages(env, obs)
    prompt = render_messages(messages)
    print(prompt)
    _action_limit_note(env, prompt)
    enable_line_editing()
    print("\nType actions (e.g. `Up || Left`) or a full <think>…</think><answer>…</answer>; "
          "an empty line or Ctrl-D quits.\n")
    total, turn = 0.0, 1
    while True:
        try:
            line = input(f"turn {turn}> ").strip()
        except EOFError:
            line = ""
        if not line:
            print(f"quit after {turn - 1} turns; total reward {total:g}")
            return 0
        obs, reward, terminated, truncated, info = env.step(_as_response(line, env))
        total += reward
        parse = info["parse"]
        if parse["error"]:
            print(f"  parser: {parse['error']}")
        for dropped in parse["dropped"]:
            print(f"  dropped {dropped['text']!r}: {dropped['reason']}")
        print(f"  executed {info['actions_executed']} → reward {reward:g}")
        if terminated or truncated:
            outcome = "SUCCESS" if info["success"] else ("out of actions" if truncated else "episode over")
            print(f"\n{obs}\n\n{outcome}: total reward {total:g} in {turn} turns")
            return 0
        turn += 1
        feedback, state = after_turn(env, turn, obs, reward, info)  # what the model would see
        print(render_messages([{"role": "user", "content": feedback + state}]))


ACTIONS = {"list": run_list, "show": run_show, "play": run_play}
