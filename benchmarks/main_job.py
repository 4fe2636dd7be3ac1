"""How long the README's main job takes: `ragen2 train --filter snr-top-p` end to end, timed.

    python benchmarks/main_job.py --threads 1 --out docs/benchmarks/main_job.json [KEY=VALUE ...]

Runs the job in a child process (as a user would: model load, validation before, the steps,
validation after, the final checkpoint) into a temporary run folder, and prints one JSON object:
the wall time of the whole command, the run's own per-step phase times (`metrics.jsonl`), the
checkpoint size it logged, its validation before → after, and the machine (CPU, bf16 units, threads, load at start and end).
The bundled model's first-run GGUF conversion is not included when its cache already exists
(`cache_existed`); `benchmarks/model_load.py` times that conversion.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ragen2 import metric_names as names
from ragen2.bench.machine import code_version, emit_report, machine_info
from ragen2.bundled_model import model_cache_root


def step_phases(metrics_path: Path) -> list[dict]:
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    keys = (names.TIME_STEP_S, names.TIME_ROLLOUT_S, names.TIME_UPDATE_S, names.TIME_VALIDATION_S)
    return [{"step": row["step"], **{k.split("/")[1]: row[k] for k in keys if k in row}} for row in rows]


def checkpoint_size(events_path: Path) -> dict | None:
    """The size the trainer logged at its first save (`checkpoint_size` event), in MB."""
    for line in events_path.read_text().splitlines():
        event = json.loads(line) if line.strip() else {}
        if event.get("kind") == "checkpoint_size":
            # the optimiser's share is printed only when it is a tenth or more (none before a first update)
            total = re.search(r": ([\d.]+) MB", event["message"])
            optimiser = re.search(r"\(([\d.]+) MB of it optimiser state", event["message"])
            return {"total_mb": float(total.group(1)) if total else None,
                    "optimizer_state_mb": float(optimiser.group(1)) if optimiser else None,
                    "message": event["message"]}
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="trainer.num_threads (0: the machine's default)")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("overrides", nargs="*", help="extra KEY=VALUE overrides (the measured job has none)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ragen2-main-job-") as parent:
        command = ["ragen2", "train", "--filter", "snr-top-p", "--quiet", "--out", parent,
                   "trainer.run_name=main", f"trainer.num_threads={args.threads}", *args.overrides]
        cache_existed = model_cache_root().is_dir() and any(model_cache_root().iterdir())
        load_start = [round(x, 2) for x in os.getloadavg()]
        started = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall_s = time.perf_counter() - started
        if done.returncode != 0:
            print(done.stdout[-4000:], file=sys.stderr)
            print(f"main_job: `{' '.join(command)}` exited {done.returncode}", file=sys.stderr)
            return done.returncode
        run_dir = Path(parent) / "main"
        summary = json.loads((run_dir / "summary.json").read_text())
        phases = step_phases(run_dir / "metrics.jsonl")
        checkpoint = checkpoint_size(run_dir / "events.jsonl")
    steps = [p["step_s"] for p in phases if "step_s" in p]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # so the machine entry reports the child's thread count
    report = {
        "benchmark": "main_job",
        "command": "python benchmarks/main_job.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "job": " ".join(command[:5]) + " " + " ".join(command[7:]),
        "code": code_version(),
        "machine": machine_info(with_torch=True),
        "load_avg_at_start": load_start,
        "cache_existed": cache_existed,
        "wall_s": round(wall_s, 1),
        "wall_min": round(wall_s / 60, 2),
        "steps": summary.get("steps"),
        "step_s_min": min(steps) if steps else None,
        "step_s_max": max(steps) if steps else None,
        "step_s_sum": round(sum(steps), 1),
        "phases_by_step": phases,
        "checkpoint": checkpoint,
        "val_before_success_rate": summary.get("val_before_success_rate"),
        "final_val_success_rate": summary.get("final_val_success_rate"),
        "val_success_change": summary.get("val_success_change"),
    }
    emit_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
