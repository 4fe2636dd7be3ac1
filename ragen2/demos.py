"""Expert demonstrations, rendered by the rollout's own turn protocol (`ragen2 demos`, read by `ragen2 sft`).

    demo = render_demo(DemoSpec("frozen_lake", {"require_think": True}, max_turns=5), seed=7,
                       rollout_index=0, reasoning="grounded")
    write_demos(path, demos); demos = read_demos(path)      # JSONL, one episode per line

An episode is played by the env's expert (`envs.experts.expert_turn`, recomputed from the state
every turn) and written as the chat the policy would have seen: the system message and each turn's
user message come from `envs.prompt` exactly as `ragen2.rollout.episode.Episode` builds them (the
"Reward:" message after each turn, the "No valid action" warning, the turn budget), and each
assistant message is what the env was given: the prefilled tag + the reply
(`<think>…</think><answer>…</answer>`, or `<answer>…</answer>` in answer-only mode).

One line per episode: `messages` (roles system/user/assistant: TRL's SFTTrainer and OpenRLHF's
SFT datasets take this), `env`, `env_args` (every env setting that differs from the env's registered
defaults, `require_think` always: `envs.make(env, **env_args)` rebuilds the env), `seed`,
`rollout_index`, `return`, `success`, and `rollout` (the turn rules it was rendered under) and
`reasoning`.

Reasoning: `none` writes answer-only demos (`require_think=false`); `grounded` writes think-mode
demos whose reasoning states facts read off the observation that the action depends on;
`template` writes one fixed reasoning text for every input (a control for the collapse probe:
reasoning that carries no information about the input).

`replay_demo` plays a demo's assistant turns through a fresh env and checks that every user
message and the return are what the env shows: a file edited by hand, or rendered for another env
or other settings, is refused with the line and turn that differ.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import envs
from envs.parsing import format_response, prefill_tag
from envs.prompt import after_turn, first_turn_messages

REASONINGS = ("none", "grounded", "template")
ROLES = ("system", "user", "assistant")


class DemosError(ValueError):
    """A demos request or file that cannot be used; the message names what and where."""


@dataclass(frozen=True)
class DemoSpec:
    """Which env, with which settings, under which turn rules: what a demo line records."""

    env: str
    env_args: dict  # every setting that differs from the registered defaults (require_think always)
    max_turns: int
    max_response_words: int | None = None

    def make_env(self):
        try:
            return envs.make(self.env, **self.env_args)
        except envs.EnvConfigError as error:
            raise DemosError(str(error)) from None


def env_args_of(env_name: str, settings: dict) -> dict:
    """The env settings that differ from `env_name`'s registered defaults, plus `require_think`."""
    entry = envs.spec(env_name)
    config = entry.make_config(**settings)
    defaults = entry.config
    differing = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                 if getattr(config, f.name) != getattr(defaults, f.name)}
    differing["require_think"] = bool(config.require_think)
    return {key: list(value) if isinstance(value, tuple) else value for key, value in differing.items()}


def settings_for(reasoning: str, settings: dict) -> dict:
    """The env settings a reasoning mode needs: think mode for grounded/template, answer-only for none."""
    if reasoning not in REASONINGS:
        raise DemosError(f"--reasoning must be one of {list(REASONINGS)}, got {reasoning!r}")
    wanted = reasoning != "none"
    if "require_think" in settings and bool(settings["require_think"]) != wanted:
        raise DemosError(f"--reasoning {reasoning} writes {'think-mode' if wanted else 'answer-only'} demos, "
                         f"but require_think={settings['require_think']} was given: drop it or change --reasoning")
    return {**settings, "require_think": wanted}


def _play(spec: DemoSpec, seed: int, rollout_index: int, reply: Callable[[object, int], str]) -> dict:
    """One episode of `reply(env, turn) -> assistant text` under the rollout's turn protocol."""
    env = spec.make_env()
    observation, _ = env.reset(seed=seed, options={"rollout_index": rollout_index})
    system, first_user = first_turn_messages(env, observation, spec.max_response_words)
    messages = [system, first_user]
    total, success = 0.0, False
    for turn in range(spec.max_turns):
        text = reply(env, turn)
        messages.append({"role": "assistant", "content": text})
        observation, reward, terminated, truncated, info = env.step(text)
        total += float(reward)
        success = bool(info["success"])
        if terminated or truncated or turn + 1 >= spec.max_turns:
            break
        feedback, next_turn = after_turn(env, turn + 2, observation, reward, info,
                                         max_response_words=spec.max_response_words)
        messages.append({"role": "user", "content": feedback + next_turn})
    env.close()
    return {"messages": messages, "return": total, "success": success}


def expert_reply(env, reasoning: str, turns_left: int | None = None) -> str:
    """The expert's turn as the policy would write it, prefilled tag included; `turns_left`: the
    turns the rollout still allows (the slippery FrozenLake planner uses it)."""
    from envs.experts import expert_turn  # the experts import every env's solver

    turn = expert_turn(env, turns_left=turns_left)
    think = {"none": None, "grounded": turn.grounded, "template": turn.template}[reasoning]
    return format_response(list(turn.actions), think=think)


def render_demo(spec: DemoSpec, seed: int, rollout_index: int, reasoning: str) -> dict:
    """One expert episode as a demo line (see the module doc)."""
    played = _play(spec, seed, rollout_index, lambda env, turn: expert_reply(env, reasoning, spec.max_turns - turn))
    return {"messages": played["messages"], "env": spec.env, "env_args": dict(spec.env_args), "seed": int(seed),
            "rollout_index": int(rollout_index), "return": played["return"], "success": played["success"],
            "reasoning": reasoning,
            "rollout": {"max_turns": spec.max_turns, "max_response_words": spec.max_response_words}}


def spec_of(demo: dict) -> DemoSpec:
    rules = demo.get("rollout") or {}
    return DemoSpec(demo["env"], dict(demo.get("env_args") or {}), int(rules.get("max_turns", _turns(demo))),
                    rules.get("max_response_words"))


def _turns(demo: dict) -> int:
    return sum(m["role"] == "assistant" for m in demo["messages"])


def assistant_texts(demo: dict) -> list[str]:
    return [m["content"] for m in demo["messages"] if m["role"] == "assistant"]


def replay_demo(demo: dict, where: str = "demo") -> None:
    """Play the demo's assistant turns through its env; DemosError where a message or the return differs."""
    texts = assistant_texts(demo)
    spec = spec_of(demo)
    played = _play(spec, int(demo["seed"]), int(demo.get("rollout_index", 0)),
                   lambda env, turn: texts[turn] if turn < len(texts) else "")
    recorded, replayed = demo["messages"], played["messages"]
    for index, (mine, theirs) in enumerate(zip(recorded, replayed)):
        if mine != theirs:
            raise DemosError(f"{where}: message {index + 1} ({mine.get('role')}) is not what env {spec.env!r} with "
                             f"{spec.env_args} shows for seed {demo['seed']}: {str(mine.get('content'))[:80]!r} vs "
                             f"{str(theirs.get('content'))[:80]!r}")
    if len(recorded) != len(replayed):
        raise DemosError(f"{where}: {len(recorded)} messages, but the episode of env {spec.env!r} seed {demo['seed']} "
                         f"has {len(replayed)} (it ends at a different turn)")
    if not math.isclose(float(demo["return"]), played["return"], abs_tol=1e-9) or bool(demo["success"]) != played["success"]:
        raise DemosError(f"{where}: recorded return {demo['return']} / success {demo['success']}, replayed "
                         f"{played['return']} / {played['success']}")


def check_demo(demo, where: str) -> None:
    """The shape of one demo line; DemosError naming the first problem."""
    if not isinstance(demo, dict):
        raise DemosError(f"{where}: not a JSON object")
    for key in ("messages", "env", "seed", "return", "success"):
        if key not in demo:
            raise DemosError(f"{where}: no {key!r} field (a file written by `ragen2 demos` has messages, env, "
                             f"env_args, seed, rollout_index, return, success)")
    messages = demo["messages"]
    if not isinstance(messages, list) or not messages:
        raise DemosError(f"{where}: 'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            role = message.get("role") if isinstance(message, dict) else type(message).__name__
            raise DemosError(f"{where}: message {i + 1} has role {role!r}; only {list(ROLES)} with text content")
    if messages[0]["role"] != "system" or len(messages) < 2 or messages[1]["role"] != "user":
        raise DemosError(f"{where}: a demo starts with a system and a user message (the rollout's first prompt)")
    if not any(m["role"] == "assistant" for m in messages):
        raise DemosError(f"{where}: no assistant turn: nothing to train on")


def read_demos(path: str | Path, replay: bool = True) -> list[dict]:
    """Every demo of a JSONL file, each checked (and replayed through its env unless `replay=False`)."""
    path = Path(path)
    if not path.is_file():
        raise DemosError(f"{path}: no such demos file (write one with `ragen2 demos --env ENV --out {path}`)")
    demos = []
    with path.open() as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                demo = json.loads(line)
            except json.JSONDecodeError as error:
                raise DemosError(f"{where}: not JSON ({error.msg})") from None
            check_demo(demo, where)
            if replay:
                replay_demo(demo, where)
            demos.append(demo)
    if not demos:
        raise DemosError(f"{path}: empty: no demos to train on")
    envs_seen = sorted({d["env"] for d in demos})
    if len(envs_seen) > 1:
        raise DemosError(f"{path}: demos of several envs {envs_seen}: one env per file")
    return demos


def write_demos(path: str | Path, demos: list[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("w") as handle:
        for demo in demos:
            handle.write(json.dumps(demo, ensure_ascii=False) + "\n")
    partial.replace(path)  # a stopped command leaves no half-written file under the real name


def prefill_of(demo: dict) -> str:
    """The tag the rollout prefills before each of this demo's assistant turns."""
    return prefill_tag(bool((demo.get("env_args") or {}).get("require_think", True)))
