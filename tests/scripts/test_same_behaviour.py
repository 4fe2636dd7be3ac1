"""scripts/same_behaviour.py: two runs are the same when their metrics agree (wall-clock readings
aside) and their weights are equal tensor for tensor, whatever order a file's header was written in."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load():
    spec = importlib.util.spec_from_file_location("same_behaviour_under_test", SCRIPTS / "same_behaviour.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_run(folder: Path, rows: list[dict], weights: dict[str, torch.Tensor], metadata: dict) -> Path:
    (folder / "checkpoints" / "step_000001" / "policy").mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    save_file(weights, str(folder / "checkpoints" / "step_000001" / "policy" / "model.safetensors"), metadata=metadata)
    return folder


def test_same_metrics_and_tensors_are_the_same_run_whatever_the_header_order(tmp_path):
    same_behaviour = load()
    weights = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4)}
    rows = [{"step": 0, "actor/pg_loss": 0.5, "time/step_s": 1.0, "throughput/update_tokens_per_s": 9.0}]
    base = fake_run(tmp_path / "base", rows, weights, {"x": "1", "y": "2"})
    slower = [dict(rows[0], **{"time/step_s": 3.0, "throughput/update_tokens_per_s": 2.0})]
    new = fake_run(tmp_path / "new", slower, {k: v.clone() for k, v in weights.items()}, {"y": "2", "x": "1"})
    assert same_behaviour.compare(base, new)["same"]


def test_a_changed_metric_or_weight_is_a_difference(tmp_path):
    same_behaviour = load()
    weights = {"a": torch.arange(6.0)}
    rows = [{"step": 0, "actor/pg_loss": 0.5}]
    base = fake_run(tmp_path / "base", rows, weights, {})
    moved = fake_run(tmp_path / "moved", rows, {"a": torch.arange(6.0) + 1e-7 * torch.arange(6.0)}, {})
    result = same_behaviour.compare(base, moved)
    assert not result["same"] and not result["weights_identical"] and result["metrics_differing"] == []
    other = fake_run(tmp_path / "other", [{"step": 0, "actor/pg_loss": 0.25}], weights, {})
    result = same_behaviour.compare(base, other)
    assert not result["same"] and result["metrics_differing"] == ["actor/pg_loss"] and result["weights_identical"]
