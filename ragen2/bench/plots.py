"""Training curves of a bench, one PNG per env: every (algo, treatment) of that env on shared axes.

Seeds are drawn thin and their mean bold (at the steps every seed logged): with a few seeds a
std band would hide a seed that collapsed. A panel whose metric no cell logged says so, e.g.
MI-ZScore-EMA, which exists only where the MI probe ran on reasoning spans.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from ragen2 import metric_names as names
from ragen2.bench.worker import val_before
from ragen2.run_dir import finite, read_steps

PANELS = (  # (metric key, title)
    (names.VAL_SUCCESS_RATE, "validation success"),
    (names.ROLLOUT_SUCCESS_RATE, "training success"),
    (names.ROLLOUT_IN_GROUP_REWARD_STD_MEAN, "in-group reward std"),
    (names.ACTOR_ENTROPY, "policy entropy (gap: skipped step)"),
    (names.PROBE_MI_ZSCORE_EMA, "MI-ZScore-EMA"),
    (names.SNR_KEPT_FRACTION, "kept fraction of groups"),
)


def series(rows: list[dict], key: str) -> dict[int, float]:
    return {r["step"] + 1: finite(r[key]) for r in rows if finite(r.get(key)) is not None}


def cell_rows(run_dir: Path) -> list[dict]:
    """The cell's logged steps; a validation of the untrained model (validate_before) goes first, at step 0."""
    before = finite(val_before(run_dir).get(names.VAL_SUCCESS_RATE))
    return ([{"step": -1, names.VAL_SUCCESS_RATE: before}] if before is not None else []) + read_steps(run_dir)


def plot_envs(folder: Path, cells: list[dict], results: list[dict]) -> list[Path]:
    matplotlib.use("Agg")  # PNGs only, on any machine; chosen when drawing, not for whoever imports this
    folder.mkdir(parents=True, exist_ok=True)
    done = {r["name"] for r in results if r["status"] == "done"}
    several_matrices = len({c["matrix"] for c in cells}) > 1
    written = []
    for env in dict.fromkeys(c["env"] for c in cells):
        lines: dict[str, list[list[dict]]] = {}
        for cell in cells:
            if cell["env"] == env and cell["name"] in done:
                row = "" if cell["row"] == "all" else f"{cell['row']} "
                label = f"{row}{cell['treatment']}" + (f" [{cell['matrix']}]" if several_matrices else "")
                lines.setdefault(label, []).append(cell_rows(Path(cell["run_dir"])))
        if not lines:
            continue
        # sharex: validation logged only at the end is one point, placed on the training steps' axis
        figure, axes = plt.subplots(2, 3, figsize=(15, 7.5), constrained_layout=True, sharex=True)
        for axis, (key, title) in zip(axes.flat, PANELS):
            drawn = False
            for index, (label, runs) in enumerate(lines.items()):
                color = f"C{index % 10}"
                per_seed = [series(rows, key) for rows in runs]
                for points in per_seed:
                    if points:
                        axis.plot(list(points), list(points.values()), color=color, alpha=0.35, linewidth=0.8)
                common = sorted(set.intersection(*(set(p) for p in per_seed))) if per_seed else []
                if common:
                    means = [sum(p[s] for p in per_seed) / len(per_seed) for s in common]
                    axis.plot(common, means, color=color, marker="o", markersize=3, linewidth=2,
                              label=f"{label} (n={len(per_seed)})")
                    drawn = True
            axis.set(title=title, xlabel="training step")
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
            axis.grid(alpha=0.3)
            if not drawn:
                axis.text(0.5, 0.5, "not logged", ha="center", va="center", transform=axis.transAxes, color="0.5")
        # One legend for the figure, below the panels: a legend inside a panel covers its curves.
        handles = {label: handle for axis in axes.flat for handle, label in zip(*axis.get_legend_handles_labels())}
        if handles:
            figure.legend(list(handles.values()), list(handles), loc="outside lower center",
                          ncol=min(4, len(handles)), fontsize=8, frameon=False)
        figure.suptitle(f"{env}: mean over seeds (bold), seeds (thin)")
        path = folder / f"{env}.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written
