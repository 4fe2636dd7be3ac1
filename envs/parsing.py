"""The response parser every env shares: `<think>…</think><answer>…</answer>` → actions.

Written with `str.find` rather than a regex so hostile text (megabytes, thousands of
unclosed tags) is parsed in linear time. The semantics match RAGEN's
`re.search(r"<think>(.*?)</think>\\s*<answer>(.*?)</answer>", DOTALL)`: the match starts
at the first `<think>`, the reasoning runs to the first `</think>` that is followed (after
whitespace only) by `<answer>`, and the answer runs to the next `</answer>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACTION_SEPARATOR = "||"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
# The turn protocol's format pieces (ragen2/rollout/episode.py drives them): sampling a turn
# stops once its answer is closed; `prefill_tag` below opens every assistant turn.
STOP_STRINGS = (ANSWER_CLOSE,)
# A `||` storm can produce millions of pieces; `info` keeps the first few and a count.
MAX_DROPPED_RECORDED = 16
MAX_RECORDED_CHARS = 200
_WHITESPACE = re.compile(r"\s*+")  # matched at one position only


def prefill_tag(require_think: bool) -> str:
    """The tag that opens every assistant turn in the prompt: `<think>`, or `<answer>` for
    answer-only envs. RAGEN prefills it so that the model continues from inside the format
    instead of having to start it, which a 135M model rarely does unprompted."""
    return THINK_OPEN if require_think else ANSWER_OPEN


@dataclass(frozen=True)
class DroppedAction:
    text: str
    reason: str


@dataclass(frozen=True)
class ParsedResponse:
    """What the parser found. `actions` are canonical (vocabulary spelling) and valid."""

    format_ok: bool
    think: str = ""
    answer: str = ""
    actions: tuple[str, ...] = ()
    dropped: tuple[DroppedAction, ...] = ()
    num_dropped: int = 0
    error: str | None = None
    # Pieces within the first max_actions that were rejected (unknown or unusable). Pieces
    # beyond max_actions are dropped but not invalid: RAGEN truncates them before checking.
    num_invalid: int = 0

    def to_info(self) -> dict:
        """A JSON-friendly summary for an env's `info` (long strings clipped)."""
        return {
            "format_ok": self.format_ok,
            "error": self.error,
            "think_chars": len(self.think),
            "answer": _clip(self.answer),
            "actions": list(self.actions),
            "dropped": [{"text": _clip(d.text), "reason": d.reason} for d in self.dropped],
            "num_dropped": self.num_dropped,
            "num_invalid": self.num_invalid,
        }


def _clip(text: str) -> str:
    if len(text) <= MAX_RECORDED_CHARS:
        return text
    return text[:MAX_RECORDED_CHARS] + f"…[{len(text) - MAX_RECORDED_CHARS} more chars]"


def _find_think_answer(text: str) -> tuple[str, str] | str:
    """Return (think, answer) or an error message saying what is missing."""
    start = text.find(THINK_OPEN)
    if start < 0:
        return f"no {THINK_OPEN} tag"
    think_start = start + len(THINK_OPEN)
    search_from = think_start
    while True:
        close = text.find(THINK_CLOSE, search_from)
        if close < 0:
            if search_from == think_start:
                return f"{THINK_OPEN} is never closed"
            return f"no {ANSWER_OPEN} directly after {THINK_CLOSE}"
        after = close + len(THINK_CLOSE)
        answer_at = _WHITESPACE.match(text, after).end()
        if text.startswith(ANSWER_OPEN, answer_at):
            answer_start = answer_at + len(ANSWER_OPEN)
            answer_end = text.find(ANSWER_CLOSE, answer_start)
            if answer_end < 0:
                return f"{ANSWER_OPEN} is never closed"
            return text[think_start:close], text[answer_start:answer_end]
        search_from = after


def _find_answer(text: str) -> tuple[str, str] | str:
    start = text.find(ANSWER_OPEN)
    if start < 0:
        return f"no {ANSWER_OPEN} tag"
    answer_start = start + len(ANSWER_OPEN)
    end = text.find(ANSWER_CLOSE, answer_start)
    if end < 0:
        return f"{ANSWER_OPEN} is never closed"
    return "", text[answer_start:end]


def parse_response(
    text: str,
    *,
    vocabulary: tuple[str, ...] | None = None,
    max_actions: int = 1,
    require_think: bool = True,
    separator: str = ACTION_SEPARATOR,
) -> ParsedResponse:
    """Parse one model turn.

    `vocabulary=None` means free-form answers (Countdown, math): every non-empty piece
    is an action. Otherwise pieces are matched case-insensitively and mapped to the
    vocabulary's spelling; unknown pieces are dropped with a reason.
    """
    if not isinstance(text, str):
        return ParsedResponse(format_ok=False, error=f"response is {type(text).__name__}, not str")
    found = _find_think_answer(text) if require_think else _find_answer(text)
    if isinstance(found, str):
        return ParsedResponse(format_ok=False, error=found)
    think, answer = found

    pieces = (p.strip() for p in answer.split(separator))
    candidates = [p for p in pieces if p]
    if not candidates:
        return ParsedResponse(format_ok=True, think=think, answer=answer, error="empty answer")

    lookup = {a.lower(): a for a in vocabulary} if vocabulary is not None else None
    actions: list[str] = []
    dropped: list[DroppedAction] = []
    num_dropped = num_invalid = 0

    def drop(piece: str, reason: str) -> None:
        nonlocal num_dropped
        num_dropped += 1
        if len(dropped) < MAX_DROPPED_RECORDED:
            dropped.append(DroppedAction(piece, reason))

    for index, piece in enumerate(candidates):
        if index >= max_actions:
            drop(piece, f"beyond max_actions_per_turn={max_actions}")
            continue
        if lookup is None:
            actions.append(piece)
        elif piece.lower() in lookup:
            actions.append(lookup[piece.lower()])
        else:
            num_invalid += 1
            drop(piece, "not in the action vocabulary")
    error = None if actions else "no valid action"
    return ParsedResponse(
        format_ok=True,
        think=think,
        answer=answer,
        actions=tuple(actions),
        dropped=tuple(dropped),
        num_dropped=num_dropped,
        error=error,
        num_invalid=num_invalid,
    )


def format_response(actions: list[str] | tuple[str, ...], think: str | None = "",
                    separator: str = ACTION_SEPARATOR) -> str:
    """The inverse of `parse_response`: what a well-behaved model would write."""
    answer = f" {separator} ".join(actions)
    body = f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
    if think is None:
        return body
    return f"{THINK_OPEN}{think}{THINK_CLOSE}{body}"
