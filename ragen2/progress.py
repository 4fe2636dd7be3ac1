"""The live line of a training step: what phase, how far, how long left.

    live = LiveLine(enabled=LiveLine.wanted(quiet))
    rollout(..., progress=live.rollout("rollout"))       # turn 2/5 | 24 live | 210 tok/s | ETA 0:41
    ppo_update(..., UpdateOptions(on_micro_batch=live.update()))  # update micro-batch 3/8 | ETA 0:20
    evaluate(..., progress=live.rollout("validation"))   # validation turn 3/5 | replies 12/32 | episodes over 4/32 | ...
    live.stop()

Drawn with rich on stderr (where the step lines go), redrawn in place and erased when the
phase ends, so finished steps stay as plain lines. Off under --quiet, and when stdout or stderr
is not a terminal (a log file gets step lines only). The ETA is elapsed / done x remaining,
with `done` in the phase's natural unit: turns (a turn's share from its sampled tokens; timed
from the first sampled token, see `rollout`) or micro-batches.

Given the run's plan (`LiveLine(total_steps=N, first_step=S)`, S > 0 on a resume) the line also
gives the whole run's: `step 3/10 | run ETA 12:30`. A training step starts with its "rollout"
phase, so the time between two such starts is one whole step (update, validation, checkpoint
included); the run's remainder is what is left of this step (the mean step less its elapsed
time, or this phase's ETA if longer) plus the mean step for each step after it. Before a step
has finished there is no mean: the line says `run ETA > X`, the estimate that takes each later
step to be as long as this one's elapsed time plus this phase's ETA (before training, only the
phase's ETA). Why: a phase's ETA alone reads as the
run's, and a one-step CPU run spends most of its time in the other phases (issue 49, item 6).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.text import Text


@dataclass
class RolloutProgress:
    """What the agent loop reports after each decode step (and at each turn's end)."""

    turn: int  # 1-based turn being sampled
    max_turns: int
    live: int  # episodes still sampling this turn
    turn_rows: int  # episodes that started this turn
    turn_tokens: int  # tokens sampled so far in this turn
    tokens: int  # tokens sampled so far in the rollout
    max_new_tokens: int
    episodes_done: int
    episodes: int

    @property
    def fraction(self) -> float:
        """Turns done, the current one counted by its tokens against its budget (rows x max_new_tokens)."""
        within = min(1.0, self.turn_tokens / max(1, self.turn_rows * self.max_new_tokens)) if self.live else 1.0
        return min(1.0, (self.turn - 1 + within) / max(1, self.max_turns))


def format_eta(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


def eta(elapsed: float, fraction: float) -> float | None:
    """Seconds left if the rest goes at the pace so far; None before any progress."""
    if fraction <= 0:
        return None
    return elapsed / fraction * (1 - fraction)


MIN_PACE = 0.05  # share of a phase sampled since the first report before its pace gives an ETA


class LiveLine:
    """One transient status line; every method is a no-op when disabled."""

    def __init__(self, enabled: bool = False, stream=None, clock=time.perf_counter,
                 total_steps: int | None = None, first_step: int = 0):
        self.enabled, self.clock = enabled, clock
        self.stream = stream if stream is not None else sys.stderr
        self._live = None
        self._started = clock()
        self.last_text = ""  # what was last drawn (tests read it)
        self.total_steps, self.first_step = total_steps, first_step  # the run's plan; None: no run ETA
        self._step_starts: list[float] = []  # when each training step of this process started

    @staticmethod
    def wanted(quiet: bool) -> bool:
        """Draw only for a person watching: not --quiet, stdout and stderr both terminals."""
        def tty(stream) -> bool:
            try:
                return bool(stream.isatty())
            except (AttributeError, ValueError):  # a closed or replaced stream
                return False

        return not quiet and tty(sys.stdout) and tty(sys.stderr)

    # --- drawing ------------------------------------------------------------------------------

    def _draw(self, text: str) -> None:
        self.last_text = text
        if not self.enabled:
            return
        if self._live is None:
            # force_terminal: enabled means a terminal was checked for (and tests draw into a buffer)
            self._live = Live("", console=Console(file=self.stream, force_terminal=True), transient=True,
                              auto_refresh=False)
            self._live.start()
        self._live.update(Text(text), refresh=True)  # Text: no markup parsing, no number colouring

    def begin(self) -> None:
        self._started = self.clock()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _eta_text(self, fraction: float) -> str:
        left = eta(self.clock() - self._started, fraction)
        return ("ETA --:--" if left is None else f"ETA {format_eta(left)}") + self._run_text(left)

    def _run_text(self, phase_left: float | None) -> str:
        """` | step i/N | run ETA h:mm:ss` from the finished steps' mean and this phase (module doc)."""
        if self.total_steps is None:
            return ""
        starts, now = self._step_starts, self.clock()
        if not starts:  # validation before training: no step has a time yet, only this phase's
            left = "--:--" if phase_left is None else f"> {format_eta(phase_left)}"
            return f" | before step {self.first_step + 1}/{self.total_steps} | run ETA {left}"
        index = self.first_step + len(starts) - 1
        after, so_far = self.total_steps - index - 1, now - starts[-1]
        head = f" | step {index + 1}/{self.total_steps}"
        if len(starts) >= 2:
            mean = (starts[-1] - starts[0]) / (len(starts) - 1)
            this_step = max(mean - so_far, phase_left or 0.0)
            return f"{head} | run ETA {format_eta(this_step + max(after, 0) * mean)}"
        if phase_left is None:
            return f"{head} | run ETA --:--"
        return f"{head} | run ETA > {format_eta(phase_left + max(after, 0) * (so_far + phase_left))}"

    # --- callbacks for the phases -------------------------------------------------------------

    def rollout(self, phase: str = "rollout"):
        """A callback for `rollout(progress=...)` / `evaluate(progress=...)`.

        The ETA's pace starts at the first report, after the first prompt's prefill: counted from
        the phase's start, a slow prefill over the first token's share read as the pace of the whole
        phase (a 12-minute Sokoban step's first ETA was 1:17:21). Later turns' prefills are in it."""
        self.begin()
        if phase == "rollout" and self.total_steps is not None:  # a training step begins with its rollout
            self._step_starts.append(self._started)
        last, origin = [0.0], []  # origin: (time, fraction) of the first report

        def report(p: RolloutProgress) -> None:
            now = self.clock()
            if not origin:
                origin.append((now, p.fraction))
            if now - last[0] < 0.2 and p.live:  # redraw at most 5 times a second
                return
            last[0] = now
            rate = p.tokens / max(now - self._started, 1e-9)
            if phase == "validation":  # replies finish within a turn, episodes mostly at its end: show both
                head = (f"{phase} turn {p.turn}/{p.max_turns} | replies {p.turn_rows - p.live}/{p.turn_rows} | "
                        f"episodes over {p.episodes_done}/{p.episodes}")
            else:
                head = f"{phase} turn {p.turn}/{p.max_turns} | {p.live} live"
            since, at = origin[0]
            done = p.fraction - at
            left = eta(now - since, done / (1 - at)) if done >= MIN_PACE and at < 1 else None
            self._draw(f"{head} | {rate:.0f} tok/s | " + ("ETA --:--" if left is None else f"ETA {format_eta(left)}")
                       + self._run_text(left))

        return report

    def update(self, phase: str = "update"):
        """A callback for `ppo_update`'s `UpdateOptions.on_micro_batch`: (done, total) micro-batches."""
        self.begin()

        def report(done: int, total: int) -> None:
            self._draw(f"{phase} micro-batch {done}/{total} | {self._eta_text(done / max(total, 1))}")

        return report
