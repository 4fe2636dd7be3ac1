"""One runner per cell: several `ragen2 bench` processes on one suite folder share its cells.

Before a runner starts a cell it creates `<cell>/bench_claim.json` (exclusively: of two runners
racing, one wins) naming its host, process id and that process's start time; it deletes the file
when the cell ends, however it ends. Another runner skips a claimed cell. A claim whose process
is gone (killed, the machine restarted), or that stayed unreadable for UNREADABLE_CLAIM_S (its
runner died between creating and writing it), is stale and is taken over, so an interrupted cell
resumes as before. A claim from another host cannot be checked from here and is respected; the
file is not committed (.gitignore), so a fresh clone on a new machine starts with none.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

CLAIM_FILE = "bench_claim.json"
# A claim file that cannot be read for this long was not being written: its runner died first.
UNREADABLE_CLAIM_S = 30.0


def _start_time(pid: int) -> str | None:
    """The process's start time (Linux, in clock ticks since boot): a reused pid has another."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 of stat, counted after the command name


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    return start is None or _start_time(pid) in (None, start)


def _me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid())}


def holder(run_dir: Path) -> dict | None:
    """Who holds the cell's claim, if a live runner (or one on another host) does; None if free."""
    path = Path(run_dir) / CLAIM_FILE
    try:
        held = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        # Being written right now by the runner that won the race; or left empty by a runner killed
        # between creating and writing it, which must not hold the cell forever.
        try:
            fresh = time.time() - path.stat().st_mtime < UNREADABLE_CLAIM_S
        except OSError:
            return None
        return {"host": "?", "pid": None} if fresh else None
    if held.get("host") != socket.gethostname():
        return held
    pid = held.get("pid")
    return held if isinstance(pid, int) and _alive(pid, held.get("start")) else None


def claim(run_dir: Path) -> dict | None:
    """Claim the cell for this process: None on success, else the live holder's record."""
    path = Path(run_dir) / CLAIM_FILE
    for _ in range(2):  # a stale claim is removed once and the claim retried
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            held = holder(run_dir)
            if held is not None:
                return held
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as file:
            json.dump(_me(), file)
        return None
    return holder(run_dir) or {"host": "?", "pid": None}


def release(run_dir: Path) -> None:
    """Delete the cell's claim if this process holds it."""
    path = Path(run_dir) / CLAIM_FILE
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if held.get("host") == socket.gethostname() and held.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def describe(held: dict) -> str:
    return f"another runner (pid {held.get('pid')} on {held.get('host')})"
