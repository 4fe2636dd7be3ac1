"""Every regular expression applied to model output is linear: each function that applies one is fed
envs.checker.adversarial_texts (long runs ended by a character no run continues with, openers
left open, tokens repeated unclosed) at its env's longest reply, and must return within
CALL_CPU_SECONDS of this thread's CPU. The rewrites must also return what the patterns they
replace returned (those patterns are kept here as references, run on short text only).

Where the regexes are: envs/deepcoder.py (`_FENCE`), envs/searchqa.py (actions and free-text
answers), envs/math_answers.py (numbers), envs/countdown.py (tokens, stated result),
envs/parsing.py (blanks between tags), envs/webshop.py and envs/webshop_catalog.py (spaces, search
words), envs/retrieval.py (query words). ragen2/ applies none to model output
(instruments/completions.py clips by length); envs/deepcoder_judge.py's label patterns read
problem statements, and envs/webshop_reward.py's product titles and options, not answers.
"""

from __future__ import annotations

import re
import textwrap
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs import countdown, deepcoder, math_answers, retrieval, searchqa, webshop, webshop_catalog
from envs.checker import adversarial_texts, max_reply_chars
from envs.parsing import parse_response

# Linear work on these lengths takes milliseconds (648,000 characters at most); the quadratic
# patterns fixed here took 2.85 s at 32,000 characters and grow fourfold per doubling. Thread
# CPU, so a busy CI machine's waiting does not count.
CALL_CPU_SECONDS = 0.5


def _reply_chars(env_name: str) -> int:
    return max_reply_chars(envs.make(env_name))


def _tolerant(function):
    def call(text):
        try:
            function(text)
        except (ValueError, ArithmeticError):  # e.g. ExpressionError: only the time matters here
            pass
    return call


# (name, function over model output, the env whose reply length applies)
APPLIED = [
    ("deepcoder.extract_code", deepcoder.extract_code, "deepcoder"),  # with its dedent
    ("deepcoder.parse", lambda text, env=envs.make("deepcoder"): env.parse(text), "deepcoder"),
    ("parsing.parse_response", lambda text: parse_response(text, require_think=True), "deepcoder"),
    ("searchqa.free_text_answer", searchqa.free_text_answer, "searchqa"),
    ("searchqa.canonical_action", searchqa.canonical_action, "searchqa"),
    ("searchqa.ragen_action", searchqa.ragen_action, "searchqa"),
    ("searchqa.answer_reward", lambda text: searchqa.answer_reward(text, "Paris"), "searchqa"),
    ("retrieval.tokenize", retrieval.tokenize, "searchqa"),
    ("math_answers.answers_match", lambda text: math_answers.answers_match(text, "42", "math"), "metamathqa_math"),
    ("math_answers.parse_number", math_answers.parse_number, "metamathqa_math"),
    ("math_answers.canonical_math_text", math_answers.canonical_math_text, "metamathqa_math"),
    ("countdown.evaluate_expression", _tolerant(countdown.evaluate_expression), "countdown"),
    ("countdown._tokenize", _tolerant(countdown._tokenize), "countdown"),
    ("webshop.canonical_action", webshop.canonical_action, "webshop"),
    ("webshop_catalog.search_tokens", webshop_catalog.search_tokens, "webshop"),
]
_SHAPES: dict[int, list[str]] = {}


def _shapes(length: int) -> list[str]:
    return _SHAPES.setdefault(length, adversarial_texts(length))


@pytest.mark.parametrize("name,function,env_name", APPLIED, ids=[row[0] for row in APPLIED])
def test_each_regex_is_linear_on_adversarial_text_at_the_full_reply_length(name, function, env_name):
    length = _reply_chars(env_name)
    for text in _shapes(length) + [f"<answer>{text}</answer>" for text in _shapes(length)[:8]]:
        start = time.thread_time()
        function(text)
        spent = time.thread_time() - start
        assert spent < CALL_CPU_SECONDS, (name, ascii(text[:40]), len(text), round(spent, 3))


def test_the_fence_that_took_twelve_seconds_takes_milliseconds():
    """The issue's case at DeepCoder's full budget: a fence, 648,000 blanks and a character that
    ends neither run (64,000 blanks alone took 11.85 s through extract_code)."""
    answer = "```" + " " * (_reply_chars("deepcoder") - 4) + "!"
    start = time.thread_time()
    assert deepcoder.extract_code(answer) == answer.strip("\n")  # no fence: the whole answer
    assert time.thread_time() - start < CALL_CPU_SECONDS


def test_fences_are_still_found():
    assert deepcoder.extract_code("```python\nprint(1)\n```") == "print(1)"
    assert deepcoder.extract_code("x\n``` py3 \t\n  a\n  b\n```\n```c++\nlast\n```") == "last"
    assert deepcoder.extract_code("```python\nunclosed = 1\n") == "unclosed = 1"
    assert deepcoder.extract_code("```python print(1)```") == "```python print(1)```"  # no newline: no fence


# --- the rewrites keep the old patterns' results -----------------------------------------------

OLD_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
OLD_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
OLD_BOXED = re.compile(r"\\boxed\{([^}]+)\}")
PIECES = ["```", "``", "`", " ", "\t", "\n", "py", "c++", "-", "!", "<think>", "</think>", "\\boxed{", "{", "}",
          "*", "**", "a", "answer is", "so", ",", ".", "?", ":", "9", "é", "_"]
pieces = st.lists(st.sampled_from(PIECES), max_size=24).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=pieces)
def test_possessive_fence_finds_the_same_blocks(text):
    assert deepcoder._FENCE.findall(text) == OLD_FENCE.findall(text)


@settings(max_examples=400, deadline=None)
@given(text=pieces)
def test_searchqa_scans_match_the_patterns_they_replace(text):
    assert searchqa._drop_think_blocks(text) == OLD_THINK.sub("", text)
    old = OLD_BOXED.search(text)
    assert searchqa._boxed(text) == (old.group(1) if old else None)
    stripped = text.strip()
    assert searchqa._strip_non_word(stripped) == re.sub(r"^\W+|\W+$", "", stripped)


OLD_BOLD = (re.compile(r"\*\*([^*]+)\*\*"), re.compile(r"\*([^*]+)\*"))
OLD_STATED = (re.compile(r"(?:the\s+)?(?:correct\s+)?answer\s+is\s*:?\s*([^.!?]+)", re.IGNORECASE),
              re.compile(r"(?:therefore|thus|so|hence)\s*,?\s*([^.!?]+)", re.IGNORECASE))


@settings(max_examples=400, deadline=None)
@given(text=pieces)
def test_possessive_searchqa_patterns_match_as_before(text):
    for new, old in zip(searchqa._BOLD + searchqa._STATED, OLD_BOLD + OLD_STATED):
        assert new.findall(text) == old.findall(text)
        found, expected = new.search(text), old.search(text)
        assert (found and (found.span(), found.groups())) == (expected and (expected.span(), expected.groups()))


NUMBER_PIECES = ["1", "23", "456", ",", ".", "/", "-", "+", "\\frac", "{", "}", "$", "x", "="]


@settings(max_examples=400, deadline=None)
@given(text=st.lists(st.sampled_from(NUMBER_PIECES), max_size=12).map("".join))
def test_possessive_number_patterns_match_as_before(text):
    old = {"_INTEGER": r"[+-]?\d+", "_THOUSANDS": r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?",
           "_DECIMAL": r"[+-]?(?:\d+\.\d*|\.\d+)", "_SLASH_FRACTION": r"([+-]?\d+)/(\d+)",
           "_LATEX_FRACTION": r"([+-]?)\\frac\{([+-]?\d+(?:\.\d+)?)\}\{(\d+(?:\.\d+)?)\}"}
    for name, pattern in old.items():
        new, reference = getattr(math_answers, name).fullmatch(text), re.fullmatch(pattern, text, re.ASCII)
        assert (new and new.groups()) == (reference and reference.groups()), name
    tokens = [m.groups() for m in countdown._TOKENS.finditer(text)]
    assert tokens == [m.groups() for m in re.finditer(r"(\s+)|([0-9]+)|([-+*/()]+)|(.)", text, re.DOTALL)]


@settings(max_examples=400, deadline=None)
@given(text=st.lists(st.sampled_from([" ", "\t", "\n", "a", "\r", "  x", "\tb"]), max_size=16).map("".join))
def test_dedent_is_textwraps(text):
    assert deepcoder.dedent(text) == textwrap.dedent(text)


def test_dedent_of_an_extracted_block_stays_linear():
    """textwrap.dedent compiled the margin into a regex (0.4 s for 648,000 blanks); ours scans."""
    length = _reply_chars("deepcoder")
    for text in (" " * length + "x", "\t" * length + "\n", (" " * 80 + "\n") * (length // 81), (" " * 80 + "x\n") * 8000):
        start = time.thread_time()
        deepcoder.dedent(text)
        assert time.thread_time() - start < CALL_CPU_SECONDS
