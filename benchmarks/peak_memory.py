"""Peak resident memory of a 1-step `ragen2 train` per preset, and which phase sets it.

    python benchmarks/peak_memory.py [--envs sokoban,frozen_lake] [--threads 1] [--kill-gb 8] [--heap kept|default]
                                     [--out docs/benchmarks/peak_memory.json] [KEY=VALUE ...]

Each preset runs in a child process as `ragen2 train --env NAME --steps 1` runs it (the preset's
config, validation before and after, the MI probe if due at step 0, the update, the checkpoint),
with KEY=VALUE overrides for both. The child wraps each phase of the trainer (model load,
validation, rollout, probe, gradient decomposition, update inputs, update, checkpoint) and,
around each, resets VmHWM (/proc/self/clear_refs) and reads it after: the phase's peak resident
set, and the set it started from. The child's allocator keeps freed memory as `ragen2` does
(ragen2.heap), so the sets include the free memory its heap holds, as in a real run; `--heap
default` runs glibc's defaults and returns freed heap to the OS (malloc_trim) before each phase,
so each phase starts from what is alive. torch's
allocations go through malloc, so tracemalloc would not see them; VmHWM does. The whole run's
peak is the largest VmHWM read (before every reset and at the end).

The parent polls the child's VmRSS and stops it past `--kill-gb`, or when the machine's available
memory falls below `--min-available-gb` (the machine is shared: an out-of-memory kill could take
someone else's process), and starts a preset only when `--min-start-gb` is
available. Prints one JSON object and writes it to `--out`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GB = 2 ** 30


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def status_kb(key: str, pid: str = "self") -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return None


def available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / GB
    return 0.0


# ---------------------------------------------------------------- child: one preset, phase by phase

class PhaseMeter:
    """Per-phase peak resident set (outermost phases only: a phase inside another is its parent's)."""

    def __init__(self, partial_out: str | None = None, trim: bool = True):
        self.partial_out = partial_out  # phases so far, for the parent when it stops this child
        self.trim = trim  # return freed heap to the OS before each phase
        self.phases: list[dict] = []
        self.depth = 0
        self.peak_kb = 0

    def _hwm(self) -> int:
        value = status_kb("VmHWM:") or 0
        self.peak_kb = max(self.peak_kb, value)
        return value

    def wrap(self, owner, name: str, label: str) -> None:
        inner = getattr(owner, name)
        meter = self

        def measured(*args, **kwargs):
            if meter.depth:
                return inner(*args, **kwargs)
            meter.depth += 1
            meter._hwm()  # keep the whole run's peak before resetting it
            if meter.trim:
                try:
                    ctypes.CDLL("libc.so.6").malloc_trim(0)
                except (OSError, AttributeError):
                    pass
            Path("/proc/self/clear_refs").write_text("5")
            start_kb = status_kb("VmRSS:") or 0
            if meter.partial_out:  # the phase running when the parent stops this child
                Path(meter.partial_out).write_text(json.dumps({"phases": meter.phases, "in_progress": {
                    "phase": label, "rss_at_start_gb": round(start_kb / 2 ** 20, 3)}}))
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                peak_kb = meter._hwm()
                meter.phases.append({"phase": label, "seconds": round(time.perf_counter() - started, 2),
                                     "rss_at_start_gb": round(start_kb / 2 ** 20, 3),
                                     "peak_rss_gb": round(peak_kb / 2 ** 20, 3),
                                     "peak_above_start_gb": round((peak_kb - start_kb) / 2 ** 20, 3)})
                log(f"  {label}: {meter.phases[-1]['seconds']:.1f} s, peak {peak_kb / 2 ** 20:.2f} GB "
                    f"(from {start_kb / 2 ** 20:.2f})")
                if meter.partial_out:
                    Path(meter.partial_out).write_text(json.dumps({"phases": meter.phases}))
                meter.depth -= 1

        setattr(owner, name, measured)


def child(args) -> None:
    import torch

    from ragen2 import metric_names as names
    from ragen2.config import load_config
    from ragen2.engines.local import learner, trainer
    from ragen2.instruments import probe as probe_lib

    from ragen2 import heap

    kept = args.heap == "kept" and heap.keep_freed_memory().startswith("freed memory kept")
    torch.set_num_threads(args.threads)
    meter = PhaseMeter(args.child_out, trim=not kept)
    # trainer.grad_decomp: wherever the trainer takes the module from
    for owner, name, label in ((learner, "build_models", "load_models"), (trainer, "validate", "validation"),
                               (trainer, "rollout", "rollout"), (probe_lib.Probe, "maybe_run", "probe"),
                               (trainer.grad_decomp, "maybe_decompose", "grad_decomposition"),
                               (learner, "update_inputs", "update_inputs"), (learner, "ppo_update", "update"),
                               (trainer, "save", "checkpoint")):
        meter.wrap(owner, name, label)
    cfg = load_config(env=args.env, overrides=["model.device=cpu", "trainer.total_steps=1",
                                               f"trainer.num_threads={args.threads}", *args.overrides])
    with tempfile.TemporaryDirectory() as run_dir:
        run = trainer.setup(cfg, Path(run_dir) / "run", quiet=True)
        summary = trainer.train(run)
        rows = [json.loads(line) for line in (Path(run_dir) / "run" / "metrics.jsonl").read_text().splitlines()
                if line.strip()] if (Path(run_dir) / "run" / "metrics.jsonl").is_file() else []
    meter._hwm()
    step = rows[-1] if rows else {}
    report = {
        "env": cfg.env.name, "dtype": cfg.model.dtype, "torch_threads": torch.get_num_threads(),
        "heap": heap.state(),
        "config": {"groups_x_size": f"{cfg.rollout.num_groups}x{cfg.rollout.group_size}",
                   "max_turns": cfg.rollout.max_turns, "max_new_tokens": cfg.rollout.max_new_tokens,
                   "mini_batch": cfg.optim.mini_batch_size, "micro_batch": cfg.optim.micro_batch_size,
                   "shared_prefix": cfg.optim.shared_prefix, "probe_every": cfg.probe.every,
                   "grad_every": cfg.probe.grad_every, "val_before": cfg.trainer.val_before},
        "batch": {k: step[k] for k in (names.UPDATE_ROWS, names.UPDATE_TOKENS, names.ROLLOUT_RESPONSE_TOKENS_MEAN,
                                       names.TIME_STEP_S) if k in step},
        "steps_done": summary.get("steps"),
        "peak_rss_gb": round(meter.peak_kb / 2 ** 20, 3),
        "phases": meter.phases,
    }
    Path(args.child_out).write_text(json.dumps(report, indent=2) + "\n")


# ---------------------------------------------------------------- parent: one child per preset, watched

def watched_child(env: str, args) -> dict:
    """Run one preset in a child; stop it past --kill-gb. Returns its report (or why it has none)."""
    if available_gb() < args.min_start_gb:
        return {"env": env, "error": f"not started: {available_gb():.1f} GB available, "
                                     f"fewer than --min-start-gb {args.min_start_gb}"}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = handle.name
    command = [sys.executable, __file__, "--child", env, "--child-out", out, "--threads", str(args.threads),
               "--heap", args.heap, *args.overrides]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT)
    sampled_peak_kb, killed = 0, None
    while process.poll() is None:
        rss = status_kb("VmRSS:", str(process.pid)) or 0
        sampled_peak_kb = max(sampled_peak_kb, rss)
        if rss > args.kill_gb * 2 ** 20 or available_gb() < args.min_available_gb:
            killed = (f"stopped at {rss / 2 ** 20:.2f} GB resident (--kill-gb {args.kill_gb}), "
                      f"{available_gb():.2f} GB available (--min-available-gb {args.min_available_gb})")
            process.kill()
            break
        time.sleep(0.2)
    process.wait()
    seconds = round(time.perf_counter() - started, 1)
    text = Path(out).read_text() if Path(out).is_file() else ""
    Path(out).unlink(missing_ok=True)
    report = json.loads(text) if text.strip() else {}
    if killed or process.returncode or "peak_rss_gb" not in report:  # only the phases it finished
        return {"env": env, "error": killed or f"child exited with {process.returncode}", "wall_s": seconds,
                "sampled_peak_rss_gb": round(sampled_peak_kb / 2 ** 20, 3), "phases_done": report.get("phases", []),
                "in_progress": report.get("in_progress")}
    report.update(wall_s=seconds, sampled_peak_rss_gb=round(sampled_peak_kb / 2 ** 20, 3))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default="sokoban,frozen_lake", help="comma-separated env presets")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the child")
    parser.add_argument("--kill-gb", type=float, default=8.0, help="stop a child whose resident set passes this")
    parser.add_argument("--min-start-gb", type=float, default=5.0,
                        help="start a preset only when the machine has this much available")
    parser.add_argument("--min-available-gb", type=float, default=1.0,
                        help="stop the child when the machine's available memory falls below this")
    parser.add_argument("--target-gb", type=float, default=4.0)
    parser.add_argument("--heap", choices=("kept", "default"), default="kept",
                        help="the child's allocator: kept as `ragen2` runs (ragen2.heap), or glibc's defaults")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "peak_memory.json"),
                        help="where the JSON goes too ('' = stdout only)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config KEY=VALUE overrides")
    args = parser.parse_args()
    if args.child:
        args.env = args.child
        child(args)
        return
    from ragen2.bench.machine import emit_report, machine_info

    load_start = [round(x, 2) for x in os.getloadavg()]
    presets = []
    for env in [name.strip() for name in args.envs.split(",") if name.strip()]:
        log(f"{env}: 1-step train in a child process")
        presets.append(watched_child(env, args))
        log(f"{env}: peak {presets[-1].get('peak_rss_gb', presets[-1].get('error'))}")
    report = {"machine": machine_info(), "load_avg_at_start": load_start,
              "load_avg_at_end": [round(x, 2) for x in os.getloadavg()], "overrides": args.overrides,
              "target_peak_gb": args.target_gb, "presets": presets,
              "under_target": {p["env"]: p.get("peak_rss_gb", float("inf")) < args.target_gb for p in presets}}
    emit_report(report, args.out)


if __name__ == "__main__":
    main()
