"""`ragen2 plot RUN_DIR`: training curves as PNG (ragen2.reports.plot draws them), the validation
curves starting from the untrained model's validation at step 0 where the run made one."""

from __future__ import annotations

import sys
from pathlib import Path

from ragen2.commands import COMMANDS
from ragen2.run_dir import CURVES_FILE, METRICS_FILE


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "plot", help=COMMANDS["plot"],
        description="Training curves as PNG, one panel per quantity, steps from 1 as on the console; the "
                    "validation before training (trainer.val_before) is drawn at step 0, a hollow diamond.")
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help=f"a ragen2 run directory (has {METRICS_FILE})")
    parser.add_argument("--out", type=Path, help=f"PNG path (default RUN_DIR/{CURVES_FILE})")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ragen2.reports.plot import plot_run  # matplotlib: not for `ragen2 plot --help`

    try:
        path = plot_run(args.run_dir, args.out)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
