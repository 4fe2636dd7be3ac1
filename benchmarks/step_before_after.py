"""The training step as it ran before issue 31's work against today's, each in a process of its own.

    python benchmarks/step_before_after.py [--rounds 2] [--repeats 2] [--threads 1] [--warm-up 2]
                                           [--variants before shared_prefix_glibc_heap today]
    python benchmarks/step_before_after.py --resummarise docs/benchmarks/step_before_after.json
                                           [--out docs/benchmarks/step_before_after.json] [KEY=VALUE ...]

Three variants, each a child `benchmarks/shared_prefix.py --whole-step` timing one side (old
log-probs and the update after `--warm-up` untimed updates, then whole training steps after a
warm-up step) on the CPU default config; rounds alternate their order, so a busy spell on a
shared machine hits each:

- `before`: shared prefix off, transformers' sdpa, the probe scoring the whole model, and
  glibc's allocation defaults (freed memory goes back to the kernel);
- `shared_prefix_glibc_heap`: today's code with glibc's defaults;
- `today`: today's code as `ragen2` runs it, freed memory kept in the process (ragen2.heap);
- `today_probe_float32` (only when `--variants` names it): `today` with `probe.dtype=float32`, the
  MI probe scoring in fp32 instead of the policy's compute dtype (the default), so that
  `ratio_probe_dtype` compares the two precisions on the same code.

`before` scores the probe in fp32 (`probe.dtype=float32`), as the code before did: fp32 was its
only precision.

The allocation policy is process-wide, which is why each variant needs a process of its own. Each
child rolls out from the same seed, so all see the same batch (checked: `same_batch`), and their
update metrics must agree. Prints one JSON object with every child's runs, each variant's best,
and the ratios before / today, before / shared_prefix_glibc_heap (the shared-prefix work) and
shared_prefix_glibc_heap / today (the heap), and writes it to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from ragen2.bench.machine import emit_report, machine_info  # noqa: E402

VARIANTS = {
    # the code before scored the probe in fp32, whatever the policy computed in
    "before": ["--sides", "off", "--off-as-before", "--heap", "default", "probe.dtype=float32"],
    "shared_prefix_glibc_heap": ["--sides", "on", "--heap", "default"],
    "today": ["--sides", "on", "--heap", "kept"],
    # today's code with the probe in fp32 instead of the policy's compute dtype (probe.dtype's default)
    "today_probe_float32": ["--sides", "on", "--heap", "kept", "probe.dtype=float32"],
}
DEFAULT_VARIANTS = ("before", "shared_prefix_glibc_heap", "today")
PHASES = ("old_log_probs", "update")
STEP_PHASES = ("rollout", "probe", "update", "step")


def run_child(variant: str, args, out: Path) -> dict:
    command = [sys.executable, str(ROOT / "benchmarks" / "shared_prefix.py"), "--whole-step",
               "--warm-up", str(args.warm_up),
               "--threads", str(args.threads), "--repeats", str(args.repeats), "--out", str(out),
               *VARIANTS[variant], *args.overrides]
    print(f"{variant}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"{variant}: the child failed with exit code {done.returncode}")
    return json.loads(out.read_text())


def side_of(child: dict) -> str:
    return "off" if "off" in child["whole_step"] else "on"


def summarise(children: list[dict]) -> dict:
    """One variant's best figures over its children's runs."""
    side = side_of(children[0])
    phases = {name: min(run for c in children for run in c[side][name]["runs_s"]) for name in PHASES}
    steps = [run for c in children for run in c["whole_step"][side]]
    best_step = min(steps, key=lambda run: run["phases_s"]["step"])
    step, probe = best_step["phases_s"]["step"], best_step["phases_s"].get("probe", 0.0)
    # CPU seconds (this process's work, without its waits for a core on a shared machine): the
    # fewest over the variant's steps, step and probe each
    cpu_runs = [run["cpu_phases_s"] for run in steps if "cpu_phases_s" in run]
    cpu_best = {name: min(run[name] for run in cpu_runs) for name in ("step", "probe")
                if cpu_runs and all(name in run for run in cpu_runs)}
    every = children[0]["config"]["probe_every"]
    return {
        "side": side,
        "phases_best_s": phases,
        "whole_step_best_s": {name: best_step["phases_s"].get(name) for name in STEP_PHASES},
        "step_runs_s": [run["phases_s"]["step"] for run in steps],
        "whole_step_best_cpu_s": cpu_best,
        "step_cpu_runs_s": [run["step"] for run in cpu_runs],
        "probe_cpu_runs_s": [run.get("probe") for run in cpu_runs],
        # Arithmetic on the best step's phases, not measured steps: the probe's share of it, the
        # step when no probe is due, and the mean step of a run probing every `probe.every` steps.
        "probe_share_of_step": round(probe / step, 3),
        "step_without_probe_s": round(step - probe, 3),
        "mean_step_probe_every_s": round(step - probe + probe / every, 3) if every else round(step - probe, 3),
        "peak_rss_gb": max(peak for c in children for name in PHASES for peak in c[side][name].get("peak_rss_gb", [0])),
        "update_metrics": children[0]["update_metrics"],
        # what the best step's probe found and the dtype it scored in (probe/dtype)
        "probe_metrics": best_step.get("probe_metrics", {}),
        "heap": children[0]["machine"]["heap"],
    }


def ratio(slow: float | None, fast: float | None) -> float | None:
    return round(slow / fast, 2) if slow and fast else None


def ratios(slow: dict, fast: dict) -> dict:
    out = {name: ratio(slow["phases_best_s"][name], fast["phases_best_s"][name]) for name in PHASES}
    out.update({f"whole_step_{name}": ratio(slow["whole_step_best_s"][name], fast["whole_step_best_s"][name])
                for name in STEP_PHASES})
    out.update({name: ratio(slow[name], fast[name]) for name in ("step_without_probe_s", "mean_step_probe_every_s")})
    out.update({f"whole_step_{name}_cpu": ratio(slow.get("whole_step_best_cpu_s", {}).get(name),
                                                 fast.get("whole_step_best_cpu_s", {}).get(name))
                for name in ("step", "probe")})
    return out


def add_summaries(report: dict) -> dict:
    """Each variant's best figures and the ratios, from the children's runs in `report`."""
    best = {variant: summarise(children) for variant, children in report["children"].items()}
    report["best"] = best
    pairs = {"ratio_before_over_today": ("before", "today"),
             "ratio_shared_prefix_work": ("before", "shared_prefix_glibc_heap"),
             "ratio_heap_kept": ("shared_prefix_glibc_heap", "today"),
             # same code, the probe in fp32 over the probe in the policy's dtype (the default)
             "ratio_probe_dtype": ("today_probe_float32", "today"),
             "ratio_before_over_today_probe_float32": ("before", "today_probe_float32"),
             # reports written while fp32 was the default and the policy's dtype a variant
             "ratio_before_over_today_probe_policy_dtype": ("before", "today_probe_policy_dtype"),
             "ratio_probe_policy_dtype": ("today", "today_probe_policy_dtype")}
    report.update({name: ratios(best[slow], best[fast]) for name, (slow, fast) in pairs.items()
                   if slow in best and fast in best})
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="children per variant, order alternating")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each phase inside a child")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--warm-up", type=int, default=2,
                        help="untimed updates in each child before the timed phases: a process's first "
                             "two fault in its heap and the optimiser's moments")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(DEFAULT_VARIANTS),
                        help="which variants to time, in this order in even rounds")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "step_before_after.json"))
    parser.add_argument("overrides", nargs="*", help="config KEY=VALUE overrides, passed to every child")
    parser.add_argument("--resummarise", metavar="JSON",
                        help="recompute the best figures and ratios of an earlier report from its children's "
                             "runs (after a change to this summary), written back to that file")
    args = parser.parse_args()
    if args.resummarise:
        emit_report(add_summaries(json.loads(Path(args.resummarise).read_text())), args.resummarise)
        return
    load_start = os.getloadavg()
    runs: dict[str, list[dict]] = {variant: [] for variant in args.variants}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = list(args.variants) if round_index % 2 == 0 else list(args.variants)[::-1]
            for variant in order:
                runs[variant].append(run_child(variant, args, Path(tmp) / f"{variant}-{round_index}.json"))
    first = runs["today" if "today" in runs else args.variants[0]][0]
    batches = [child["batch"] | {"rollout_s": None} for children in runs.values() for child in children]
    report = {
        "machine": machine_info(with_torch=False) | {key: first["machine"].get(key) for key in
                                                     ("torch", "torch_threads", "cpu_capability", "bf16_flags")},
        "load_avg_at_start": [round(x, 2) for x in load_start],
        "config": first["config"], "dtype": first["dtype"], "batch": first["batch"],
        "same_batch": all(b == batches[0] for b in batches),
        "variants": {variant: VARIANTS[variant] for variant in args.variants},
        "warm_up_updates": args.warm_up,
        "targets": {"old_log_probs": 2.5, "update": 2.5, "whole_step_step": 2.0, "whole_step_probe": 2.0},
        "children": runs,
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    emit_report(add_summaries(report), args.out)


if __name__ == "__main__":
    main()
