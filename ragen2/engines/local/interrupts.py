"""Ctrl-C (SIGINT) and SIGTERM during training: stop cleanly, lose nothing.

A step has phases that only read the run's state (rollout, validation: they advance the
sampling RNG, which is snapshotted) and phases that change it (probe EMA, filter and stop
policy, the update). A signal in a read-only phase abandons it at once; a signal anywhere
else is remembered and honoured at the end of the step, so the weights, optimiser and
counters on disk always belong to one completed step.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

import torch

HANDLED = (signal.SIGINT, signal.SIGTERM)


class StepAbandoned(BaseException):
    """Raised out of an abandonable phase; a BaseException so `except Exception` cannot swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupts:
    """Catches SIGINT/SIGTERM while installed (main thread only; elsewhere it is a no-op)."""

    def __init__(self, quiet: bool = False):
        self.signum: int | None = None
        self.count = 0
        self.quiet = quiet
        self._abandonable = False
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in HANDLED:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        self.count += 1
        self.signum = signum
        if self._abandonable:
            self._abandonable = False  # raise once; the handler of this exception must not be interrupted
            raise StepAbandoned(signum)
        if self.count >= 3:  # the user insists: quit now, keeping only what is already on disk
            raise KeyboardInterrupt
        if not self.quiet:
            print(f"\n{signal.Signals(signum).name}: finishing this step's update, then saving and stopping"
                  + (" (once more to quit without saving this step)" if self.count == 2 else ""),
                  file=sys.stderr, flush=True)

    @contextmanager
    def abandonable(self):
        """A phase that may be dropped: a pending or arriving signal raises StepAbandoned."""
        if self.signum is not None:
            raise StepAbandoned(self.signum)
        self._abandonable = True
        try:
            yield
        finally:
            self._abandonable = False


def rng_snapshot(generator: torch.Generator) -> tuple:
    """What an abandoned step must put back so the resumed run samples exactly as an uninterrupted one."""
    return generator.get_state(), torch.get_rng_state()


def restore_rng(generator: torch.Generator, snapshot: tuple) -> None:
    generator.set_state(snapshot[0])
    torch.set_rng_state(snapshot[1])
