"""Whether a run stops after a step, and why: an ordered list of stoppers, the first decision wins.

A step records what its watchers observed (`run.StepResult`: the filter's stop policy on the
selection, the collapse watch's alert, the validation rule); each stopper reads one of them, or
the pending signal, and returns a `Stop` or None. The training loop asks once per step, after
validation has added its observation. The decision is what the run reports: the `stop` event in
events.jsonl and its printed line, the step row's `stop_reason`, summary.json's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ragen2.engines.local.run import Run, StepResult


@dataclass(frozen=True)
class Stop:
    """Why the run stops. `signal` is set for an interrupt: the run is saved to be resumed, not
    finished, so it gets no summary.json and its row no stop_reason (trainer._interrupted)."""

    reason: str  # "interrupted", a snr.StopPolicy reason, or a collapse alert's kind
    message: str = ""  # the printed line and the event's message
    signal: str | None = None

    @property
    def interrupted(self) -> bool:
        return self.signal is not None


def interrupted(run: Run, result: StepResult | None = None) -> Stop | None:
    """SIGINT / SIGTERM arrived (engines/local/interrupts); between steps there is no result to read."""
    interrupts = run.services.interrupts
    return Stop("interrupted", signal=interrupts.signal_name) if interrupts.requested else None


def filter_stop(run: Run, result: StepResult) -> Stop | None:
    """The filter's stop policy: consecutive skipped steps, or the reward spread's collapse."""
    decision = result.filter_decision
    return Stop(decision.reason, decision.message) if decision.stop else None


def collapse_stop(run: Run, result: StepResult) -> Stop | None:
    """probe.stop_on_collapse / stop_on_early_warning, on the collapse watch's alert."""
    alert = result.collapse_alert
    return Stop(alert.kind, f"stopping the run: {alert.message}") if alert is not None else None


def low_validation_stop(run: Run, result: StepResult) -> Stop | None:
    """RAGEN-2's low-validation-success rule, on this step's validation."""
    decision = result.validation_decision
    return Stop(decision.reason, decision.message) if decision is not None and decision.stop else None


# First decision wins. An interrupt first: the user asked, and the run must be saved to resume
# (its row gets no stop_reason). Then the filter's policy before the collapse watch, as the
# trainer ranked them when both wrote the row's stop_reason; validation last, as it is observed
# only when no earlier stopper has decided.
STOPPERS: tuple[Callable[[Run, StepResult], Stop | None], ...] = (interrupted, filter_stop, collapse_stop, low_validation_stop)


def first_stop(run: Run, result: StepResult, stoppers=STOPPERS) -> Stop | None:
    for stopper in stoppers:
        stop = stopper(run, result)
        if stop is not None:
            return stop
    return None
