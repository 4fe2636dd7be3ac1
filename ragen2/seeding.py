"""Which env instances a run meets, and the seeds of its samplers: one stream per purpose, so
that training, validation, `ragen2 eval`, `ragen2 audit` and the MI probe never share instances
or random draws, and both engines meet the same instances in the same steps.

Each stream is a NumPy generator keyed by (seed, stream); a training step's key is
(trainer.seed, step). Instance seeds are drawn in [0, 2**31 - 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ragen2.config import Config

VALIDATION_STREAM = 987_654_321  # validation instances, apart from every step's
EVAL_STREAM = 555_000_111  # `ragen2 eval` instances, apart from training and validation
AUDIT_STREAM = 424_242  # `ragen2 audit --model` instances, apart from training and validation
DEMO_STREAM = 0xDE305  # `ragen2 demos` instances, apart from training, validation and eval
PROBE_STREAM = 0x9B0BE  # the probe's row sampling, apart from everything else seeded by the step
# dynamic sampling's extra rounds (filter.max_rounds): their own instances, so round 0 stays the
# step's instances of every arm and arms with and without refill meet the same ones, paired
REFILL_STREAM = 0xD5A90


def instance_seeds(key: list[int], count: int) -> list[int]:
    """`count` env instance seeds from the stream keyed by `key`."""
    rng = np.random.default_rng(key)
    return [int(s) for s in rng.integers(0, 2**31 - 1, size=count)]


def step_seeds(cfg: Config, step: int) -> list[int]:
    """The P instance seeds of a step: a pure function of (trainer.seed, step)."""
    return instance_seeds([cfg.trainer.seed, step], cfg.rollout.num_groups)


def refill_seeds(cfg: Config, step: int, round_: int) -> list[int]:
    """The P instance seeds of a step's extra generation round `round_` >= 1 (dynamic sampling)."""
    if round_ < 1:
        raise ValueError(f"refill round {round_}: round 0 is the step's own (step_seeds)")
    return instance_seeds([cfg.trainer.seed, REFILL_STREAM, step, round_], cfg.rollout.num_groups)


def validation_seeds(cfg: Config) -> list[int]:
    return instance_seeds([cfg.trainer.seed, VALIDATION_STREAM], cfg.trainer.val_groups)


def validation_sampling_seed(cfg: Config) -> int:
    """The seed of validation's sampling generator."""
    return cfg.trainer.seed + VALIDATION_STREAM


def eval_seeds(seed: int, count: int) -> list[int]:
    return instance_seeds([seed, EVAL_STREAM], count)


def eval_sampling_seed(seed: int) -> int:
    return seed + EVAL_STREAM


def demo_seeds(seed: int, count: int) -> list[int]:
    return instance_seeds([seed, DEMO_STREAM], count)


def audit_seeds(seed: int, count: int) -> list[int]:
    return instance_seeds([seed, AUDIT_STREAM], count)


def probe_rng(step: int) -> np.random.Generator:
    """The probe's generator at a step (which rows it scores)."""
    return np.random.default_rng([step, PROBE_STREAM])
