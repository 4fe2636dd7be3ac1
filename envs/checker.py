"""`check_env`: the contract every registered env must keep (like gymnasium's check_env).

Each check raises `EnvCheckError` naming the env and what broke. It exercises:
seeding (same seed → same instance, different seeds → not all equal), the reset/step
contract (types, the 5-tuple, budgets, truncation, stepping after the end), determinism of
whole episodes, rendering, the parser round trip, the format penalty, thread safety, and
that `step` returns for hostile model output (a step that raises on what a model wrote ends
a training run: that is a bug of the env, whatever the text).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from envs.base import EpisodeOverError, TextEnv
from envs.parsing import format_response


class EnvCheckError(AssertionError):
    pass


def _require(condition: bool, env: TextEnv, message: str) -> None:
    if not condition:
        raise EnvCheckError(f"{type(env).__name__}: {message}")


def _episode(env: TextEnv, seed: int, policy_seed: int, max_turns: int = 50) -> list[tuple]:
    """Play one episode with random valid actions; return the transcript."""
    obs, info = env.reset(seed=seed)
    transcript = [("reset", obs)]
    rng = np.random.default_rng(policy_seed)
    for _ in range(max_turns):
        count = int(rng.integers(1, env.config.max_actions_per_turn + 1))
        actions = [env.sample_action(rng) for _ in range(count)]
        obs, reward, terminated, truncated, info = env.step(format_response(actions, think="ok"))
        transcript.append((tuple(actions), obs, reward, terminated, truncated, info["success"]))
        if terminated or truncated:
            break
    return transcript


def check_seeding(env: TextEnv, fresh: TextEnv) -> None:
    for seed in (0, 1, 12345, 2**40 + 7):
        obs_a, _ = env.reset(seed=seed)
        obs_b, _ = fresh.reset(seed=seed)
        _require(obs_a == obs_b, env, f"seed {seed} gave different observations in two instances")
        _require(env.render() == fresh.render(), env, f"seed {seed}: render differs between instances")
    observations = {env.reset(seed=seed)[0] for seed in range(20)}
    _require(len(observations) > 1, env, "20 different seeds all gave the same observation")


def check_reset_step_contract(env: TextEnv, seed: int = 7) -> None:
    obs, info = env.reset(seed=seed)
    _require(isinstance(obs, str) and obs, env, "reset must return a non-empty str observation")
    _require(isinstance(info, dict), env, "reset must return an info dict")
    _require(isinstance(env.instruction, str) and env.instruction.strip(), env, "instruction is empty")
    vocabulary = env.action_vocabulary
    _require(vocabulary is None or (len(vocabulary) > 0 and all(isinstance(a, str) for a in vocabulary)),
             env, "action_vocabulary must be None or a non-empty tuple of str")
    _require(env.actions_left == env.config.max_actions_per_traj, env, "actions_left after reset != budget")

    rng = np.random.default_rng(seed)
    steps = 0
    while True:
        result = env.step(format_response([env.sample_action(rng)], think="checking"))
        _require(isinstance(result, tuple) and len(result) == 5, env, "step must return a 5-tuple")
        obs, reward, terminated, truncated, info = result
        steps += 1
        _require(isinstance(obs, str), env, "step observation must be str")
        _require(isinstance(reward, float) and math.isfinite(reward), env, f"reward must be a finite float: {reward!r}")
        _require(isinstance(terminated, bool) and isinstance(truncated, bool), env, "terminated/truncated must be bool")
        _require(not (terminated and truncated), env, "terminated and truncated at once")
        for key in ("success", "parse", "actions_executed", "action_is_valid", "actions_left"):
            _require(key in info, env, f"step info lacks '{key}'")
        _require(info["action_is_valid"], env, "a sampled valid action was reported invalid")
        _require(not (info["success"] and not terminated), env, "success without termination")
        if terminated or truncated:
            break
        _require(steps <= env.config.max_actions_per_traj, env, "episode outlived max_actions_per_traj")
    if truncated:
        _require(env.actions_left == 0, env, "truncated with actions left")
    try:
        env.step(format_response([env.sample_action(rng)]))
    except EpisodeOverError:
        pass
    else:
        raise EnvCheckError(f"{type(env).__name__}: step after the episode ended must raise EpisodeOverError")


def check_format_penalty(env: TextEnv, seed: int = 3) -> None:
    obs, _ = env.reset(seed=seed)
    actions_left = env.actions_left
    for garbage in ("no tags at all", "<think>unclosed", "<answer></answer>"):
        next_obs, reward, terminated, truncated, info = env.step(garbage)
        _require(reward == env.config.format_penalty, env,
                 f"malformed turn {garbage!r} gave reward {reward}, expected the format penalty")
        _require(not info["action_is_valid"] and not terminated and not truncated, env,
                 "a malformed turn must not act or end the episode")
        _require(env.actions_left == actions_left, env, "a malformed turn consumed action budget")
        _require(info["parse"]["error"], env, "a malformed turn's info must say what was wrong")


def check_parser_round_trip(env: TextEnv, seed: int = 11) -> None:
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for think in ("plan", None if not env.config.require_think else "x"):
        actions = [env.sample_action(rng) for _ in range(env.config.max_actions_per_turn)]
        parsed = env.parse(format_response(actions, think=think))
        _require(parsed.format_ok and list(parsed.actions) == [a.strip() for a in actions], env,
                 f"parser round trip lost actions: {actions} → {parsed.actions}")
    vocabulary = env.action_vocabulary
    if vocabulary is not None:
        shouted = [a.upper() for a in vocabulary[: env.config.max_actions_per_turn]]
        parsed = env.parse(format_response(shouted, think="t"))
        _require(list(parsed.actions) == list(vocabulary[: len(shouted)]), env,
                 "vocabulary matching must ignore case and return the canonical spelling")


def check_determinism(env: TextEnv, fresh: TextEnv) -> None:
    for seed in (0, 5):
        _require(_episode(env, seed, policy_seed=seed) == _episode(fresh, seed, policy_seed=seed), env,
                 f"episode with seed {seed} differs between two instances")


def check_rendering(env: TextEnv, seed: int = 2) -> None:
    obs, _ = env.reset(seed=seed)
    _require(env.render() == obs, env, "render() after reset must equal the observation")
    _require(env.render() == env.render(), env, "render() must not change state")


def check_threads(make_env, seeds=range(8)) -> None:
    """Episodes played in threads must match the same episodes played serially."""
    serial = {seed: _episode(make_env(), seed, policy_seed=seed) for seed in seeds}
    threaded: dict[int, list] = {}
    errors: list[BaseException] = []

    def play(seed: int) -> None:
        try:
            threaded[seed] = _episode(make_env(), seed, policy_seed=seed)
        except BaseException as error:  # surfaced below, with the env named
            errors.append(error)

    workers = [threading.Thread(target=play, args=(seed,)) for seed in seeds]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise EnvCheckError(f"an episode raised in a thread: {errors[0]!r}")
    if threaded != serial:
        raise EnvCheckError("episodes played in threads differ from the same episodes played serially")


_JUNK = "\x00\udcff\u202e\ufeff🙂ß\u0301\r\x1b[2J"
# Answers an env will act on: each is wrapped in well-formed tags below.
HOSTILE_ANSWERS = (
    _JUNK * 500, "\udcff", "\x00", "9" * 5000, "1e999", "nan", "-inf", "[" * 1100, "(" * 1100 + ")" * 1100,
    "||" * 5000, "|| ||", "x" * 1_000_000, "search[" + "q" * 100_000 + "]", "click[\x00]", "finish[]",
    "<answer>", "</answer>", "<think>", "```python\n" + _JUNK + "\n```", "import os; os._exit(0)",
    "def f(:\n", "Up || Down || Left || Right || " * 200,
)
# Whole turns, malformed or odd: nested, unclosed, repeated, shouted, empty tags, nothing at all.
HOSTILE_TURNS = (
    "", " ", "\n" * 10_000, "x" * 1_000_000, _JUNK * 2000, "\udcff" * 1000,
    "<think>" * 20_000 + "<answer>" * 20_000, "</answer>" * 1000 + "<answer>", "<answer><answer>a</answer></answer>",
    "<think><think>x</think></think><answer><answer>up</answer></answer>", "<THINK>x</THINK><ANSWER>up</ANSWER>",
    "<think>x</think><answer>up</answer>" * 1000, "<think>\udcff</think><answer>\udcff</answer>",
    "<think>x</think>\n<answer>\x00</answer>\x00", "<answer></answer>" * 100, "<think></think><answer>",
)


def check_hostile_outputs(env: TextEnv, seed: int = 5) -> None:
    """`step` returns a well-typed 5-tuple for every hostile model output: it never raises."""
    turns = [format_response([answer], think="hostile") for answer in HOSTILE_ANSWERS] + list(HOSTILE_TURNS)
    env.reset(seed=seed)
    for number, text in enumerate(turns):
        try:
            result = env.step(text)
        except Exception as error:  # the contract under test: surfaced with the text that broke it
            raise EnvCheckError(f"{type(env).__name__}: step raised {error!r} on hostile output "
                                f"{ascii(text[:60])} ({len(text)} chars)") from error
        _require(isinstance(result, tuple) and len(result) == 5, env, "step must return a 5-tuple")
        obs, reward, terminated, truncated, info = result
        _require(isinstance(obs, str) and isinstance(info, dict), env, "step must return a str observation and info")
        _require(isinstance(reward, float) and math.isfinite(reward), env,
                 f"hostile output {ascii(text[:60])} gave reward {reward!r}, not a finite float")
        _require(isinstance(terminated, bool) and isinstance(truncated, bool), env, "terminated/truncated must be bool")
        if terminated or truncated:
            env.reset(seed=seed + number + 1)


def check_env(make_env) -> None:
    """Run every check. `make_env` is a zero-argument callable returning a fresh env."""
    env, fresh = make_env(), make_env()
    check_reset_step_contract(env)
    check_seeding(env, fresh)
    check_rendering(env)
    check_format_penalty(env)
    check_hostile_outputs(env)
    check_parser_round_trip(env)
    check_determinism(env, fresh)
    check_threads(make_env)
