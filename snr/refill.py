"""DAPO's dynamic sampling, the bookkeeping: which groups of each generation round join the batch,
and when to stop sampling.

DAPO (arXiv 2503.14476, section 3.2) keeps sampling while the batch holds fewer groups with spread
than it should: a group whose rewards are all equal has zero GRPO advantage, so it carries no task
signal. The caller samples the rounds (the local engine: ragen2/engines/local/dynamic_sampling.py);
a :class:`Refill` says which groups of each round to keep, with the filter's own spread function
(:func:`snr.group_spread`, on the filter's signal), and when to stop: the batch is full, or
``config.max_rounds`` rounds were sampled. Running out of rounds is an outcome, not an error (veRL
raises): the caller trains on what it found, or skips when it found nothing.

    refill = Refill(load_preset("dapo-dynamic"), num_groups=8)
    while not refill.done:
        rewards = sample_round()                     # [8, G]
        keep = refill.add(rewards)                   # indices of this round's groups to keep
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import FilterConfig
from .selection import FilterInputError, _reward_matrix, _signal_spread, group_spread


@dataclass
class Refill:
    """One step's rounds. `found` counts the groups kept so far (at most `num_groups`), `flat`
    the groups seen without spread, `rounds` the rounds added."""

    config: FilterConfig
    num_groups: int
    rounds: int = 0
    found: int = 0
    flat: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.config, FilterConfig):
            raise FilterInputError(f"config must be a FilterConfig; got {type(self.config).__name__}")
        if self.num_groups < 1:
            raise FilterInputError(f"num_groups must be >= 1; got {self.num_groups}")

    @property
    def full(self) -> bool:
        return self.found >= self.num_groups

    @property
    def done(self) -> bool:
        """Stop sampling: the batch is full, or config.max_rounds rounds were sampled."""
        return self.full or self.rounds >= self.config.max_rounds

    @property
    def exhausted(self) -> bool:
        """The round limit ended sampling before the batch was full."""
        return self.done and not self.full

    def add(self, rewards: Any, signal: Any = None) -> list[int]:
        """The groups of one more round to keep: those with spread, in order, up to the count still
        missing. `rewards` is [groups, G]; `signal` its values under a signal other than the reward,
        as `select_groups` takes them."""
        if self.done:
            raise FilterInputError(f"add: sampling is done ({self.found} of {self.num_groups} groups, "
                                   f"{self.rounds} of {self.config.max_rounds} rounds)")
        matrix = _reward_matrix(rewards)
        zero = (_signal_spread(self.config, signal, tuple(matrix.shape)) or
                group_spread(matrix, self.config.ddof))[2]
        with_spread = (~zero).nonzero().flatten().tolist()
        taken = with_spread[: self.num_groups - self.found]
        self.rounds += 1
        self.found += len(taken)
        self.flat += int(zero.sum())
        return taken
