import json

from ragen2.cli import main


def test_plot_writes_a_png_with_skipped_steps(tmp_path, capsys):
    rows = [{"step": s, "rollout/success_rate": s / 4, "rollout/in_group_reward_std_mean": 0.3,
             "actor/entropy": 2.0 - s / 10, "rollout/response_tokens_mean": 20 + s, "actor/grad_norm": 1.0,
             "snr/skipped": float(s == 2)} for s in range(5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "rollo')
    assert main(["plot", str(tmp_path)]) == 0
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert str(png) in capsys.readouterr().out


def test_plot_of_an_empty_run_is_a_clear_error(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "no metrics.jsonl rows" in capsys.readouterr().err
