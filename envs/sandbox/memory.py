"""A memory cgroup per run, where the host offers one: the run's total memory (every process,
SysV shared memory, files in its tmpfs work dir, kernel memory charged to it) is capped,
and the kernel's OOM killer acts inside the run only.

- cgroup v2: a child of our own cgroup when that cgroup already delegates the memory
  controller to its children (cgroup.subtree_control lists it), or of the root cgroup when
  we are in it. We never move the host process (the "no internal processes" rule forbids
  enabling controllers on a cgroup that has processes, and moving would change the host).
- cgroup v1 (hybrid hosts): a child of our memory-hierarchy cgroup, with memsw (swap) too.
- none writable (unprivileged without delegation, a read-only /sys/fs/cgroup): None, and the
  sandbox falls back to per-process limits (see docs/sandbox.md for what that bounds).
"""
from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from dataclasses import dataclass

HEADROOM = 16 * 2**20  # the launcher and reaper (two small Pythons) share the run's cgroup
_lock = threading.Lock()
_found: tuple | None = None


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) of the cgroup mounts."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                found.append((fields[4], tail[0], tail[2]))
    return found


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for v2) -> our cgroup path, from /proc/self/cgroup."""
    paths = {}
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _detect() -> tuple | None:
    """("v2" | "v1", parent directory) where we may create run cgroups, or None."""
    try:
        mounts, own = _mounts(), _own_cgroups()
    except OSError:
        return None
    for point, fstype, options in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        base = os.path.normpath(point + own[""])
        try:
            if "memory" in _read(os.path.join(base, "cgroup.subtree_control")).split():
                if os.access(base, os.W_OK):
                    return ("v2", base)
            elif own[""] == "/" and "memory" in _read(os.path.join(base, "cgroup.controllers")).split():
                _write(os.path.join(base, "cgroup.subtree_control"), "+memory")
                return ("v2", base)
        except OSError:
            pass
    for point, fstype, options in mounts:
        if fstype == "cgroup" and "memory" in options.split(",") and "memory" in own:
            base = os.path.normpath(point + own["memory"])
            if os.path.isfile(os.path.join(base, "memory.limit_in_bytes")) and os.access(base, os.W_OK):
                return ("v1", base)
    return None


def available() -> str | None:
    """"cgroup-v2", "cgroup-v1" or None (cached: the host does not change under us)."""
    global _found
    with _lock:
        if _found is None:
            _found = _detect() or ()
        return f"cgroup-{_found[0]}" if _found else None


@dataclass
class RunCgroup:
    version: str
    path: str

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    @classmethod
    def create(cls, limit_bytes: int, max_processes: int) -> RunCgroup:
        if available() is None:
            raise OSError("no writable memory cgroup on this host")
        version, parent = _found
        path = os.path.join(parent, f"ragen2-sandbox-{secrets.token_hex(6)}")
        os.mkdir(path)
        run = cls(version, path)
        try:
            total = str(limit_bytes + HEADROOM)
            if version == "v2":
                _write(os.path.join(path, "memory.max"), total)
                for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1"),
                                    ("pids.max", str(max_processes + 2))):
                    if os.path.exists(os.path.join(path, name)):
                        _write(os.path.join(path, name), value)
            else:
                _write(os.path.join(path, "memory.limit_in_bytes"), total)
                if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                    _write(os.path.join(path, "memory.memsw.limit_in_bytes"), total)
        except OSError:
            run.remove()
            raise
        return run

    def usage(self) -> dict:
        """{"oom_kills": n, "peak_bytes": n} (0 where the kernel does not say)."""
        stats = {"oom_kills": 0, "peak_bytes": 0}
        events, peak = (("memory.events", "memory.peak") if self.version == "v2"
                        else ("memory.oom_control", "memory.max_usage_in_bytes"))
        with contextlib.suppress(OSError, ValueError):
            for line in _read(os.path.join(self.path, events)).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    stats["oom_kills"] = int(value)
        with contextlib.suppress(OSError, ValueError):
            stats["peak_bytes"] = int(_read(os.path.join(self.path, peak)))
        if self.version == "v1" and not stats["oom_kills"]:
            with contextlib.suppress(OSError, ValueError):  # older kernels count failures only
                if int(_read(os.path.join(self.path, "memory.memsw.failcnt")) or 0) and \
                        "under_oom 1" in _read(os.path.join(self.path, "memory.oom_control")):
                    stats["oom_kills"] = 1
        return stats

    def remove(self, timeout: float = 3.0) -> bool:
        """Kill what is left in it (v2) and remove it; False if it would not go."""
        kill = os.path.join(self.path, "cgroup.kill")  # v2 on Linux >= 5.14
        if self.version == "v2" and os.path.exists(kill):
            with contextlib.suppress(OSError):
                _write(kill, "1")
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:  # EBUSY while the PID namespace is still being torn down
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)
