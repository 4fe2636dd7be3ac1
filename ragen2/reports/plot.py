"""Training curves of a run as PNG (one figure, one panel per quantity), for `ragen2 plot`.

Steps are 1-based, as the console counts them ("step 1/6"): x = metrics.jsonl's 0-based
`step` field + 1, which is also the number of the checkpoint written after that step.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from ragen2 import metric_names as names
from ragen2.run_dir import CURVES_FILE, METRICS_FILE, finite, read_steps

PANELS = (
    ("reward (mean)", (names.ROLLOUT_REWARD_MEAN, names.VAL_REWARD_MEAN)),
    ("success rate", (names.ROLLOUT_SUCCESS_RATE, names.VAL_SUCCESS_RATE)),
    ("format ok (share of turns)", (names.ROLLOUT_FORMAT_OK_FRACTION,)),
    ("kept fraction of groups (SNR filter)", (names.SNR_KEPT_FRACTION,)),
    ("in-group reward std", (names.ROLLOUT_IN_GROUP_REWARD_STD_MEAN, names.SNR_KEPT_REWARD_STD_MEAN)),
    ("entropy", (names.ACTOR_ENTROPY,)),
    ("response tokens", (names.ROLLOUT_RESPONSE_TOKENS_MEAN, names.ROLLOUT_THINK_TOKENS_MEAN)),
    ("grad norm (pre-clip)", (names.ACTOR_GRAD_NORM,)),
    ("MI-ZScore-EMA", (names.PROBE_MI_ZSCORE_EMA,)),
)


def display_step(row: dict) -> int:
    """The step as people see it (1-based) from a metrics row's 0-based `step`."""
    return int(row["step"]) + 1


def curves_figure(rows: list[dict], title: str):
    matplotlib.use("Agg")  # a PNG only, on any machine; chosen when drawing, not for whoever imports this
    figure, axes = plt.subplots(3, 3, figsize=(14, 10), constrained_layout=True)
    skipped = [display_step(r) for r in rows if finite(r.get(names.SNR_SKIPPED))]
    first, last = min(display_step(r) for r in rows), max(display_step(r) for r in rows)
    for axis, (panel, keys) in zip(axes.flat, PANELS):
        drawn = False
        for key in keys:
            points = [(display_step(r), finite(r.get(key))) for r in rows]
            points = [(s, v) for s, v in points if v is not None]
            if points:
                steps, values = zip(*points)
                axis.plot(steps, values, marker="o", markersize=3, label=key)
                drawn = True
        for step in skipped:
            axis.axvline(step, color="0.85", linewidth=3, zorder=0)
        axis.set_title(panel)
        axis.set_xlabel("step")
        axis.set_xlim(first - 0.5, last + 0.5)  # the same steps on every panel, logged or not
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        if drawn:  # below the axes, so it never covers a curve
            axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
        else:
            axis.text(0.5, 0.5, "not logged", ha="center", va="center", transform=axis.transAxes, color="0.5")
    figure.suptitle(f"{title}  (steps from 1, as on the console; grey bands: skipped steps)")
    return figure


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    rows = read_steps(run_dir) if Path(run_dir).is_dir() else []
    if not rows:
        raise FileNotFoundError(f"no {METRICS_FILE} rows in {run_dir}"
                                + ("" if Path(run_dir).is_dir() else " (no such directory)"))
    figure = curves_figure(rows, Path(run_dir).name)
    out = out or Path(run_dir) / CURVES_FILE
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
