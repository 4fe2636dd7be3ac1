"""`ragen2 audit RUN RUN ...`: RAGEN-2's claim 2 asked of several runs at once.

The claim: MI-ZScore(-EMA) tracks task success while the policy's entropy does not (the paper:
Spearman +0.39 against -0.11 ... -0.14). One run cannot separate them when everything in it
follows one trend (format being learned), so this puts the proxies side by side per run and
then asks across runs:

- within each run, Spearman over steps of each proxy with the target (as `ragen2 audit RUN`);
- across runs, the mean of those within-run rhos and how many are positive;
- across runs, Spearman of each run's last proxy value with its last target value (runs that
  end better: did they end with a higher MI-ZScore-EMA, a lower entropy?).
"""

from __future__ import annotations

from pathlib import Path

from ragen2 import metric_names as names
from ragen2.reports.audit_report import SUCCESS_KEY, load_run, series, spearman, spearman_table
from ragen2.reports.probe_dtype import mixed_dtypes_line, run_probe_dtypes

# The two proxies the claim contrasts, plus retrieval accuracy (the probe's other reading).
CONTRASTED = (("MI-ZScore-EMA", names.PROBE_MI_ZSCORE_EMA), ("Policy token entropy", names.ACTOR_ENTROPY),
              ("Retrieval accuracy@1", names.PROBE_RETRIEVAL_ACCURACY_AT_1))


def _last(rows: list[dict], key: str) -> float | None:
    _, values = series(rows, key)
    return values[-1] if values else None


def across_runs(per_run: list[dict], proxies=CONTRASTED) -> list[dict]:
    """Per proxy: the mean within-run rho, its sign count, and the across-run rho of last values."""
    out = []
    for label, key in proxies:
        rhos = [r["rho"][key] for r in per_run if r["rho"].get(key) is not None]
        finals = [(r["last"][key], r["last"]["target"]) for r in per_run
                  if r["last"].get(key) is not None and r["last"].get("target") is not None]
        entry = {"proxy": label, "key": key, "runs_with_rho": len(rhos),
                 "mean_within_run_rho": sum(rhos) / len(rhos) if rhos else None,
                 "positive_within_run": sum(rho > 0 for rho in rhos), "runs_with_final": len(finals),
                 "across_run_rho": None, "across_run_p": None}
        if len(finals) >= 3 and (result := spearman(finals)) is not None:
            entry["across_run_rho"], entry["across_run_p"] = result
        out.append(entry)
    return out


def audit_runs(run_dirs: list[Path], target: str = SUCCESS_KEY, proxies=CONTRASTED) -> dict:
    per_run = []
    for run_dir in run_dirs:
        record = load_run(run_dir)
        table = {entry["key"]: entry["rho"] for entry in spearman_table(record.rows, target, proxies)}
        last = {key: _last(record.rows, key) for _, key in proxies}
        last["target"] = _last(record.rows, target)
        per_run.append({"run_dir": str(run_dir), "steps": len(record.rows), "rho": table, "last": last,
                        "probe_dtypes": run_probe_dtypes(record.rows, record.config)})
    dtypes = mixed_dtypes_line({Path(r["run_dir"]).name: r["probe_dtypes"] for r in per_run})
    return {"target": target, "runs": per_run, "across_runs": across_runs(per_run, proxies),
            "probe_dtype_note": dtypes}


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def render(result: dict) -> str:
    """A plain-text table: one line per run, then the across-run lines."""
    labels = [entry["proxy"] for entry in result["across_runs"]]
    keys = [entry["key"] for entry in result["across_runs"]]
    width = max(len(Path(r["run_dir"]).name) for r in result["runs"])
    lines = [f"Spearman with {result['target']} over each run's steps:",
             f"  {'run':<{width}}  steps  " + "  ".join(f"{label:>20}" for label in labels)]
    for r in result["runs"]:
        lines.append(f"  {Path(r['run_dir']).name:<{width}}  {r['steps']:>5}  "
                     + "  ".join(f"{_fmt(r['rho'].get(key)):>20}" for key in keys))
    lines.append("across runs:")
    for entry in result["across_runs"]:
        lines.append(f"  {entry['proxy']}: mean within-run rho {_fmt(entry['mean_within_run_rho'])} "
                     f"({entry['positive_within_run']} of {entry['runs_with_rho']} positive); "
                     f"last value against last target over {entry['runs_with_final']} runs: "
                     f"rho {_fmt(entry['across_run_rho'])}"
                     + ("" if entry["across_run_p"] is None else f" (p {entry['across_run_p']:.3f})"))
    if result.get("probe_dtype_note"):
        lines.append(result["probe_dtype_note"])
    if len(result["runs"]) < 5:
        lines.append(f"only {len(result['runs'])} runs: an across-run rank correlation needs more to say much")
    return "\n".join(lines)
