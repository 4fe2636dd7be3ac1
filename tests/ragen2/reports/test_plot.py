import json

import pytest

from ragen2.reports import plot
from ragen2.cli import main


def _rows(n=5):
    return [{"step": s, "rollout/success_rate": s / 4, "rollout/in_group_reward_std_mean": 0.3,
             "rollout/reward_mean": -0.1 + s / 10, "rollout/format_ok_fraction": 0.2 * s,
             "snr/kept_fraction": 1.0 - s / 8, "actor/entropy": 2.0 - s / 10, "rollout/response_tokens_mean": 20 + s,
             "actor/grad_norm": 1.0, "snr/skipped": float(s == 2)} for s in range(n)]


def test_plot_writes_a_png_with_skipped_steps(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()) + '{"step": 5, "rollo')
    assert main(["plot", str(tmp_path)]) == 0
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert str(png) in capsys.readouterr().out


def test_curves_have_the_console_panels_1_based_integer_steps_and_legends_off_the_curves():
    import matplotlib.pyplot as plt

    figure = plot.curves_figure(_rows(), "run")
    try:
        figure.canvas.draw()
        axes = {axis.get_title(): axis for axis in figure.axes}
        for title in ("reward (mean)", "format ok (share of turns)", "kept fraction of groups (SNR filter)"):
            assert title in axes
        reward = axes["reward (mean)"].lines[0]
        # logged steps 0..4 are the console's steps 1..5
        assert list(reward.get_xdata()) == [1, 2, 3, 4, 5]
        assert list(reward.get_ydata()) == pytest.approx([-0.1, 0.0, 0.1, 0.2, 0.3])
        assert list(axes["format ok (share of turns)"].lines[0].get_ydata()) == pytest.approx([0, .2, .4, .6, .8])
        grey = [line for line in axes["entropy"].lines if line.get_color() == "0.85"]
        assert [list(line.get_xdata()) for line in grey] == [[3, 3]]  # skipped logged step 2 = step 3
        renderer = figure.canvas.get_renderer()
        for axis in figure.axes:
            ticks = [t for t in axis.get_xticks() if axis.get_xlim()[0] <= t <= axis.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks)
            legend = axis.get_legend()
            if legend is not None:  # drawn below the plotting area, never over a curve
                assert legend.get_window_extent(renderer).y1 < axis.get_window_extent(renderer).y0
    finally:
        plt.close(figure)


def test_plot_of_an_empty_or_missing_run_is_a_clear_error(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert f"no metrics.jsonl rows in {tmp_path}" in capsys.readouterr().err
    assert main(["plot", "/nonexistent"]) == 2
    assert "error: no metrics.jsonl rows in /nonexistent (no such directory)" in capsys.readouterr().err


# --- the validation before training, at step 0 ------------------------------------------------------


def _events(tmp_path, *befores):
    events = [{"kind": "precision", "time": 0}]
    events += [{"kind": "validation_before", "step": 0, "time": 0, "metrics": m} for m in befores]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_validation_before_is_the_last_event_else_the_summary_else_nothing(tmp_path):
    assert plot.validation_before(tmp_path) == {}
    (tmp_path / "summary.json").write_text(json.dumps({"val_before_success_rate": 0.25}))
    assert plot.validation_before(tmp_path) == {"val/success_rate": 0.25}  # no events: the summary's number
    # a restarted run validated twice before training: the last one counts, as run_dir.before_after reads it
    _events(tmp_path, {"val/success_rate": 0.1}, {"val/success_rate": 0.3, "val/reward_mean": -0.2,
                                                  "val/format_ok_fraction": "nan"})
    assert plot.validation_before(tmp_path) == {"val/success_rate": 0.3, "val/reward_mean": -0.2}
    (tmp_path / "events.jsonl").unlink()
    (tmp_path / "summary.json").write_text('{"val_before_succ')  # cut short by a kill: no point, no crash
    assert plot.validation_before(tmp_path) == {}


def test_curves_put_the_before_point_at_step_0_on_validation_keys_only():
    rows = _rows()
    rows[1]["val/success_rate"], rows[4]["val/success_rate"] = 0.5, 0.75
    before = {"val/success_rate": 0.25, "val/reward_mean": -0.3, "rollout/success_rate": 0.9}
    got = {c.key: c for c in plot.curves(rows, ("rollout/success_rate", "val/success_rate"), before)}
    assert got["val/success_rate"] == plot.Curve("val/success_rate", [2, 5], [0.5, 0.75], before=0.25)
    assert got["rollout/success_rate"].before is None  # a training metric has no "before training" value
    # validated only before training: the point alone is still a curve
    assert plot.curves(rows, ("val/reward_mean",), before) == [plot.Curve("val/reward_mean", [], [], before=-0.3)]
    assert plot.curves(rows, ("val/reward_mean",), {}) == []


def test_curves_figure_draws_the_before_point_apart_at_step_0(tmp_path):
    import matplotlib.pyplot as plt

    rows = _rows()
    rows[2]["val/success_rate"], rows[4]["val/success_rate"] = 0.5, 0.75
    figure = plot.curves_figure(rows, "run", before={"val/success_rate": 0.25, "val/reward_mean": -0.3})
    try:
        axes = {axis.get_title(): axis for axis in figure.axes}
        lines = {line.get_label(): line for line in axes["success rate"].lines}
        validated, start = lines["val/success_rate"], lines["val/success_rate before training"]
        assert list(validated.get_xdata()) == [3, 5] and list(start.get_xdata()) == [0]
        assert list(start.get_ydata()) == [0.25]
        # distinct: a hollow diamond in the curve's colour, joined to the first validated step by a dotted line
        assert start.get_marker() == "D" and start.get_markerfacecolor() == "white" and start.get_linestyle() == "None"
        assert start.get_color() == validated.get_color()
        dotted = [line for line in axes["success rate"].lines if line.get_linestyle() == ":"]
        assert [(list(d.get_xdata()), list(d.get_ydata())) for d in dotted] == [([0, 3], [0.25, 0.5])]
        reward = {line.get_label(): line for line in axes["reward (mean)"].lines}
        assert list(reward["val/reward_mean before training"].get_ydata()) == [-0.3]  # no validated step: the point
        assert all(axis.get_xlim() == (-0.5, 5.5) for axis in figure.axes)  # step 0 on every panel
    finally:
        plt.close(figure)


def test_plot_run_draws_the_runs_validation_before(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    _events(tmp_path, {"val/success_rate": 0.125})
    seen = []
    original = plot.curves_figure
    monkeypatch.setattr(plot, "curves_figure", lambda rows, title, **kw: seen.append(kw) or original(rows, title, **kw))
    assert main(["plot", str(tmp_path)]) == 0
    assert seen == [{"before": {"val/success_rate": 0.125}}]
