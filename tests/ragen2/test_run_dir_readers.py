"""Engine parity of the run-directory readers: `ragen2 plot`, `ragen2 audit` and `ragen2 bench
report` read a run written by the OpenRLHF controller's writer (evaluations as rows of their own)
exactly as one written by the local engine's RunLog (validation inside the step's row); one NaN
rule, one summary schema, and files cut short by a kill."""

import json
import math
import shutil

import pytest

from ragen2.reports import plot
from ragen2.reports.audit_report import build_report
from ragen2.bench.plots import series as bench_series
from ragen2.bench.report import cell_result
from ragen2.bench.runner import steps_logged
from ragen2.engines.openrlhf.run_files import RunFiles, eval_row, numeric
from ragen2 import run_dir
from ragen2.run_dir import RunLog, finite, read_metrics, read_steps

# Three rollout steps (0-based 0, 1, 2), the middle one skipped by the filter; evaluations after
# steps 1 and 2 (val_every=2 plus the last step). Step 2's entropy is NaN.
TRAIN = [
    {"rollout/reward_mean": 0.1, "rollout/success_rate": 0.25, "rollout/in_group_reward_std_mean": 0.4,
     "rollout/format_ok_fraction": 0.5, "rollout/num_tokens": 100.0, "rollout/response_tokens_mean": 5.0,
     "rollout/num_trajectories": 8.0, "snr/kept_fraction": 1.0, "snr/skipped": 0.0, "actor/entropy": 1.5,
     "actor/grad_norm": 2.0, "probe/mi_zscore_ema": 1.0, "probe/mi_estimate": 0.2, "probe/num_rows": 32.0,
     "policy_loss": 0.3, "generated_samples": ["text"]},
    {"rollout/reward_mean": 0.0, "rollout/success_rate": 0.0, "rollout/in_group_reward_std_mean": 0.0,
     "rollout/format_ok_fraction": 0.75, "rollout/num_tokens": 120.0, "rollout/response_tokens_mean": 6.0,
     "rollout/num_trajectories": 8.0, "snr/kept_fraction": 0.0, "snr/skipped": 1.0,
     "probe/mi_zscore_ema": 0.9, "probe/mi_estimate": 0.1, "probe/num_rows": 32.0},
    {"rollout/reward_mean": 0.4, "rollout/success_rate": 0.5, "rollout/in_group_reward_std_mean": 0.3,
     "rollout/format_ok_fraction": 1.0, "rollout/num_tokens": 140.0, "rollout/response_tokens_mean": 7.0,
     "rollout/num_trajectories": 8.0, "snr/kept_fraction": 0.5, "snr/skipped": 0.0,
     "actor/entropy": float("nan"), "actor/grad_norm": 1.0, "probe/mi_zscore_ema": 0.8,
     "probe/mi_estimate": 0.05, "probe/num_rows": 32.0, "policy_loss": 0.2},
]
EVALS = {1: {"eval_bandit_pass1": 0.3, "eval_bandit_pass4": 0.8},
         2: {"eval_bandit_pass1": 0.5, "eval_bandit_pass4": 0.9}}


@pytest.fixture
def runs(tmp_path):
    """(openrlhf run dir, local run dir) holding the same numbers, each in its writer's shape."""
    orl, local = tmp_path / "openrlhf", tmp_path / "local"
    files = RunFiles(orl)  # the controller's calls, in its order: the step's row, then its evaluation
    for step, logs in enumerate(TRAIN):
        files.log_step(step, logs)
        if step in EVALS:
            files.log_eval(step, EVALS[step])
    files.finish(3, 1, None)
    local.mkdir()
    log = RunLog(local, 3, {}, quiet=True)  # the local engine: validation merged into the step's metrics
    for step, logs in enumerate(TRAIN):
        metrics = {k: v for k, v in logs.items() if isinstance(v, (int, float))}  # NaN kept: written as "nan"
        log.step(step, metrics | (eval_row(EVALS[step]) if step in EVALS else {}))
    log.close()
    shutil.copy(orl / "summary.json", local / "summary.json")  # the bench reads its counts from there
    return orl, local


def test_the_two_writers_differ_on_disk_as_described(runs):
    orl, local = runs
    assert [r["step"] for r in read_metrics(orl)] == [0, 1, 1, 2, 2]  # evaluations are rows of their own
    assert [r["step"] for r in read_metrics(local)] == [0, 1, 2]
    assert read_metrics(local)[2]["actor/entropy"] == "nan" and "actor/entropy" not in read_metrics(orl)[3]


def test_read_steps_gives_one_row_per_training_step_with_its_evaluation(runs):
    orl, local = runs
    for run in runs:
        rows = read_steps(run)
        assert [r["step"] for r in rows] == [0, 1, 2]
        assert "val/reward_mean" not in rows[0]
        assert (rows[1]["val/reward_mean"], rows[1]["val/max_reward_mean"]) == (0.3, 0.8)
        assert (rows[2]["val/reward_mean"], rows[2]["val/max_reward_mean"]) == (0.5, 0.9)
        assert rows[2]["openrlhf/eval_bandit_pass4"] == 0.9 and rows[2]["rollout/reward_mean"] == 0.4
        assert finite(rows[2].get("actor/entropy")) is None  # "nan" in one file, left out in the other
    as_numbers = [[{k: finite(v) for k, v in r.items() if finite(v) is not None} for r in read_steps(run)]
                  for run in runs]
    assert as_numbers[0] == as_numbers[1]
    assert steps_logged(orl) == steps_logged(local) == 3  # the bench's progress counter


def test_audit_counts_training_steps_not_evaluation_rows(runs, tmp_path):
    summaries = []
    for run in runs:
        summary = build_report(run, tmp_path / f"audit-{run.name}")["data"]
        assert summary["steps"] == 3
        assert summary["run_stats"] == {"probes": 3, "probe_rows_max": 32.0, "skipped_steps": 1}
        assert summary["series"]["rollout/success_rate"] == {"n": 3, "first": 0.25, "last": 0.5, "min": 0.0,
                                                             "max": 0.5, "first_step": 0, "last_step": 2}
        assert summary["series"]["actor/entropy"]["n"] == 1  # skipped step: none; step 2: NaN
        assert summary["verdict"]["lines"][0].startswith("3 steps;") and "1 skipped step(s)" in \
            summary["verdict"]["lines"][0]
        summaries.append({k: v for k, v in summary.items() if k != "run_dir"})
    assert summaries[0] == summaries[1]


def test_plot_reads_three_steps_with_validation_at_its_1_based_steps(runs, monkeypatch):
    import matplotlib.pyplot as plt

    seen = []
    original = plot.curves_figure
    monkeypatch.setattr(plot, "curves_figure", lambda rows, title, **kw: seen.append(original(rows, title, **kw)) or seen[-1])
    drawn = []
    for run in runs:
        assert plot.plot_run(run).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        figure = seen[-1]
        try:
            axes = {axis.get_title(): axis for axis in figure.axes}
            reward = {line.get_label(): line for line in axes["reward (mean)"].lines}
            assert list(reward["rollout/reward_mean"].get_xdata()) == [1, 2, 3]
            assert list(reward["rollout/reward_mean"].get_ydata()) == pytest.approx([0.1, 0.0, 0.4])
            assert list(reward["val/reward_mean"].get_xdata()) == [2, 3]  # evaluated after steps 2 and 3
            assert list(reward["val/reward_mean"].get_ydata()) == pytest.approx([0.3, 0.5])
            assert axes["reward (mean)"].get_xlim() == (0.5, 3.5)
            entropy = [line for line in axes["entropy"].lines if line.get_label() == "actor/entropy"]
            assert list(entropy[0].get_xdata()) == [1]  # step 2 skipped (no update), step 3 NaN
            grey = [list(line.get_xdata()) for line in axes["entropy"].lines if line.get_color() == "0.85"]
            assert grey == [[2, 2]]  # the skipped step
            drawn.append({title: [(line.get_label(), list(line.get_xdata()), list(line.get_ydata()))
                                  for line in axis.lines] for title, axis in axes.items()})
        finally:
            plt.close(figure)
    assert drawn[0] == drawn[1]


def test_bench_report_reads_the_same_numbers_from_either_engine(runs):
    results = []
    for run in runs:
        row = cell_result({"name": "cell", "run_dir": str(run)})
        assert row["status"] == "done" and (row["steps"], row["steps_trained"], row["steps_skipped"]) == (3, 2, 1)
        assert row["final_val_reward"] == 0.5  # OpenRLHF's evaluator measures reward, not success
        assert row["final_val_success"] is None and row["final_val_pass_at_g"] is None
        assert row["train_reward_mean"] == pytest.approx(0.5 / 3) and row["last_train_reward"] == 0.4
        assert row["kept_fraction_mean"] == pytest.approx(0.5) and row["last_mi_zscore_ema"] == 0.8
        assert (row["rollout_tokens"], row["response_tokens"]) == (360, 144)
        results.append({k: v for k, v in row.items() if k != "run_dir"})
        assert bench_series(read_steps(run), "val/reward_mean") == {2: 0.3, 3: 0.5}
    assert results[0] == results[1]


def test_read_steps_rules_resume_redo_early_eval_and_non_finite(tmp_path):
    rows = [{"step": -1, "val/reward_mean": 0.0},  # an evaluation before any step: no local counterpart
            {"step": 0, "rollout/reward_mean": 0.1}, {"step": 1, "rollout/reward_mean": 0.2, "actor/grad_norm": "inf"},
            {"step": 1, "val/reward_mean": 0.3, "openrlhf/eval_x_pass1": 0.3},
            {"step": 2, "rollout/reward_mean": 0.9},  # died here; resumed from the step-1 checkpoint:
            {"step": 1, "rollout/reward_mean": 0.25, "actor/entropy": "nan", "stop_reason": "collapse"},
            {"step": 1, "val/reward_mean": 0.35}, {"step": 2, "rollout/reward_mean": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rol')
    out = read_steps(tmp_path)
    assert [r["step"] for r in out] == [0, 1, 2]
    assert out[1]["rollout/reward_mean"] == 0.25 and out[1]["val/reward_mean"] == 0.35
    assert "openrlhf/eval_x_pass1" not in out[1] and "actor/grad_norm" not in out[1]  # the redone step's row only
    assert math.isnan(out[1]["actor/entropy"]) and out[1]["stop_reason"] == "collapse"  # other strings stay
    assert out[2]["rollout/reward_mean"] == 0.5
    assert read_steps(tmp_path / "missing") == []
    # an inf stays an inf (the audit's gradient-norm alarm reads it); finite() is None for it
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "actor/grad_norm": "inf", "x": True}) + "\n")
    row = read_steps(tmp_path)[0]
    assert row["actor/grad_norm"] == math.inf and finite(row["actor/grad_norm"]) is None and finite(row["x"]) is None
    assert numeric({"a": float("inf"), "b": 1}) == {"b": 1.0}  # the OpenRLHF writer drops what finite() ignores


def test_one_summary_schema_for_both_engines(runs):
    orl, local = runs
    written = json.loads((orl / run_dir.SUMMARY_FILE).read_text())  # the controller's, from its own rows
    rebuilt = run_dir.summary(read_steps(local), run_dir=local, engine="local", stop_reason=None, wall_s=1.0)
    assert list(written) == list(rebuilt)  # the same keys in the same order
    differ = {"run_dir", "engine", "wall_s_this_session"}
    assert {k: v for k, v in written.items() if k not in differ} == {k: v for k, v in rebuilt.items() if k not in differ}
    assert (written["steps"], written["steps_trained"], written["steps_skipped"]) == (3, 2, 1)
    assert (written["first_reward_mean"], written["last_reward_mean"]) == (0.1, 0.4)
    assert (written["final_val_reward_mean"], written["best_val_reward_mean"]) == (0.5, 0.5)
    assert written["final_val_success_rate"] is None  # OpenRLHF's evaluator measures reward, not success
    assert run_dir.read_summary(orl) == written and run_dir.read_summary(orl / "missing") is None


def test_the_local_summary_adds_its_own_counts_after_the_schema(tmp_path):
    rows = [{"step": 0, "rollout/reward_mean": 0.2, "val/success_rate": 0.5, "val/reward_mean": 0.1},
            {"step": 1, "rollout/reward_mean": 0.3, "snr/skipped": 1.0, "val/success_rate": float("nan")}]
    out = run_dir.summary(rows, run_dir=tmp_path, engine="local", stop_reason="x", wall_s=2.04, nonfinite_skips=3)
    assert (out["steps"], out["steps_skipped"], out["steps_trained"]) == (2, 1, 1)
    assert (out["final_val_success_rate"], out["best_val_success_rate"]) == (0.5, 0.5)  # a NaN one is no best
    assert out["wall_s_this_session"] == 2.0 and list(out)[-1] == "nonfinite_skips"


def test_non_finite_values_are_written_as_strings_and_read_back_as_floats(tmp_path):
    metrics = run_dir.MetricsFile(tmp_path)
    metrics.write({"step": 0, "a": float("nan"), "b": float("inf"), "c": -float("inf"), "d": 1.5, "e": "text"})
    metrics.close()
    assert json.loads((tmp_path / run_dir.METRICS_FILE).read_text()) == {
        "step": 0, "a": "nan", "b": "inf", "c": "-inf", "d": 1.5, "e": "text"}  # valid JSON, nothing dropped
    row = read_steps(tmp_path)[0]
    assert math.isnan(row["a"]) and row["b"] == math.inf and row["c"] == -math.inf and row["e"] == "text"
    assert [finite(row[k]) for k in "abcde"] == [None, None, None, 1.5, None]
    run_dir.write_summary(tmp_path, {"first_reward_mean": float("nan"), "steps": 1})
    assert json.loads((tmp_path / run_dir.SUMMARY_FILE).read_text()) == {"first_reward_mean": "nan", "steps": 1}
    # the same rule whoever spelled it: bare NaN (JSON extension) and other spellings read as floats
    (tmp_path / run_dir.METRICS_FILE).write_text('{"step": 0, "a": NaN, "b": " -Infinity", "c": "+inf"}\n')
    row = read_steps(tmp_path)[0]
    assert math.isnan(row["a"]) and row["b"] == -math.inf and row["c"] == math.inf


def test_a_resumed_run_keeps_the_rows_before_its_checkpoint_and_the_controller_appends(tmp_path):
    first = run_dir.MetricsFile(tmp_path)
    for step in range(3):
        first.write({"step": step, "x": float(step)})
    first.close()
    resumed = run_dir.MetricsFile(tmp_path, resume_step=2)  # steps 2 and later are redone
    resumed.write({"step": 2, "x": 20.0})
    resumed.close()
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [(0, 0.0), (1, 1.0), (2, 20.0)]
    appended = run_dir.MetricsFile(tmp_path)  # no resume step: appends (the OpenRLHF controller)
    appended.close()  # and writes nothing until a row comes
    assert len(read_metrics(tmp_path)) == 3
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    run_dir.MetricsFile(fresh).close()
    assert not (fresh / run_dir.METRICS_FILE).exists() and not run_dir.has_run(fresh)


def test_every_reader_stops_at_a_line_cut_short_by_a_kill(tmp_path):
    (tmp_path / run_dir.METRICS_FILE).write_text('{"step": 0, "x": 1}\n{"step": 1, "x"')
    (tmp_path / run_dir.EVENTS_FILE).write_text('{"kind": "stop", "step": 0}\n{"kind": "al')
    (tmp_path / run_dir.COMPLETIONS_FILE).write_text('{"step": 0, "rank": "best"}\n{"step": 0, "ra')
    assert read_steps(tmp_path) == [{"step": 0, "x": 1}]
    assert run_dir.read_events(tmp_path) == [{"kind": "stop", "step": 0}]
    assert run_dir.read_completions(tmp_path) == [{"step": 0, "rank": "best"}]
    assert run_dir.has_run(tmp_path)
    log = run_dir.CompletionsLog(tmp_path, resume_step=1)  # a resume drops the cut line and keeps step 0
    log.write(1, [{"rank": "worst"}])
    log.close()
    assert [r["rank"] for r in run_dir.read_completions(tmp_path)] == ["best", "worst"]


def test_config_file_round_trip(tmp_path):
    from ragen2.config import load_config

    cfg = load_config()
    run_dir.write_config(tmp_path, cfg)
    assert (tmp_path / run_dir.CONFIG_FILE).read_text() == cfg.to_yaml()
    assert run_dir.read_config(tmp_path)["trainer"]["seed"] == cfg.trainer.seed
    assert run_dir.read_config(tmp_path / "missing") is None
