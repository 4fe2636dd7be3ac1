"""Checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is a folder `checkpoints/step_NNNNNN/` holding the model weights, optimiser
states, RNG states, and the JSON state of the step counter, stop policy and probe EMA.
It is written to a temporary folder and renamed into place, so a process killed mid-save
leaves the previous checkpoint as the latest complete one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ragen2 import models as model_lib

STATE_FILE = "state.json"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (one with its state file), or None."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return None
    done = sorted(p for p in folder.glob("step_*") if (p / STATE_FILE).is_file())
    return done[-1] if done else None


def save_checkpoint(run_dir: Path, step: int, models, optimizers, generator: torch.Generator,
                    state: dict, keep_last: int) -> Path:
    """Save after `step` completed steps; keep the newest `keep_last` checkpoints."""
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step_{step:06d}"
    staging = folder / f".staging_step_{step:06d}_{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    model_lib.save_model(models.policy, staging / "policy")
    if models.critic is not None:
        model_lib.save_model(models.critic, staging / "critic")
    torch.save({
        "actor": optimizers.actor.state_dict(),
        "critic": optimizers.critic.state_dict() if optimizers.critic is not None else None,
        "generator": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }, staging / "optimizers_and_rng.pt")
    # The state file is written last: its presence marks the checkpoint complete.
    (staging / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    for old in sorted(p for p in folder.glob("step_*"))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, models, optimizers, generator: torch.Generator) -> dict:
    """Restore models, optimisers and RNGs in place; return the JSON state."""
    path = Path(path)
    state = json.loads((path / STATE_FILE).read_text())
    model_lib.load_model_weights(models.policy, path / "policy")
    if models.critic is not None:
        model_lib.load_model_weights(models.critic, path / "critic")
    saved = torch.load(path / "optimizers_and_rng.pt", map_location="cpu", weights_only=False)
    optimizers.actor.load_state_dict(saved["actor"])
    if optimizers.critic is not None and saved["critic"] is not None:
        optimizers.critic.load_state_dict(saved["critic"])
    generator.set_state(saved["generator"])
    torch.set_rng_state(saved["torch_rng"])
    return state
