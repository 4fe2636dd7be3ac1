"""Training curves of a run as PNG (one figure, one panel per quantity), for `ragen2 plot`.

Steps are 1-based, as the console counts them ("step 1/6"): x = metrics.jsonl's 0-based
`step` field + 1, which is also the number of the checkpoint written after that step. The
untrained model's validation (trainer.val_before), the point a run is judged against, sits at
step 0 on the validation curves, drawn apart from the trained steps (`Curve`, `draw_curve`;
the audit's series.png draws it the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from ragen2 import metric_names as names
from ragen2.run_dir import CURVES_FILE, METRICS_FILE, finite, read_events, read_steps, read_summary

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
BEFORE_STEP = 0  # the validation before training, drawn before step 1
BEFORE_LABEL = "before training"


@dataclass
class Curve:
    """One metric as drawn: its 1-based steps and values, and for a validation metric the untrained
    model's value (`before`), drawn at BEFORE_STEP."""

    key: str
    steps: list[int]
    values: list[float]
    before: float | None = None


def validation_before(run_dir: Path, events: list[dict] | None = None) -> dict[str, float]:
    """The untrained model's validation metrics (finite ones): the last `validation_before` event's,
    as run_dir.before_after reads it (a restarted run can write two); where events.jsonl has none,
    summary.json's val_before_success_rate. {} when the run validated nothing before training."""
    before: dict[str, float] = {}
    for event in read_events(run_dir) if events is None else events:
        if event.get("kind") == "validation_before":
            metrics = event.get("metrics") or {}
            before = {key: float(value) for key, value in metrics.items() if finite(value) is not None}
    if before:
        return before
    try:
        summary = read_summary(run_dir) or {}
    except ValueError:  # a summary.json cut short: no before point, not a failed plot
        summary = {}
    success = finite(summary.get("val_before_success_rate")) if isinstance(summary, dict) else None
    return {} if success is None else {names.VAL_SUCCESS_RATE: success}


def display_step(row: dict) -> int:
    """The step as people see it (1-based) from a metrics row's 0-based `step`."""
    return int(row["step"]) + 1


def curves(rows: list[dict], keys, before: dict[str, float] | None = None) -> list[Curve]:
    """The curves of `keys` that have a value: logged points at 1-based steps, and the validation
    before training on a validation key (a run validated only before training still gets its point)."""
    out = []
    for key in keys:
        points = [(display_step(r), finite(r.get(key))) for r in rows]
        points = [(s, v) for s, v in points if v is not None]
        start = (before or {}).get(key) if key.startswith(names.VAL) else None
        if points or start is not None:
            out.append(Curve(key, [s for s, _ in points], [v for _, v in points], start))
    return out


def draw_curve(axis, curve: Curve, **style) -> None:
    """The logged points with `style`; the before-training point as a hollow diamond at step 0,
    joined to the first validated step by a dotted line: the same colour, but no trained step."""
    colour = None
    if curve.steps:
        (line,) = axis.plot(curve.steps, curve.values, label=curve.key, **style)
        colour = line.get_color()
    if curve.before is None:
        return
    hollow = dict(linestyle="none", marker="D", markersize=6, markerfacecolor="white", markeredgewidth=1.5)
    (mark,) = axis.plot([BEFORE_STEP], [curve.before], label=f"{curve.key} {BEFORE_LABEL}",
                        **hollow, **({"color": colour} if colour else {}))
    if curve.steps:
        axis.plot([BEFORE_STEP, curve.steps[0]], [curve.before, curve.values[0]], linestyle=":", color=mark.get_color())


def curves_figure(rows: list[dict], title: str, before: dict[str, float] | None = None):
    matplotlib.use("Agg")  # a PNG only, on any machine; chosen when drawing, not for whoever imports this
    figure, axes = plt.subplots(3, 3, figsize=(14, 10), constrained_layout=True)
    skipped = [display_step(r) for r in rows if finite(r.get(names.SNR_SKIPPED))]
    panels = [(panel, curves(rows, keys, before)) for panel, keys in PANELS]
    first, last = min(display_step(r) for r in rows), max(display_step(r) for r in rows)
    if any(c.before is not None for _, drawn in panels for c in drawn):
        first = BEFORE_STEP
    for axis, (panel, drawn) in zip(axes.flat, panels):
        for curve in drawn:
            draw_curve(axis, curve, marker="o", markersize=3)
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
    start = f"; step 0: validation {BEFORE_LABEL}" if first == BEFORE_STEP else ""
    figure.suptitle(f"{title}  (steps from 1, as on the console{start}; grey bands: skipped steps)")
    return figure


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    rows = read_steps(run_dir) if Path(run_dir).is_dir() else []
    if not rows:
        raise FileNotFoundError(f"no {METRICS_FILE} rows in {run_dir}"
                                + ("" if Path(run_dir).is_dir() else " (no such directory)"))
    figure = curves_figure(rows, Path(run_dir).name, before=validation_before(run_dir))
    out = out or Path(run_dir) / CURVES_FILE
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
