"""Checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is a folder `checkpoints/step_NNNNNN/` holding the model weights, optimiser
states, RNG states, and the JSON state of the step counter, stop policy and probe EMA.
It is written to a temporary folder and renamed into place, so a process killed mid-save
leaves the previous checkpoint as the latest complete one. The state file lists every other
file's size, so a checkpoint damaged later (a full disk, a copy cut short) is recognised and
`load_latest` falls back to the one before it.

Size: the Adam moments are two more copies of the trainable weights, so a full-finetune
checkpoint is about 3x the fp32 weights (SmolLM2-135M: 0.5 GB of weights, ~1.6 GB in all).
`trainer.save_optimizer=false` keeps weights and RNG states only (a resume then restarts the
Adam moments from zero and says so); `trainer.keep_last` bounds how many are kept; LoRA runs
save only the adapters. The first save of a process prints the size and these options.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ragen2 import models as model_lib
from ragen2.run_dir import CHECKPOINT_STATE_FILE as STATE_FILE
from ragen2.run_dir import CRITIC_DIR, POLICY_DIR, checkpoint_name, checkpoints_dir
# Reading a checkpoint's state needs no torch: those readers live in run_dir (export, eval and audit use them).
from ragen2.run_dir import CheckpointDamaged, complete_checkpoints, latest_checkpoint, read_state  # noqa: F401

OPTIMIZER_FILE = "optimizers_and_rng.pt"
_size_reported: set[str] = set()  # run directories whose checkpoint size this process printed


def _file_sizes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != STATE_FILE}


def size_report(path: Path) -> str:
    """One line: how big a checkpoint is, what takes the room, and how to keep less."""
    sizes = _file_sizes(Path(path))
    total = sum(sizes.values())
    optim = sizes.get(OPTIMIZER_FILE, 0)
    line = f"checkpoint {Path(path).name}: {total / 1e6:.1f} MB"
    if optim > 0.1 * total:
        line += (f" ({optim / 1e6:.1f} MB of it optimiser state; trainer.save_optimizer=false keeps weights only, "
                 f"trainer.keep_last=N bounds how many are kept)")
    return line


@dataclass
class Saved:
    """What a checkpoint holds beside its JSON state: the models' weights, the optimisers' moments and
    the sampling generator's state (torch's global RNG goes with it)."""

    models: object  # learner.Models
    optimizers: object  # learner.Optimizers
    generator: torch.Generator


@dataclass(frozen=True)
class SaveOptions:
    keep_last: int  # checkpoints kept, the newest
    save_optimizer: bool = True  # False: weights and RNG states only
    report: Callable[[str], None] | None = print  # told the checkpoint's size once per run directory and process

    @classmethod
    def of(cls, trainer, report: Callable[[str], None] | None = None) -> SaveOptions:
        """From the config's trainer section (trainer.keep_last, trainer.save_optimizer)."""
        return cls(trainer.keep_last, trainer.save_optimizer, report)


def save_checkpoint(run_dir: Path, step: int, saved: Saved, state: dict, options: SaveOptions) -> Path:
    """Save after `step` completed steps; keep the newest `options.keep_last` checkpoints."""
    models, optimizers, generator = saved.models, saved.optimizers, saved.generator
    keep_last, save_optimizer, report = options.keep_last, options.save_optimizer, options.report
    folder = checkpoints_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / checkpoint_name(step)
    staging = folder / f".staging_{final.name}_{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    model_lib.save_model(models.policy, staging / POLICY_DIR)
    if models.critic is not None:
        model_lib.save_model(models.critic, staging / CRITIC_DIR)
    torch.save({
        "actor": optimizers.actor.state_dict() if save_optimizer else None,
        "critic": optimizers.critic.state_dict() if optimizers.critic is not None and save_optimizer else None,
        "generator": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }, staging / OPTIMIZER_FILE)
    # The state file is written last: its presence marks the checkpoint complete.
    state = {"step": step, **state, "optimizer_saved": save_optimizer, "files": _file_sizes(staging)}
    (staging / STATE_FILE).write_text(json.dumps(state, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    for old in sorted(p for p in folder.glob("step_*"))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    if report is not None and str(Path(run_dir).resolve()) not in _size_reported:
        _size_reported.add(str(Path(run_dir).resolve()))
        report(size_report(final))
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
            state = load_checkpoint(path, models, optimizers, generator)
        except CheckpointDamaged as error:
            warn(f"checkpoint {path.name} is damaged ({error}); falling back to the one before it")
            continue
        if not state.get("optimizer_saved", True):
            warn(f"checkpoint {path.name} holds weights only (trainer.save_optimizer=false): the optimiser's "
                 "moments restart from zero, so the steps from here differ from an uninterrupted run")
        return path, state
    return None


def _restore(path: Path, models, optimizers, generator: torch.Generator) -> None:
    model_lib.load_model_weights(models.policy, path / POLICY_DIR)
    if models.critic is not None:
        model_lib.load_model_weights(models.critic, path / CRITIC_DIR)
    saved = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=False)
    if saved["actor"] is not None:  # None: saved with save_optimizer=False, the moments restart at zero
        optimizers.actor.load_state_dict(saved["actor"])
    if optimizers.critic is not None and saved["critic"] is not None:
        optimizers.critic.load_state_dict(saved["critic"])
    generator.set_state(saved["generator"])
    torch.set_rng_state(saved["torch_rng"])
