"""Final-answer extraction and comparison for math datasets (MetaMathQA, GSM8K).

Two scoring modes:

- `strict` (RAGEN's MetaMathQA check): lower-case both sides, delete all whitespace, and
  compare the strings exactly. "$18" ≠ "18", "1,500" ≠ "1500".
- `math`: the strict form first (so whatever strict accepts, math accepts too), then
  LaTeX wrappers (`\\boxed{}`, `$…$`, `\\(…\\)`, `\\text{}`) are peeled and both sides are
  read as exact numbers where they can be: `1,500` = `1500`, `18.00` = `18`, `0.5` = `1/2`
  = `\\frac{1}{2}`, `$18` = `18` (a leading currency sign; `$` elsewhere is kept unless it
  delimits, so `5$5` ≠ `55`), `25\\%` = `25`, `x = 5` = `5`. Non-numeric answers are
  compared as their peeled strings. Numbers are read with regular expressions and
  `fractions.Fraction`, never evaluated as code.
"""

from __future__ import annotations

import re
from fractions import Fraction

ANSWER_MARKER = "The answer is:"
SCORING_MODES = ("strict", "math")
# \d and [a-z] are ASCII-only (re.ASCII): Fraction must never see other scripts' digits.
# All are anchored (match / fullmatch) or one class (sub): linear on model output; the digit
# runs are possessive besides (what follows each run is never a digit, so no match changes).
# A final answer is short; longer text is only compared strictly, which keeps the
# peeling loop and the number parsing cheap on hostile megabyte answers.
MAX_MATH_ANSWER_CHARS = 1000

_WHITESPACE = re.compile(r"\s+")
_INTEGER = re.compile(r"[+-]?\d++", re.ASCII)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}+(?:,\d{3})++(?:\.\d++)?", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:\d++\.\d*+|\.\d++)", re.ASCII)
_SLASH_FRACTION = re.compile(r"([+-]?\d++)/(\d++)", re.ASCII)
_LATEX_FRACTION = re.compile(r"([+-]?)\\frac\{([+-]?\d++(?:\.\d++)?)\}\{(\d++(?:\.\d++)?)\}", re.ASCII)
_LATEX_SHORT_FRACTION = re.compile(r"([+-]?)\\frac(\d)(\d)", re.ASCII)  # \frac12
_ASSIGNMENT = re.compile(r"[a-z]=(?=.)", re.ASCII)  # "x=5" → "5"
# A currency sign before the number ("$18", "-$5"). Any other `$` is kept: only delimiting
# `$…$` pairs are peeled, so "5$5" is not 55.
_LEADING_DOLLAR = re.compile(r"([+-]?)\$(?=[0-9.])", re.ASCII)
_WRAPPERS = ("\\boxed{", "\\text{", "\\textbf{", "\\mathrm{", "\\mbox{")
# Spelling variants that mean the same thing: (from, to), applied in order.
_REWRITES = (
    ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""),
    ("\\!", ""), ("\\,", ""), ("\\;", ""), ("{,}", ","), ("^{\\circ}", ""), ("^\\circ", ""),
    ("\\%", "%"), ("\\$", "$"),
)


def extract_label(response: str) -> str | None:
    """The text after the last "The answer is:" in a MetaMathQA response, or None.

    RAGEN's regex took everything after the first marker; MetaMathQA responses end with
    the marker, so the two agree there, and the last one is right if a step quotes it.
    """
    at = response.rfind(ANSWER_MARKER)
    if at < 0:
        return None
    label = response[at + len(ANSWER_MARKER):].strip()
    return label or None


def normalize_strict(text: str) -> str:
    """RAGEN's normal form: lower case, no whitespace at all."""
    return _WHITESPACE.sub("", text.lower())


def _unwrap_command(text: str, prefix: str) -> str | None:
    """`\\boxed{X}` → `X` when the braces after `prefix` enclose the whole rest of the text."""
    if not (text.startswith(prefix) and text.endswith("}")):
        return None
    depth = 1
    for index in range(len(prefix), len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[len(prefix):index] if index == len(text) - 1 else None
    return None


def _peel(text: str) -> str:
    """Remove wrappers that do not change the answer, outermost first, until none is left."""
    while True:
        before = text
        text = text.rstrip(".")
        for opening, closing in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(text) > len(opening) + len(closing) and text.startswith(opening) and text.endswith(closing):
                text = text[len(opening):-len(closing)]
        for prefix in _WRAPPERS:
            inner = _unwrap_command(text, prefix)
            if inner is not None:
                text = inner
        if text == before:
            return text


def canonical_math_text(text: str) -> str:
    """The string `math` mode compares when an answer is not a number."""
    text = normalize_strict(text)
    if len(text) > MAX_MATH_ANSWER_CHARS:
        return text
    for old, new in _REWRITES:
        text = text.replace(old, new)
    text = _peel(text)
    assignment = _ASSIGNMENT.match(text)
    if assignment:
        text = _peel(text[assignment.end():])
    return text


def parse_number(text: str) -> Fraction | None:
    """Read a canonical answer as an exact number, or None if it is not one."""
    currency = _LEADING_DOLLAR.match(text)
    if currency:
        text = currency[1] + text[currency.end():]
    if text.endswith("%"):
        text = text[:-1]
    try:
        if _INTEGER.fullmatch(text) or _DECIMAL.fullmatch(text):
            return Fraction(text)
        if _THOUSANDS.fullmatch(text):
            return Fraction(text.replace(",", ""))
        match = _SLASH_FRACTION.fullmatch(text)
        if match:
            return Fraction(int(match[1]), int(match[2]))
        match = _LATEX_FRACTION.fullmatch(text) or _LATEX_SHORT_FRACTION.fullmatch(text)
        if match:
            value = Fraction(match[2]) / Fraction(match[3])
            return -value if match[1] == "-" else value
    except (ValueError, ZeroDivisionError):  # "1/0", or digits past int()'s length limit
        return None
    return None


def answers_match(answer: str, label: str, mode: str = "strict") -> bool:
    """Does the model's `answer` match the dataset's `label` under `mode`?"""
    if mode not in SCORING_MODES:
        raise ValueError(f"unknown scoring mode {mode!r}; valid: {list(SCORING_MODES)}")
    strict_answer, strict_label = normalize_strict(answer), normalize_strict(label)
    if not strict_answer:
        return False
    if strict_answer == strict_label or mode == "strict":
        return strict_answer == strict_label
    canonical_answer, canonical_label = canonical_math_text(answer), canonical_math_text(label)
    if canonical_answer == canonical_label:
        return bool(canonical_answer)
    number_answer, number_label = parse_number(canonical_answer), parse_number(canonical_label)
    return number_answer is not None and number_answer == number_label
