"""Countdown: the safe expression evaluator, the reward rules, and reachable generated targets."""

import re
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.base import EnvConfigError
from envs.countdown import (
    MAX_EXPRESSION_CHARS,
    CountdownConfig,
    CountdownEnv,
    ExpressionError,
    evaluate_expression,
    score_answer,
)
from envs.parsing import format_response


def answer(env, text):
    return env.step(format_response([text], think="t"))


def reachable(values: list[Fraction], target: int) -> bool:
    """Brute force: can `values` (all of them, each once) be combined into `target`?"""
    if len(values) == 1:
        return values[0] == target
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            a, b = values[i], values[j]
            rest = [v for k, v in enumerate(values) if k not in (i, j)]
            results = {a + b, a - b, b - a, a * b}
            results |= {a / b} if b else set()
            results |= {b / a} if a else set()
            if any(reachable(rest + [c], target) for c in results):
                return True
    return False


# --- the evaluator -------------------------------------------------------------------------

@pytest.mark.parametrize("text, value, numbers", [
    ("2 + 5 - 3", 4, (2, 5, 3)),
    ("(1 + 2) * 3", 9, (1, 2, 3)),
    ("2 * 3 + 4", 10, (2, 3, 4)),      # * binds tighter than +
    ("1 - 2 - 3", -4, (1, 2, 3)),      # left-associative
    ("8 / 4 / 2", 1, (8, 4, 2)),
    ("- 3 + 5 + 2", 4, (3, 5, 2)),     # RAGEN's own example answer starts with a unary minus
    ("-(2 - 7) * -1", -5, (2, 7, 1)),
    ("7 / 2 * 2", 7, (7, 2, 2)),       # a fraction on the way, an integer at the end
    ("6 × 2 ÷ 3 − 1", 3, (6, 2, 3, 1)),  # the Unicode operators models like to write
    ("((((4))))", 4, (4,)),
    ("+3", 3, (3,)),                   # unary plus, as Python's eval (both references) has it
    ("+5 + 3 + 2 + 7", 17, (5, 3, 2, 7)),
    ("-+-3 * +2", 6, (3, 2)),
])
def test_expressions_evaluate_exactly(text, value, numbers):
    result = evaluate_expression(text)
    assert result.value == value and result.numbers == numbers and result.stated_result is None


def test_a_trailing_equals_states_a_result_and_division_by_zero_is_undefined():
    assert evaluate_expression("2 + 5 - 3 = 4").stated_result == 4
    assert evaluate_expression("1 / (2 - 2) + 3").value is None
    assert evaluate_expression("1 / 3").value == Fraction(1, 3)


@pytest.mark.parametrize("text, message", [
    ("", "empty expression"),
    ("2 +", "ends where a number was expected"),
    ("(2 + 3", "missing ')'"),
    ("2 + 3)", "unexpected ')'"),
    ("()", "unexpected ')' where a number was expected"),
    ("2 + * 3", "unexpected '*' where a number was expected"),
    ("3 5 2", "unexpected 5"),
    ("2 ** 3", "'**' (power) is not allowed"),
    ("2**99999999", "'**' (power) is not allowed"),
    ("2.5 * 2", "decimal point"),
    ("1 = 2 = 3", "more than one '='"),
    ("1 + 2 = three", "after '=' expected a whole number"),
    ("1 + 2 = 1 + 2", "after '=' expected a whole number"),
    ("9" * 13, "more than 12 digits"),
    ("1;2", "unexpected character ';'"),
    ("__import__('os').system('x')", "unexpected character '_'"),
    ("().__class__", "decimal point at position 2"),  # the tokenizer stops it first
    ("lambda: 0", "unexpected character 'l'"),
    ("１ + 2", "unexpected character '１'"),  # full-width digit: ASCII digits only
])
def test_malformed_expressions_say_why(text, message):
    with pytest.raises(ExpressionError, match=re.escape(message)):
        evaluate_expression(text)


def test_nesting_the_references_accept_is_accepted_and_length_is_capped_far_above():
    # Python's eval (RAGEN-2's and TinyZero's scorer) accepts 200 nested parentheses and
    # 2,000 unary minus signs; our evaluator is iterative, so depth costs no recursion.
    assert evaluate_expression("(" * 200 + "1" + ")" * 200).value == 1
    assert evaluate_expression("-" * 2001 + "1").value == -1  # an odd number of signs
    assert evaluate_expression("(" * 20_000 + "7" + ")" * 20_000).value == 7
    with pytest.raises(ExpressionError, match="longer than 100000 characters"):
        evaluate_expression("1+" * MAX_EXPRESSION_CHARS + "1")
    with pytest.raises(ExpressionError, match="more than 64 numbers"):
        evaluate_expression("+".join(["9"] * 65))
    with pytest.raises(ExpressionError, match="missing '\\)'"):
        evaluate_expression("(" * 49_000 + "1")


@pytest.mark.parametrize("text, numbers, target", [
    ("+5 + 3 + 2 + 7", [5, 3, 2, 7], 17),                         # TinyZero's and RAGEN-2's scorers: 1.0
    ("(" * 40 + "5 + 3" + ")" * 40 + " + 2 + 7", [5, 3, 2, 7], 17),  # nested over 32 levels
    ("5" + " " * 300 + "+ 3 + 2 + 7", [5, 3, 2, 7], 17),           # longer than 256 characters
    ("- - " * 20 + "5 + 3 + 2 + 7", [5, 3, 2, 7], 17),               # 40 unary signs
])
def test_correct_answers_the_references_score_one_score_one(text, numbers, target):
    # Reference value: eval(text) == 17 and the digit multiset matches, so RAGEN-2 gives 1.0.
    assert eval(text, {"__builtins__": None}, {}) == target  # the reference's own check
    assert score_answer(text, numbers, target).reward == 1.0


@st.composite
def expression_and_value(draw):
    """A random expression built as text and, separately, as its exact value."""
    def build(depth):
        if depth == 0 or draw(st.booleans()):
            n = draw(st.integers(0, 99))
            return str(n), Fraction(n)
        (left, lv), (right, rv) = build(depth - 1), build(depth - 1)
        op = draw(st.sampled_from("+-*/"))
        if op == "/" and rv == 0:
            op = "+"
        value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else None}[op]
        return f"({left} {op} {right})", value
    return build(3)


@settings(max_examples=200, deadline=None)
@given(expression_and_value())
def test_evaluator_agrees_with_exact_arithmetic(pair):
    text, value = pair
    assert evaluate_expression(text).value == value


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789+-*/()= .×÷−_a;'\"[]{}\\\n")), max_size=80) | st.text())
def test_any_text_either_parses_or_raises_expression_error(text):
    try:
        evaluate_expression(text)
    except ExpressionError:
        pass
    verdict = score_answer(text, [3, 5, 2], 4)
    assert verdict.reward in (0.0, 0.1, 1.0)


# --- the reward ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, numbers, target, reward, verdict", [
    ("2 + 5 - 3", [3, 5, 2], 4, 1.0, "correct"),
    ("2 + 5 - 3 = 4", [3, 5, 2], 4, 1.0, "correct"),
    ("- 3 + 5 + 2", [3, 5, 2], 4, 1.0, "correct"),
    ("6 / (1 - 3 / 4)", [1, 3, 4, 6], 24, 1.0, "correct"),  # 6 / (1/4): fractions inside, 24 out
    ("2 + 5 + 3", [3, 5, 2], 4, 0.1, "wrong_value"),
    ("2 + 5 - 3 = 5", [3, 5, 2], 4, 0.1, "wrong_stated_result"),
    ("4 / (2 - 2) + 1", [4, 2, 2, 1], 5, 0.1, "division_by_zero"),
    ("2 + 5 - 4", [3, 5, 2], 4, 0.0, "wrong_numbers"),      # a number not given
    ("2 * 2", [3, 5, 2], 4, 0.0, "wrong_numbers"),          # 2 reused, 3 and 5 left out
    ("5 - 3 + 2 + 2 - 2", [3, 5, 2], 4, 0.0, "wrong_numbers"),
    ("5 - 3 + 2", [3, 5, 2, 2], 4, 0.0, "wrong_numbers"),   # one of the two 2s left out
    ("3 5 2", [3, 5, 2], 4, 0.0, "malformed"),              # RAGEN gave 0.1 here; not well-formed
    ("2 ** 2", [2, 2], 4, 0.0, "malformed"),
])
def test_reward_rules(text, numbers, target, reward, verdict):
    result = score_answer(text, numbers, target)
    assert (result.reward, result.verdict, result.correct) == (reward, verdict, verdict == "correct")


@pytest.mark.parametrize("text", [
    "__import__('os').system('x')", "1;2", "().__class__", "2**99999999", "lambda: 0", "lambda x: x",
    "exec('1')", "eval('2+5-3')", "open('/etc/passwd')", "[2, 5, 3]", "2 + 5 - 3 # comment",
    "(" * 5000 + "2" + ")" * 5000, "-" * 5000 + "2", "1+" * 100_000 + "1", "\x00", "\udcff",
    "9/" * 20_000 + "7", "(" * 49_000 + "2",
])
def test_hostile_answers_score_zero_without_raising(text):
    env = CountdownEnv()
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(f"<think>t</think><answer>{text}</answer>")
    assert reward == 0.0 and terminated and not truncated and not info["success"]
    # Deep nesting of one number parses now (as far as eval would) but uses the wrong numbers.
    assert info["action_infos"][0]["verdict"] in ("malformed", "wrong_numbers")


# --- the env -------------------------------------------------------------------------------

def test_registered_default_passes_the_checker():
    env = envs.make("countdown")
    assert isinstance(env, CountdownEnv) and env.config == CountdownConfig()
    assert (env.config.max_actions_per_traj, env.config.max_actions_per_turn) == (1, 1)
    assert (env.config.score, env.config.format_score) == (1.0, 0.1)
    envs.check_env(lambda: envs.make("countdown"))


def test_small_config_passes_the_checker():
    envs.check_env(lambda: CountdownEnv(CountdownConfig(num_numbers=(2, 2), number_range=(1, 9), max_target=20)))


def test_episode_single_answer_terminates_with_ragen_scores():
    env = CountdownEnv()
    obs, info = env.reset(seed=4)
    assert obs == f"Target: {env.target}, nums: {list(env.numbers)}"
    assert info["numbers"] == list(env.numbers) and info["target"] == env.target
    obs, reward, terminated, truncated, info = answer(env, info["solution"])
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert obs == "Your answer got 1 points."

    env.reset(seed=4)
    wrong = " * ".join(str(n) for n in env.numbers)  # the product of all numbers
    expected = 1.0 if np.prod(env.numbers) == env.target else 0.1
    obs, reward, terminated, truncated, info = answer(env, wrong)
    assert (reward, terminated, info["success"]) == (expected, True, expected == 1.0)


def test_malformed_turn_gets_the_format_penalty_and_keeps_the_puzzle():
    env = CountdownEnv()
    obs, _ = env.reset(seed=1)
    next_obs, reward, terminated, truncated, info = env.step("2 + 3 without tags")
    assert (reward, terminated, truncated, next_obs) == (-0.1, False, False, obs)


def test_generated_targets_are_reachable_in_range_and_use_every_number():
    env = CountdownEnv()
    counts = Counter()
    for seed in range(250):
        _, info = env.reset(seed=seed)
        numbers, target = env.numbers, env.target
        counts[len(numbers)] += 1
        assert all(1 <= n <= 99 for n in numbers) and 1 <= target <= 1000
        assert reachable([Fraction(n) for n in numbers], target), (seed, numbers, target)
        solution = evaluate_expression(info["solution"])
        assert Counter(solution.numbers) == Counter(numbers) and solution.value == target
    assert set(counts) == {3, 4} and min(counts.values()) > 80


def test_generator_honours_a_small_config():
    env = CountdownEnv(CountdownConfig(num_numbers=(2, 2), number_range=(1, 9), max_target=18))
    for seed in range(200):
        env.reset(seed=seed)
        assert len(env.numbers) == 2 and all(1 <= n <= 9 for n in env.numbers) and 1 <= env.target <= 18
        assert reachable([Fraction(n) for n in env.numbers], env.target)


def test_same_seed_same_puzzle_and_sampled_actions_use_the_numbers():
    a, b = CountdownEnv(), CountdownEnv()
    for seed in range(30):
        assert a.reset(seed=seed)[0] == b.reset(seed=seed)[0]
        action = a.sample_action(np.random.default_rng(seed))
        assert Counter(evaluate_expression(action).numbers) == Counter(a.numbers)
        assert score_answer(action, a.numbers, a.target).reward in (0.1, 1.0)


@pytest.mark.parametrize("overrides, message", [
    ({"num_numbers": (4, 3)}, "num_numbers must satisfy"),
    ({"num_numbers": (1, 3)}, "num_numbers must satisfy"),
    ({"num_numbers": (3, 7)}, "num_numbers must satisfy"),
    ({"number_range": (0, 9)}, "number_range must satisfy"),
    ({"max_target": 100}, "max_target must be >= max numbers x max number = 396"),
    ({"format_score": 2.0}, "format_score <= score"),
])
def test_bad_config_values_name_the_problem(overrides, message):
    with pytest.raises(EnvConfigError, match=message):
        CountdownConfig(**overrides)


def test_bad_config_through_make_is_an_env_config_error():
    with pytest.raises(EnvConfigError, match="num_numbers"):
        envs.make("countdown", num_numbers=(5, 3))
    with pytest.raises(EnvConfigError, match="num_numbers must be tuple"):
        envs.make("countdown", num_numbers=[3, 4])
