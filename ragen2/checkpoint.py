"""Checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is a folder `checkpoints/step_NNNNNN/` holding the model weights, optimiser
states, RNG states, and the JSON state of the step counter, stop policy and probe EMA.
It is written to a temporary folder and renamed into place, so a process killed mid-save
leaves the previous checkpoint as the latest complete one. The state file lists every other
file's size, so a checkpoint damaged later (a full disk, a copy cut short) is recognised and
`load_latest` falls back to the one before it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ragen2 import models as model_lib

STATE_FILE = "state.json"


class CheckpointDamaged(RuntimeError):
    """A checkpoint folder whose files are missing, cut short or unreadable."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints with their state file (written last), newest first."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.glob("step_*") if (p / STATE_FILE).is_file()), reverse=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    done = complete_checkpoints(run_dir)
    return done[0] if done else None


def _file_sizes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != STATE_FILE}


def read_state(path: Path) -> dict:
    """The checkpoint's JSON state, after checking that its files are all there at full size."""
    try:
        state = json.loads((Path(path) / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointDamaged(f"{STATE_FILE} unreadable ({error})") from None
    for name, size in state.get("files", {}).items():  # absent in checkpoints written before sizes were kept
        file = Path(path) / name
        actual = file.stat().st_size if file.is_file() else None
        if actual != size:
            raise CheckpointDamaged(f"{name} is {'missing' if actual is None else f'{actual} bytes, expected {size}'}")
    return state


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
    state = {"step": step, **state, "files": _file_sizes(staging)}
    (staging / STATE_FILE).write_text(json.dumps(state, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    for old in sorted(p for p in folder.glob("step_*"))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, models, optimizers, generator: torch.Generator) -> dict:
    """Restore models, optimisers and RNGs in place; return the JSON state.

    Raises CheckpointDamaged (before touching anything where the sizes tell) for a damaged folder."""
    path = Path(path)
    state = read_state(path)
    try:
        _restore(path, models, optimizers, generator)
    except CheckpointDamaged:
        raise
    except Exception as error:  # noqa: BLE001 - safetensors, torch.load and pickle each raise their own types
        raise CheckpointDamaged(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from None
    return state


def load_latest(run_dir: Path, models, optimizers, generator: torch.Generator, warn) -> tuple[Path, dict] | None:
    """Restore the newest checkpoint that loads; `warn(line)` for each damaged one passed over.

    A damaged checkpoint may have been half-read into the models; the next one read overwrites
    every tensor, so the state after a fallback is exactly that checkpoint's."""
    for path in complete_checkpoints(run_dir):
        try:
            return path, load_checkpoint(path, models, optimizers, generator)
        except CheckpointDamaged as error:
            warn(f"checkpoint {path.name} is damaged ({error}); falling back to the one before it")
    return None


def _restore(path: Path, models, optimizers, generator: torch.Generator) -> None:
    model_lib.load_model_weights(models.policy, path / "policy")
    if models.critic is not None:
        model_lib.load_model_weights(models.critic, path / "critic")
    saved = torch.load(path / "optimizers_and_rng.pt", map_location="cpu", weights_only=False)
    optimizers.actor.load_state_dict(saved["actor"])
    if optimizers.critic is not None and saved["critic"] is not None:
        optimizers.critic.load_state_dict(saved["critic"])
    generator.set_state(saved["generator"])
    torch.set_rng_state(saved["torch_rng"])
