"""`ragen2 bench report DIR`: every table and plot rebuilt from the cells' run directories.

Writes into DIR:
  results.csv / results.json  one row per cell (validation success before training where the
                              suite measured it, final and best after; rewards, steps skipped,
                              wall, rollout and update time, tokens; the budget spent: episodes,
                              sampled and update tokens, optimiser steps), plus, in the JSON, the
                              means and standard deviations over seeds, the paired comparisons
                              and the budget warnings
  report.md                   the paper-shaped table per matrix: validation success (%) per env
                              and algorithm, mean ± std over seeds, each filter's change from the
                              baseline, published numbers beside ours where the suite has them,
                              and each pair of arms' paired difference over seeds (t and bootstrap
                              CIs, sign-flip p; ragen2.bench.comparisons); then every cell, the
                              budget each spent with a warning where arms differ in a budget the
                              suite declares equal (`equal_budgets`), and the cells that did not
                              finish with the reason
  plots/<env>.png             training curves per env (see ragen2.bench.plots)
With `docs`, the report also goes into a markdown file to commit (between markers, so a
hand-written reading around it survives a rebuild), with its plots and results.json beside it.
Nothing is read from the running process: a report can be rebuilt any time, also mid-suite.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

from ragen2 import metric_names as names
from ragen2.bench import comparisons as comparisons_lib
from ragen2.bench.plots import plot_envs
from ragen2.bench.published import PUBLISHED, published_value
from ragen2.bench.runner import read_manifest, read_state
from ragen2.bench.worker import val_before
from ragen2.config import upgrade_saved
from ragen2.reports.probe_dtype import mixed_dtypes_line, run_probe_dtypes
from ragen2.run_dir import finite, read_config, read_steps, read_summary

COLUMNS = ("name", "matrix", "env", "algo", "filter", "variant", "treatment", "row", "model", "seed", "status",
           "reason",
           "steps", "steps_trained", "steps_skipped", "stop_reason", "val_success_before", "final_val_success",
           "best_val_success", "final_val_reward", "final_val_pass_at_g", "train_reward_mean", "last_train_reward",
           "kept_fraction_mean", "last_mi_zscore_ema", "probe_dtype", "wall_s", "compute_s", "rollout_s", "update_s",
           "rollout_tokens",
           "response_tokens", "env_episodes", "generation_rounds", "update_tokens", "optimizer_steps", "optimizer_steps_per_trained_step",
           "run_dir")
AGGREGATED = ("val_success_before", "final_val_success", "best_val_success", "final_val_reward", "train_reward_mean",
              "steps_skipped", "wall_s", "compute_s", "rollout_s", "update_s", "rollout_tokens")
# The phases a filter shrinks (they run on the kept groups only): their sum is the update time.
UPDATE_PHASES = (names.PHASE_OLD_LOG_PROBS, names.PHASE_REF_LOG_PROBS, names.PHASE_VALUES, names.PHASE_ADVANTAGES,
                 names.PHASE_UPDATE)


def _mean(values) -> float | None:
    return sum(values) / len(values) if values else None


def cell_result(cell: dict) -> dict:
    """One row of results: the manifest's labels plus the numbers of a finished run."""
    run_dir = Path(cell["run_dir"])
    state = read_state(run_dir)
    row = {key: cell.get(key) for key in ("name", "matrix", "env", "algo", "filter", "variant", "treatment", "row",
                                          "model", "seed", "run_dir")}
    row.update({key: None for key in COLUMNS if key not in row})
    summary = read_summary(run_dir)
    if summary is None:
        row["status"] = state.get("status", "not run")
        if row["status"] == "running":  # no live process writes here: the last bench stopped mid-cell
            row["status"] = "unfinished"
        row["reason"] = state.get("reason")
        return row
    rows = read_steps(run_dir)
    # The last validated step: by success where measured, by reward for OpenRLHF's evaluator (no success rate)
    val_keys = (names.VAL_SUCCESS_RATE, names.VAL_REWARD_MEAN)
    val = [r for r in rows if any(finite(r.get(key)) is not None for key in val_keys)]
    last_val = val[-1] if val else {}
    pass_key = next((k for k in last_val if k.startswith(names.VAL_PASS_AT)), None)

    def logged(key: str) -> list[float]:
        return [v for r in rows if (v := finite(r.get(key))) is not None]

    def total(key: str) -> float | None:  # None where no row logged it (an older run, another engine)
        values = logged(key)
        return sum(values) if values else None

    rewards, mi = logged(names.ROLLOUT_REWARD_MEAN), logged(names.PROBE_MI_ZSCORE_EMA)
    optimizer_steps = total(names.UPDATE_OPTIMIZER_STEPS)
    rollout_s = logged(names.TIME_ROLLOUT_S)  # phase times: absent from an OpenRLHF run's rows
    update_s = [seconds for phase in UPDATE_PHASES for seconds in logged(names.phase_seconds(phase))]
    row.update({
        "status": "done",
        "val_success_before": finite(val_before(run_dir).get(names.VAL_SUCCESS_RATE)),
        "steps": summary["steps"], "steps_trained": summary["steps_trained"],
        "steps_skipped": summary["steps_skipped"], "stop_reason": summary.get("stop_reason"),
        "final_val_success": summary.get("final_val_success_rate"),
        "best_val_success": summary.get("best_val_success_rate"),
        "final_val_reward": finite(last_val.get(names.VAL_REWARD_MEAN)),
        "final_val_pass_at_g": finite(last_val.get(pass_key)) if pass_key else None,
        "train_reward_mean": _mean(rewards),
        "last_train_reward": rewards[-1] if rewards else None,
        "kept_fraction_mean": _mean(logged(names.SNR_KEPT_FRACTION)),
        "last_mi_zscore_ema": mi[-1] if mi else None,
        # what the probe scored in ("+" joins them if a resumed run changed it); None: no probe row
        "probe_dtype": "+".join(run_probe_dtypes(rows, upgrade_saved(read_config(run_dir) or {}))) or None,
        # The runner's clock spans every attempt of a resumed cell; a hand-run cell has only its last session.
        "wall_s": state.get("wall_s", summary.get("wall_s_this_session")),
        # The cell's own compute: its steps' and validations' logged times, each step once (a resumed
        # cell's rows are its steps), so attempts lost to a kill or a stop are not counted.
        "compute_s": (steps_s + (total(names.TIME_VALIDATION_S) or 0.0)
                      if (steps_s := total(names.TIME_STEP_S)) is not None else None),
        "rollout_s": sum(rollout_s) if rollout_s else None,
        "update_s": sum(update_s) if update_s else None,
        "rollout_tokens": int(sum(logged(names.ROLLOUT_NUM_TOKENS))),
        "response_tokens": int(round(sampling_total(rows, names.SAMPLING_TOKENS, _round_tokens) or 0)),
        "env_episodes": sampling_total(rows, names.SAMPLING_EPISODES,
                                       lambda r: finite(r.get(names.ROLLOUT_NUM_TRAJECTORIES))),
        "generation_rounds": sampling_total(rows, names.SAMPLING_ROUNDS, lambda r: 1.0),
        "update_tokens": total(names.UPDATE_TOKENS),
        "optimizer_steps": optimizer_steps,
        "val_curve": ([[0.0, before]] if (before := finite(val_before(run_dir).get(names.VAL_SUCCESS_RATE)))
                      is not None else []) + val_curve(rows),  # the untrained model: no episode spent
        "optimizer_steps_per_trained_step": (optimizer_steps / summary["steps_trained"]
                                             if optimizer_steps is not None and summary["steps_trained"] else None),
    })
    return row


def sampling_total(rows: list[dict], key: str, one_round) -> float | None:
    """The sum over steps of a sampling/* budget (every generation round); a row without it (a run
    from before dynamic sampling, the OpenRLHF engine) had one round: `one_round(row)` reads it."""
    values = [v if (v := finite(r.get(key))) is not None else one_round(r) for r in rows]
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def val_curve(rows: list[dict]) -> list[list[float]]:
    """[training episodes sampled through the step, validation success] at each validated step: what
    the equal-rollout-budget comparison reads (results.json only)."""
    curve, episodes = [], 0.0
    for row in rows:
        spent = finite(row.get(names.SAMPLING_EPISODES))
        episodes += spent if spent is not None else (finite(row.get(names.ROLLOUT_NUM_TRAJECTORIES)) or 0.0)
        success = finite(row.get(names.VAL_SUCCESS_RATE))
        if success is not None:
            curve.append([episodes, success])
    return curve


def _round_tokens(row: dict) -> float | None:
    mean, count = finite(row.get(names.ROLLOUT_RESPONSE_TOKENS_MEAN)), finite(row.get(names.ROLLOUT_NUM_TRAJECTORIES))
    return None if mean is None or count is None else mean * count


def mean_std(values) -> dict:
    """Mean and sample standard deviation (ddof=1) over seeds; std is None for a single seed."""
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "std": None, "n": 0}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return {"mean": mean, "std": std, "n": len(values)}


def group_key(row: dict) -> tuple:
    """Seeds of one setting: (matrix, env, table row, treatment)."""
    return (row["matrix"], row["env"], row["row"], row["treatment"])


def aggregate(results: list[dict]) -> dict[tuple, dict]:
    groups: dict[tuple, list[dict]] = {}
    for row in results:
        if row["status"] == "done":
            groups.setdefault(group_key(row), []).append(row)
    return {key: {name: mean_std([r[name] for r in rows]) for name in AGGREGATED} | {"seeds": [r["seed"] for r in rows]}
            for key, rows in groups.items()}


def percent(stat: dict) -> str:
    """A success rate as the paper prints it: percent, one decimal, ± the std over seeds."""
    if stat["mean"] is None:
        return "—"
    std = "–" if stat["std"] is None else f"{100 * stat['std']:.1f}"
    return f"{100 * stat['mean']:.1f} ± {std}"


def delta(stat: dict, base: dict | None) -> str:
    """Change from the baseline treatment, in percentage points of the mean."""
    if base is None or stat["mean"] is None or base["mean"] is None:
        return ""
    return f" ({100 * (stat['mean'] - base['mean']):+.1f})"


def matrix_table(matrix: str, cells: list[dict], stats: dict, published: str | None) -> list[str]:
    """Rows: algorithm (or filter); columns: env × treatment; entries: final val success %, Δ from baseline."""
    mine = [c for c in cells if c["matrix"] == matrix]
    envs = list(dict.fromkeys(c["env"] for c in mine))
    treatments = list(dict.fromkeys(c["treatment"] for c in mine))
    baseline = mine[0]["baseline"]
    empty = {"mean": None, "std": None}
    header = ["" if mine[0].get("compare") == "algo" else "algorithm"] + [f"{e}: {t}" for e in envs for t in treatments]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]

    def published_for(row: str, env: str, treatment: str) -> float | None:
        cell = next((c for c in mine if (c["row"], c["env"], c["treatment"]) == (row, env, treatment)), None)
        if cell is None or cell["variant"]:
            return None
        return published_value(published, cell["algo"], env, cell["filter"], cell.get("model"))

    for row in dict.fromkeys(c["row"] for c in mine):
        values, published_row = [], []
        for env in envs:
            base_setting = stats.get((matrix, env, row, baseline), {})
            base = base_setting.get("final_val_success")
            base_published = published_for(row, env, baseline)
            for treatment in treatments:
                setting = stats.get((matrix, env, row, treatment), {})
                stat = setting.get("final_val_success", empty)
                # means over different seeds differ by the seeds too: no change shown until they match
                same_seeds = sorted(setting.get("seeds", [])) == sorted(base_setting.get("seeds", []))
                values.append(percent(stat) + ("" if treatment == baseline or not same_seeds else delta(stat, base)))
                value = published_for(row, env, treatment)
                shown = "—" if value is None else f"{value:.1f}"
                if value is not None and base_published is not None and treatment != baseline:
                    shown += f" ({value - base_published:+.1f})"
                published_row.append(shown)
        lines.append(f"| {row} | " + " | ".join(values) + " |")
        if any(v != "—" for v in published_row):
            lines.append(f"| {row}, published | " + " | ".join(published_row) + " |")
    return lines


def markdown(manifest: dict, results: list[dict], stats: dict, plots: list[Path], compared: list[dict] = (),
             equal_budgets: list[str] = (), gains: list[dict] = ()) -> str:
    cells = manifest["cells"]
    published = manifest.get("published")
    lines = [f"# Bench `{manifest['suite']}`", ""]
    if manifest.get("description"):
        lines += [manifest["description"].strip(), ""]
    done = sum(r["status"] == "done" for r in results)
    machine = manifest.get("machine")
    where = ""
    if machine:
        gpu = f", {machine['gpu']}" if "gpu" in machine else ""
        where = f" on {machine['cpu']} ({machine['cpus_usable']} cores{gpu})"
    lines += [f"{done} of {len(results)} cells finished. Engine: {manifest.get('engine', 'local')}{where}. "
              "Numbers: final validation success rate in percent, mean ± sample std over seeds "
              "(– for one seed); in brackets, the change of the mean from the matrix's baseline, in points, "
              "where both cover the same seeds.", ""]
    dtypes = mixed_dtypes_line({r["name"]: r["probe_dtype"].split("+") for r in results if r.get("probe_dtype")},
                               what="cells")
    if dtypes:
        lines += [dtypes, ""]
    for matrix in dict.fromkeys(c["matrix"] for c in cells):
        first = next(c for c in cells if c["matrix"] == matrix)
        seeds = sorted({c["seed"] for c in cells if c["matrix"] == matrix})
        lines += [f"## {matrix}", "", f"Baseline: `{first['baseline']}`. Seeds {seeds}. Settings of the first cell: "
                  f"{first.get('settings', '')}", ""]
        lines += matrix_table(matrix, cells, stats, published)
        lines.append("")
        lines += comparisons_lib.comparison_lines(matrix, list(compared))
        lines += comparisons_lib.gain_lines(matrix, list(gains))
    if published:
        lines += [f"Published rows: {PUBLISHED[published]['source']}, {PUBLISHED[published]['metric']}; "
                  "a different model and scale from ours unless the suite ran the paper's setting.", ""]
    # compute: the cell's own steps and validations (each step once); the runner's clock (wall_s,
    # in results.csv) misses attempts killed without a word and counts the ones redone after a kill
    lines += ["## Every cell", "", "Compute: the cell's own steps and validations, each once (a resumed cell's "
              "lost attempts excluded); update: its steps' update passes.", "",
              "| cell | status | val before | final val | best val | val reward | train reward "
              "| kept fraction | skipped | MI-ZScore-EMA (last) | compute (min) | update (min) | rollout tokens |",
              "|" + " --- |" * 13]

    def fmt(value, spec=".3f"):
        return "—" if value is None else format(value, spec)

    for r in results:
        compute, update = (None if r[key] is None else r[key] / 60 for key in ("compute_s", "update_s"))
        lines.append(f"| {r['name']} | {r['status']} | {fmt(r['val_success_before'])} | {fmt(r['final_val_success'])} "
                     f"| {fmt(r['best_val_success'])} | {fmt(r['final_val_reward'])} | {fmt(r['train_reward_mean'])} | "
                     f"{fmt(r['kept_fraction_mean'], '.2f')} | "
                     f"{fmt(r['steps_skipped'], 'd')} | {fmt(r['last_mi_zscore_ema'])} | "
                     f"{fmt(compute, '.1f')} | {fmt(update, '.1f')} | {fmt(r['rollout_tokens'], 'd')} |")
    lines += [""] + comparisons_lib.budget_lines(results, list(equal_budgets),
                                                 comparisons_lib.warnings(list(compared)))
    unfinished = [r for r in results if r["status"] != "done"]
    if unfinished:
        lines += ["", "## Not finished", ""]
        lines += [f"- `{r['name']}`: {r['status']}" + (f" — {r['reason']}" if r["reason"] else "")
                  for r in unfinished]
    if plots:
        lines += ["", "## Training curves", ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in plots]
    lines += ["", "All numbers: `results.csv`, `results.json`.", ""]
    return "\n".join(lines)


def build_report(out: Path, with_plots: bool = True) -> dict:
    """Rebuild results.csv/json, report.md and plots/ in `out`; returns the paths written."""
    out = Path(out)
    manifest = read_manifest(out)
    results = [cell_result(cell) for cell in manifest["cells"]]
    stats = aggregate(results)
    equal_budgets = manifest.get("suite_data", {}).get("equal_budgets", [])
    compared = comparisons_lib.compare(manifest["cells"], results, equal_budgets)
    warnings = comparisons_lib.warnings(compared)
    gains = comparisons_lib.gains_over_start(manifest["cells"], results)
    with (out / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: r[k] for k in COLUMNS} for r in results)
    (out / "results.json").write_text(json.dumps({
        "suite": manifest["suite"], "published": manifest.get("published"), "cells": results,
        "aggregated": [{"matrix": k[0], "env": k[1], "row": k[2], "treatment": k[3], **v}
                       for k, v in stats.items()],
        "equal_budgets": equal_budgets, "comparisons": compared, "budget_warnings": warnings,
        "gains_over_start": gains}, indent=1))
    plots = []
    if with_plots and any(r["status"] == "done" for r in results):
        plots = plot_envs(out / "plots", manifest["cells"], results)
    report = out / "report.md"
    report.write_text(markdown(manifest, results, stats, plots, compared, equal_budgets, gains))
    return {"csv": out / "results.csv", "json": out / "results.json", "markdown": report, "plots": plots,
            "warnings": warnings}


BEGIN, END = "<!-- generated by ragen2 bench report: begin -->", "<!-- generated: end -->"


def marked_block(block: str, begin: str = BEGIN, end: str = END) -> str:
    """`block` between its markers, as every generated section is written."""
    return f"{begin}\n{block.strip()}\n{end}"


def replace_block(text: str, block: str, begin: str = BEGIN, end: str = END) -> str | None:
    """`text` with what lies between its `begin` and `end` markers replaced by `block` (the markers
    and everything around them kept); None when `text` lacks either marker."""
    if begin not in text or end not in text:
        return None
    head, rest = text.split(begin, 1)
    return f"{head}{marked_block(block, begin, end)}{rest.split(end, 1)[1]}"


def publish(docs: Path, paths: dict) -> Path:
    """Put the report into `docs` (e.g. docs/bench_cpu_smoke.md) with `<stem>_<env>.png` and `<stem>.json`."""
    docs = Path(docs)
    docs.parent.mkdir(parents=True, exist_ok=True)
    block = paths["markdown"].read_text().replace("`results.csv`, `results.json`", f"`{docs.stem}.json`")
    block = block.split("\n", 1)[1]  # the title line stays the doc's own
    block = "\n".join("#" + line if line.startswith("## ") else line for line in block.splitlines())
    for plot in paths["plots"]:
        target = docs.parent / f"{docs.stem}_{plot.name}"
        shutil.copyfile(plot, target)
        block = block.replace(f"(plots/{plot.name})", f"({target.name})")
    shutil.copyfile(paths["json"], docs.parent / f"{docs.stem}.json")
    existing = docs.read_text() if docs.is_file() else None
    replaced = replace_block(existing, block) if existing is not None else None
    wrapped = marked_block(block)
    if replaced is not None:
        docs.write_text(replaced)
    elif existing is not None:  # a hand-written file without the markers: never overwrite it
        docs.write_text(existing.rstrip() + "\n\n" + wrapped + "\n")
    else:
        title = paths["markdown"].read_text().splitlines()[0]
        docs.write_text(f"{title}\n\n{wrapped}\n\n## Reading\n\n(to be written after looking at the numbers)\n")
    return docs
