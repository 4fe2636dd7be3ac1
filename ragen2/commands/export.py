"""`ragen2 export RUN_DIR`: a checkpoint as a Hugging Face folder (ragen2.export writes it)."""

from __future__ import annotations

import sys
from pathlib import Path

from ragen2.commands import COMMANDS
from ragen2.run_dir import EXPORT_DIR


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help=COMMANDS["export"],
        description="Load a run's checkpoint on its base model and save it with save_pretrained, so that "
                    "AutoModelForCausalLM.from_pretrained(OUT) loads it anywhere.")
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a ragen2 run directory")
    parser.add_argument("--out", type=Path, help=f"folder to write (default RUN_DIR/{EXPORT_DIR}/step_N)")
    parser.add_argument("--checkpoint", metavar="step_N", help="which checkpoint (default the latest complete one)")
    parser.add_argument("--lora", choices=("merge", "adapter"), default="merge",
                        help="LoRA runs: merge the adapters into the base (default) or write a PEFT adapter")
    parser.set_defaults(run=run)


def run(args) -> int:
    # torch and transformers: not for `ragen2 export --help`
    from ragen2.export import ExportError, export_checkpoint, folder_size
    from ragen2.models import ModelSourceError, ModelWeightsError

    try:
        out = export_checkpoint(args.run_dir, args.out, args.checkpoint, args.lora)
    except (ExportError, FileNotFoundError, ModelSourceError, ModelWeightsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({folder_size(out) / 1e6:.1f} MB); load it with "
          f"AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0
