"""When to stop training because the filter keeps finding no signal.

:class:`StopPolicy` watches one number per step (and whether the step was
skipped) and says when to stop, following RAGEN-2's trainer:

* **Consecutive skips.** A skipped step is one where the filter kept no group.
  After `max_consecutive_skips` skipped steps in a row (default 5), stop. Any
  step that trains resets the count.
* **Spread collapse.** The baseline is the mean in-group reward spread over the
  first `spread_baseline` (10) steps that trained. After that, stop once
  `spread_patience` (10) consecutive trained steps have a spread below
  `spread_ratio` (0.1) x the baseline. Skipped steps are ignored by this rule
  (neither counted nor resetting it), as in RAGEN: the skip rule covers them.
* **Low validation success.** After `low_val_patience` (5) validations in a row
  with a success rate below `low_val_success` (0.01), stop: RAGEN-2's trainer
  does this on every validation env (agent_trainer.py, "low_validation_success").

Pass the pre-filter mean in-group reward std (``snr/reward_std_mean`` of a
:class:`~snr.selection.Selection`, which :meth:`StopPolicy.observe` reads) —
RAGEN's ``rollout/in_group_reward_std``.

The policy is stateful; :meth:`state_dict` / :meth:`load_state_dict` carry it
across checkpoints so a resumed run keeps its counts and baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

SPREAD_METRIC = "snr/reward_std_mean"


@dataclass(frozen=True)
class StopConfig:
    """Thresholds of :class:`StopPolicy`; 0 turns a rule off.

    The spread rule names its fields as mi_probe's collapse detector does:
    `<series>_baseline` (how many first values make the baseline), `<series>_ratio`
    (the threshold as a ratio of it) and `<series>_patience` (how many in a row).

    max_consecutive_skips  stop after this many skipped steps in a row (0: never).
    spread_baseline        trained steps averaged into the spread baseline.
    spread_ratio           threshold = spread_ratio x baseline, in (0, 1].
    spread_patience        trained steps in a row below the threshold before
                           stopping (0: spread-collapse detection off).
    low_val_success        a validation success rate below this counts as low.
    low_val_patience       stop after this many low validations in a row (0: never).
    """

    max_consecutive_skips: int = 5
    spread_baseline: int = 10
    spread_ratio: float = 0.1
    spread_patience: int = 10
    low_val_success: float = 0.01
    low_val_patience: int = 5

    def __post_init__(self) -> None:
        for name in ("max_consecutive_skips", "spread_baseline", "spread_patience", "low_val_patience"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0; got {value!r}")
        if self.spread_patience > 0 and self.spread_baseline < 1:
            raise ValueError("spread_baseline must be >= 1 when spread-collapse detection is on (spread_patience > 0)")
        ratio = self.spread_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < ratio <= 1.0:
            raise ValueError(f"spread_ratio must be in (0, 1]; got {ratio!r}")
        low = self.low_val_success
        if isinstance(low, bool) or not isinstance(low, (int, float)) or not 0.0 <= low <= 1.0:
            raise ValueError(f"low_val_success must be in [0, 1]; got {low!r}")


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    reason: str | None = None  # "consecutive_skips" | "spread_collapse" | "low_validation_success"
    message: str | None = None


# The low-validation count's metric: the trainer refreshes it after validating, past the step's row.
LOW_VALIDATIONS = "snr/low_validations"

_STATE_KEYS = (
    "steps",
    "total_skips",
    "consecutive_skips",
    "baseline_spreads",
    "baseline",
    "steps_below",
    "low_validations",
    "stop_reason",
    "stop_message",
)


class StopPolicy:
    """Counts skipped steps and watches the reward spread; says when to stop."""

    def __init__(self, config: StopConfig | None = None) -> None:
        self.config = config if config is not None else StopConfig()
        self.steps = 0
        self.total_skips = 0
        self.consecutive_skips = 0
        self.baseline_spreads: list[float] = []  # spreads of the first trained steps
        self.baseline: float | None = None
        self.steps_below = 0  # trained steps in a row below spread_ratio x baseline
        self.low_validations = 0  # validations in a row below low_val_success
        self.stop_reason: str | None = None
        self.stop_message: str | None = None

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def observe(self, selection: Any) -> StopDecision:
        """Update from a :class:`~snr.selection.Selection` (its skip flag and spread)."""
        return self.update(selection.skip, selection.metrics[SPREAD_METRIC])

    def update(self, skipped: bool, spread: float | None = None) -> StopDecision:
        """Record one training step; `spread` is needed on trained steps while
        collapse detection is on (it is ignored on skipped steps)."""
        if self.stopped:  # the decision stands; later calls do not change counts
            return self.decision()
        cfg = self.config
        self.steps += 1
        if skipped:
            self.total_skips += 1
            self.consecutive_skips += 1
            n = self.consecutive_skips
            if cfg.max_consecutive_skips and n >= cfg.max_consecutive_skips:
                self._stop(
                    "consecutive_skips",
                    f"stopping: the filter kept no group for {n} consecutive steps (limit "
                    f"{cfg.max_consecutive_skips}): no prompt's rollouts differ enough in reward to carry a "
                    "task gradient. Raise the sampling temperature or group size, "
                    "lower the filter's value, or set max_consecutive_skips=0 to keep going.",
                )
            return self.decision()

        self.consecutive_skips = 0
        if cfg.spread_patience:
            self._watch_spread(spread)
        return self.decision()

    def observe_validation(self, success_rate: float) -> StopDecision:
        """Record one validation's success rate (a NaN one counts as low: nothing succeeded)."""
        if self.stopped:
            return self.decision()
        cfg = self.config
        if not cfg.low_val_patience:
            return self.decision()
        low = not (float(success_rate) >= cfg.low_val_success)
        self.low_validations = self.low_validations + 1 if low else 0
        if self.low_validations >= cfg.low_val_patience:
            self._stop(
                "low_validation_success",
                f"stopping: validation success has been below {cfg.low_val_success:g} for {self.low_validations} "
                f"validations in a row (RAGEN-2's rule): the policy is not solving the task. Check the format "
                f"rate, or set low_val_patience=0 to keep going.",
            )
        return self.decision()

    def _watch_spread(self, spread: float | None) -> None:
        cfg = self.config
        if spread is None or isinstance(spread, bool) or not math.isfinite(float(spread)) or spread < 0:
            raise ValueError(
                f"spread must be a finite number >= 0 on a trained step (collapse detection is on); got {spread!r}"
            )
        spread = float(spread)
        if self.baseline is None:
            self.baseline_spreads.append(spread)
            if len(self.baseline_spreads) == cfg.spread_baseline:
                self.baseline = sum(self.baseline_spreads) / len(self.baseline_spreads)
            return
        threshold = cfg.spread_ratio * self.baseline
        self.steps_below = self.steps_below + 1 if spread < threshold else 0
        if self.steps_below >= cfg.spread_patience:
            self._stop(
                "spread_collapse",
                f"stopping: the in-group reward spread has been below {cfg.spread_ratio:g} x its baseline "
                f"({threshold:.6g} = {cfg.spread_ratio:g} x {self.baseline:.6g}, the mean of the first "
                f"{cfg.spread_baseline} trained steps) for {self.steps_below} consecutive trained "
                f"steps (latest {spread:.6g}): the policy's rollouts have stopped differing in reward.",
            )

    def _stop(self, reason: str, message: str) -> None:
        self.stop_reason = reason
        self.stop_message = message

    def decision(self) -> StopDecision:
        return StopDecision(self.stopped, self.stop_reason, self.stop_message)

    def metrics(self) -> dict[str, float]:
        """Plain floats for the step's log row (baseline is 0.0 until it is set)."""
        return {
            "snr/consecutive_skips": float(self.consecutive_skips),
            "snr/total_skips": float(self.total_skips),
            "snr/spread_baseline": float(self.baseline) if self.baseline is not None else 0.0,
            "snr/steps_below_collapse_threshold": float(self.steps_below),
            LOW_VALIDATIONS: float(self.low_validations),
            "snr/stopped": 1.0 if self.stopped else 0.0,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "total_skips": self.total_skips,
            "consecutive_skips": self.consecutive_skips,
            "baseline_spreads": list(self.baseline_spreads),
            "baseline": self.baseline,
            "steps_below": self.steps_below,
            "low_validations": self.low_validations,
            "stop_reason": self.stop_reason,
            "stop_message": self.stop_message,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        state = {"low_validations": 0, **state}  # absent in states saved before the rule existed
        missing = [k for k in _STATE_KEYS if k not in state]
        unknown = sorted(set(state) - set(_STATE_KEYS))
        if missing or unknown:
            raise ValueError(f"not a StopPolicy state: missing keys {missing}, unknown keys {unknown}")
        for key in ("steps", "total_skips", "consecutive_skips", "steps_below", "low_validations"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"StopPolicy state {key} must be a whole number >= 0; got {value!r}")
        if state["stop_reason"] not in (None, "consecutive_skips", "spread_collapse", "low_validation_success"):
            raise ValueError(f"StopPolicy state stop_reason is unknown: {state['stop_reason']!r}")
        self.steps = state["steps"]
        self.total_skips = state["total_skips"]
        self.consecutive_skips = state["consecutive_skips"]
        self.baseline_spreads = [float(v) for v in state["baseline_spreads"]]
        self.baseline = None if state["baseline"] is None else float(state["baseline"])
        self.steps_below = state["steps_below"]
        self.low_validations = state["low_validations"]
        self.stop_reason = state["stop_reason"]
        self.stop_message = state["stop_message"]
