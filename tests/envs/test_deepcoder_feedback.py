"""DeepCoder's reward cannot be farmed through its feedback, and its judge never raises (issue 29).

The oracle below is the issue's strategy: a "solution" that writes a digest of its input where
the feedback may echo it, and answers from a table built out of the feedback. With
`feedback="verbose"` it reaches success without computing anything; by default it learns nothing.
"""

from __future__ import annotations

import ast
import json
import re
import zlib
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import envs
from envs.deepcoder import CodeTest, DeepCoderConfig, load_problems
from envs.deepcoder_judge import VERDICT_WORDS, feedback_text, judge, shown_by_statement
from envs.parsing import format_response
from envs.sandbox import SandboxResult

WORDS = "|".join(re.escape(word) for word in VERDICT_WORDS.values())
# Everything the default feedback may say on a problem whose statement shows no test.
FIXED_FEEDBACK = re.compile(rf"Correct! All \d+ tests passed\.|Incorrect\. Passed \d+/\d+ tests\. "
                            rf"Test \d+ failed \(({WORDS})\)\.")
TURNS = 8

ORACLE = '''
import json, os, sys, zlib
TABLE = json.loads({table!r})
CHANNEL = {channel}
def digest(text):
    return format(zlib.crc32(text.encode()), "08x")
def leak(d):
    if CHANNEL == 0:
        return d  # the issue's strategy: read back from "got ..."
    if CHANNEL == 1:
        raise ValueError(d)  # the traceback's last line
    if CHANNEL == 2:
        raise type("Leak_" + d, (Exception,), {{}})()  # an exception class named after the input
    if CHANNEL == 3:
        sys.stderr.write(d + chr(10))
        sys.stderr.flush()
        os._exit(int(d[:2], 16) or 1)  # the exit code
    if CHANNEL == 4:
        os.kill(os.getpid(), 1 + int(d, 16) % 15)  # the signal's name
    bit = int(d, 16) % 3  # the verdict itself: the one choice left to the program, 3 bits at most
    if bit == 0:
        bytearray(2 ** 40)
    if bit == 1:
        sys.stdout.write("x" * (2 ** 21))
    raise SystemExit(1)
'''
CALL_MAIN = '''
def _answer(*args):
    d = digest(json.dumps(list(args)))
    return TABLE[d] if d in TABLE else leak(d)
def {fn}(*args):
    return _answer(*args)
class Solution:
    def {fn}(self, *args):
        return _answer(*args)
'''


def oracle_program(problem, table: dict, channel: int) -> str:
    code = ORACLE.format(table=json.dumps(table), channel=channel)
    call = next((test for test in problem.tests if test.kind == "call"), None)
    if call is None:
        return code + ("data = sys.stdin.read()\nd = digest(data)\n"
                       "print(TABLE[d] if d in TABLE else leak(d))\n")
    return code + CALL_MAIN.format(fn=call.fn_name)


def digest_of(test: CodeTest) -> str:
    text = test.input if test.kind == "stdio" else json.dumps(list(test.input))
    return format(zlib.crc32(text.encode()), "08x")


VERBOSE_FAILURE = re.compile(r"wrong_answer: expected (.*), got (.*)\)\.$", re.DOTALL)


def learn(observation: str, table: dict, kind: str) -> None:
    """What the oracle reads off the feedback: the verbose wording's "expected X, got <digest>"."""
    found = VERBOSE_FAILURE.search(observation)
    if not found:
        return
    try:
        if kind == "stdio":
            table[ast.literal_eval(found.group(2))] = ast.literal_eval(found.group(1))
        else:
            table[json.loads(found.group(2))] = json.loads(found.group(1))
    except (ValueError, SyntaxError):
        pass  # a clipped value: nothing learnt this turn


def play_oracle(problem_id: str, channels, **overrides) -> tuple[list[float], list[str], bool]:
    env = envs.make("deepcoder", max_actions_per_traj=TURNS, **overrides)
    for seed in range(2000):
        if env.reset(seed=seed)[1]["problem_id"] == problem_id:
            break
    kind = env.problem.tests[0].kind
    table, rewards, observations, success = {}, [], [], False
    for turn in range(TURNS):
        code = oracle_program(env.problem, table, channels[turn % len(channels)])
        obs, reward, terminated, truncated, info = env.step(format_response([code], think="oracle"))
        rewards.append(reward)
        observations.append(obs)
        learn(obs, table, kind)
        success = info["success"]
        if terminated or truncated:
            break
    return rewards, observations, success


def constant_reward(problem) -> float:
    """The best reward an answer that ignores its input gets (judged here, no sandbox needed)."""
    if problem.tests[0].kind == "stdio":
        outputs = ["", "0", "1", "-1", "YES", "NO", "Yes", "No", "True", "False"]
    else:
        outputs = [json.dumps(value) for value in (0, 1, -1, True, False, None, [], "", {})]
    best = 0.0
    for output in outputs:
        result = SandboxResult("ok", "exited normally", stdout=output + "\n")
        best = max(best, sum(judge(test, result).passed for test in problem.tests) / len(problem.tests))
    return best


def test_the_oracle_farms_the_verbose_feedback():
    """The strategy is real: where the feedback shows expected outputs it succeeds, one test a turn."""
    for problem_id in ("sum_two", "add"):
        rewards, _, success = play_oracle(problem_id, channels=(0,), feedback="verbose")
        assert success and rewards == [0.0, 0.25, 0.5, 0.75, 1.0], (problem_id, rewards)


def test_the_oracle_learns_nothing_from_the_default_feedback():
    """8 turns on every shipped problem, each turn leaking the digest through another channel (output,
    exception message, exception class name, exit code, signal, verdict): no success, no reward above
    a constant answer's, and every observation is the fixed wording without a digest in it."""
    problems = load_problems(DeepCoderConfig())
    channels = (0, 1, 2, 3, 4, 5)
    with ThreadPoolExecutor(max_workers=4) as pool:
        games = list(pool.map(lambda p: play_oracle(p.problem_id, channels), problems))
    assert len(games) == 31
    over = {}
    for problem, (rewards, observations, success) in zip(problems, games):
        assert len(rewards) == TURNS and not success, problem.problem_id
        if max(rewards) > constant_reward(problem):
            over[problem.problem_id] = rewards
        digests = {digest_of(test) for test in problem.tests}
        for obs in observations:
            assert FIXED_FEEDBACK.fullmatch(obs), (problem.problem_id, obs)
            assert not any(d in obs for d in digests), (problem.problem_id, obs)
    assert over == {}
    assert max(max(rewards) for rewards, _, _ in games) == 0.0  # a digest is never an answer


# --- the statement's own examples may be shown ---------------------------------------------------

CODEFORCES = "Sum the numbers.\n\n-----Examples-----\nInput\n3\n1 2 3\n\nOutput\n6\n\nInput\n1\n5\nOutput\n5\n"
LEETCODE = ("Return the indices of the two numbers that add up to target.\n\nExample 1:\n\n"
            "Input: nums = [2,7,11,15], target = 9\nOutput: [0,1]\nExplanation: nums[0] + nums[1] == 9.\n\n"
            "Constraints:\n2 <= nums.length <= 10^4\n-10^9 <= nums[i] <= 10^9\n")


@pytest.mark.parametrize("statement, test, shown", [
    (CODEFORCES, CodeTest("stdio", "3\n1 2 3\n", "6\n"), True),
    (CODEFORCES, CodeTest("stdio", "1\n5", "5"), True),
    (CODEFORCES, CodeTest("stdio", "3\n1 2 3\n", "5\n"), False),  # the input is shown, this output is not
    (CODEFORCES, CodeTest("stdio", "2\n4 5\n", "9\n"), False),
    (CODEFORCES, CodeTest("stdio", "6\n", "3\n"), False),  # both lines appear, but not as input then output
    (CODEFORCES, CodeTest("stdio", "", "6\n"), False),
    (LEETCODE, CodeTest("call", [[2, 7, 11, 15], 9], [[0, 1]], "two_sum", True), True),
    (LEETCODE, CodeTest("call", [[2, 7, 11, 15], 9], [0, 1], "two_sum"), True),
    (LEETCODE, CodeTest("call", [[2, 7, 11, 15], 9], [[1, 0]], "two_sum", True), False),
    (LEETCODE, CodeTest("call", [[2, 7], 9], [[0, 1]], "two_sum", True), False),
    (LEETCODE, CodeTest("call", [2, 4], [[0, 1]], "two_sum", True), False),  # numbers of the constraints
    ("Write add(a, b). add(1, 2) == 3.", CodeTest("call", [1, 2], [3], "add", True), False),  # no labels: hidden
])
def test_a_test_counts_as_shown_only_when_the_statement_shows_its_input_then_its_output(statement, test, shown):
    assert shown_by_statement(statement, test) is shown


def test_a_failed_example_of_the_statement_is_shown_a_hidden_one_is_not(tmp_path):
    row = {"problem": CODEFORCES, "tests": [{"type": "stdin_stdout", "input": "3\n1 2 3\n", "output": "6\n"},
                                            {"type": "stdin_stdout", "input": "2\n40 2\n", "output": "42\n"}]}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    env = envs.make("deepcoder", source="file", path=str(path), max_actions_per_traj=2)
    env.reset(seed=0)
    obs = env.step(format_response(["print(0)"], think="t"))[0]
    assert obs == ("Incorrect. Passed 0/2 tests. Test 1 failed (wrong answer). Test 1 is an example of the "
                   "statement: input\n3\n1 2 3\nexpected output\n6")
    obs = env.step(format_response(["print(6)"], think="t"))[0]
    assert obs == "Incorrect. Passed 1/2 tests. Test 2 failed (wrong answer)."


# --- the judge never raises ------------------------------------------------------------------------

STDIO_TEST = CodeTest("stdio", "1 2\n", "3\n")
CALL_TESTS = [CodeTest("call", [1, 2], [3], "f", True), CodeTest("call", [[1]], [[[1]]], "f", True),
              CodeTest("call", ["a"], {"k": [1.5, None]}, "f")]
TESTS = [STDIO_TEST, *CALL_TESTS]


def nested(depth: int, opener: str) -> str:
    closer = {"[": "]", '{"a":': "}"}[opener]
    return opener * depth + "1" * (opener == '{"a":') + closer * depth


def assert_judged(test: CodeTest, stdout: str, verdict: str = "ok", message: str = "exited normally") -> None:
    outcome = judge(test, SandboxResult(verdict, message, stdout=stdout))
    assert outcome.verdict in VERDICT_WORDS or outcome.verdict == "ok"
    assert outcome.verdict != "judge_error", outcome.message
    assert isinstance(outcome.message, str) and outcome.message
    if verdict == "ok":
        outcome.message.encode("utf-8")  # no lone surrogate: the message can be logged and tokenised
    for mode in ("verdict", "verbose"):
        text = feedback_text([outcome], [test], "Solve it.", "print(1)", mode)
        assert isinstance(text, str) and text
    default = feedback_text([outcome], [test], "Solve it.", "print(1)")
    assert FIXED_FEEDBACK.fullmatch(default), default


def deep_stack(frames: int, function, *args):
    """Call `function` under `frames` extra frames: the judge must not rely on a shallow caller."""
    return function(*args) if frames == 0 else deep_stack(frames - 1, function, *args)


@pytest.mark.parametrize("test", TESTS, ids=lambda t: t.kind)
@pytest.mark.parametrize("frames", [0, 300])
def test_every_nesting_depth_from_900_to_1100_gets_a_verdict(test, frames):
    for depth in range(900, 1101):
        for opener in ("[", '{"a":'):
            for tail in ("\n", ""):
                deep_stack(frames, assert_judged, test, nested(depth, opener) + tail)


HOSTILE_LINES = st.one_of(
    st.builds(nested, st.integers(900, 1100), st.sampled_from(["[", '{"a":'])),
    st.integers(4000, 6000).map(lambda n: "9" * n),  # past int's 4300-digit limit, or just under it
    st.integers(0, 10**6).map(lambda n: str(-(10 ** 300) - n)),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "[NaN]", '{"a": Infinity}', "1e999", "-0", "[1, 2, 3"]),
    st.binary(max_size=64).map(lambda b: b.decode("utf-8", "replace")),  # invalid UTF-8, as the sandbox decodes it
    st.binary(max_size=64).map(lambda b: b.decode("utf-8", "surrogateescape")),  # lone surrogates
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=8),
    st.sampled_from(["x", "[", "9", '"', "\u2028", "\x00", "🙂"]).map(lambda c: c * 2**20),  # 1 MB lines
    st.text(max_size=40),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                 max_leaves=10).map(json.dumps),
)


@settings(max_examples=150, deadline=timedelta(seconds=5), suppress_health_check=[HealthCheck.too_slow,
                                                                                   HealthCheck.data_too_large])
@given(lines=st.lists(HOSTILE_LINES, min_size=1, max_size=3), newline=st.booleans(),
       test=st.sampled_from(TESTS), frames=st.integers(0, 300))
@example(lines=[nested(989, "[")], newline=True, test=CALL_TESTS[0], frames=0)  # the crash
def test_any_program_output_gets_a_verdict_and_a_message(lines, newline, test, frames):
    deep_stack(frames, assert_judged, test, "\n".join(lines) + ("\n" if newline else ""))


@settings(max_examples=60, deadline=timedelta(seconds=5))
@given(verdict=st.sampled_from(sorted(set(VERDICT_WORDS) - {"judge_error"})), message=st.text(max_size=200),
       stdout=st.text(max_size=200), test=st.sampled_from(TESTS))
def test_sandbox_verdicts_reach_the_policy_as_a_word_only(verdict, message, stdout, test):
    """The sandbox's message quotes the program (its last stderr line, exit code, signal): not shown."""
    assert_judged(test, stdout, verdict, message or "x")


# --- end to end: env.step returns for every hostile output --------------------------------------

RAW_RESULT = "import os\nos.write(3, {data!r})\nos._exit(0)\n"  # straight to the harness's result pipe
CALL_ANSWERS = [f"def add(a, b):\n    x = 1\n    for _ in range({depth}):\n        x = [x]\n    return x"
                for depth in (900, 988, 989, 990, 1000, 1100)] + [
    RAW_RESULT.format(data=data) for data in (b"NaN", b"[Infinity]", b"9" * 5000 + b"\n", b"\xff\xfe\xed\n",
                                              b"\xed\xa0\x80", b"[" * 2**20)]
STDIO_ANSWERS = ["import sys\nsys.stdout.buffer.write(b'\\xff\\xfe' * 1000)",
                 "import sys\nsys.stdout.write('9' * 2**20)", "print('\\udcff')",
                 "import sys\nsys.stdout.write('[' * 1100 + ']' * 1100)"]


@pytest.mark.parametrize("problem_id, code", [("add", code) for code in CALL_ANSWERS]
                         + [("sum_two", code) for code in STDIO_ANSWERS])
def test_env_step_returns_for_hostile_outputs(problem_id, code):
    env = envs.make("deepcoder", max_tests=1)
    for seed in range(2000):
        if env.reset(seed=seed)[1]["problem_id"] == problem_id:
            break
    obs, reward, terminated, truncated, info = env.step(format_response([code], think="t"))
    assert reward == 0.0 and truncated and not terminated
    assert FIXED_FEEDBACK.fullmatch(obs), obs
    assert info["action_infos"][0]["verdicts"][0] in set(VERDICT_WORDS) - {"judge_error"}
