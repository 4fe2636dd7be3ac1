"""`ragen2 export RUN_DIR`: a checkpoint as a Hugging Face folder that `from_pretrained` loads.

    ragen2 export runs/NAME                       latest checkpoint -> runs/NAME/export/step_N
    ragen2 export runs/NAME --checkpoint step_4 --out hf/ --lora adapter

A ragen2 checkpoint holds only what training needs (weights as `model.safetensors`, plus
optimiser and RNG states); its base model is named in the run's config.yaml. Export loads the
base, puts the checkpoint's weights on top and writes config.json, the tokenizer and the weights
with `save_pretrained`. A LoRA run is merged into the base (`--lora merge`, the default: a plain
model) or written as a PEFT adapter (`--lora adapter`: adapter_config.json + adapter weights; its
`base_model_name_or_path` is the base's source, so the base must be reachable where it is loaded).
"""

from __future__ import annotations

import os
from pathlib import Path

from ragen2.reports import audit
from ragen2.run_dir import CONFIG_FILE, EXPORT_DIR, CheckpointDamaged, checkpoints_dir, complete_checkpoints, read_state


class ExportError(RuntimeError):
    """A run directory or checkpoint that cannot be exported (nothing was written)."""


def find_checkpoint(run_dir: Path, name: str | None) -> Path:
    """The checkpoint folder to export: `name` (step_N, N with or without zero padding) or the latest."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise ExportError(f"{run_dir}: not a ragen2 run directory (no {CONFIG_FILE} naming the base model)")
    done = complete_checkpoints(run_dir)
    if not done:
        raise ExportError(f"{run_dir}: no complete checkpoint under {checkpoints_dir(run_dir)}")
    if name is None:
        return done[0]
    digits = name.removeprefix("step_")
    if not digits.isdigit():
        raise ExportError(f"--checkpoint {name!r}: expected step_N (one of {', '.join(p.name for p in done)})")
    for path in done:
        if int(path.name.removeprefix("step_")) == int(digits):
            return path
    raise ExportError(f"--checkpoint {name}: not among the complete checkpoints ({', '.join(p.name for p in done)})")


def _plain(model):
    """The model without GGUF's quantization_config, which makes save_pretrained refuse it."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
        for attr in ("is_quantized", "hf_quantizer"):
            if hasattr(model, attr):
                setattr(model, attr, False if attr == "is_quantized" else None)
    return model


def export_checkpoint(run_dir: Path, out: Path | None = None, checkpoint: str | None = None,
                      lora: str = "merge") -> Path:
    """Write the Hugging Face folder and return it (default RUN_DIR/export/step_N)."""
    if lora not in ("merge", "adapter"):
        raise ExportError(f"--lora {lora!r}: use merge or adapter")
    path = find_checkpoint(run_dir, checkpoint)
    try:
        read_state(path)
    except CheckpointDamaged as error:
        raise ExportError(f"{path} is damaged ({error}); export an earlier one with --checkpoint") from None
    spec = audit.resolve_model(str(path))
    policy, tokenizer = audit.load_model(spec)
    is_lora = hasattr(policy, "merge_and_unload")
    if lora == "adapter" and not is_lora:
        raise ExportError(f"--lora adapter: the run {run_dir} did not train LoRA adapters (model.lora_rank 0)")
    out = Path(out) if out is not None else Path(run_dir) / EXPORT_DIR / path.name
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} exists and is not empty; pick another --out")
    if is_lora and lora == "merge":
        policy = policy.merge_and_unload()
    if is_lora and lora == "adapter":
        policy.peft_config["default"].base_model_name_or_path = spec.source
    _plain(policy).save_pretrained(out)
    tokenizer.save_pretrained(out)
    _readable(out)
    return out


def _readable(folder: Path) -> None:
    """save_pretrained writes the weights through a private temporary file (mode 0600): give every
    file the mode a new file gets here (0644 under the usual umask 022), so others can load the export."""
    umask = os.umask(0)
    os.umask(umask)  # reading the umask means setting it; put it back at once
    for path in Path(folder).rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
