"""The rollout's settings: one frozen dataclass, checked when it is built.

It is also the `rollout:` section of the training config (ragen2.config), so each field is
defined, documented and defaulted here once. The defaults are the CPU-sized main job's (Bandit,
one turn, the bundled 135M model); presets (configs/envs, configs/paper) set larger ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from envs.parsing import STOP_STRINGS

ContextMode = Literal["full", "window"]
CONTEXT_MODES = get_args(ContextMode)


class RolloutConfigError(ValueError):
    pass


def _whole(name: str, value, minimum: int = 1, what: str = "an int") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RolloutConfigError(f"{name} must be {what} >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class RolloutConfig:
    """How one step samples: P groups (one initial state each) x G episodes of up to K turns.

    num_groups          P initial states per training step. `rollout()` takes the seeds
                        themselves and ignores this; the trainer draws this many per step.
    group_size          G episodes per initial state.
    max_turns           K.
    max_new_tokens      per turn.
    temperature, top_p  sampling.
    context             full: the whole history is the prompt, one training row per
                        episode; window: the system message plus the last `window_turns`
                        turns (the current one included), one training row per turn.
    max_context_tokens  prompt + max_new_tokens must fit, else the episode ends.
    max_response_words  the prompt's length hint; None: none.
    stop_strings        a reply ends at the first of these.
    prefill_tag         open every assistant turn with the format's tag in the prompt
                        ("<think>", or "<answer>" for answer-only envs), as RAGEN does: the
                        model continues from inside the format instead of having to start
                        it, which a 135M model rarely does unprompted.
    """

    num_groups: int = 4
    group_size: int = 4
    max_turns: int = 1
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    context: ContextMode = "full"
    window_turns: int = 2
    max_context_tokens: int = 2048
    max_response_words: int | None = None
    stop_strings: tuple[str, ...] = STOP_STRINGS
    prefill_tag: bool = True

    def __post_init__(self) -> None:
        for name in ("num_groups", "group_size", "max_turns", "max_new_tokens", "window_turns"):
            _whole(name, getattr(self, name))
        _whole("max_context_tokens", self.max_context_tokens, 64)
        if self.context not in CONTEXT_MODES:
            raise RolloutConfigError(f"context must be one of {CONTEXT_MODES}, got {self.context!r}")
        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature < float("inf")):
            raise RolloutConfigError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise RolloutConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.max_response_words is not None:
            _whole("max_response_words", self.max_response_words, what="None or an int")
        if self.max_new_tokens >= self.max_context_tokens:
            raise RolloutConfigError(f"max_new_tokens ({self.max_new_tokens}) must be below "
                                     f"max_context_tokens ({self.max_context_tokens}): no room for a prompt")
