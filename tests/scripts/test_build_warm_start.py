"""scripts/build_warm_start.py rebuilds a warm start with the passes its calibration ran: a
calibration made before sft.padding_free existed ran the padded passes, and the padding-free ones
(today's default) round differently, so its rebuild must name sft.padding_free=false."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("build_warm_start_under_test", ROOT / "scripts" / "build_warm_start.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_committed_warm_start_rebuilds_with_the_passes_it_ran(tool):
    results = json.loads((ROOT / "docs" / "benchmarks" / "warm_start_calibration.json").read_text())["results"]
    for result in results:
        demos, sft = tool.rebuild_commands(result, Path("runs/warm/x"))
        assert demos[:2] == ["ragen2", "demos"] and sft[:2] == ["ragen2", "sft"]
        named = [a for a in sft if a.startswith("sft.padding_free=")]
        if "sft.padding_free=" in result["warm_start_command"]:
            assert named == [a for a in result["warm_start_command"].split() if a.startswith("sft.padding_free=")]
        else:
            assert named == ["sft.padding_free=false"]
        assert "trainer.out=runs/warm" in sft and "trainer.run_name=x" in sft and "trainer.val_every=0" in sft


def test_a_calibration_that_names_its_passes_is_rebuilt_as_named(tool):
    result = {"warm_start_command": "ragen2 demos --env frozen_lake --out d.jsonl && ragen2 sft --demos d.jsonl "
                                    "--steps 10 trainer.out=runs/calibration sft.padding_free=true"}
    _, sft = tool.rebuild_commands(result, Path("runs/warm/y"))
    assert [a for a in sft if a.startswith("sft.padding_free=")] == ["sft.padding_free=true"]
    assert "trainer.out=runs/calibration" not in sft
