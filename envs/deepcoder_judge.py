"""DeepCoder's judge: a program's raw output → a verdict, and what the policy is told about it.

No sandbox here (envs/deepcoder.py runs the program and hands its SandboxResult over), so every
function can be tested on raw outputs alone. Two rules hold:

- The judge never raises. Every output — nesting past the recursion limit, 5000-digit ints,
  NaN, 1 MB lines, lone surrogates, no newline — gets a verdict and a message (a judge bug is
  the verdict `judge_error`, never an exception that ends a training run).
- The feedback (`feedback_text`, the next observation) gives nothing hidden away. By default it
  says the verdict in a fixed vocabulary, how many tests passed and which one failed first —
  never a hidden test's input or expected output, and nothing the program wrote (its output,
  stderr, exit code, signal or exception names are all its own choice and can carry its input).
  A test whose input and output the statement itself shows (`shown_by_statement`) may be
  shown. What remains is the verdict word the program can choose: at most log2(8) = 3 bits per
  turn about one hidden input, never an expected output. `feedback="verbose"` restores the
  old text (expected X, got Y, the sandbox's message), which lets a policy read the answers.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FEEDBACK_MODES = ("verdict", "verbose")
MAX_FEEDBACK_CHARS = 300
# Compiling for the feedback is the host's CPU: 0.24 s for a 648,000-character answer (DeepCoder's
# longest; `uncapped_compile_s` in docs/benchmarks/deepcoder_host_cost.json). 8,000 tokens of real
# code are some 32,000 characters, so longer programs are not compiled here.
MAX_COMPILE_CHARS = 100_000
# The only words the default feedback uses for a failure; the program can pick among them, no more.
VERDICT_WORDS = {
    "wrong_answer": "wrong answer", "runtime_error": "runtime error", "timeout": "time limit exceeded",
    "memory_limit": "memory limit exceeded", "output_limit": "output limit exceeded", "killed": "killed by a signal",
    "sandbox_error": "sandbox error", "judge_error": "judge error",
}

# Runs a function-call test: the solution's own prints go to stderr; the result, as JSON,
# is the one line on the real stdout. The expected value never enters the sandbox.
CALL_HARNESS = """\
import json, os, sys
result_fd = os.dup(1)
os.dup2(2, 1)
sys.stdout = sys.stderr  # line-buffered, so its prints and any traceback keep their order
request = json.loads(sys.stdin.read())
namespace = {"__name__": "solution", "__builtins__": __builtins__}
with open("solution.py", "rb") as handle:
    exec(compile(handle.read(), "solution.py", "exec"), namespace)
name = request["fn_name"]
target = namespace.get(name)
if target is None and isinstance(namespace.get("Solution"), type):
    target = getattr(namespace["Solution"](), name, None)
if not callable(target):
    raise NameError(f"the solution defines no function {name!r} (nor a Solution class with it)")
result = target(*request["args"])
try:
    text = json.dumps(result)
except (TypeError, ValueError) as error:
    raise TypeError(f"{name} returned a {type(result).__name__}, which JSON cannot hold: {error}") from None
sys.stdout.flush()
os.write(result_fd, text.encode() + b"\\n")
"""


@dataclass(frozen=True)
class CodeTest:
    kind: str  # "stdio" | "call"
    input: Any  # stdin text, or the list of call arguments
    expected: Any  # expected stdout text, or the expected return value (JSON)
    fn_name: str = ""
    wrapped: bool = False  # TACO's layout: the expected return value inside a one-element list


@dataclass(frozen=True)
class TestOutcome:
    verdict: str  # ok | wrong_answer | runtime_error | timeout | memory_limit | output_limit | killed
    #               | sandbox_error | judge_error
    message: str  # for the host (info, verbose feedback): may quote the program and the test
    cpu_seconds: float = 0.0
    host_cpu_seconds: float = 0.0  # what the run cost the host (SandboxResult.host_cpu_seconds)

    @property
    def passed(self) -> bool:
        return self.verdict == "ok"


def normalised_lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.strip().splitlines()]


def json_equal(a, b) -> bool:
    """Equality of JSON values where True is not 1 and 2 == 2.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _clip(text: str, limit: int = 80) -> str:
    """At most `limit` characters, surrogates escaped (a lone one cannot be encoded downstream)."""
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _shown(value) -> str:
    """An expected value or a stdout text, short, for host-side messages; never raises."""
    if isinstance(value, str):
        return _clip(repr(value[:200]))
    try:
        return _clip(json.dumps(value))
    except (TypeError, ValueError, RecursionError):
        return f"(a {type(value).__name__} too large or too deep to show)"


def judge(test: CodeTest, result) -> TestOutcome:
    """The verdict on one test from the sandbox's result (verdict, message, stdout, cpu_seconds)."""
    try:
        return _judge(test, result)
    except Exception as error:  # a judge bug must not end training; the verdict shows it, tests forbid it
        return TestOutcome("judge_error", f"the judge failed: {type(error).__name__}",
                           getattr(result, "cpu_seconds", 0.0))


def _judge(test: CodeTest, result) -> TestOutcome:
    cpu = result.cpu_seconds
    if result.verdict != "ok":
        return TestOutcome(result.verdict, result.message, cpu)
    if test.kind == "stdio":
        if normalised_lines(result.stdout) == normalised_lines(test.expected):
            return TestOutcome("ok", "output matches", cpu)
        message = f"expected {_shown(test.expected.strip())}, got {_shown(result.stdout.strip())}"
        return TestOutcome("wrong_answer", message, cpu)
    lines = result.stdout.strip().splitlines()
    if not lines:
        return TestOutcome("wrong_answer", f"{test.fn_name} returned nothing (the program exited first)", cpu)
    try:
        value = json.loads(lines[-1])
    except (ValueError, RecursionError):  # the program may write its own line: too deep, a 5000-digit int
        return TestOutcome("wrong_answer", "the function's result could not be read", cpu)
    expected = test.expected[0] if test.wrapped else test.expected
    try:
        equal = json_equal(value, expected) or (test.wrapped and json_equal(value, test.expected))
    except RecursionError:  # only as deep as the expected value, but the caller's stack is not ours
        equal = False
    if equal:
        return TestOutcome("ok", "result matches", cpu)
    # The line as written, not the value re-encoded: json.dumps would recurse one frame deeper than loads did.
    return TestOutcome("wrong_answer", f"expected {_shown(expected)}, got {_clip(lines[-1])}", cpu)


# --- what the policy is told ---------------------------------------------------------------

_INPUT_LABEL = re.compile(r"^[\W_]*(?:example\s*\d*\s*[:.]?\s*)?input\b", re.IGNORECASE)
_OUTPUT_LABEL = re.compile(r"^[\W_]*output\b[\W_]*?(?=[\w\[{\"'-]|$)", re.IGNORECASE)


def _json_forms(value) -> list[str]:
    try:
        return [json.dumps(value), json.dumps(value, separators=(",", ":"))]
    except (TypeError, ValueError, RecursionError):
        return []


def _shows_stdio(lines: list[str], test: CodeTest) -> bool:
    """The input's lines, whole and in a row, then within 3 lines the output's (an example block)."""
    given = [line for line in normalised_lines(test.input) if line]
    wanted = [line for line in normalised_lines(test.expected) if line]
    if not given or not wanted:
        return False
    for start in range(len(lines) - len(given) + 1):
        if lines[start: start + len(given)] == given:
            after = start + len(given)
            if any(lines[after + gap: after + gap + len(wanted)] == wanted for gap in range(4)):
                return True
    return False


def _find_token(line: str, forms: list[str], start: int) -> int:
    """The end of the first of `forms` in `line` at or after `start`, not inside a longer token; -1 if none."""
    ends = [match.end() for form in forms if form
            for match in [re.compile(r"(?<![\w.-])" + re.escape(form) + r"(?![\w.])").search(line, start)] if match]
    return min(ends, default=-1)


def _shows_call(lines: list[str], test: CodeTest) -> bool:
    """An "Input: a = …, b = …" line holding every argument in order, then within 3 lines an "Output: …" line
    that is exactly the expected value (LeetCode's and LiveCodeBench's example layout)."""
    expected = _json_forms(test.expected[0] if test.wrapped else test.expected)
    arguments = [_json_forms(arg) for arg in test.input]
    if not expected or not all(arguments):
        return False
    for number, line in enumerate(lines):
        label = _INPUT_LABEL.match(line)
        if not label:
            continue
        position = label.end()
        for forms in arguments:
            position = _find_token(line, forms, position)
            if position < 0:
                break
        if position < 0:
            continue
        for later in lines[number + 1: number + 4]:
            output = _OUTPUT_LABEL.match(later)
            if output and output.group().strip() and later[output.end():].strip().rstrip(".") in expected:
                return True
    return False


def shown_by_statement(statement: str, test: CodeTest) -> bool:
    """Whether the statement shows this test's input and its output, as an example does.

    Strict on purpose: a miss only withholds an example the policy can read anyway, a false match
    would show a hidden test."""
    try:
        if len(str(test.input)) + len(str(test.expected)) > 2 * len(statement):  # cheap: most hidden tests
            return False
        lines = [line for line in normalised_lines(statement) if line]
        return _shows_call(lines, test) if test.kind == "call" else _shows_stdio(lines, test)
    except (TypeError, ValueError, RecursionError):  # odd data: treat the test as hidden
        return False


def syntax_error(code: str) -> str | None:
    """Why `code` does not parse, from the code alone (so it tells nothing about the tests); None if it
    does, or if it is longer than MAX_COMPILE_CHARS."""
    if len(code) > MAX_COMPILE_CHARS:
        return None
    try:
        ast.parse(code)
    except SyntaxError as error:
        return _clip(f"line {error.lineno}: {error.msg}", 120)
    except (ValueError, UnicodeError, RecursionError, MemoryError, OverflowError):
        return None
    return None


def _example(test: CodeTest, number: int) -> str:
    if test.kind == "call":
        given = ", ".join(_json_forms(arg)[0] for arg in test.input)
        wanted = _json_forms(test.expected[0] if test.wrapped else test.expected)[0]
    else:
        given, wanted = test.input.strip(), test.expected.strip()
    return (f" Test {number} is an example of the statement: input\n{_clip(given, MAX_FEEDBACK_CHARS)}\n"
            f"expected output\n{_clip(wanted, MAX_FEEDBACK_CHARS)}")


def feedback_text(outcomes: Sequence[TestOutcome], tests: Sequence[CodeTest], statement: str, code: str,
                  mode: str = "verdict") -> str:
    """The next observation after a program was judged (see the module docstring for what it may say)."""
    passed = sum(outcome.passed for outcome in outcomes)
    if passed == len(tests):
        return f"Correct! All {len(tests)} tests passed."
    number, outcome = next((n, o) for n, o in enumerate(outcomes, start=1) if not o.passed)
    head = f"Incorrect. Passed {passed}/{len(tests)} tests. Test {number} failed"
    if mode == "verbose":
        return f"{head} ({f'{outcome.verdict}: {outcome.message}'[:MAX_FEEDBACK_CHARS]})."
    text = f"{head} ({VERDICT_WORDS.get(outcome.verdict, 'failed')})."
    if outcome.verdict == "runtime_error" and (error := syntax_error(code)):
        text += f" The program does not compile: {error}."
    test = tests[number - 1]
    if shown_by_statement(statement, test):
        text += _example(test, number)
    return text
