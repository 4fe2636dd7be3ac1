"""Where a run's numbers go: metrics.jsonl always (one flushed line per step), events.jsonl
for alerts and stops, completions.jsonl (ragen2.completions), wandb and TensorBoard when asked
for, and a one-line progress display."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from ragen2 import completions as completions_lib

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible rather than dropping the row
    return value


def read_metrics(run_dir: Path) -> list[dict]:
    """The file's rows as written (RunLog's resume rewrites them so); readers want `read_steps`."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut short by a kill: everything before it is intact
    return rows


# How every reader sees a run (`ragen2 plot`, `audit`, `bench report`), whichever engine wrote it.
NON_FINITE = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf,
              "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}
EVAL_PREFIXES = ("val/", "openrlhf/")  # the only keys of the OpenRLHF writer's evaluation rows


def finite(value) -> float | None:
    """A row's value as a finite float, else None (bools, strings, NaN and inf are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _is_eval_row(row: dict) -> bool:
    keys = [key for key in row if key != "step"]
    return bool(keys) and all(key.startswith(EVAL_PREFIXES) for key in keys)


def read_steps(run_dir: Path) -> list[dict]:
    """One row per training step, in step order, as the local engine writes them.

    The local engine puts a step's validation (`val/...`) in that step's row; the OpenRLHF
    writer (engines/openrlhf/run_files.py) appends it as a row of its own with the same `step`,
    after the step's row: here it is merged into that row, so no reader counts it as a step.
    An evaluation with no training row of its step (one run before the first step) is left out,
    as the local engine has no such validation. A later training row for a step already read
    replaces it and its evaluation (an appended log of a resumed run redoes steps).
    NaN/inf read as float NaN/inf however they were logged (the local writer writes strings,
    JSON allows bare NaN), so every reader filters them alike (`finite`); the gradient-norm
    alarm still sees an inf.
    """
    steps: dict[int, dict] = {}
    pending_eval: dict[int, dict] = {}
    for raw in read_metrics(run_dir):
        step = raw.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            continue  # not a step row: nothing any writer produces
        row = {key: NON_FINITE.get(value.strip().lower(), value) if isinstance(value, str) else value
               for key, value in raw.items()}
        if _is_eval_row(row):
            if step in steps:
                steps[step].update(row)
            else:  # kept in case its step's row follows (no writer does that today)
                pending_eval.setdefault(step, {}).update(row)
        else:
            steps[step] = {**pending_eval.pop(step, {}), **row}
    return [steps[step] for step in sorted(steps)]


# The parts of a step's time the step line shows (seconds; the step total includes them all).
STEP_PARTS = (("rollout", "time/rollout_s"), ("probe", "probe/time_s"), ("grad", "grad_prefilter/time_s"),
              ("old-logp", "time/old_log_probs_s"), ("ref", "time/ref_log_probs_s"), ("values", "time/values_s"),
              ("grad", "grad/time_s"), ("update", "time/update_s"), ("val", "time/validation_s"))


class RunLog:
    def __init__(self, run_dir: Path, total_steps: int, config_dict: dict, *, resume_step: int = 0,
                 use_wandb: bool = False, use_tensorboard: bool = False, quiet: bool = False,
                 print_completions: bool = False):
        self.run_dir = Path(run_dir)
        self.total_steps = total_steps
        self.quiet = quiet
        self.print_completions = print_completions and not quiet
        # On resume, drop rows past the checkpoint: those steps are about to be redone.
        kept = [row for row in read_metrics(self.run_dir) if row.get("step", 0) < resume_step]
        self._metrics = (self.run_dir / METRICS_FILE).open("w")
        for row in kept:
            self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        self._completions = completions_lib.CompletionsLog(self.run_dir, resume_step)
        self._events = (self.run_dir / EVENTS_FILE).open("a")
        self._wandb = self._tensorboard = None
        if use_wandb:
            self._wandb = self._start_wandb(config_dict)
        if use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tensorboard = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError:
                self.event("warning", message="TensorBoard requested but not installed: pip install tensorboard")
        self._started = time.time()

    def _start_wandb(self, config_dict: dict):
        from ragen2 import wandb_log

        return wandb_log.start(self.run_dir, config_dict, lambda message: self.event("warning", message=message))

    def step(self, step: int, metrics: dict, completions: list[dict] = ()) -> None:
        """One step's metrics row, and its recorded completions (ragen2.completions.pick)."""
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        self._completions.write(step, list(completions))
        numeric = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if self._wandb is not None:
            logged = dict(numeric)
            if completions:  # in the same log call: one wandb step per training step
                import wandb

                logged["completions"] = wandb.Table(columns=completions_lib.TABLE_COLUMNS,
                                                    data=completions_lib.table_rows(step, completions))
            self._wandb.log(logged, step=step)
        if self._tensorboard is not None:
            for key, value in numeric.items():
                self._tensorboard.add_scalar(key, value, step)
            if completions:
                self._tensorboard.add_text("completions", completions_lib.markdown(completions), step)
        if not self.quiet:
            self._print_progress(step, metrics)
        if self.print_completions and completions:
            print(completions_lib.console_text(completions), file=sys.stderr, flush=True)

    def _print_progress(self, step: int, m: dict) -> None:
        parts = [f"step {step + 1}/{self.total_steps}"]
        if "rollout/reward_mean" in m:
            parts.append(f"reward {m['rollout/reward_mean']:+.3f}")
            parts.append(f"success {m.get('rollout/success_rate', 0):.2f}")
            parts.append(f"format {m.get('rollout/format_ok_fraction', 0):.2f}")
        if "snr/groups_kept" in m:
            parts.append(f"kept {int(m['snr/groups_kept'])}/{int(m['snr/groups_total'])}")
        if m.get("snr/skipped"):
            parts.append("SKIPPED")
        if "val/success_rate" in m:
            parts.append(f"val success {m['val/success_rate']:.2f}")
        if "time/step_s" in m:
            shares = [f"{name} {m[key]:.1f}" for name, key in STEP_PARTS if m.get(key, 0) >= 0.05]
            parts.append(f"{m['time/step_s']:.1f}s" + (f" ({', '.join(shares)})" if shares else ""))
        elapsed = time.time() - self._started
        print(" | ".join(parts) + f" | elapsed {elapsed / 60:.1f} min", file=sys.stderr, flush=True)

    def event(self, kind: str, **fields) -> None:
        self._events.write(json.dumps({"kind": kind, "time": time.time(), **fields}) + "\n")
        self._events.flush()
        if not self.quiet and kind != "checkpoint":
            print(f"[{kind}] {fields.get('message', '')}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self._metrics.close()
        self._completions.close()
        self._events.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tensorboard is not None:
            self._tensorboard.close()
