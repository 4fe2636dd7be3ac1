"""The bench runner: finished cells skipped, a failing cell isolated, resume from a checkpoint.

Most tests drive `run_cells` with a fake cell function (no model); one trains real cells of a
tiny in-process model, and one starts a real worker process that fails.
"""

import io
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import yaml

from ragen2.bench import claims, runner
from ragen2.bench.display import PlainDisplay
from ragen2.bench.suite import SuiteError, expand, load_suite
from ragen2.cli import main
from ragen2.config import Config
from ragen2.run_dir import read_metrics

TINY = ["rollout.num_groups=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "trainer.val_groups=2",
        "optim.micro_batch_size=2", "optim.mini_batch_size=4", "probe.every=0"]


def make_cells(tmp_path, seeds=(0, 1), overrides=(), model=None, keep=False):
    data = {"name": "t", "seeds": list(seeds), "keep_final_checkpoint": keep,
            "overrides": [*TINY, "trainer.total_steps=2", *overrides],
            "matrices": [{"name": "m", "algos": ["grpo"], "filters": ["none", "snr-top-p"], "envs": [None],
                          **({"models": [str(model)]} if model else {})}]}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    suite = load_suite(str(path))
    return suite, expand(suite, tmp_path / "bench")


def fake_cell(calls, fail=()):
    """Writes what a finished run leaves (metrics, summary, a checkpoint) unless the cell is in `fail`."""
    def run(cell, on_progress):
        calls.append(cell.name)
        on_progress("1/2")
        if cell.name in fail:
            raise RuntimeError(f"boom in {cell.name}\nsecond line of the traceback")
        (cell.run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "rollout/reward_mean": 0.5}) + "\n")
        (cell.run_dir / "checkpoints" / "step_000002").mkdir(parents=True)
        (cell.run_dir / "checkpoints" / "step_000002" / "state.json").write_text("{}")
        (cell.run_dir / "summary.json").write_text(json.dumps({"final_val_success_rate": 0.25, "steps": 2}))
    return run


def test_a_failing_cell_never_stops_the_others_and_a_rerun_skips_finished_cells(tmp_path):
    _, cells = make_cells(tmp_path)
    names = [c.name for c in cells]
    calls, stream = [], io.StringIO()
    statuses = runner.run_cells(cells, fake_cell(calls, fail={names[1]}), PlainDisplay(names, stream))
    assert calls == names  # the failure in the second cell did not stop the third and fourth
    assert statuses == {names[0]: "done", names[1]: "failed", names[2]: "done", names[3]: "done"}
    state = runner.read_state(cells[1].run_dir)
    assert state["status"] == "failed" and state["reason"] == f"RuntimeError: boom in {names[1]}"
    assert state["attempts"] == 1 and state["wall_s"] >= 0
    # where and on what code each cell ran: a long suite's cells span sessions and machines
    from ragen2.bench.machine import code_version, cpu_name
    assert state["cpu"] == cpu_name() and state["code"] == code_version()
    assert (cells[1].run_dir / "config.yaml").read_text() == cells[1].config.to_yaml()
    log = stream.getvalue()
    assert f"{names[1]}: failed" in log and "boom in" in log and f"{names[0]}: done" in log
    assert "val success 0.250" in log

    calls.clear()
    statuses = runner.run_cells(cells, fake_cell(calls), PlainDisplay(names, io.StringIO()))
    assert calls == [names[1]]  # only the unfinished cell runs again
    assert set(statuses.values()) == {"done"}
    assert runner.read_state(cells[1].run_dir)["attempts"] == 2
    assert runner.read_state(cells[1].run_dir)["reason"] is None


def test_a_seeds_arms_run_on_one_commit_and_the_runner_says_where_to_finish_them(tmp_path):
    from ragen2.bench.machine import code_version

    if code_version() is None:
        pytest.skip("runs from a checkout: the rule compares commits")
    _, cells = make_cells(tmp_path)  # seeds 0 and 1, arms none and snr-top-p
    names = [c.name for c in cells]
    runner.run_cells(cells[:1], fake_cell([]), PlainDisplay(names[:1], io.StringIO()))
    assert runner.commit_to_resume(cells) == code_version()["commit"]  # seed 0's arm finished on this code
    old = "0123456789" * 4  # as if seed 0's first arm had finished in an earlier session
    runner.write_state(cells[0].run_dir, code={"commit": old, "tracked_files_changed": 0})
    assert runner.commit_to_resume(cells) == old

    calls, stream = [], io.StringIO()
    statuses = runner.run_cells(cells, fake_cell(calls), PlainDisplay(names, stream))
    assert calls == names[2:]  # seed 1 runs here; seed 0's other arm waits for its commit
    assert statuses[names[1]] == "other-commit" and "seed 0's arms ran on 0123456789" in stream.getvalue()
    assert not (cells[1].run_dir / "summary.json").exists()
    assert runner.commit_to_resume(cells) == old

    # a cell begun elsewhere binds its seed too, before it finishes: a second runner started on
    # newer code while the first still runs a seed's first arm leaves that seed to the first
    (tmp_path / "later").mkdir()
    _, later = make_cells(tmp_path / "later")
    later[0].run_dir.mkdir(parents=True)
    runner.write_state(later[0].run_dir, status="running", code={"commit": old, "tracked_files_changed": 0})
    assert runner.seed_commit(later[1], later) == old and runner.commit_to_resume(later) == old


@pytest.mark.parametrize("keep", [False, True])
def test_the_final_checkpoint_is_deleted_unless_the_suite_keeps_it(tmp_path, keep):
    suite, cells = make_cells(tmp_path, seeds=(0,), keep=keep)
    runner.run_cells(cells, fake_cell([]), PlainDisplay([c.name for c in cells], io.StringIO()),
                     suite.keep_final_checkpoint)
    assert all((c.run_dir / "checkpoints").exists() == keep for c in cells)


def test_a_cell_without_summary_counts_as_failed_and_an_interrupt_is_not_a_failure(tmp_path):
    _, cells = make_cells(tmp_path, seeds=(0,))
    names = [c.name for c in cells]

    def quiet_exit(cell, on_progress):  # returns normally but leaves no summary.json
        pass

    statuses = runner.run_cells(cells, quiet_exit, PlainDisplay(names, io.StringIO()))
    assert set(statuses.values()) == {"failed"}
    assert runner.read_state(cells[0].run_dir)["reason"] == "the run ended without writing summary.json"

    def interrupted(cell, on_progress):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run_cells(cells, interrupted, PlainDisplay(names, io.StringIO()))
    assert runner.read_state(cells[0].run_dir)["status"] == "interrupted"


def test_a_run_directory_with_another_config_is_refused_before_anything_runs(tmp_path):
    _, cells = make_cells(tmp_path, seeds=(0,))
    runner.run_cells(cells, fake_cell([]), PlainDisplay([c.name for c in cells], io.StringIO()))
    runner.check_resumable(cells)  # same suite: fine
    (cells[0].run_dir / "config.yaml").write_text(
        cells[0].config.to_yaml().replace(f"out: {tmp_path}/bench/runs", "out: bench/runs"))
    assert "  out: bench/runs\n" in (cells[0].run_dir / "config.yaml").read_text()
    runner.check_resumable(cells)  # the same folder named relatively: still the same run
    _, changed = make_cells(tmp_path, seeds=(0,), overrides=["optim.actor_lr=1e-3"])
    with pytest.raises(SuiteError, match=r"another config \(differs in \['optim.actor_lr'\]\)"):
        runner.check_resumable(changed)


def test_a_field_added_after_a_cell_began_is_no_difference_but_a_changed_setting_is(tmp_path):
    # A cell finished before trainer.val_before existed: its config.yaml has no such key, and the
    # suite now sets it to false, unlike the field's default (true). The user changed nothing.
    _, cells = make_cells(tmp_path, seeds=(0,))
    cell = cells[0]
    assert cell.config.trainer.val_before is False and Config().trainer.val_before is True
    saved = yaml.safe_load(cell.config.to_yaml())
    del saved["trainer"]["val_before"]
    cell.run_dir.mkdir(parents=True)
    (cell.run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    runner.check_resumable([cell])
    saved["trainer"]["val_before"] = True  # written, and different: a real change of setting
    (cell.run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(SuiteError, match=r"differs in \['trainer.val_before'\]"):
        runner.check_resumable([cell])


def test_a_cell_begun_before_probe_segment_auto_resumes_with_the_segment_it_probed(tmp_path):
    _, cells = make_cells(tmp_path, seeds=(0,))
    cell = cells[0]
    assert cell.config.probe.segment == "auto"
    cell.run_dir.mkdir(parents=True)
    old = cell.config.model_copy(deep=True)
    old.probe.segment = "reasoning"  # what config.yaml held when "reasoning" was the default
    (cell.run_dir / "config.yaml").write_text(old.to_yaml())
    runner.check_resumable([cell])  # a value decided at start is no difference
    seen = []
    runner.run_cells([cell], lambda c, _: seen.append(yaml.safe_load((c.run_dir / "config.yaml").read_text())),
                     PlainDisplay([cell.name], io.StringIO()))
    assert seen[0]["probe"]["segment"] == "reasoning"  # kept, not re-decided as reply mid-run


# --- real cells --------------------------------------------------------------------------------



def _deterministic(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows]


def test_a_half_finished_cell_resumes_from_its_checkpoint(tmp_path, tiny_model_dir):
    torch.set_num_threads(1)
    suite, cells = make_cells(tmp_path, seeds=(0,), model=tiny_model_dir,
                              overrides=["trainer.save_every=1", "trainer.keep_last=2"])
    cell = cells[0]
    display = PlainDisplay([cell.name], io.StringIO())
    runner.run_cells([cell], runner.in_process_cell, display, keep_final_checkpoint=True)
    complete = read_metrics(cell.run_dir)
    assert len(complete) == 2 and runner.read_state(cell.run_dir)["status"] == "done"
    # Make it half-finished, as a process killed during step 2 leaves it: step 1's checkpoint only.
    import shutil

    shutil.rmtree(cell.run_dir / "checkpoints" / "step_000002")
    (cell.run_dir / "summary.json").unlink()
    runner.run_cells([cell], runner.in_process_cell, display, keep_final_checkpoint=False)
    events = [json.loads(line) for line in (cell.run_dir / "events.jsonl").read_text().splitlines()]
    resumes = [e for e in events if e["kind"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] == 1
    resumed = read_metrics(cell.run_dir)
    assert _deterministic(resumed) == _deterministic(complete)  # step 2 redone exactly, from the checkpoint
    assert not (cell.run_dir / "checkpoints").exists()  # finished and not kept
    assert runner.read_state(cell.run_dir)["attempts"] == 2


def test_a_crashing_worker_process_is_recorded_with_its_reason(tmp_path):
    _, cells = make_cells(tmp_path, seeds=(0,), model="/nonexistent/model")
    cell = cells[0]
    statuses = runner.run_cells([cell], runner.subprocess_cell, PlainDisplay([cell.name], io.StringIO()))
    assert statuses == {cell.name: "failed"}
    reason = runner.read_state(cell.run_dir)["reason"]
    assert reason == "ModelSourceError: no model directory at /nonexistent/model"
    assert "Traceback" in (cell.run_dir / runner.CELL_LOG).read_text()


def test_the_cli_retries_a_failed_cell_from_its_checkpoint_and_gives_up_after_three_tries(tmp_path, monkeypatch,
                                                                                          capsys):
    tries = {}

    def flaky(cell, on_progress, **options):  # the first try of every cell is killed; snr-top-p never recovers
        tries[cell.name] = tries.get(cell.name, 0) + 1
        if tries[cell.name] == 1 or "snr-top-p" in cell.name:
            raise runner.CellFailed("killed by signal 9 (out of memory?)")
        fake_cell([])(cell, on_progress)

    monkeypatch.setattr(runner, "in_process_cell", flaky)
    data = {"name": "t", "seeds": [0], "overrides": [*TINY, "trainer.total_steps=2"],
            "matrices": [{"name": "m", "algos": ["grpo"], "filters": ["none", "snr-top-p"], "envs": [None]}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "bench"
    code = main(["bench", str(tmp_path / "t.yaml"), "--out", str(out), "--in-process", "--plain", "--no-report"])
    assert code == 1 and tries == {"bandit--grpo--none--s0": 2, "bandit--grpo--snr-top-p--s0": 3}
    assert runner.read_state(out / "runs" / "bandit--grpo--none--s0")["status"] == "done"
    assert runner.read_state(out / "runs" / "bandit--grpo--snr-top-p--s0")["attempts"] == 3
    err = capsys.readouterr().err
    assert "retrying 2 failed cell(s) from their checkpoints" in err and "retrying 1 failed cell(s)" in err
    assert "1 cell(s) failed: bandit--grpo--snr-top-p--s0" in err


def test_cli_runs_a_suite_in_process_then_reports(tmp_path, tiny_model_dir, capsys):
    torch.set_num_threads(1)
    data = {"name": "tiny", "seeds": [0], "overrides": [*TINY, "trainer.total_steps=1"],
            "matrices": [{"name": "m", "algos": ["grpo"], "filters": ["none", "snr-top-p"], "envs": [None],
                          "models": [str(tiny_model_dir)]}]}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "bench"
    argv = ["bench", str(tmp_path / "tiny.yaml"), "--out", str(out), "--in-process", "--plain", "--no-plots"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "bandit--grpo--none--s0: done" in captured.err and "report:" in captured.out
    manifest = json.loads((out / "bench.json").read_text())
    assert [c["name"] for c in manifest["cells"]] == ["bandit--grpo--none--s0", "bandit--grpo--snr-top-p--s0"]
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",done," in row for row in rows[1:])
    # the budget each spent, from the trainer's counters: 1 step of 2 groups x 2 episodes; no
    # filter trains all 4 rows in one optimiser step (mini-batch 4), every token once
    cells = {c["name"]: c for c in json.loads((out / "results.json").read_text())["cells"]}
    plain, filtered = cells["bandit--grpo--none--s0"], cells["bandit--grpo--snr-top-p--s0"]
    assert (plain["env_episodes"], plain["optimizer_steps"], plain["optimizer_steps_per_trained_step"]) == (4, 1, 1)
    assert plain["update_tokens"] == plain["rollout_tokens"] > plain["response_tokens"] > 0
    assert filtered["env_episodes"] == 4 and filtered["optimizer_steps"] == filtered["steps_trained"]
    assert main(argv) == 0  # everything done: a second run only reports
    assert "bandit--grpo--none--s0: done" in capsys.readouterr().err


def test_engine_openrlhf_runs_the_engine_or_says_clearly_why_not(tmp_path, monkeypatch, capsys):
    import sys
    import types

    from ragen2.bench import worker

    suite, cells = make_cells(tmp_path, seeds=(0,))
    argv = ["bench", str(suite.path), "--out", str(tmp_path / "bench"), "--engine", "openrlhf"]
    monkeypatch.setattr(worker, "_openrlhf_installed", lambda: False)  # as on this CPU machine
    assert main(argv) == 2
    assert 'needs the extra: pip install "ragen2[openrlhf]"' in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ragen2.engines.openrlhf.launch", None)  # the engine module missing
    assert main(argv) == 2
    assert "--engine openrlhf: the OpenRLHF engine is not importable" in capsys.readouterr().err
    assert not (tmp_path / "bench" / "bench.json").exists()  # refused before anything was written

    launched = []

    def run(cfg, run_dir, args):
        launched.append((cfg.trainer.run_name, run_dir, args.nodes, args.gpus_per_node, args.dry_run))
        if len(launched) == 1:
            return 3
        (run_dir / "summary.json").write_text(json.dumps({"final_val_success_rate": 1.0}))
        return 0

    monkeypatch.setitem(sys.modules, "ragen2.engines.openrlhf.launch", types.SimpleNamespace(run=run))
    monkeypatch.setattr(worker, "_openrlhf_installed", lambda: True)
    cell = cells[0]
    engine_cell = lambda c, p: runner.in_process_cell(c, p, engine="openrlhf", cluster={"nodes": 2})  # noqa: E731
    runner.run_cells([cell], engine_cell, PlainDisplay([cell.name], io.StringIO()))
    assert runner.read_state(cell.run_dir)["reason"] == "RuntimeError: the OpenRLHF engine exited with status 3"
    runner.run_cells([cell], engine_cell, PlainDisplay([cell.name], io.StringIO()))
    assert launched[1] == (cell.name, cell.run_dir, 2, 8, False) and runner.read_state(cell.run_dir)["status"] == "done"


def test_live_table_shows_each_cell_status_and_reason():
    from rich.console import Console

    from ragen2.bench.display import LiveDisplay, make_display

    assert type(make_display(["a"], "t", live=False)) is PlainDisplay  # not a terminal: plain lines
    display = LiveDisplay(["cell-a", "cell-b", "cell-c"], "bench t")
    display.update("cell-a", status="done", note="val success 0.500", wall_s=90)
    display.update("cell-b", status="failed", note="RuntimeError: boom", wall_s=6)
    display.update("cell-c", status="running", progress="2/3")
    console = Console(record=True, width=150, file=io.StringIO())
    console.print(display._table())
    text = console.export_text()
    assert "bench t  [1 done, 1 failed, 1 running]" in text
    for line in ("cell-a │ done", "cell-b │ failed", "cell-c │ running │ 2/3"):
        assert line in text
    assert "RuntimeError: boom" in text and "1.5 min" in text


def test_code_version_names_the_commit_and_counts_changed_tracked_files(tmp_path):
    import subprocess

    from ragen2.bench.machine import code_version

    assert code_version(tmp_path) is None  # not a checkout: an installed wheel records nothing
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert code_version(tmp_path) == {"commit": head, "tracked_files_changed": 0}
    (tmp_path / "a.py").write_text("x = 2\n")
    (tmp_path / "untracked.py").write_text("")
    assert code_version(tmp_path) == {"commit": head, "tracked_files_changed": 1}


def test_runners_on_one_folder_share_its_cells_and_never_run_one_twice(tmp_path):
    _, cells = make_cells(tmp_path)
    names = [c.name for c in cells]
    outer_calls, inner_calls, inner_statuses = [], [], {}

    def first_cell_starts_a_second_runner(cell, on_progress):
        # while this runner holds the first cell, a second runner over the same cells starts
        inner_statuses.update(runner.run_cells(cells, fake_cell(inner_calls), PlainDisplay(names, io.StringIO())))
        fake_cell(outer_calls)(cell, on_progress)

    stream = io.StringIO()
    outer = runner.run_cells(cells, first_cell_starts_a_second_runner, PlainDisplay(names, stream))
    assert outer_calls == names[:1] and inner_calls == names[1:]  # every cell ran exactly once
    assert inner_statuses[names[0]] == "elsewhere"
    assert set(outer.values()) == {"done"}  # the cells the second runner finished count as done here
    assert not any((c.run_dir / claims.CLAIM_FILE).exists() for c in cells)  # each claim released


def _claim_file(run_dir, host, pid, start=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / claims.CLAIM_FILE).write_text(json.dumps({"host": host, "pid": pid, "start": start}))


def test_a_live_claim_is_respected_and_a_stale_one_taken_over(tmp_path):
    _, cells = make_cells(tmp_path, seeds=(0,))
    names = [c.name for c in cells]
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _claim_file(cells[0].run_dir, socket.gethostname(), holder.pid, claims._start_time(holder.pid))
        _claim_file(cells[1].run_dir, "another-machine", 1)
        calls, stream = [], io.StringIO()
        statuses = runner.run_cells(cells, fake_cell(calls), PlainDisplay(names, stream))
        assert calls == [] and set(statuses.values()) == {"elsewhere"}
        assert f"pid {holder.pid} on {socket.gethostname()}" in stream.getvalue()
        assert "another-machine" in stream.getvalue()
    finally:
        holder.kill()
        holder.wait()
    (cells[1].run_dir / claims.CLAIM_FILE).unlink()
    calls = []
    statuses = runner.run_cells(cells, fake_cell(calls), PlainDisplay(names, io.StringIO()))
    assert calls == names and set(statuses.values()) == {"done"}  # the dead runner's claim was stale
    assert not (cells[0].run_dir / claims.CLAIM_FILE).exists()


def test_list_shows_which_cells_another_runner_is_running(tmp_path, capsys):
    _, cells = make_cells(tmp_path, seeds=(0,))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _claim_file(cells[0].run_dir, socket.gethostname(), holder.pid, claims._start_time(holder.pid))
        assert main(["bench", str(tmp_path / "suite.yaml"), "--out", str(tmp_path / "bench"), "--list"]) == 0
    finally:
        holder.kill()
        holder.wait()
    out = capsys.readouterr().out
    assert f"[running] {cells[0].name} (run by another runner (pid {holder.pid} on" in out
    assert f"[new    ] {cells[1].name}" in out


def test_an_unreadable_claim_holds_the_cell_only_while_it_may_still_be_being_written(tmp_path):
    _, cells = make_cells(tmp_path, seeds=(0,))
    run_dir = cells[0].run_dir
    run_dir.mkdir(parents=True)
    (run_dir / claims.CLAIM_FILE).write_text("")  # created, not yet written: the winner of a race
    assert claims.claim(run_dir) == {"host": "?", "pid": None}
    old = time.time() - claims.UNREADABLE_CLAIM_S - 1  # a runner killed between create and write
    os.utime(run_dir / claims.CLAIM_FILE, (old, old))
    assert claims.claim(run_dir) is None
    assert json.loads((run_dir / claims.CLAIM_FILE).read_text())["pid"] == os.getpid()


def test_a_reused_pid_does_not_keep_a_claim_alive(tmp_path):
    _, cells = make_cells(tmp_path, seeds=(0,))
    # this very process, but started at another time: the pid was reused, its runner is gone
    _claim_file(cells[0].run_dir, socket.gethostname(), os.getpid(), "1")
    assert claims.claim(cells[0].run_dir) is None
    assert json.loads((cells[0].run_dir / claims.CLAIM_FILE).read_text())["start"] == claims._start_time(os.getpid())


@pytest.mark.parametrize("ending", ["failure", "interrupt"])
def test_a_claim_is_released_however_the_cell_ends(tmp_path, ending):
    _, cells = make_cells(tmp_path, seeds=(0,))
    cells = cells[:1]

    def ends(cell, on_progress):
        assert claims.holder(cell.run_dir)["pid"] == os.getpid()  # held while it runs
        raise KeyboardInterrupt if ending == "interrupt" else RuntimeError("boom")

    if ending == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            runner.run_cells(cells, ends, PlainDisplay([cells[0].name], io.StringIO()))
    else:
        assert runner.run_cells(cells, ends, PlainDisplay([cells[0].name], io.StringIO())) == {cells[0].name: "failed"}
    assert not (cells[0].run_dir / claims.CLAIM_FILE).exists()
