"""scripts/filter_experiment_checks.py rewrites its committed JSON exactly from the committed cells, so
the figures docs/filter_experiment.md quotes from it cannot drift from the data."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_checks_reproduce_the_committed_json(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("filter_checks_under_test", ROOT / "scripts/filter_experiment_checks.py")
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)
    monkeypatch.chdir(ROOT)  # the committed file names its bench relative to the repository
    out = tmp_path / "checks.json"
    assert checks.main(["--out", str(out)]) == 0
    fresh, committed = json.loads(out.read_text()), json.loads((ROOT / "docs/benchmarks/filter_experiment_checks.json").read_text())
    fresh.pop("command"), committed.pop("command")
    assert fresh == committed
    # what the docs rest on: seed 0 left out leaves 7 pairs, and seed 0's hand-recorded cells are flagged
    assert committed["final_val_success_differences"]["snr-top-p - none"]["without_seed_0"]["n"] == 7
    assert sum(c["tracked_files_changed"] is None for c in committed["code_by_seed"]["0"].values()) == 3
    assert all(c["tracked_files_changed"] == 0 for s, arms in committed["code_by_seed"].items() if s != "0"
               for c in arms.values())
