"""Degenerate replies: a character, token or short n-gram repeated over most of a reply, or a
loop that ran until the token budget cut the reply (RAGEN issue #52: "!!!!!!" after a few PPO
steps). The MI probe tells input-agnostic reasoning from grounded reasoning; this tells a
policy that has started to repeat itself, before the reward falls.

A reply is degenerate when some period p <= max_period (in characters: one character, one
token's text, a few words) repeats at least `min_repeats` times in a row over at least
`min_chars` characters, and that periodic stretch either

* covers at least `cover` of the reply ("!!!!!!!!", "the the the ...", a sentence looping), or
* runs to the reply's last character in a reply cut at the token budget (finish reason
  "length"): the loop is what the budget stopped.

Linear time in the reply length: for each period p the reply is compared with itself shifted
by p (one vectorised pass), and the longest run of matches is the longest stretch with period
p; max_period passes in all, each O(n). No regular expression (a backreference pattern such as
``(.+?)\\1+`` backtracks, quadratic or worse on long replies).

Pure numpy; imports nothing of ragen2 (the rollout batch counts the share per step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

__all__ = ["DegenerationConfig", "Degeneration", "degenerate_fraction", "judge_reply"]

# finish reasons that mean the token budget cut the reply (the rollout writes "length")
CUT_REASONS = ("length",)


@dataclass(frozen=True)
class DegenerationConfig:
    """What counts as degenerate (see the module doc).

    max_period   longest repeated unit looked for, in characters (a short n-gram of words).
    min_repeats  the unit must repeat at least this many times in a row: five identical
                 actions ("Up || Up || Up || Up || Up", RAGEN's per-turn budget) stay normal.
    min_chars    the repeated stretch must be at least this long; shorter replies are not judged.
    cover        share of the reply the stretch must cover (a reply not cut by the budget).
    """

    max_period: int = 64
    min_repeats: int = 6
    min_chars: int = 12
    cover: float = 0.5

    def __post_init__(self) -> None:
        for name in ("max_period", "min_repeats", "min_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not (isinstance(self.cover, (int, float)) and 0.0 < self.cover <= 1.0):
            raise ValueError(f"cover must be in (0, 1], got {self.cover!r}")


@dataclass(frozen=True)
class Degeneration:
    """The verdict on one reply: `kind` is None (normal), "repeat" or "loop_cut"."""

    kind: str | None
    period: int = 0  # the repeated unit's length in characters
    span: int = 0  # characters the periodic stretch covers

    @property
    def degenerate(self) -> bool:
        return self.kind is not None


def _runs(matches: np.ndarray) -> tuple[int, int]:
    """(longest run of True, the run that ends at the last element or 0)."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], matches.view(np.int8), [0]))))
    if edges.size == 0:
        return 0, 0
    lengths = edges[1::2] - edges[::2]
    tail = int(lengths[-1]) if edges[-1] == matches.size else 0
    return int(lengths.max()), tail


def judge_reply(text: str, finish_reason: str | None = None,
                config: DegenerationConfig | None = None) -> Degeneration:
    """Whether one reply is degenerate, and how (see the module doc)."""
    cfg = config if config is not None else DegenerationConfig()
    n = len(text)
    if n < cfg.min_chars:
        return Degeneration(None)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    cut = finish_reason in CUT_REASONS
    best = Degeneration(None)
    for period in range(1, min(cfg.max_period, n // cfg.min_repeats) + 1):
        longest, tail = _runs(codes[period:] == codes[:-period])
        need = max(cfg.min_repeats * period, cfg.min_chars)  # a run of k matches spans k + period chars
        if longest + period >= need and longest + period >= cfg.cover * n:
            return Degeneration("repeat", period, longest + period)
        if cut and tail + period >= need and not best.degenerate:
            best = Degeneration("loop_cut", period, tail + period)  # a later period may still cover more
    return best


def degenerate_fraction(replies: Iterable[tuple[str, str | None]], config: DegenerationConfig | None = None) -> float:
    """Share of (text, finish_reason) replies that are degenerate; 0.0 for none."""
    verdicts = [judge_reply(text, reason, config).degenerate for text, reason in replies]
    return sum(verdicts) / len(verdicts) if verdicts else 0.0
