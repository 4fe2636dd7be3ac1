"""Runs whose MI probes scored in different dtypes are named as such, in one line, wherever they are
compared (`ragen2 audit RUN RUN ...`, `ragen2 bench report`), and only then."""

import json
from pathlib import Path

import yaml

from ragen2.bench.report import build_report
from ragen2.cli import main
from ragen2.reports.probe_dtype import mixed_dtypes_line, run_probe_dtypes


def _run(folder: Path, dtype: str | None, config: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    rows = []
    for step, (success, mi) in enumerate(([0.1, 0.2], [0.3, 0.5], [0.4, 0.6])):
        row = {"step": step, "rollout/success_rate": success, "probe/mi_zscore_ema": mi, "actor/entropy": 1.0}
        if dtype is not None:
            row["probe/dtype"] = dtype
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config is not None:
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def test_a_runs_dtypes_come_from_its_rows_or_for_older_rows_from_its_config():
    probed = [{"step": 0, "probe/mi_estimate": 0.1, "probe/dtype": "bfloat16"}, {"step": 1, "actor/entropy": 1.0}]
    assert run_probe_dtypes(probed) == ["bfloat16"]
    # a resumed run that changed probe.dtype shows both, in order
    assert run_probe_dtypes([*probed, {"step": 2, "probe/mi_estimate": 0.1, "probe/dtype": "float32"}]) == [
        "bfloat16", "float32"]
    # no probe row (a probe timing alone is no score): nothing to compare
    assert run_probe_dtypes([{"step": 0, "actor/entropy": 1.0, "probe/time_s": 2.0}]) == []
    old = [{"step": 0, "probe/mi_estimate": 0.1}]
    assert run_probe_dtypes(old, {"probe": {}, "model": {"dtype": "bfloat16"}}) == ["float32"]  # before probe.dtype
    assert run_probe_dtypes(old, {"probe": {"dtype": "float32"}, "model": {"dtype": "bfloat16"}}) == ["float32"]
    assert run_probe_dtypes(old, {"probe": {"dtype": "policy"}, "model": {"dtype": "bfloat16"}}) == ["bfloat16"]
    assert run_probe_dtypes(old, None) == ["unknown"]


def test_the_line_appears_only_when_dtypes_differ():
    assert mixed_dtypes_line({"a": ["bfloat16"], "b": ["bfloat16"], "c": []}) is None
    line = mixed_dtypes_line({"a": ["bfloat16"], "b": ["float32"], "c": ["bfloat16"]})
    assert line.startswith("note: the MI probe scored in different dtypes across these runs")
    assert "bfloat16: a, c; float32: b" in line and "\n" not in line


def test_audit_of_several_runs_says_when_they_scored_in_different_dtypes(tmp_path, capsys):
    bf16 = _run(tmp_path / "intel", "bfloat16")
    # written before rows recorded it: fp32, as its config says
    fp32 = _run(tmp_path / "old", None, {"probe": {"dtype": "float32"}, "model": {"dtype": "bfloat16"}})
    assert main(["audit", str(bf16), str(fp32)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "different dtypes" in line]
    assert notes == [notes[0]] and "bfloat16: intel; float32: old" in notes[0]
    same = _run(tmp_path / "intel2", "bfloat16")
    assert main(["audit", str(bf16), str(same)]) == 0
    assert "different dtypes" not in capsys.readouterr().out


def _bench(out: Path, dtypes: dict[str, str]) -> Path:
    cells = []
    for name, dtype in dtypes.items():
        cell = {"name": name, "matrix": "main", "env": "bandit", "algo": "grpo", "filter": "none", "variant": "",
                "model": "bundled", "seed": 0, "treatment": "none", "row": "grpo", "compare": "filter",
                "baseline": "none", "run_dir": str(out / "runs" / name), "settings": "3 steps"}
        run = _run(Path(cell["run_dir"]), dtype)
        (run / "summary.json").write_text(json.dumps({"steps": 3, "steps_trained": 3, "steps_skipped": 0,
                                                      "final_val_success_rate": 0.5, "best_val_success_rate": 0.5}))
        (run / "bench_cell.json").write_text(json.dumps({"status": "done", "wall_s": 1.0}))
        cells.append(cell)
    (out / "bench.json").write_text(json.dumps({"suite": "s", "engine": "local", "cells": cells}))
    return out


def test_bench_report_says_when_its_cells_scored_in_different_dtypes(tmp_path):
    mixed = build_report(_bench(tmp_path / "mixed", {"a--s0": "bfloat16", "b--s1": "float32"}), with_plots=False)
    text = mixed["markdown"].read_text()
    assert text.count("different dtypes") == 1 and "bfloat16: a--s0; float32: b--s1" in text
    cells = {c["name"]: c["probe_dtype"] for c in json.loads(mixed["json"].read_text())["cells"]}
    assert cells == {"a--s0": "bfloat16", "b--s1": "float32"}
    alike = build_report(_bench(tmp_path / "alike", {"a--s0": "bfloat16", "b--s1": "bfloat16"}), with_plots=False)
    assert "different dtypes" not in alike["markdown"].read_text()
