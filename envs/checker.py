"""`check_env`: the contract every registered env must keep (like gymnasium's check_env).

Each check raises `EnvCheckError` naming the env and what broke. It exercises:
seeding (same seed → same instance, different seeds → not all equal), the reset/step
contract (types, the 5-tuple, budgets, truncation, stepping after the end), determinism of
whole episodes, rendering, the parser round trip, the format penalty, thread safety, and
that `step` returns for hostile model output (a step that raises on what a model wrote ends
a training run: that is a bug of the env, whatever the text), within a host-CPU budget linear in
the text's length, also on text shaped to make a backtracking regex slow, at the env's longest reply.
"""

from __future__ import annotations

import math
import threading
import time

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


# How long a reply can be: an env's token budget (RAGEN-2's max response length, at least
# MIN_REPLY_TOKENS, above every shipped config's max_new_tokens: 400 in configs/paper) times
# the longest token of SmolLM2-135M, the default policy (a newline and 80 blanks). DeepCoder's
# 8,000 tokens are 648,000 characters.
LONGEST_TOKEN_CHARS = 81
MIN_REPLY_TOKENS = 1024
# Host CPU one step may spend on its own work (parsing, answer extraction, reward), not counting
# a sandbox's runs (an action's info reports those as `sandbox_host_cpu_seconds`; the sandbox's
# own suite bounds them per run): STEP_CPU_SECONDS plus STEP_CPU_SECONDS_PER_MILLION_CHARS for
# each million characters of the turn, a linear budget. Measured as process CPU
# (time.process_time: every thread, none of the waiting), so a busy 2-core CI machine does not
# fail it by being slow. DeepCoder's costliest adversarial answer (648,000 characters) costs it
# 15 ms (docs/benchmarks/deepcoder_host_cost.json) against a bound of 0.37 s; the per-character
# allowance is for scans like SearchQA's free-text reading, linear but slow per character, on the
# corpus's million-character answers. A quadratic pattern costs seconds to minutes at these
# lengths (a fence and 64,000 blanks: 11.85 s).
STEP_CPU_SECONDS = 0.05
STEP_CPU_SECONDS_PER_MILLION_CHARS = 0.5

# Runs ended by a character no run continues with, after the openers patterns start with; tokens
# repeated with nothing closing them. What makes a backtracking regex slow on model output.
_RUNS = (" ", "\t", "\n", " \t", "9", "x", "-", "*", "`", "{", "<", "|", "é")
_OPENERS = ("```", "```python", "<think>", "<answer>", "\\boxed{", "**", "*", "answer is", "the", "so", "search",
            "search[", "click[", "1/", "\\frac{", "$")
_REPEATS = ("<think>", "</think>", "<answer>", "</answer>", "<think></think>", "```", "```python\n", "``` ",
            "\\boxed{", "\\boxed{}", "**a", "*a", "search[", "finish[", "answer is ", "the ", "so ", "9,", "1/",
            "$", "x=", "||", "(", "[", "\\frac{1}{")


def max_reply_chars(env: TextEnv) -> int:
    return max(int(env.ragen_max_words), MIN_REPLY_TOKENS) * LONGEST_TOKEN_CHARS


def adversarial_texts(length: int) -> list[str]:
    """Texts of about `length` characters, each ending in `!`, that no regex here may be slow on."""
    texts = [run * (length // len(run)) + "!" for run in _RUNS]
    texts += [opener + run * ((length - len(opener)) // len(run)) + "!" for opener in _OPENERS for run in (" ", "9", "x")]
    return texts + [token * (length // len(token)) + "!" for token in _REPEATS]


def _timed_step(env: TextEnv, text: str):
    start = time.process_time()
    try:
        result = env.step(text)
    except Exception as error:  # the contract under test: surfaced with the text that broke it
        raise EnvCheckError(f"{type(env).__name__}: step raised {error!r} on hostile output "
                            f"{ascii(text[:60])} ({len(text)} chars)") from error
    spent = time.process_time() - start
    if isinstance(result, tuple) and len(result) == 5 and isinstance(result[4], dict):
        spent -= sum(float(action.get("sandbox_host_cpu_seconds", 0.0))
                     for action in result[4].get("action_infos", ()) if isinstance(action, dict))
    bound = STEP_CPU_SECONDS + STEP_CPU_SECONDS_PER_MILLION_CHARS * len(text) / 1e6
    _require(spent <= bound, env, f"step took {spent:.2f} s of host CPU (bound {bound:.2f} s) "
             f"on {ascii(text[:60])} ({len(text)} chars)")
    return result


def check_hostile_outputs(env: TextEnv, seed: int = 5, adversarial: bool = True) -> None:
    """`step` returns a well-typed 5-tuple for every hostile model output, within its host-CPU
    budget (STEP_CPU_SECONDS and a per-character allowance): it never raises, no text stalls it.
    `adversarial`: add adversarial_texts at the env's longest reply, as answers and as whole turns."""
    answers = list(HOSTILE_ANSWERS)
    turns = list(HOSTILE_TURNS)
    if adversarial:
        shapes = adversarial_texts(max_reply_chars(env))
        answers, turns = answers + shapes, turns + shapes
    turns = [format_response([answer], think="hostile") for answer in answers] + turns
    env.reset(seed=seed)
    for number, text in enumerate(turns):
        result = _timed_step(env, text)
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
