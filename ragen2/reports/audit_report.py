"""The run-directory audit: one self-contained HTML page (PNG plots inlined as base64) and a
JSON summary, built from a run's metrics.jsonl, events.jsonl and config.yaml.

What it shows: the collapse proxies over steps (MI-ZScore-EMA, retrieval accuracy, MI,
entropy, in-group reward std, success, the share of degenerate replies) with the collapse and
degeneration alerts marked; the Spearman rank
correlation of each proxy with the success rate over the steps where both were logged
(RAGEN-2 compares proxies this way); and the gradient decomposition by reward-std bucket.

Steps are 1-based in everything drawn or written for people (plots, HTML, the console), as
the training console counts them ("step 1/6"): metrics.jsonl's 0-based `step` field + 1.
summary.json keeps the logged 0-based `step` values.

Alerts are the run's logged `alert` events merged with a replay of the same detector over
the logged series (thresholds from the run's config), so a run that predates the detector,
or one whose events file was lost, is still audited.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import numpy as np
from scipy import stats

import envs
import mi_probe
from ragen2 import metric_names as names
from ragen2.reports.audit_verdict import run_verdict
from ragen2.reports.plot import BEFORE_LABEL, BEFORE_STEP, Curve, curves as plot_curves, draw_curve, validation_before
from ragen2.config import upgrade_saved
from ragen2.instruments.probe import series_values
from ragen2.run_dir import AUDIT_DIR, SUMMARY_FILE, finite, read_config, read_events, read_steps

SUCCESS_KEY = names.ROLLOUT_SUCCESS_RATE
# (label, metric key): the proxies whose rank correlation with success the report tabulates
PROXIES = (
    ("MI-ZScore-EMA", names.PROBE_MI_ZSCORE_EMA),
    ("MI-ZScore", names.PROBE_MI_ZSCORE),
    ("MI estimate", names.PROBE_MI_ESTIMATE),
    ("MI estimate (sequence)", names.PROBE_MI_ESTIMATE_SEQ),
    ("Retrieval accuracy@1", names.PROBE_RETRIEVAL_ACCURACY_AT_1),
    ("Conditional entropy H(Z|X)", names.PROBE_CONDITIONAL_ENTROPY_EST),
    ("Reasoning entropy H(Z)", names.PROBE_REASONING_ENTROPY_EST),
    ("Policy token entropy", names.ACTOR_ENTROPY),
    ("In-group reward std", names.ROLLOUT_IN_GROUP_REWARD_STD_MEAN),
)
PANELS = (
    ("MI-ZScore-EMA", (names.PROBE_MI_ZSCORE_EMA, names.PROBE_MI_ZSCORE)),
    ("retrieval accuracy@1", (names.PROBE_RETRIEVAL_ACCURACY_AT_1, names.PROBE_RETRIEVAL_CHANCE_LEVEL_AT_1)),
    ("MI estimate (nats)", (names.PROBE_MI_ESTIMATE, names.PROBE_MI_UPPER_BOUND)),
    ("entropy (nats/token)", (names.ACTOR_ENTROPY, names.PROBE_CONDITIONAL_ENTROPY_EST)),
    ("in-group reward std", (names.ROLLOUT_IN_GROUP_REWARD_STD_MEAN,)),
    ("success rate", (SUCCESS_KEY, names.VAL_SUCCESS_RATE)),
    ("degenerate replies (share)", (names.ROLLOUT_DEGENERATE_FRACTION, names.VAL_DEGENERATE_FRACTION)),
)
ALERT_COLOURS = {"template_collapse": "tab:red", "reward_std_cliff": "tab:orange", "grad_norm_spike": "tab:purple",
                 "degeneration": "tab:brown"}
GRAD_KEY = re.compile(rf"^{re.escape(names.GRAD)}/(bucket_\d+|all)/(.+)$")
# what each bar shows: the task norm beside the regularisers' norms times their coefficients
# (what each term adds to the update, as RAGEN-2 logs them); the unscaled ones go in the table
PLOTTED = (("task", "task_norm", "‖g_task‖"), ("entropy", "entropy_scaled_norm", "‖entropy_coef · g_entropy‖"),
           ("kl", "kl_scaled_norm", "‖kl_coef · g_kl‖"))
COEFFICIENT_KEYS = {"entropy": ("entropy_coef", 0.001), "kl": ("kl_coef", 0.0)}  # ragen2.config's defaults


@dataclass
class RunRecord:
    run_dir: Path
    rows: list[dict]
    events: list[dict]
    config: dict


def load_run(run_dir: Path) -> RunRecord:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: not a directory")
    rows = read_steps(run_dir)  # an OpenRLHF run's evaluation rows are no steps
    if not rows:
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl rows (is it a ragen2 run directory?)")
    return RunRecord(run_dir, rows, read_events(run_dir), upgrade_saved(read_config(run_dir) or {}))


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(row["step"], finite(row.get(key))) for row in rows]
    points = [(s, v) for s, v in points if v is not None]
    return [s for s, _ in points], [v for _, v in points]


def spearman_table(rows: list[dict], target: str = SUCCESS_KEY, proxies=PROXIES) -> list[dict]:
    """Spearman rho (and p-value) of each proxy with `target`, over steps that logged both."""
    target_at = dict(zip(*series(rows, target)))
    table = []
    for label, key in proxies:
        steps, values = series(rows, key)
        pairs = [(v, target_at[s]) for s, v in zip(steps, values) if s in target_at]
        entry = {"proxy": label, "key": key, "n": len(pairs), "rho": None, "p_value": None, "note": ""}
        if len(pairs) < 3:
            entry["note"] = "fewer than 3 steps with both" if pairs or steps else "not logged"
        elif (result := spearman(pairs)) is None:
            entry["note"] = "constant series: rank correlation undefined"
        else:
            entry["rho"], entry["p_value"] = result
        table.append(entry)
    return table


def spearman(pairs: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Spearman rho and p-value of (x, y) pairs; None when either side is constant (undefined)."""
    if len({x for x, _ in pairs}) < 2 or len({y for _, y in pairs}) < 2:
        return None
    xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = stats.spearmanr(xs, ys)
    rho = float(result.statistic)
    if len(pairs) <= EXACT_SPEARMAN_MAX_N:
        return rho, exact_spearman_p(xs, ys, rho)
    return rho, float(result.pvalue)


EXACT_SPEARMAN_MAX_N = 8  # 8! = 40,320 orderings; past it the t approximation is fair


def exact_spearman_p(xs: list[float], ys: list[float], rho: float) -> float:
    """Two-sided permutation p-value: the share of the orderings of y whose |rho| reaches the observed
    one. The t approximation says p = 0 for a perfect rank order of 3 probes, where 2 of the 6
    orderings reach |rho| = 1 (p = 1/3)."""
    rank_x = stats.rankdata(xs)
    rank_y = stats.rankdata(ys)
    observed, hits, total = abs(rho) - 1e-12, 0, 0
    for order in itertools.permutations(rank_y):
        hits += abs(float(np.corrcoef(rank_x, order)[0, 1])) >= observed
        total += 1
    return hits / total


def detector_config(config: dict) -> mi_probe.CollapseDetectorConfig:
    probe = config.get("probe", {}) if isinstance(config, dict) else {}
    return mi_probe.CollapseDetectorConfig(**(probe.get("collapse") or {}))


def collect_alerts(record: RunRecord) -> list[dict]:
    """Logged alert events plus a replay of the detector over the logged series, deduplicated."""
    found: dict[tuple[str, int], dict] = {}
    for event in record.events:
        if event.get("kind") == "alert" and "alert" in event and isinstance(event.get("step"), int):
            found[(event["alert"], event["step"])] = {"kind": event["alert"], "step": event["step"],
                                                      "message": event.get("message", ""), "source": "logged"}
    detector = mi_probe.CollapseDetector(detector_config(record.config))
    for row in record.rows:
        for alert in detector.update(int(row["step"]), **series_values(row)):
            entry = found.setdefault((alert.kind, alert.step), {"kind": alert.kind, "step": alert.step,
                                                                 "message": alert.message, "source": "replayed"})
            if entry["source"] == "logged":
                entry["source"] = "logged+replayed"
    return sorted(found.values(), key=lambda a: (a["step"], a["kind"]))


def grad_decomposition(rows: list[dict]) -> dict[int, dict[str, dict[str, float]]]:
    """{step: {bucket: {key: value}}} from the `grad/<bucket>/<key>` metrics."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    for row in rows:
        for key, value in row.items():
            match = GRAD_KEY.match(key)
            if match and finite(value) is not None:
                out.setdefault(row["step"], {}).setdefault(match[1], {})[match[2]] = finite(value)
    return out


def with_scaled_norms(grad: dict, config: dict) -> dict:
    """Fill `entropy_scaled_norm` / `kl_scaled_norm` from the unscaled norm and the run's
    coefficient where a run predates them (logged ones are kept as they are)."""
    algo = (config or {}).get("algo") or {}
    for buckets in grad.values():
        for values in buckets.values():
            for component, (key, default) in COEFFICIENT_KEYS.items():
                coef = finite(algo.get(key, default))
                if f"{component}_scaled_norm" not in values and f"{component}_norm" in values and coef is not None:
                    values[f"{component}_scaled_norm"] = abs(coef) * values[f"{component}_norm"]
    return grad


VERDICT_KEYS = (names.ROLLOUT_FORMAT_OK_FRACTION, names.ROLLOUT_THINK_SPAN_FRACTION, names.PROBE_NUM_ROWS)


def series_summary(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for keys in [keys for _, keys in PANELS] + [VERDICT_KEYS]:
        for key in keys:
            steps, values = series(rows, key)
            if values:
                out[key] = {"n": len(values), "first": values[0], "last": values[-1], "min": min(values),
                            "max": max(values), "first_step": steps[0], "last_step": steps[-1]}
    return out


def run_stats(rows: list[dict]) -> dict:
    """Counts the run verdict reads: probes that scored rows, their largest row count, skipped steps."""
    probed = (names.PROBE_MI_ESTIMATE, names.PROBE_NUM_ROWS, names.PROBE_SKIPPED_TOO_FEW_GROUPS)
    probe_rows = [finite(r.get(names.PROBE_NUM_ROWS)) for r in rows if any(key in r for key in probed)]
    return {"probes": len(probe_rows), "probe_rows_max": max((v for v in probe_rows if v is not None), default=None),
            "skipped_steps": sum(1 for r in rows if finite(r.get(names.SNR_SKIPPED)))}


def bound_summary(grad: dict) -> dict:
    """Task-gradient norm against the bucket's mean reward std, over every logged bucket."""
    points = [(b["reward_std_mean"], b["task_norm"]) for buckets in grad.values() for name, b in buckets.items()
              if name != "all" and "task_norm" in b and "reward_std_mean" in b]
    ratios = [norm / std for std, norm in points if std > 0]
    zero = [norm for std, norm in points if std == 0]
    return {"num_buckets": len(points), "C_max": max(ratios, default=None),
            "task_norm_in_zero_std_buckets_max": max(zero, default=None)}


# --- plots -------------------------------------------------------------------------------------


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def _pyplot():
    matplotlib.use("Agg")  # PNGs only, on any machine; chosen when drawing, not for whoever imports this
    return plt


def logged_panels(rows: list[dict]) -> list[tuple[str, tuple[str, ...]]]:
    """The PANELS with at least one logged value: an unprobed run draws no empty MI panels."""
    return [(title, keys) for title, keys in PANELS if any(series(rows, key)[1] for key in keys)]


def series_curves(rows: list[dict], before: dict[str, float] | None = None) -> list[tuple[str, list[Curve]]]:
    """What series.png draws, panel by panel: the logged panels' curves at 1-based steps, the
    validation before training at step 0 (`plot.curves`, as `ragen2 plot` draws them)."""
    panels = logged_panels(rows) or list(PANELS[-1:])
    return [(title, plot_curves(rows, keys, before)) for title, keys in panels]


def plot_series(rows: list[dict], alerts: list[dict], before: dict[str, float] | None = None) -> bytes:
    plt = _pyplot()
    panels = series_curves(rows, before)
    columns = min(3, len(panels))
    lines = -(-len(panels) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(13, 3.5 * lines), constrained_layout=True, squeeze=False)
    last_step = max((row["step"] for row in rows), default=0) + 1
    first_step = BEFORE_STEP if any(c.before is not None for _, drawn in panels for c in drawn) else 1
    for axis in axes.flat[len(panels):]:
        axis.remove()  # a short last line of panels leaves no empty frame
    for axis, (title, drawn) in zip(axes.flat, panels):
        for curve in drawn:
            dashed = "chance" in curve.key or "upper_bound" in curve.key
            draw_curve(axis, curve, linestyle="--" if dashed else "-", marker=None if dashed else "o", markersize=3)
        for alert in alerts:
            axis.axvline(alert["step"] + 1, color=ALERT_COLOURS.get(alert["kind"], "k"), alpha=0.5, linewidth=1.5)
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.set_xlim(first_step - 0.5, last_step + 0.5)  # every panel spans the run, also one logged at a single step
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend(fontsize=7, loc="best", framealpha=0.6)
    marks = ", ".join(f"{kind}: {colour[4:]}" for kind, colour in ALERT_COLOURS.items())
    start = f"; step 0: validation {BEFORE_LABEL}" if first_step == BEFORE_STEP else ""
    figure.suptitle(f"collapse proxies (vertical lines = alerts; {marks}{start})", fontsize=10)
    return _png(figure)


def plot_grad(grad: dict, max_steps: int = 3) -> bytes:
    """Per bucket, ‖g_task‖ beside the entropy and KL norms times their coefficients (bars, log
    scale when they span orders of magnitude) for the last `max_steps` decomposed steps."""
    plt = _pyplot()
    steps = sorted(grad)[-max_steps:]
    figure, axes = plt.subplots(1, len(steps), figsize=(5.2 * len(steps), 4.2), constrained_layout=True,
                                squeeze=False)
    for axis, step in zip(axes[0], steps):
        buckets = sorted((b for b in grad[step] if b != "all"), key=lambda b: int(b.split("_")[1])) + ["all"]
        components = [(key, label) for _, key, label in PLOTTED if any(key in grad[step].get(b, {}) for b in buckets)]
        width = 0.8 / max(1, len(components))
        positive = [v for b in buckets for key, _ in components if (v := grad[step].get(b, {}).get(key, 0.0)) > 0]
        # log scale only when the norms span orders of magnitude (entropy vs task often do)
        log_scale = len(positive) > 1 and max(positive) / min(positive) > 100
        for k, (key, label) in enumerate(components):
            heights = [grad[step].get(b, {}).get(key, 0.0) for b in buckets]
            xs = [i + k * width for i in range(len(buckets))]
            axis.bar(xs, heights, width, label=label)
            for x, height in zip(xs, heights):
                if height == 0:  # an exact zero is a finding (no spread, or policy = reference)
                    axis.annotate("0", (x, 0), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7)
        labels = [f"{b}\nstd {grad[step].get(b, {}).get('reward_std_mean', float('nan')):.2f}" for b in buckets]
        axis.set_xticks([i + width * (len(components) - 1) / 2 for i in range(len(buckets))], labels, fontsize=7)
        if log_scale:
            axis.set_yscale("symlog", linthresh=min(positive))
        if positive:  # headroom above the tallest bar, so that the legend covers no bar
            axis.set_ylim(top=max(positive) * (20 if log_scale else 1.4))
        axis.set_title(f"step {step + 1}: gradient norms in the update, by reward-std bucket", fontsize=9)
        axis.legend(fontsize=7, loc="upper right", ncol=len(components))
    return _png(figure)


BOUND_UNDEFINED = ("C undefined: no bucket had reward spread\n(every group scored alike),\n"
                   "so there is no ‖g_task‖/√Var(R|x) ratio")


def plot_bound(grad: dict) -> bytes:
    """‖g_task‖ against the bucket's mean √Var(R|x): the bound is a line through the origin."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5.2, 4.2), constrained_layout=True)
    for step, buckets in sorted(grad.items()):
        points = [(b["reward_std_mean"], b["task_norm"]) for name, b in buckets.items()
                  if name != "all" and "task_norm" in b and "reward_std_mean" in b]
        if points:
            axis.scatter([p[0] for p in points], [p[1] for p in points], s=18, label=f"step {step + 1}")
    axis.set_xlim(left=0)  # norms and spreads are >= 0; the bound is a line through the origin
    axis.set_ylim(bottom=0)
    bound = bound_summary(grad)
    if bound["C_max"] is not None:
        right = axis.get_xlim()[1]
        axis.plot([0, right], [0, bound["C_max"] * right], "k--", linewidth=1, label=f"C = {bound['C_max']:.3g}")
    else:  # no bucket had spread: C = ‖g_task‖/√Var is undefined, and the plot says why
        axis.text(0.5, 0.5, BOUND_UNDEFINED, ha="center", va="center", transform=axis.transAxes, fontsize=8,
                  color="0.3", wrap=True)
    axis.set_xlabel("bucket mean in-group reward std √Var(R|x)")
    axis.set_ylabel("‖g_task‖")
    axis.set_title("task gradient vs reward spread", fontsize=9)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=7)
    return _png(figure)


# --- the report --------------------------------------------------------------------------------

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
.scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%}
.note{color:#666;font-size:90%}code{background:#f6f6f6;padding:0 3px}"""


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:.3e}"
    return html.escape(str(value))


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell if isinstance(cell, str) else _fmt(cell)}</td>" for cell in row)
                   + "</tr>" for row in rows)
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"  # wide tables scroll, not cut


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def summarise(record: RunRecord, target: str = SUCCESS_KEY) -> dict:
    """The JSON summary (also the data behind the HTML), with the run verdict."""
    summary = _summary(record, target)
    label, lines = run_verdict(summary)
    summary["verdict"] = {"label": label, "lines": lines}
    return summary


def think_mode(config: dict) -> bool | None:
    """The run's require_think: its env override, else the env's registered default; None for an env
    that cannot be looked up here (one of your own not on the path), so the advice names no mode."""
    env = config.get("env") or {}
    overrides = env.get("overrides") or {}
    if "require_think" in overrides:
        return bool(overrides["require_think"])
    try:
        return bool(envs.spec(env.get("name") or "bandit").config.require_think)
    except envs.EnvConfigError:
        return None


def _summary(record: RunRecord, target: str) -> dict:
    cfg = record.config
    grad = with_scaled_norms(grad_decomposition(record.rows), record.config)
    return {
        "run_dir": str(record.run_dir),
        "steps": len(record.rows),
        "config": {"env": cfg.get("env", {}).get("name"), "algo": cfg.get("algo", {}).get("name"),
                   "filter": cfg.get("filter_preset"), "model": cfg.get("model", {}).get("name"),
                   "think_mode": think_mode(cfg), "max_turns": (cfg.get("rollout") or {}).get("max_turns"),
                   "probe": cfg.get("probe", {}),
                   "rollout": {k: (cfg.get("rollout") or {}).get(k) for k in ("num_groups", "group_size")}},
        "target": target,
        "series": series_summary(record.rows),
        "validation_before": validation_before(record.run_dir, record.events),  # the untrained model's
        "spearman": spearman_table(record.rows, target),
        "alerts": collect_alerts(record),
        "grad_decomposition": {str(step): buckets for step, buckets in sorted(grad.items())},
        "bound": bound_summary(grad),
        "run_stats": run_stats(record.rows),
    }


def render_html(summary: dict, images: dict[str, bytes]) -> str:
    cfg = summary["config"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>ragen2 audit: "
             f"{html.escape(Path(summary['run_dir']).name)}</title><style>{STYLE}</style></head><body>",
             f"<h1>Collapse audit: <code>{html.escape(summary['run_dir'])}</code></h1>",
             f"<p>{summary['steps']} steps · env <b>{_fmt(cfg['env'])}</b> · algo <b>{_fmt(cfg['algo'])}</b> · "
             f"filter <b>{_fmt(cfg['filter'])}</b> · model <b>{_fmt(cfg['model'])}</b> · probe mode "
             f"<b>{_fmt(cfg['probe'].get('mode'))}</b> over <b>{_fmt(cfg['probe'].get('segment', 'reasoning'))}</b> "
             f"segments, every {_fmt(cfg['probe'].get('every'))} steps</p>",
             f"<h2>Verdict: {html.escape(summary['verdict']['label'])}</h2><ul>"
             + "".join(f"<li>{html.escape(line)}</li>" for line in summary["verdict"]["lines"]) + "</ul>",
             "<p class='note'>Steps are counted from 1, as on the training console (metrics.jsonl's "
             "<code>step</code> field + 1).</p>",
             "<h2>Proxies over training</h2>", _img(images["series"], "collapse proxies over steps")]
    alerts = summary["alerts"]
    parts.append("<h2>Alerts</h2>")
    parts.append(_table(["step", "kind", "source", "message"],
                        [[a["step"] + 1, a["kind"], a["source"], html.escape(a["message"])] for a in alerts])
                 if alerts else "<p>No alert: no template collapse, reward-std cliff, gradient-norm spike or "
                                "degeneration.</p>")
    logged = [e for e in summary["spearman"] if e["note"] != "not logged"]  # a row of dashes says nothing
    absent = []  # what this run did not record, named once at the end instead of as empty panels
    if logged:
        parts.append(f"<h2>Spearman correlation with <code>{html.escape(summary['target'])}</code></h2>")
        parts.append(_table(["proxy", "metric", "steps", "Spearman ρ", "p-value", "note"],
                            [[e["proxy"], f"<code>{html.escape(e['key'])}</code>", e["n"], e["rho"], e["p_value"],
                              html.escape(e["note"])] for e in logged]))
        parts.append("<p class='note'>Rank correlation over the steps where both the proxy and the target were "
                     "logged, within this run. RAGEN-2 reports that the MI-based proxies track task performance "
                     "where entropy does not; with few probes the p-values here are large.</p>")
    unlogged = [e["proxy"] for e in summary["spearman"] if e["note"] == "not logged"]
    if unlogged:
        absent.append(f"{', '.join(unlogged)} (the MI probe: <code>probe.every</code>)"
                      if all(e["key"].startswith(names.PROBE) for e in summary["spearman"] if e["proxy"] in unlogged)
                      else ", ".join(unlogged))
    grad = summary["grad_decomposition"]
    if grad:
        parts.append("<h2>Gradient decomposition by reward-std bucket</h2>")
        parts += [_img(images["grad"], "gradient norms by bucket"), _img(images["bound"], "task norm vs reward std")]
        last_step = list(grad)[-1]
        buckets = grad[last_step]
        keys = ["reward_std_mean", "num_groups", "num_tokens", "task_norm", "entropy_scaled_norm", "kl_scaled_norm",
                "total_norm", "entropy_norm", "kl_norm", "task_norm_per_token", "cos_task_entropy", "cos_task_kl"]
        order = sorted((b for b in buckets if b != "all"), key=lambda b: int(b.split("_")[1])) + ["all"]
        parts.append(f"<p>Step {int(last_step) + 1}:</p>")
        parts.append(_table(["bucket", *keys], [[b, *[buckets.get(b, {}).get(k) for k in keys]] for b in order]))
        parts.append("<p class='note'><code>*_scaled_norm</code> is the norm times its coefficient in the loss "
                     "(entropy_coef, kl_coef): what the term adds to the update, and what sits beside "
                     "<code>task_norm</code> in the plot (RAGEN-2 logs these). <code>entropy_norm</code> and "
                     "<code>kl_norm</code> are the unscaled gradients of the terms.</p>")
        bound = summary["bound"]
        c_text = _fmt(bound["C_max"]) if bound["C_max"] is not None else (
            "undefined (no bucket had reward spread: every group's rollouts scored the same)")
        parts.append(f"<p class='note'>Largest ‖g_task‖ / √Var(R|x) over buckets with spread: C ≈ "
                     f"{c_text}; largest ‖g_task‖ in zero-spread buckets: "
                     f"{_fmt(bound['task_norm_in_zero_std_buckets_max'])} (the bound says 0 for a group whose "
                     f"members all scored the same; a PPO critic's advantages can break that).</p>")
    else:
        absent.append("the gradient decomposition by reward-std bucket (<code>probe.grad_every</code>)")
    if absent:
        parts.append("<p class='note'>Not recorded in this run, so not shown: " + "; ".join(absent) + ".</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(run_dir: Path, out_dir: Path | None = None, target: str = SUCCESS_KEY) -> dict:
    """Write report.html, summary.json and the PNGs into `out_dir` (default RUN_DIR/audit)."""
    record = load_run(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else Path(run_dir) / AUDIT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarise(record, target)
    grad = with_scaled_norms(grad_decomposition(record.rows), record.config)
    images = {"series": plot_series(record.rows, summary["alerts"], summary["validation_before"])}
    if grad:
        images.update(grad=plot_grad(grad), bound=plot_bound(grad))
    for name, png in images.items():
        (out_dir / f"{name}.png").write_bytes(png)
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    (out_dir / "report.html").write_text(render_html(summary, images))
    return {"html": out_dir / "report.html", "summary": out_dir / SUMMARY_FILE, "data": summary}
