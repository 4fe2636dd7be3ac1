"""A training step hands back what it observed (trainer.train_step's StepResult: the batch, the
selection, the metrics), so nothing outside the engine wraps the trainer to see a step."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from ragen2.config import load_config
from ragen2.engines.local import trainer

REPO = Path(__file__).resolve().parents[4]


def trainer_module_names(tree: ast.Module) -> set[str]:
    """The names a file binds to ragen2.engines.local.trainer (`from ragen2.engines.local import trainer [as x]`)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "ragen2.engines.local":
            bound |= {alias.asname or alias.name for alias in node.names if alias.name == "trainer"}
        elif isinstance(node, ast.Import):
            bound |= {alias.asname for alias in node.names if alias.name == "ragen2.engines.local.trainer"
                      and alias.asname}
    return bound


def assignments_to(tree: ast.Module, modules: set[str]) -> list[int]:
    """Lines that assign to an attribute of one of `modules` (`m.x = ...`, `setattr(m, ...)`)."""
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id in modules:
                    lines.append(node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in modules):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_benchmark_or_script_assigns_to_the_trainer():
    offenders = {}
    for path in sorted([*REPO.glob("benchmarks/*.py"), *REPO.glob("scripts/*.py")]):
        tree = ast.parse(path.read_text())
        modules = trainer_module_names(tree)
        if modules and assignments_to(tree, modules):
            offenders[str(path.relative_to(REPO))] = assignments_to(tree, modules)
    assert offenders == {}, "observe a step through train_step's StepResult or train(on_step=...), not a patch"


def test_the_check_sees_a_patched_trainer():
    # the check above must be able to fail: the three kinds of patch it is there to catch
    patched = ast.parse("from ragen2.engines.local import trainer as t\nt.rollout = f\nsetattr(t, 'x', 1)\n"
                        "t.a, b = 1, 2\nother.rollout = f\n")
    assert assignments_to(patched, trainer_module_names(patched)) == [2, 3, 4]


@pytest.mark.usefixtures("single_thread")
def test_train_step_returns_its_batch_and_selection_and_train_shows_each_step(tiny_model_dir, tmp_path):
    cfg = load_config(overrides=["model.name=" + str(tiny_model_dir), "trainer.total_steps=2", "trainer.val_groups=1",
                                 "trainer.val_before=false", "probe.every=0", "rollout.num_groups=2",
                                 "rollout.group_size=2", "rollout.max_new_tokens=8", "optim.micro_batch_size=2",
                                 "trainer.num_threads=1"])
    run = trainer.setup(cfg, tmp_path / "run", quiet=True)
    seen = []
    trainer.train(run, on_step=lambda result: seen.append((run.state.step, result)))
    assert [step for step, _ in seen] == [0, 1]  # called once per step, before the step counter moves
    rows = [json_row for json_row in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for _, result in seen:
        batch, selection = result.batch, result.selection
        assert batch.input_ids.shape[0] == 4  # 2 groups x 2: the rollout, before the filter
        assert torch.equal(selection.kept, torch.arange(2)) and not selection.skip  # filter none keeps all
        assert result.metrics["rollout/reward_mean"] == pytest.approx(batch.metrics()["rollout/reward_mean"])
