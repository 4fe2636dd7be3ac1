"""Countdown: combine the given numbers with + - * / into an expression that equals a target.

    obs:    "Target: 24, nums: [3, 5, 2, 14]"
    answer: <answer>(5 - 3) * 14 - 2 * 2</answer>   (free-form arithmetic)

Problems are generated in-process from the instance rng: 3–4 numbers and a target reached
by combining all of them, so every instance has a solution (the one we built is in the
reset info as `solution`).

Answers are evaluated by our own tokenizer and an iterative operator-precedence parser over
exact fractions. Nothing the model writes reaches `eval`: the grammar has integers, + - * /,
parentheses and unary plus and minus (as Python's eval, which both references use, has),
nothing else. The input is capped in length (100,000 characters), number count (64) and
literal size (12 digits), all above anything the references can score, and nesting costs
no recursion, so hostile text costs milliseconds and never raises.

Reward (RAGEN's score / format_score, decided here for inputs RAGEN's regex could not tell
apart):
    1.0  the expression uses exactly the given numbers (as a multiset) and equals the target;
    0.1  it parses and uses exactly the given numbers but its value is wrong, is undefined
         (division by zero), or a trailing "= N" states a number other than the target;
    0.0  anything else: unparseable text, other numbers, a number used twice or left out.
RAGEN also gave 0.1 to unparseable text whose digits matched (e.g. "3 5 2"); we give 0,
since the bonus is meant to reward a well-formed equation. Any non-empty answer ends the
episode (one answer per puzzle, like RAGEN).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from envs.base import ActionOutcome, EnvConfig, EnvConfigError, TextEnv
from envs import ragen_text
from envs.registry import register

# Bounds against hostile text, set above what the references (RAGEN-2, TinyZero: Python's
# eval after a digit-multiset check) can score: their answers must use the given <= 6 numbers.
MAX_EXPRESSION_CHARS = 100_000  # linear-time tokenizing and evaluation: milliseconds
MAX_LITERALS = 64  # bounds big-number work (a chain of divisions grows every denominator)
MAX_LITERAL_DIGITS = 12
MAX_NUMBERS = 6  # keeps generated expressions short and the reachability brute force cheap
GENERATION_TRIES = 64

_OPERATOR_ALIASES = {"×": "*", "÷": "/", "−": "-"}  # what models often write instead
_STATED_RESULT = re.compile(r"-?[0-9]{1,%d}" % MAX_LITERAL_DIGITS)


class ExpressionError(ValueError):
    """The answer is not an arithmetic expression we accept; the message says why."""


@dataclass(frozen=True)
class EvaluatedExpression:
    value: Fraction | None  # None when a division by zero made it undefined
    numbers: tuple[int, ...]  # every literal, in the order written
    stated_result: int | None = None  # N from a trailing "= N"


# Runs, so long inputs stay fast; possessive, so a run is never re-split (each class is disjoint from
# the next, so no match changes): one pass over model output.
_TOKENS = re.compile(r"(\s++)|([0-9]++)|([-+*/()]++)|(.)", re.DOTALL)
_ALIAS_TABLE = str.maketrans(_OPERATOR_ALIASES)


def _tokenize(text: str) -> list:
    """Integers and the single-character operators; anything else is an ExpressionError."""
    tokens: list = []
    literals = 0
    for match in _TOKENS.finditer(text.translate(_ALIAS_TABLE)):
        space, digits, operators, other = match.groups()
        if space:
            continue
        if digits:
            if len(digits) > MAX_LITERAL_DIGITS:
                raise ExpressionError(
                    f"number at position {match.start()} has more than {MAX_LITERAL_DIGITS} digits")
            literals += 1
            if literals > MAX_LITERALS:
                raise ExpressionError(f"more than {MAX_LITERALS} numbers")
            tokens.append(int(digits))
        elif operators:
            if "**" in operators:
                raise ExpressionError("'**' (power) is not allowed: use + - * / only")
            tokens.extend(operators)
        elif other == ".":
            raise ExpressionError(f"decimal point at position {match.start()}: use the given integers only")
        else:
            raise ExpressionError(f"unexpected character {other!r} at position {match.start()}")
    return tokens


def _combine(operator: str, left: Fraction | None, right: Fraction | None) -> Fraction | None:
    if left is None or right is None:
        return None
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    return None if right == 0 else left / right


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_UNARY = {"+": "u+", "-": "u-"}


def _apply(operator: str, values: list) -> None:
    if operator in ("u+", "u-"):
        value = values.pop()
        values.append(value if operator == "u+" or value is None else -value)
    else:
        right = values.pop()
        values.append(_combine(operator, values.pop(), right))


def _evaluate(tokens: list) -> tuple[Fraction | None, list[int]]:
    """Shunting-yard over the grammar
        expression := term (('+'|'-') term)*;  term := unary (('*'|'/') unary)*;
        unary := ('+'|'-') unary | primary;  primary := INTEGER | '(' expression ')'
    with explicit stacks, not recursion, so nesting depth costs memory, never Python's stack
    (RAGEN-2's and TinyZero's eval accept 200 parentheses and about 2,000 unary signs)."""
    if not tokens:
        raise ExpressionError("empty expression")
    values: list = []
    operators: list[str] = []
    numbers: list[int] = []
    expect_operand = True
    for token in tokens:
        if expect_operand:
            if isinstance(token, int):
                values.append(Fraction(token))
                numbers.append(token)
                expect_operand = False
            elif token in _UNARY:
                sign = _UNARY[token]
                if operators and operators[-1] in ("u+", "u-"):  # a run of signs folds into one
                    sign = "u-" if (operators.pop() == "u-") != (sign == "u-") else "u+"
                operators.append(sign)
            elif token == "(":
                operators.append("(")
            else:
                raise ExpressionError(f"unexpected {token!r} where a number was expected")
        elif token in _PRECEDENCE:
            # Unary signs bind tighter than any binary operator; equal precedence is left-associative.
            while operators and operators[-1] != "(" and (
                    operators[-1] in ("u+", "u-") or _PRECEDENCE[operators[-1]] >= _PRECEDENCE[token]):
                _apply(operators.pop(), values)
            operators.append(token)
            expect_operand = True
        elif token == ")":
            while operators and operators[-1] != "(":
                _apply(operators.pop(), values)
            if not operators:
                raise ExpressionError("unexpected ')' without a matching '('")
            operators.pop()
        else:
            raise ExpressionError(f"unexpected {token!r} after a complete expression")
    if expect_operand:
        raise ExpressionError("expression ends where a number was expected")
    while operators:
        operator = operators.pop()
        if operator == "(":
            raise ExpressionError("unbalanced parentheses: missing ')'")
        _apply(operator, values)
    return values[0], numbers


def evaluate_expression(text: str) -> EvaluatedExpression:
    """Parse and evaluate `expr` or `expr = N` exactly; raise ExpressionError if malformed."""
    if not isinstance(text, str):
        raise ExpressionError(f"expression must be str, got {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    left, *rest = text.split("=")
    if len(rest) > 1:
        raise ExpressionError("more than one '='")
    stated = None
    if rest:
        stated_text = rest[0].strip()
        if not _STATED_RESULT.fullmatch(stated_text):
            raise ExpressionError(f"after '=' expected a whole number, got {stated_text[:40]!r}")
        stated = int(stated_text)
    value, numbers = _evaluate(_tokenize(left))
    return EvaluatedExpression(value=value, numbers=tuple(numbers), stated_result=stated)


@dataclass(frozen=True)
class CountdownVerdict:
    reward: float
    correct: bool
    verdict: str  # correct | wrong_value | division_by_zero | wrong_stated_result | wrong_numbers | malformed
    reason: str

    def to_info(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "correct": self.correct}


def score_answer(answer: str, numbers, target: int, *, score: float = 1.0,
                 format_score: float = 0.1) -> CountdownVerdict:
    """Score one answer against a puzzle (see the module docstring for the rules)."""
    try:
        result = evaluate_expression(answer)
    except ExpressionError as error:
        return CountdownVerdict(0.0, False, "malformed", str(error))
    if Counter(result.numbers) != Counter(int(n) for n in numbers):
        return CountdownVerdict(0.0, False, "wrong_numbers",
                                f"used {sorted(result.numbers)}, must use each of {sorted(numbers)} once")
    if result.value is None:
        return CountdownVerdict(format_score, False, "division_by_zero", "the expression divides by zero")
    if result.stated_result is not None and result.stated_result != target:
        return CountdownVerdict(format_score, False, "wrong_stated_result",
                                f"states {result.stated_result}, the target is {target}")
    if result.value != target:
        return CountdownVerdict(format_score, False, "wrong_value", f"equals {result.value}, not {target}")
    return CountdownVerdict(score, True, "correct", f"equals {target}")


def generate_puzzle(rng: np.random.Generator, num_numbers: tuple[int, int], number_range: tuple[int, int],
                    max_target: int) -> tuple[tuple[int, ...], int, str]:
    """Draw numbers, then combine all of them in a random order with random operators.

    Intermediate results stay non-negative integers (a smaller minus a larger is flipped,
    an inexact division becomes another operator), so the built solution reads naturally.
    A target outside 1..max_target is redrawn; after GENERATION_TRIES the sum is used,
    which the config guarantees is in range. Returns (numbers, target, solution).
    """
    count = int(rng.integers(num_numbers[0], num_numbers[1] + 1))
    numbers = tuple(int(n) for n in rng.integers(number_range[0], number_range[1] + 1, size=count))
    for _ in range(GENERATION_TRIES):
        pool = [(n, str(n)) for n in numbers]
        while len(pool) > 1:
            i, j = (int(k) for k in rng.choice(len(pool), size=2, replace=False))
            (a, a_text), (b, b_text) = pool[i], pool[j]
            pool = [item for k, item in enumerate(pool) if k not in (i, j)]
            operator = "+-*/"[int(rng.integers(4))]
            if operator == "/" and (b == 0 or a % b != 0):
                operator = "+-*"[int(rng.integers(3))]
            if operator == "-" and a < b:
                (a, a_text), (b, b_text) = (b, b_text), (a, a_text)
            value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[operator]
            pool.append((value, f"({a_text} {operator} {b_text})"))
        target, solution = pool[0]
        if 1 <= target <= max_target:
            return numbers, target, _strip_outer_parentheses(solution)
    return numbers, sum(numbers), " + ".join(str(n) for n in numbers)


def _strip_outer_parentheses(text: str) -> str:
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for index, char in enumerate(text):
            depth += char == "("
            depth -= char == ")"
            if depth == 0 and index < len(text) - 1:
                return text  # "(a) + (b)": the outer pair does not enclose everything
        return text[1:-1]
    return text


def _check_int_pair(name: str, value, low: int, high: int) -> None:
    ok = (isinstance(value, tuple) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in value))
    if not ok:
        raise EnvConfigError(f"{name} must be a pair of ints (low, high), got {value!r}")
    if not low <= value[0] <= value[1] <= high:
        raise EnvConfigError(f"{name} must satisfy {low} <= low <= high <= {high}, got {value!r}")


@dataclass(frozen=True)
class CountdownConfig(EnvConfig):
    max_actions_per_traj: int = 1
    num_numbers: tuple[int, int] = (3, 4)  # inclusive range of how many numbers a puzzle has
    number_range: tuple[int, int] = (1, 99)  # inclusive range of each number
    max_target: int = 1000
    score: float = 1.0  # reward for a correct equation
    format_score: float = 0.1  # reward for a well-formed equation with the right numbers but wrong value

    def __post_init__(self) -> None:
        _check_int_pair("num_numbers", self.num_numbers, 2, MAX_NUMBERS)
        _check_int_pair("number_range", self.number_range, 1, 10**6)
        if not isinstance(self.max_target, int) or isinstance(self.max_target, bool) or self.max_target > 10**9:
            raise EnvConfigError(f"max_target must be an int <= 10**9, got {self.max_target!r}")
        largest_sum = self.num_numbers[1] * self.number_range[1]
        if self.max_target < largest_sum:
            # The generator falls back to the sum of the numbers, which must be a legal target.
            raise EnvConfigError(
                f"max_target must be >= max numbers x max number = {largest_sum}, got {self.max_target}")
        if not (np.isfinite(self.score) and np.isfinite(self.format_score) and 0 <= self.format_score <= self.score):
            raise EnvConfigError(
                f"need finite 0 <= format_score <= score, got format_score={self.format_score}, score={self.score}")
        super().__post_init__()


class CountdownEnv(TextEnv):
    config_cls = CountdownConfig

    def __init__(self, config: CountdownConfig | None = None):
        super().__init__(config)
        self.numbers: tuple[int, ...] = ()
        self.target = 0
        self.solution = ""
        self.feedback: str | None = None

    @property
    def ragen_instruction(self) -> str:
        return ragen_text.COUNTDOWN

    @property
    def instruction(self) -> str:
        example = "<answer>2 + 5 - 3</answer>"
        if self.config.require_think:
            example = "<think> 2 + 5 = 7, 7 - 3 = 4. </think>" + example
        return ("You are solving the Countdown puzzle. Use every number in the list exactly once, with "
                "+ - * / and parentheses, to write an expression that equals the target. "
                f"Example: target 4 with nums [3, 5, 2]: {example}")

    def _reset(self, rng: np.random.Generator) -> dict:
        config = self.config
        self.numbers, self.target, self.solution = generate_puzzle(
            rng, config.num_numbers, config.number_range, config.max_target)
        self.feedback = None
        return {"numbers": list(self.numbers), "target": self.target, "solution": self.solution}

    def _apply_action(self, action: str) -> ActionOutcome:
        verdict = score_answer(action, self.numbers, self.target,
                               score=self.config.score, format_score=self.config.format_score)
        self.feedback = f"Your answer got {verdict.reward:g} points."
        return ActionOutcome(verdict.reward, terminated=True, success=verdict.correct, info=verdict.to_info())

    def render(self) -> str:
        if self.feedback is not None:
            return self.feedback
        return f"Target: {self.target}, nums: {list(self.numbers)}"

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random expression over this puzzle's numbers (each used once; usually wrong)."""
        if not self.numbers:
            return "0"
        order = rng.permutation(len(self.numbers))
        text = str(self.numbers[order[0]])
        for index in order[1:]:
            operator = "+-*/"[int(rng.integers(4))]
            text = f"{text} {operator} {self.numbers[index]}"
            if rng.random() < 0.3:
                text = f"({text})"
        return text


register("countdown", CountdownEnv, CountdownConfig(),
         "Countdown: reach the target with + - * / over 3-4 given numbers (single turn)")
