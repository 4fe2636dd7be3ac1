"""The audit's series.png puts the untrained model's validation (trainer.val_before) at step 0 on the
validation curve, as `ragen2 plot` does: the data drawn is checked (`series_curves`), not pixels."""

import json

import pytest

from ragen2.reports import audit_report
from ragen2.reports.plot import Curve


def _run(tmp_path, events=True):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "rollout/success_rate": 0.1 * s, "rollout/in_group_reward_std_mean": 0.3,
             "actor/entropy": 1.0} for s in range(4)]
    rows[1]["val/success_rate"], rows[3]["val/success_rate"] = 0.5, 0.625
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text("env: {name: bandit}\n")
    if events:
        before = {"kind": "validation_before", "step": 0, "time": 0,
                  "metrics": {"val/success_rate": 0.25, "val/reward_mean": -0.1, "time/validation_s": 3.0}}
        (run / "events.jsonl").write_text(json.dumps(before) + "\n")
    else:  # an engine that writes only the summary's number
        (run / "summary.json").write_text(json.dumps({"val_before_success_rate": 0.375}))
    return run


@pytest.mark.parametrize("events, start", [(True, 0.25), (False, 0.375)])
def test_series_png_draws_the_validation_before_at_step_0(tmp_path, monkeypatch, events, start):
    drawn, axes = [], []
    real = audit_report.draw_curve
    monkeypatch.setattr(audit_report, "draw_curve", lambda axis, curve, **style: drawn.append(curve)
                        or axes.append(axis) or real(axis, curve, **style))
    out = audit_report.build_report(_run(tmp_path, events), tmp_path / "audit")
    summary = out["data"]
    assert summary["validation_before"]["val/success_rate"] == start
    panels = dict(audit_report.series_curves(audit_report.load_run(tmp_path / "run").rows,
                                             summary["validation_before"]))
    assert panels["success rate"] == [Curve("rollout/success_rate", [1, 2, 3, 4], [0.0, 0.1, 0.2, pytest.approx(0.3)]),
                                      Curve("val/success_rate", [2, 4], [0.5, 0.625], before=start)]
    # what series.png drew is that data: the before point reached the drawing
    assert Curve("val/success_rate", [2, 4], [0.5, 0.625], before=start) in drawn
    assert {axis.get_xlim() for axis in axes} == {(-0.5, 4.5)}  # every panel from step 0
    assert json.loads((tmp_path / "audit" / "summary.json").read_text())["validation_before"] == \
        summary["validation_before"]


def test_series_without_a_validation_before_has_no_step_0(tmp_path):
    run = _run(tmp_path)
    (run / "events.jsonl").unlink()
    panels = dict(audit_report.series_curves(audit_report.load_run(run).rows, audit_report.validation_before(run)))
    assert all(curve.before is None for curve in panels["success rate"])
