"""Interrupts lose nothing, damaged checkpoints are not fatal, and a run's thread count is part of it.

Signals are raised in-process at a chosen phase (inside the rollout: the step is abandoned;
inside the update: the step finishes), so each path is exercised deterministically; one test
sends a real SIGINT to a child `ragen2 train` process.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ragen2.engines.local import checkpoint as ckpt
from ragen2.engines.local import dynamic_sampling, trainer
from ragen2.cli import main
from ragen2.engines.local import learner
from ragen2.engines.local.interrupts import Interrupts, StepAbandoned
from ragen2.run_dir import read_metrics

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[4]
# What the process started with: default_int_handler, or SIG_IGN in a job a shell started with `&`
SIGINT_AT_IMPORT = signal.getsignal(signal.SIGINT)
TINY = ["rollout.num_groups=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "trainer.val_groups=2",
        "optim.micro_batch_size=2", "optim.mini_batch_size=4", "probe.every=0", "trainer.num_threads=1"]


def _common(model_dir, steps):
    return ["--model", str(model_dir), "--filter", "none", "--algo", "ppo", "--steps", str(steps), *TINY]


def _deterministic(rows):
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "throughput/")) and k != "probe/time_s"}
            for row in rows]


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
    """An uninterrupted 4-step run: what every interrupted-then-resumed run must equal."""
    out = tmp_path_factory.mktemp("reference")
    torch.set_num_threads(1)
    assert main(["train", "--quiet", "--out", str(out), "trainer.run_name=ref", *_common(tiny_model_dir, 4)]) == 0
    return _deterministic(read_metrics(out / "ref"))


# --- the signal guard itself -------------------------------------------------------------------


def test_a_signal_inside_an_abandonable_phase_raises_and_outside_it_is_deferred():
    guard = Interrupts(quiet=True)
    guard.install()
    try:
        with pytest.raises(StepAbandoned) as raised, guard.abandonable():
            signal.raise_signal(signal.SIGINT)
        assert raised.value.signum == signal.SIGINT and guard.requested
        guard.restore()
        guard = Interrupts(quiet=True)
        guard.install()
        signal.raise_signal(signal.SIGTERM)  # deferred: execution goes on
        assert guard.requested and guard.signal_name == "SIGTERM"
        with pytest.raises(StepAbandoned):  # a pending signal abandons the next abandonable phase at once
            with guard.abandonable():
                pass
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):  # a third signal quits
            signal.raise_signal(signal.SIGINT)
    finally:
        guard.restore()
    assert signal.getsignal(signal.SIGINT) is SIGINT_AT_IMPORT  # put back as it was (SIG_IGN under nohup &)


# --- interrupts during training ----------------------------------------------------------------


def _signal_during(monkeypatch, module, name, at_call, signum=signal.SIGINT):
    original = getattr(module, name)
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            if name == "rollout":
                signal.raise_signal(signum)  # mid-rollout: before any state changes
            result = original(*args, **kwargs)
            if name != "rollout":
                signal.raise_signal(signum)  # mid-update: after the optimiser stepped
            return result
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)


@pytest.mark.parametrize("phase, steps_done", [("rollout", 2), ("update", 3)])
def test_an_interrupt_saves_the_last_completed_step_and_resume_equals_an_uninterrupted_run(
        tiny_model_dir, tmp_path, monkeypatch, capsys, reference, phase, steps_done):
    module, name = (dynamic_sampling, "rollout") if phase == "rollout" else (learner, "ppo_update")
    _signal_during(monkeypatch, module, name, at_call=3)  # during step 3 (index 2)
    run = tmp_path / "r"
    code = main(["train", "--out", str(tmp_path), "trainer.run_name=r", *_common(tiny_model_dir, 4)])
    err = capsys.readouterr().err
    assert code == 128 + signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is SIGINT_AT_IMPORT  # train() put the handlers back
    assert [r["step"] for r in read_metrics(run)] == list(range(steps_done))
    assert ckpt.latest_checkpoint(run).name == f"step_{steps_done:06d}"  # saved although save_every=0
    stop = [e for e in _events(run) if e["kind"] == "stop"]
    assert len(stop) == 1 and stop[0]["reason"] == "interrupted" and stop[0]["step"] == steps_done
    assert f"ragen2 train --resume {run}" in err
    assert not (run / "summary.json").exists()  # not finished: a bench runner must resume it
    monkeypatch.undo()
    assert main(["train", "--quiet", "--resume", str(run)]) == 0
    assert _deterministic(read_metrics(run)) == reference
    assert json.loads((run / "summary.json").read_text())["steps"] == 4


def test_an_interrupt_before_the_first_step_finishes_says_there_is_nothing_to_resume(
        tiny_model_dir, tmp_path, monkeypatch, capsys):
    _signal_during(monkeypatch, dynamic_sampling, "rollout", at_call=1, signum=signal.SIGTERM)
    code = main(["train", "--out", str(tmp_path), "trainer.run_name=r", *_common(tiny_model_dir, 3)])
    assert code == 128 + signal.SIGTERM
    assert "nothing to resume" in capsys.readouterr().err
    assert ckpt.latest_checkpoint(tmp_path / "r") is None
    assert main(["train", "--resume", str(tmp_path / "r")]) == 2
    assert "nothing to resume from" in capsys.readouterr().err


@pytest.mark.parametrize("replaced", [False, True])
def test_a_run_whose_directory_is_removed_stops_and_writes_nothing_into_a_new_one(
        tiny_model_dir, tmp_path, monkeypatch, capsys, replaced):
    """rm -rf of a live run (and, with `replaced`, a new run of the same name started in its
    place): the old run must not write its checkpoint or rows into what is now another run's."""
    import shutil

    run = tmp_path / "r"
    original = dynamic_sampling.rollout
    calls = []

    def remove_during_step_2(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            shutil.rmtree(run)
            if replaced:
                run.mkdir()
                (run / "config.yaml").write_text("another run's\n")
        return original(*args, **kwargs)

    monkeypatch.setattr(dynamic_sampling, "rollout", remove_during_step_2)
    code = main(["train", "--out", str(tmp_path), "trainer.run_name=r", "trainer.save_every=1",
                 *_common(tiny_model_dir, 4)])
    err = capsys.readouterr().err
    assert code == 1
    assert f"run directory {run} was removed or replaced" in err and "stopped after step 1" in err
    assert "Traceback" not in err
    assert len(calls) == 2  # it stopped at the end of the step it noticed in
    if replaced:
        assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]
        assert (run / "config.yaml").read_text() == "another run's\n"
    else:
        assert not run.exists()


def test_a_real_sigint_to_a_training_process_checkpoints_and_prints_the_resume_command(
        tiny_model_dir, tmp_path, reference):
    run = tmp_path / "child"
    command = [sys.executable, "-m", "ragen2.cli", "train", "--out", str(tmp_path), "trainer.run_name=child",
               *_common(tiny_model_dir, 40)]
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while len(read_metrics(run)) < 1:
        assert child.poll() is None, child.communicate()[1]
        assert time.time() < deadline, "no step within the time limit"
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert "Traceback" not in err and f"ragen2 train --resume {run}" in err
    done = len(read_metrics(run))
    assert done >= 1 and ckpt.latest_checkpoint(run).name == f"step_{done:06d}"
    assert _deterministic(read_metrics(run)) == reference[:done]  # same numbers as the in-process run


# --- resuming ----------------------------------------------------------------------------------


@pytest.fixture
def three_saved_steps(tiny_model_dir, tmp_path):
    run = tmp_path / "r"
    assert main(["train", "--quiet", "--out", str(tmp_path), "trainer.run_name=r", "trainer.save_every=1",
                 *_common(tiny_model_dir, 3)]) == 0
    assert [p.name for p in ckpt.complete_checkpoints(run)] == ["step_000003", "step_000002"]
    return run


def _snapshot(run: Path) -> dict:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}


@pytest.mark.parametrize("damaged", ["policy/model.safetensors", "optimizers_and_rng.pt"])
def test_a_truncated_checkpoint_falls_back_to_the_previous_one(three_saved_steps, reference, capsys, damaged):
    run = three_saved_steps
    path = run / "checkpoints" / "step_000003" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert main(["train", "--quiet", "--resume", str(run), "trainer.total_steps=4"]) == 0
    err = capsys.readouterr().err
    assert f"checkpoint step_000003 is damaged ({damaged} is" in err and "falling back" in err
    assert "Traceback" not in err
    resumes = [e for e in _events(run) if e["kind"] == "resume"]
    assert resumes[-1]["step"] == 2
    assert _deterministic(read_metrics(run)) == reference  # steps 3 and 4 redone from step 2's state


def test_a_checkpoint_unreadable_at_full_size_also_falls_back(three_saved_steps, capsys):
    run = three_saved_steps
    path = run / "checkpoints" / "step_000003" / "optimizers_and_rng.pt"
    path.write_bytes(b"\0" * path.stat().st_size)  # sizes match: only loading it tells
    assert main(["train", "--quiet", "--resume", str(run), "trainer.total_steps=4"]) == 0
    assert "checkpoint step_000003 is damaged" in capsys.readouterr().err
    assert [e for e in _events(run) if e["kind"] == "resume"][-1]["step"] == 2


def test_a_failed_resume_changes_nothing_in_the_run_directory(three_saved_steps, capsys):
    run = three_saved_steps
    for step in ("step_000003", "step_000002"):
        (run / "checkpoints" / step / "policy" / "model.safetensors").write_bytes(b"cut")
    before = _snapshot(run)
    assert main(["train", "--quiet", "--resume", str(run), "trainer.total_steps=5"]) == 2
    err = capsys.readouterr().err
    assert "every checkpoint is damaged; nothing to resume from" in err and "Traceback" not in err
    assert _snapshot(run) == before  # config.yaml, metrics.jsonl, events.jsonl untouched


def test_resuming_a_finished_run_says_how_to_extend_it(three_saved_steps, capsys):
    before = _snapshot(three_saved_steps)
    assert main(["train", "--resume", str(three_saved_steps)]) == 0
    assert f"ragen2 train --resume {three_saved_steps} trainer.total_steps=6" in capsys.readouterr().err
    assert _snapshot(three_saved_steps) == before


# --- the thread count is part of the run -------------------------------------------------------


def test_the_thread_count_is_recorded_and_resume_restores_it(three_saved_steps, tiny_model_dir):
    import yaml

    run = three_saved_steps
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["num_threads"] == 1
    assert json.loads((ckpt.latest_checkpoint(run) / "state.json").read_text())["num_threads"] == 1
    torch.set_num_threads(2)
    from ragen2.config import build_config

    cfg = build_config(yaml.safe_load((run / "config.yaml").read_text()))
    trainer.setup(cfg, run, resume=True, quiet=True).services.log.close()
    assert torch.get_num_threads() == 1


def test_an_unset_thread_count_is_resolved_and_written(tiny_model_dir, tmp_path):
    import yaml

    torch.set_num_threads(2)
    args = [a for a in _common(tiny_model_dir, 1) if not a.startswith("trainer.num_threads")]
    assert main(["train", "--quiet", "--out", str(tmp_path), "trainer.run_name=r", *args]) == 0
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["trainer"]["num_threads"] == 2


_MKL_STATE = """
import ctypes, json, os, sys, torch
from ragen2.config import build_config
from ragen2.engines.local.trainer import apply_threads
if sys.argv[1] == "touched":  # what an earlier test or a library may have done in this process
    torch.set_num_threads(1)
lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
apply_threads(build_config({"trainer": {"num_threads": int(sys.argv[2])}}))
print(json.dumps([torch.get_num_threads(), lib.mkl_get_max_threads(), lib.mkl_serv_get_dynamic()]))
"""


@pytest.mark.parametrize("wanted", ["default", "1"])
def test_the_thread_state_a_run_computes_with_does_not_depend_on_the_process_history(wanted):
    """MKL's thread count and its dynamic threading are process state that torch.set_num_threads sets
    but a fresh process leaves at MKL's defaults; a run must start from the same state either way
    (on Intel AVX512, an in-process run after other runs differed from a fresh child at step 0)."""
    import ctypes
    import os

    if not hasattr(ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")),
                   "mkl_serv_get_dynamic"):
        pytest.skip("this torch build has no MKL")
    count = str(torch.get_num_threads()) if wanted == "default" else wanted
    states = {history: json.loads(subprocess.run([sys.executable, "-c", _MKL_STATE, history, count], cwd=ROOT,
                                                 capture_output=True, text=True, check=True).stdout)
              for history in ("fresh", "touched")}
    assert states["fresh"] == states["touched"] == [int(count), int(count), 0]


def test_resuming_with_another_thread_count_warns(three_saved_steps, capsys):
    assert main(["train", "--quiet", "--resume", str(three_saved_steps), "trainer.total_steps=4",
                 "trainer.num_threads=2"]) == 0
    assert "written with 1 torch threads, this run uses 2" in capsys.readouterr().err



def test_low_validation_success_stops_the_run_as_ragen2_does(tiny_model_dir, tmp_path):
    # The random tiny model never succeeds: with a validation every step, the 2nd low one stops it.
    assert main(["train", "--quiet", "--out", str(tmp_path), "trainer.run_name=r", "trainer.val_every=1",
                 "stop.low_val_patience=2", *_common(tiny_model_dir, 6)]) == 0
    rows = read_metrics(tmp_path / "r")
    assert len(rows) == 2 and rows[-1]["stop_reason"] == "low_validation_success"
    assert [r["snr/low_validations"] for r in rows] == [1.0, 2.0]
    assert ckpt.latest_checkpoint(tmp_path / "r").name == "step_000002"  # the stopped run is saved
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["stop_reason"] == "low_validation_success"
