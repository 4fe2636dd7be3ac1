"""`ragen2 audit` of a run that probed nothing (the main job before probe.segment=auto, or
probe.every=0) draws no empty panel and lists no "not logged" row: it names what is absent once."""

import json

from matplotlib.figure import Figure

from ragen2.reports import audit_report


def _run(tmp_path, probed: bool):
    run = tmp_path / "run"
    run.mkdir()
    rows = []
    for step in range(6):
        row = {"step": step, "rollout/success_rate": 0.2 + 0.1 * step, "rollout/reward_mean": 0.1 * step,
               "rollout/in_group_reward_std_mean": 0.3, "rollout/format_ok_fraction": 1.0, "actor/entropy": 1.0 - step / 10}
        if probed and step % 2 == 0:
            row.update({"probe/mi_zscore_ema": 0.1 * step, "probe/num_rows": 16.0, "probe/mi_estimate": 0.2})
        rows.append(row)
    rows[-1]["val/success_rate"] = 0.5
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text("probe: {every: 5, segment: reply}\nrollout: {num_groups: 4, group_size: 4}\n")
    return run


def test_an_unprobed_run_has_no_empty_panels_or_rows(tmp_path, monkeypatch):
    drawn = []
    real = Figure.subplots

    def spy(self, nrows=1, ncols=1, **kwargs):  # how many axes the series figure keeps
        axes = real(self, nrows, ncols, **kwargs)
        drawn.append(self)
        return axes

    monkeypatch.setattr(Figure, "subplots", spy)
    out = audit_report.build_report(_run(tmp_path, probed=False))
    page = out["html"].read_text()
    assert "not logged" not in page.lower()
    assert "MI-ZScore-EMA</code>" not in page  # no Spearman row for a proxy never logged
    assert "Not recorded in this run, so not shown" in page and "probe.every" in page and "probe.grad_every" in page
    assert "Gradient decomposition by reward-std bucket</h2>" not in page
    titles = [axis.get_title() for axis in drawn[0].axes]
    assert titles == ["entropy (nats/token)", "in-group reward std", "success rate"]  # the logged panels only
    assert all(axis.get_xlim() == (0.5, 6.5) for axis in drawn[0].axes)  # the run's steps, not 5.68-6.32
    assert out["data"]["verdict"]["lines"][-1].startswith("One change would make it conclusive: rerun with")


def test_a_probed_run_keeps_its_mi_panels(tmp_path):
    run = _run(tmp_path, probed=True)
    titles = [title for title, _ in audit_report.logged_panels(audit_report.load_run(run).rows)]
    assert titles[:1] == ["MI-ZScore-EMA"] and "MI estimate (nats)" in titles
    assert "retrieval accuracy@1" not in titles  # not logged by this run
