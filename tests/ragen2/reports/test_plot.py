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
