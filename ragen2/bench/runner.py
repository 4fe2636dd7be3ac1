"""Run a suite's cells one after another, resumably, each an ordinary run directory.

Cells run in a child process each (`python -m ragen2.bench.worker RUN_DIR`), not in this one:
a cell that crashes the interpreter (out of memory, a CUDA fault, a segfault in a kernel) or
leaks memory takes only itself down, and every cell starts from a clean allocator. The price is
a Python + torch start and a model load per cell: seconds from the safetensors cache, small
beside a cell's minutes of training. `in_process_cell` runs a cell here instead (`--in-process`,
for debugging, and for tests that want the real trainer without a process start).

State on disk, so `ragen2 bench` can be stopped and started again:
  <out>/bench.json                the manifest: suite, engine, every cell's labels and run dir
  <out>/runs/<cell>/config.yaml   written before the cell starts; the resume check compares it
  <out>/runs/<cell>/summary.json  written by the trainer at the end: the cell is done
  <out>/runs/<cell>/bench_cell.json  status, attempts, reason of the last failure, wall time
  <out>/runs/<cell>/bench_val_before.json  validation of the untrained model (validate_before)
  <out>/runs/<cell>/bench_claim.json  held while a runner runs the cell (ragen2.bench.claims)
A done cell is skipped; any other cell is (re)started with resume=True, which continues from its
latest checkpoint when it has one. A cell another live runner holds is skipped too, so two or
more `ragen2 bench` processes on one folder share its cells (one core each, say).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ragen2.bench.machine import code_version, cpu_name, machine_info
from ragen2.bench.suite import Cell, Suite, SuiteError, config_difference, key_settings
from ragen2.bench import claims, worker
from ragen2.bench.worker import ERROR_FILE
from ragen2.config import ConfigError, saved_config
from ragen2.run_dir import CONFIG_FILE, SUMMARY_FILE, checkpoints_dir, read_steps, read_summary, write_config

MANIFEST = "bench.json"
CELL_STATE = "bench_cell.json"
CELL_LOG = "bench_output.log"
POLL_S = 2.0
LOCATION_KEYS = ("trainer.out", "trainer.run_name")


class CellFailed(RuntimeError):
    """A cell that did not finish; the message is the reason shown in the table."""


def is_done(run_dir: Path) -> bool:
    return (Path(run_dir) / SUMMARY_FILE).is_file()


def read_state(run_dir: Path) -> dict:
    path = Path(run_dir) / CELL_STATE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_state(run_dir: Path, **fields) -> dict:
    state = {**read_state(run_dir), **fields}
    (Path(run_dir) / CELL_STATE).write_text(json.dumps(state, indent=1))
    return state


# Keys whose config value means "decide when the run starts" (written into config.yaml as decided):
# a saved run holding any decided value is the same run.
RESOLVED_AT_START = {"trainer.num_threads": 0, "model.dtype": "auto", "probe.segment": "auto"}


def _resolved_at_start(cfg, key: str) -> bool:
    if key not in RESOLVED_AT_START:
        return False
    section, field = key.split(".")
    return getattr(getattr(cfg, section), field) == RESOLVED_AT_START[key]


# ... of which a resumed cell keeps its saved decision: what the probe scores must not change mid-run
# (threads and dtype are decided again on the machine that resumes, as before)
KEPT_ON_RESUME = ("probe.segment",)


def _keep_resolved(cell: Cell):
    """The cell's config with the values its saved config.yaml already decided at start: a resumed
    cell keeps them (a run begun before probe.segment=auto existed keeps the reasoning probe)."""
    saved = cell.run_dir / CONFIG_FILE
    if not saved.is_file():
        return cell.config
    try:
        old = saved_config(saved)
    except ConfigError:
        return cell.config
    cfg = cell.config.model_copy(deep=True)
    for key in KEPT_ON_RESUME:
        if _resolved_at_start(cfg, key):
            section, field = key.split(".")
            setattr(getattr(cfg, section), field, getattr(getattr(old, section), field))
    return cfg


def check_resumable(cells: list[Cell]) -> None:
    """A run directory that already holds a different config is an error, before anything runs.

    Continuing it would mix two settings in one curve; the user chooses: another --out, or
    delete the folder.
    """
    problems = []
    for cell in cells:
        saved = cell.run_dir / CONFIG_FILE
        if saved.is_file() and saved.read_text() != cell.config.to_yaml():
            # Where the folder is named from (a relative or absolute --out) does not change the run.
            keys = [k for k in config_difference(saved.read_text(), cell.config) if k not in LOCATION_KEYS
                    and not _resolved_at_start(cell.config, k)]
            if keys:
                problems.append(f"{cell.run_dir} holds a run with another config (differs in {keys[:6]})")
    if problems:
        raise SuiteError("cannot resume: " + "; ".join(problems) + ". Use another --out or delete those folders.")


def write_manifest(out: Path, suite: Suite, cells: list[Cell], engine: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / MANIFEST
    # where the wall times were measured; each cell sets its own torch threads (its config.yaml)
    machine = {k: v for k, v in machine_info().items() if k != "torch_threads"}
    path.write_text(json.dumps({
        "suite": suite.name, "suite_path": str(suite.path), "description": suite.description,
        "published": suite.published, "keep_final_checkpoint": suite.keep_final_checkpoint,
        "validate_before": suite.validate_before, "engine": engine, "machine": machine,
        "suite_data": suite.data,
        "cells": [{**c.record(), "settings": key_settings(c)} for c in cells]}, indent=1))
    return path


def read_manifest(out: Path) -> dict:
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise SuiteError(f"{out}: no {MANIFEST} here; is it the --out folder of a `ragen2 bench` run?")
    return json.loads(path.read_text())


def _failure_reason(run_dir: Path, returncode: int) -> str:
    error_file = run_dir / ERROR_FILE
    if error_file.is_file():
        error = json.loads(error_file.read_text())
        return f"{error['type']}: {error['message']}".splitlines()[0][:300]
    if returncode < 0:
        hint = " (out of memory?)" if -returncode == 9 else ""
        return f"killed by signal {-returncode}{hint}"
    log = run_dir / CELL_LOG
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
    return f"exit code {returncode}" + (f": {lines[-1][:300]}" if lines else "")


def steps_logged(run_dir: Path) -> int:
    return len(read_steps(run_dir))  # not lines: an OpenRLHF run logs its evaluations as rows of their own


def subprocess_cell(cell: Cell, on_progress: Callable[[str], None], engine: str = "local",
                    threads: int | None = None, cluster: dict | None = None, validate_before: bool = False) -> None:
    """Train a cell in a child process; raises CellFailed with the reason if it does not finish."""
    command = [sys.executable, "-m", "ragen2.bench.worker", str(cell.run_dir), "--engine", engine]
    if threads:
        command += ["--threads", str(threads)]
    if validate_before:
        command.append("--validate-before")
    if cluster:
        command += ["--cluster", json.dumps(cluster)]
    total = cell.config.trainer.total_steps
    with (cell.run_dir / CELL_LOG).open("a") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n")
        log.flush()
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ,
                                 "PYTHONUNBUFFERED": "1"})
        try:
            while child.poll() is None:
                on_progress(f"{steps_logged(cell.run_dir)}/{total}")
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            child.terminate()  # the child gets the terminal's SIGINT too; this covers a pipe or a log
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
            raise
    on_progress(f"{steps_logged(cell.run_dir)}/{total}")
    if child.returncode != 0:
        raise CellFailed(_failure_reason(cell.run_dir, child.returncode))


def in_process_cell(cell: Cell, on_progress: Callable[[str], None], engine: str = "local",
                    threads: int | None = None, cluster: dict | None = None, validate_before: bool = False) -> None:
    if threads:
        import torch  # here only: the parent of subprocess cells never loads it

        torch.set_num_threads(threads)
    worker.run_cell(cell.run_dir, engine, quiet=True, cluster=cluster, validate_before=validate_before)


def _done_note(run_dir: Path) -> str:
    summary = read_summary(run_dir)
    value = summary.get("final_val_success_rate")
    note = "" if value is None else f"val success {value:.3f}"
    if summary.get("stop_reason"):
        note += f" (stopped: {summary['stop_reason']})"
    return note


def begun_commit(run_dir: Path) -> str | None:
    """The commit a cell began (or finished) on: None when it never started or ran outside a checkout."""
    return (read_state(run_dir).get("code") or {}).get("commit")


def seed_commit(cell: Cell, cells: list[Cell]) -> str | None:
    """The commit this cell's seed is bound to: the one its begun arms ran on (this cell's own
    included, so a half-run cell resumes on its code). A seed's arms are compared with each other,
    so they run on one commit (a suite may span sessions, commits and runners started apart)."""
    commits = {begun_commit(c.run_dir) for c in cells if c.seed == cell.seed}
    commits.discard(None)
    return min(commits) if commits else None  # more than one: a suite begun before this rule; any


def commit_to_resume(cells: list[Cell]) -> str | None:
    """The commit a runner must run on to finish the seeds begun on another one (the first such
    seed's), or None when no begun seed waits: `scripts/bench_background.sh` pins its code there."""
    for cell in cells:
        if not is_done(cell.run_dir) and (commit := seed_commit(cell, cells)):
            return commit
    return None


def run_cells(cells: list[Cell], run_cell: Callable, display, keep_final_checkpoint: bool = False,
              only: set[str] | None = None) -> dict[str, str]:
    """Run every cell not yet done; a failure is recorded and the next cell starts.

    Returns {cell name: final status}: done, failed, elsewhere (another live runner holds it) or
    other-commit (its seed's arms began on another commit than this code's; see
    `commit_to_resume`). KeyboardInterrupt marks the running cell interrupted (not failed) and
    propagates: the next `ragen2 bench` resumes it. `only`: run just these cells (by name); the
    others still decide which commit each seed is bound to.
    """
    statuses = {}
    code = (code_version() or {}).get("commit")
    for cell in cells:
        if is_done(cell.run_dir) and (only is None or cell.name in only):
            statuses[cell.name] = "done"
            display.update(cell.name, status="done", progress="skip", note=_done_note(cell.run_dir),
                           wall_s=read_state(cell.run_dir).get("wall_s"))
    for cell in cells:
        if statuses.get(cell.name) == "done" or (only is not None and cell.name not in only):
            continue
        if is_done(cell.run_dir):  # finished meanwhile by another runner
            statuses[cell.name] = "done"
            display.update(cell.name, status="done", note=_done_note(cell.run_dir))
            continue
        bound = seed_commit(cell, cells)
        if code and bound and bound != code:
            statuses[cell.name] = "other-commit"
            display.update(cell.name, status="other-commit",
                           note=f"seed {cell.seed}'s arms ran on {bound[:10]}; run there to pair them")
            continue
        cell.run_dir.mkdir(parents=True, exist_ok=True)
        held = claims.claim(cell.run_dir)
        if held is not None:
            statuses[cell.name] = "elsewhere"
            display.update(cell.name, status="elsewhere", note=f"run by {claims.describe(held)}")
            continue
        try:
            statuses[cell.name] = _run_claimed(cell, run_cell, display, keep_final_checkpoint)
        finally:
            claims.release(cell.run_dir)
    return statuses


def _run_claimed(cell: Cell, run_cell: Callable, display, keep_final_checkpoint: bool) -> str:
    """Run one cell this process holds the claim of; its final status."""
    write_config(cell.run_dir, _keep_resolved(cell))
    state = write_state(cell.run_dir, status="running", attempts=read_state(cell.run_dir).get("attempts", 0) + 1,
                        cpu=cpu_name(), code=code_version(),
                        reason=None)
    display.update(cell.name, status="running", note="")
    started = time.time()

    def spent() -> float:
        return round(state.get("wall_s", 0.0) + time.time() - started, 1)

    try:
        run_cell(cell, lambda progress: display.update(cell.name, progress=progress))
        if not is_done(cell.run_dir):
            raise CellFailed(f"the run ended without writing {SUMMARY_FILE}")
    except KeyboardInterrupt:
        write_state(cell.run_dir, status="interrupted", wall_s=spent())
        display.update(cell.name, status="interrupted", wall_s=spent())
        raise
    except Exception as error:  # noqa: BLE001 - one cell's failure must not stop the others
        reason = str(error) if isinstance(error, CellFailed) else f"{type(error).__name__}: {error}"
        reason = reason.splitlines()[0] if reason else type(error).__name__
        write_state(cell.run_dir, status="failed", reason=reason, wall_s=spent())
        display.update(cell.name, status="failed", note=reason, wall_s=spent())
        return "failed"
    # Done: the final checkpoint is only needed by `ragen2 eval`, and a 135M one is ~1.5 GB.
    if not keep_final_checkpoint:
        shutil.rmtree(checkpoints_dir(cell.run_dir), ignore_errors=True)
    write_state(cell.run_dir, status="done", reason=None, wall_s=spent())
    display.update(cell.name, status="done", note=_done_note(cell.run_dir), wall_s=spent())
    return "done"
