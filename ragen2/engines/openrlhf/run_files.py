"""What the OpenRLHF controller writes into the run directory, through ragen2.run_dir's writers
(the local engine's), so that `ragen2 plot`, `ragen2 audit` and `ragen2 bench` read runs of either
engine. The controller runs on the head node, where the run directory is.

What OpenRLHF measures is kept under its own names (its `rollout/reward_mean` is ours already).
Its evaluator reports, per prompt, the mean reward of the samples (`eval_*_pass1`) and the best
(`eval_*_passN`), not a success rate: they become `val/reward_mean` and `val/max_reward_mean`, and
`summary.json` says `final_val_success_rate: null` rather than pass a reward off as a success.

An evaluation is a row of its own, after its step's row and with the same `step` (the step's line
is already flushed when OpenRLHF evaluates; rewriting it would cost the file its append-only
safety): readers go through `ragen2.run_dir.read_steps`, which merges it into the step's row, the
local engine's shape.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from ragen2 import metric_names as names
from ragen2.run_dir import CompletionsLog, DirectoryGuard, MetricsFile, steps_of, summary, write_summary


def numeric(logs: dict | None) -> dict[str, float]:
    """The finite numbers of a log dict (OpenRLHF also logs a decoded sample string)."""
    out = {}
    for key, value in (logs or {}).items():
        if isinstance(value, (int, float)) and math.isfinite(value):  # bools count, as 0.0 / 1.0
            out[key] = float(value)
    return out


def eval_row(eval_logs: dict) -> dict[str, float]:
    """OpenRLHF's eval metrics under `openrlhf/`, plus their means over data sources under `val/`."""
    logs = numeric(eval_logs)
    row = {names.OPENRLHF + key: value for key, value in logs.items()}
    mean_reward = [v for k, v in logs.items() if k.startswith("eval_") and k.endswith("_pass1")]
    best_reward = [v for k, v in logs.items() if k.startswith("eval_") and "_pass" in k and not k.endswith("_pass1")]
    if mean_reward:
        row[names.VAL_REWARD_MEAN] = sum(mean_reward) / len(mean_reward)
    if best_reward:
        row["val/max_reward_mean"] = sum(best_reward) / len(best_reward)
    return row


class RunFiles:
    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # checked before each write: a removed or replaced directory stops the run (RunDirectoryGone)
        self.guard = DirectoryGuard(self.run_dir)
        self.started = time.time()
        self.rows: list[dict] = []  # this session's rows, for the summary
        self.metrics = MetricsFile(self.run_dir)  # appends: the engine does not resume runs
        self.completions = CompletionsLog(self.run_dir)

    def _append(self, row: dict) -> None:
        self.rows.append(row)
        self.metrics.write(row)

    def log_step(self, step: int, logs: dict | None, labels: dict[str, str] | None = None) -> None:
        """The step's numbers from OpenRLHF's logs, and `labels`: our string fields (probe/dtype)."""
        self.guard.check(step)
        self._append({"step": step, **numeric(logs), **(labels or {})})

    def log_completions(self, step: int, records: list[dict]) -> None:
        self.guard.check(step)
        self.completions.write(step, records)

    def log_eval(self, step: int, eval_logs: dict | None) -> None:
        self.guard.check(step + 1)
        row = eval_row(eval_logs or {})
        if row:
            self._append({"step": step, **row})

    def finish(self, steps: int, steps_skipped: int, stop_reason: str | None) -> dict:
        """summary.json, in the local engine's schema (the bench treats a run with one as done)."""
        self.guard.check(steps)
        content = summary(steps_of(self.rows), run_dir=self.run_dir, engine="openrlhf", stop_reason=stop_reason,
                          wall_s=time.time() - self.started, num_steps=steps, steps_skipped=steps_skipped)
        write_summary(self.run_dir, content)
        self.metrics.close()
        self.completions.close()
        return content
