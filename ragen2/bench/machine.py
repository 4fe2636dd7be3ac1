"""The machine a measurement ran on, in one shape for every benchmark script and bench manifest.

    from ragen2.bench.machine import machine_info

Times from a shared machine mean little without the CPU, how many cores this process may use,
whether bf16 runs in hardware, torch's thread count and the load at the time. The scripts in
benchmarks/ and scripts/ and `ragen2 bench` all report them through this one function, so two
JSON files can be compared field by field. It lives in the package so that any script imports
it without editing sys.path.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

from ragen2 import heap


def cpu_name() -> str:
    """The CPU model (Linux: /proc/cpuinfo's `model name`), else what `platform` knows."""
    path = Path("/proc/cpuinfo")
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.processor() or platform.machine() or "unknown CPU")


def machine_info(with_torch: bool = True) -> dict:
    """CPU, cores, Python, load; with torch also its version, threads, SIMD level, bf16 units and GPU.

    Call it when the report is written, after the script has set torch's thread count.
    `with_torch=False` for scripts that never import torch (importing it costs seconds).
    """
    info = {
        "cpu": cpu_name(),
        "arch": platform.machine(),
        "cpus": os.cpu_count(),
        # a container or taskset can allow fewer cores than the machine has
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "heap": heap.state(),  # whether freed memory stays in the process: it moves step times a lot
    }
    if with_torch:
        import torch

        from ragen2.precision import cpu_bf16_flags

        info.update({"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                     "cpu_capability": torch.backends.cpu.get_cpu_capability(), "bf16_flags": cpu_bf16_flags()})
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    return info


def code_version(where: Path | None = None) -> dict | None:
    """The commit the code runs from and whether tracked files differ from it (None outside a
    checkout, e.g. an installed wheel). A long suite's cells may run on different days and
    machines: each records what it ran."""
    where = Path(where or Path(__file__).resolve().parents[2])
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode != 0:
            return None
        changed = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip(), "tracked_files_changed": len(changed)}


def emit_report(report: dict, out: str | Path | None) -> None:
    """A benchmark's JSON: printed, and written to `out` (its folder made) when one is given."""
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
