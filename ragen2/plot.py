"""`ragen2 plot RUN_DIR`: training curves as PNG (one figure, one panel per quantity)."""

from __future__ import annotations

import sys
from pathlib import Path

from ragen2.run_log import read_metrics

PANELS = (
    ("success rate", ("rollout/success_rate", "val/success_rate")),
    ("in-group reward std", ("rollout/in_group_reward_std_mean", "snr/kept_reward_std_mean")),
    ("entropy", ("actor/entropy",)),
    ("response tokens", ("rollout/response_tokens_mean", "rollout/think_tokens_mean")),
    ("grad norm (pre-clip)", ("actor/grad_norm",)),
    ("MI-ZScore-EMA", ("probe/mi_zscore_ema",)),
)


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl rows to plot")
    figure, axes = plt.subplots(2, 3, figsize=(13, 7), constrained_layout=True)
    for axis, (title, keys) in zip(axes.flat, PANELS):
        drawn = False
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                steps, values = zip(*points)
                axis.plot(steps, values, marker="o", markersize=3, label=key)
                drawn = True
        skipped = [r["step"] for r in rows if r.get("snr/skipped")]
        for step in skipped:
            axis.axvline(step, color="0.85", linewidth=3, zorder=0)
        axis.set_title(title)
        axis.set_xlabel("step")
        if drawn:
            axis.legend(fontsize=7)
        else:
            axis.text(0.5, 0.5, "not logged", ha="center", va="center", transform=axis.transAxes, color="0.5")
    figure.suptitle(f"{Path(run_dir).name}  (grey bands: skipped steps)")
    out = out or Path(run_dir) / "curves.png"
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def add_parser(commands) -> None:
    parser = commands.add_parser("plot", help="write PNG training curves for a run directory")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, help="PNG path (default RUN_DIR/curves.png)")
    parser.set_defaults(run=run_plot)


def run_plot(args) -> int:
    try:
        path = plot_run(args.run_dir, args.out)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
