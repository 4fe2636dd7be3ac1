"""A run directory: the names of its files, their writers, their readers, and summary.json.

    RUN_DIR/config.yaml         the resolved config (what ran, `model.dtype` decided)
    RUN_DIR/metrics.jsonl       one flushed line per step (MetricsFile; RunLog in the local engine)
    RUN_DIR/events.jsonl        alerts, stops, checkpoints, warnings (RunLog.event)
    RUN_DIR/completions.jsonl   a few trajectories per step (CompletionsLog; records: ragen2.instruments.completions)
    RUN_DIR/summary.json        written when a run ends (`summary`): a bench cell with one is done
    RUN_DIR/checkpoints/step_NNNNNN/   ragen2.engines.local.checkpoint writes them; read here (read_state, latest_checkpoint)
    RUN_DIR/tensorboard/ wandb_run_id curves.png audit/ export/ eval/ openrlhf/ model/

Both engines write through MetricsFile, CompletionsLog and `summary`; `ragen2 plot`, `audit` and
`bench` read through `read_steps`, so a run reads the same whichever engine wrote it.

JSON has no NaN or infinity. A non-finite number is written as its Python string ("nan", "inf",
"-inf": kept visible rather than dropping the row) and read back as the float, by `read_steps`.
`finite` is how every reader then turns a value into a number or None.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import yaml

from ragen2 import metric_names as names
from ragen2 import wandb_log
from ragen2.instruments import completions as completions_lib

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
COMPLETIONS_FILE = "completions.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_STATE_FILE = "state.json"  # in a checkpoint folder, written last: the checkpoint is complete
POLICY_DIR, CRITIC_DIR = "policy", "critic"  # a checkpoint's model folders
TENSORBOARD_DIR = "tensorboard"
WANDB_RUN_ID_FILE = wandb_log.RUN_ID_FILE
CURVES_FILE = "curves.png"  # ragen2 plot
AUDIT_DIR = "audit"  # ragen2 audit RUN_DIR
EXPORT_DIR = "export"  # ragen2 export
EVAL_DIR = "eval"  # ragen2 eval
OPENRLHF_DIR = "openrlhf"  # the OpenRLHF engine's datasets and settings
OPENRLHF_MODEL_DIR = "model"  # where OpenRLHF saves the final model


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def checkpoint_name(step: int) -> str:
    """The folder of the checkpoint written after `step` steps."""
    return f"step_{step:06d}"


# --- reading checkpoints (engines/local/checkpoint writes them) -------------------------------


class CheckpointDamaged(RuntimeError):
    """A checkpoint folder whose files are missing, cut short or unreadable."""


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints with their state file (written last), newest first."""
    folder = checkpoints_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.glob("step_*") if (p / CHECKPOINT_STATE_FILE).is_file()), reverse=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    done = complete_checkpoints(run_dir)
    return done[0] if done else None


def read_state(path: Path) -> dict:
    """The checkpoint's JSON state, after checking that its files are all there at full size."""
    try:
        state = json.loads((Path(path) / CHECKPOINT_STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointDamaged(f"{CHECKPOINT_STATE_FILE} unreadable ({error})") from None
    for name, size in state.get("files", {}).items():  # absent in checkpoints written before sizes were kept
        file = Path(path) / name
        actual = file.stat().st_size if file.is_file() else None
        if actual != size:
            raise CheckpointDamaged(f"{name} is {'missing' if actual is None else f'{actual} bytes, expected {size}'}")
    return state


# --- the NaN rule ---------------------------------------------------------------------------

NON_FINITE = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf,
              "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}


def encode(value):
    """A value as written: a non-finite float as its string."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def decode(value):
    """A value as read: a written non-finite number (any spelling) back as the float."""
    return NON_FINITE.get(value.strip().lower(), value) if isinstance(value, str) else value


def finite(value) -> float | None:
    """A row's value as a finite float, else None (bools, strings, NaN and inf are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# --- writers --------------------------------------------------------------------------------


def _jsonl_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut short by a kill: everything before it is intact
    return rows


class MetricsFile:
    """metrics.jsonl: one line per row, flushed as it is written.

    `resume_step=None` appends to what is there (the file is made on the first row); a number
    first drops the rows of steps at or after it (a resumed run redoes those steps)."""

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        self.path = Path(run_dir) / METRICS_FILE
        self._file = None
        if resume_step is not None:
            kept = [row for row in read_metrics(run_dir) if row.get("step", 0) < resume_step]
            self._file = self.path.open("w")
            for row in kept:
                self.write(row)

    def write(self, row: dict) -> None:
        if self._file is None:
            self._file = self.path.open("a")
        self._file.write(json.dumps({key: encode(value) for key, value in row.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class CompletionsLog:
    """completions.jsonl: appended and flushed per step; on resume, lines of steps at or after the
    checkpoint's are dropped first (those steps are redone and write them again)."""

    def __init__(self, run_dir: Path, resume_step: int = 0):
        self.path = Path(run_dir) / COMPLETIONS_FILE
        self._file = None
        if self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break  # a line cut short by a kill: everything before it is intact
                if row.get("step", 0) < resume_step:
                    kept.append(line)
            self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, step: int, records: list[dict]) -> None:
        if not records:
            return
        if self._file is None:  # created on the first record: log_completions=0 leaves no file
            self._file = self.path.open("a")
        for record in records:
            self._file.write(json.dumps({"step": step, **record}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class RunDirectoryGone(RuntimeError):
    """The run directory was removed or replaced while a run was writing to it."""


def _directory_identity(path: Path) -> tuple | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


class DirectoryGuard:
    """A run's hold on its directory: (device, inode) when the run opened it. Both engines check
    it before each write, so a run whose directory was removed (rm -rf of a live run) or replaced
    by another run of the same name stops instead of mixing its rows, checkpoint or summary into
    the new one's."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.identity = _directory_identity(self.run_dir)

    def check(self, step: int) -> None:
        """Raise RunDirectoryGone if the directory is no longer the one opened; `step` is the
        number of completed steps, for the message."""
        if self.identity is not None and _directory_identity(self.run_dir) != self.identity:
            raise RunDirectoryGone(
                f"run directory {self.run_dir} was removed or replaced while this run was writing to it; "
                f"stopped after step {step} without writing to it again")


def write_config(run_dir: Path, cfg) -> None:
    (Path(run_dir) / CONFIG_FILE).write_text(cfg.to_yaml())


def summary(steps: list[dict], *, run_dir: Path, engine: str, stop_reason: str | None, wall_s: float,
            num_steps: int | None = None, steps_skipped: int | None = None, **extra) -> dict:
    """summary.json's content, from a run's step rows (`steps_of`'s shape), for either engine.

    The counts default to the rows'; an engine that keeps its own (the OpenRLHF controller's skip
    ledger) passes them. Validation success is None where only a reward was measured (OpenRLHF's
    evaluator): a reward is not passed off as a success. `extra` is engine-specific and goes last.
    """
    num_steps = len(steps) if num_steps is None else num_steps
    if steps_skipped is None:
        steps_skipped = sum(1 for r in steps if r.get(names.SNR_SKIPPED))
    rollouts = [r for r in steps if names.ROLLOUT_REWARD_MEAN in r]
    first, last = (rollouts[0], rollouts[-1]) if rollouts else ({}, {})
    success = [finite(r.get(names.VAL_SUCCESS_RATE)) for r in steps]
    success = [v for v in success if v is not None]  # a NaN one is no best
    reward = [finite(r.get(names.VAL_REWARD_MEAN)) for r in steps]
    reward = [v for v in reward if v is not None]
    return {
        "run_dir": str(run_dir), "engine": engine,
        "steps": num_steps, "steps_skipped": steps_skipped, "steps_trained": num_steps - steps_skipped,
        "stop_reason": stop_reason,
        "first_reward_mean": first.get(names.ROLLOUT_REWARD_MEAN),
        "last_reward_mean": last.get(names.ROLLOUT_REWARD_MEAN),
        "first_success_rate": first.get(names.ROLLOUT_SUCCESS_RATE),
        "last_success_rate": last.get(names.ROLLOUT_SUCCESS_RATE),
        "final_val_success_rate": success[-1] if success else None,
        **before_after(run_dir, success[-1] if success else None),
        "best_val_success_rate": max(success) if success else None,
        "final_val_reward_mean": reward[-1] if reward else None,
        "best_val_reward_mean": max(reward) if reward else None,
        "wall_s_this_session": round(wall_s, 1),
        **extra,
    }


def before_after(run_dir: Path, final: float | None) -> dict:
    """Validation success of the untrained model (trainer.val_before's event, the last one where a
    restarted run wrote two) and the final one's difference from it: the measure a run is judged by."""
    before = None
    if (Path(run_dir) / EVENTS_FILE).is_file():
        for event in read_events(run_dir):
            if event.get("kind") == "validation_before":
                before = finite((event.get("metrics") or {}).get(names.VAL_SUCCESS_RATE))
    change = None if before is None or final is None else round(final - before, 6)
    return {"val_before_success_rate": before, "val_success_change": change}


def write_summary(run_dir: Path, content: dict) -> None:
    (Path(run_dir) / SUMMARY_FILE).write_text(json.dumps({k: encode(v) for k, v in content.items()}, indent=1))


# --- readers --------------------------------------------------------------------------------


def read_metrics(run_dir: Path) -> list[dict]:
    """The file's rows as written, in file order (non-finite values still strings); readers want `read_steps`."""
    return _jsonl_rows(Path(run_dir) / METRICS_FILE)


EVAL_PREFIXES = (names.VAL, names.OPENRLHF)  # the only keys of the OpenRLHF writer's evaluation rows


def _is_eval_row(row: dict) -> bool:
    keys = [key for key in row if key != "step"]
    return bool(keys) and all(key.startswith(EVAL_PREFIXES) for key in keys)


def steps_of(rows: list[dict]) -> list[dict]:
    """One row per training step, in step order, as the local engine writes them.

    The local engine puts a step's validation (`val/...`) in that step's row; the OpenRLHF
    engine appends it as a row of its own with the same `step`, after the step's row: here it is
    merged into that row, so no reader counts it as a step. An evaluation with no training row of
    its step (one run before the first step) is left out, as the local engine has no such
    validation. A later training row for a step already read replaces it and its evaluation (an
    appended log of a resumed run redoes steps). Non-finite values come back as floats (`decode`).
    """
    steps: dict[int, dict] = {}
    pending_eval: dict[int, dict] = {}
    for raw in rows:
        step = raw.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            continue  # not a step row: nothing any writer produces
        row = {key: decode(value) for key, value in raw.items()}
        if _is_eval_row(row):
            if step in steps:
                steps[step].update(row)
            else:  # kept in case its step's row follows (no writer does that today)
                pending_eval.setdefault(step, {}).update(row)
        else:
            steps[step] = {**pending_eval.pop(step, {}), **row}
    return [steps[step] for step in sorted(steps)]


def read_steps(run_dir: Path) -> list[dict]:
    """How every reader sees a run's metrics (`ragen2 plot`, `audit`, `bench`), whichever engine wrote it."""
    return steps_of(read_metrics(run_dir))


def read_events(run_dir: Path) -> list[dict]:
    """events.jsonl's events; a line cut short by a kill is skipped."""
    path = Path(run_dir) / EVENTS_FILE
    events = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def read_completions(run_dir: Path) -> list[dict]:
    return _jsonl_rows(Path(run_dir) / COMPLETIONS_FILE)


def read_config(run_dir: Path) -> dict | None:
    """config.yaml as plain data, or None where the folder has none (not a run directory)."""
    path = Path(run_dir) / CONFIG_FILE
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else None


def read_summary(run_dir: Path) -> dict | None:
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def warm_start_of(model_name: str) -> dict | None:
    """What a run started from when `model.name` is a `ragen2 sft` run directory: its path, the digest of
    its weights and of its demos (from its summary.json), so a cell says which warm start it used."""
    folder = Path(str(model_name)).expanduser()
    summary = read_summary(folder) if (folder / SUMMARY_FILE).is_file() else None
    if not summary or summary.get("kind") != "sft":
        return None
    return {"warm_start": str(folder), "model_sha256": summary.get("model_sha256"),
            "demos_sha256": summary.get("demos_sha256"), "sft_steps": summary.get("steps")}


def has_run(run_dir: Path) -> bool:
    """True when the folder already holds a run's metrics (a new run must not write over them)."""
    path = Path(run_dir) / METRICS_FILE
    return path.is_file() and path.stat().st_size > 0


# --- the local engine's logger ----------------------------------------------------------------

# The parts of a step's time the step line shows (seconds; the step total includes them all).
STEP_PARTS = (("rollout", names.TIME_ROLLOUT_S), ("probe", names.PROBE_TIME_S), ("grad", names.GRAD_PREFILTER_TIME_S),
              ("old-logp", names.TIME_OLD_LOG_PROBS_S), ("ref", names.TIME_REF_LOG_PROBS_S),
              ("values", names.TIME_VALUES_S), ("grad", names.GRAD_TIME_S), ("update", names.TIME_UPDATE_S),
              ("val", names.TIME_VALIDATION_S))


def _spread_note(m: dict) -> str:
    """` (S with spread)` when some groups are flat; `: no learning signal` when every group's rewards
    are equal and the update still ran: "kept 2/2" alone read as a healthy step (issue 49, item 6)."""
    flat, total = m.get(names.SNR_ZERO_SPREAD_GROUPS), m.get(names.SNR_GROUPS_TOTAL)
    if flat is None or total is None or flat <= 0:
        return ""
    spread = int(total) - int(flat)
    # filter.signal=success counts success spread; rewards can still differ (format penalties)
    silent = spread == 0 and not m.get(names.SNR_SKIPPED) and m.get(names.SNR_REWARD_STD_MAX, 0.0) <= 0
    return f" ({spread} with spread{': no learning signal' if silent else ''})"


class RunLog:
    """The local engine's writer: metrics, completions and events files, wandb and TensorBoard when
    asked for, and a one-line progress display."""

    def __init__(self, run_dir: Path, total_steps: int, config_dict: dict, *, resume_step: int = 0,
                 use_wandb: bool = False, use_tensorboard: bool = False, quiet: bool = False,
                 print_completions: bool = False):
        self.run_dir = Path(run_dir)
        self.total_steps = total_steps
        self.quiet = quiet
        self.print_completions = print_completions and not quiet
        self._metrics = MetricsFile(self.run_dir, resume_step)
        self._completions = CompletionsLog(self.run_dir, resume_step)
        self._events = (self.run_dir / EVENTS_FILE).open("a")
        self._wandb = self._tensorboard = None
        if use_wandb:
            self._wandb = self._start_wandb(config_dict)
        if use_tensorboard:
            try:  # optional dependency
                from torch.utils.tensorboard import SummaryWriter

                self._tensorboard = SummaryWriter(str(self.run_dir / TENSORBOARD_DIR))
            except ImportError:
                self.event("warning", message="TensorBoard requested but not installed: pip install tensorboard")
        self._started = time.time()

    def _start_wandb(self, config_dict: dict):
        return wandb_log.start(self.run_dir, config_dict, lambda message: self.event("warning", message=message))

    def step(self, step: int, metrics: dict, completions: list[dict] = ()) -> None:
        """One step's metrics row, and its recorded completions (ragen2.instruments.completions.pick)."""
        self._metrics.write({"step": step, **metrics})
        self._completions.write(step, list(completions))
        numeric = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if self._wandb is not None:
            logged = dict(numeric)
            if completions:  # in the same log call: one wandb step per training step
                import wandb  # optional dependency, present once self._wandb is

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
        if names.ROLLOUT_REWARD_MEAN in m:
            parts.append(f"reward {m[names.ROLLOUT_REWARD_MEAN]:+.3f}")
            parts.append(f"success {m.get(names.ROLLOUT_SUCCESS_RATE, 0):.2f}")
            parts.append(f"format {m.get(names.ROLLOUT_FORMAT_OK_FRACTION, 0):.2f}")
        if names.SNR_GROUPS_KEPT in m:
            parts.append(f"kept {int(m[names.SNR_GROUPS_KEPT])}/{int(m[names.SNR_GROUPS_TOTAL])}"
                         + _spread_note(m))
        if m.get(names.SAMPLING_ROUNDS, 1) > 1:  # dynamic sampling: the batch was refilled
            parts.append(f"{int(m[names.SAMPLING_ROUNDS])} sampling rounds"
                         + (" (round limit: batch not full)" if m.get(names.SAMPLING_ROUND_LIMIT) else ""))
        if m.get(names.SNR_SKIPPED):
            parts.append("SKIPPED")
        if names.VAL_SUCCESS_RATE in m:
            parts.append(f"val success {m[names.VAL_SUCCESS_RATE]:.2f}")
        if names.TIME_STEP_S in m:
            shares = [f"{name} {m[key]:.1f}" for name, key in STEP_PARTS if m.get(key, 0) >= 0.05]
            parts.append(f"{m[names.TIME_STEP_S]:.1f}s" + (f" ({', '.join(shares)})" if shares else ""))
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
