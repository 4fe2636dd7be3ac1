"""The host side of the hostile cases that hold (tests/envs/hostile_programs.py, HOLD): while the
program holds what it took, the host checks its own side. `Prober` finds each holding program
by the name it takes, runs its probe (PROBES) and releases it; the tests judge what it found.

The probes look from outside, as root: /proc of the host, and descriptors of the program's
processes copied with pidfd_getfd (the socket buffers and pipe sizes the kernel holds for it).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import termios
import threading
from dataclasses import dataclass
from pathlib import Path

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


@dataclass
class ProbeContext:
    mode: str  # "root" (the run has a fresh uid) or "userns" (the program's uid is a host user's)
    python: str | None = None  # an interpreter the program's uid may run (the pipe-budget check)


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat from the state on (the name may hold spaces): state, ppid, pgrp, session, ..."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _family(pid: int) -> list[int]:
    """The program and its children, as host pids."""
    children = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(_stat(int(entry))[1]) == pid:
                children.append(int(entry))
    return [pid, *children]


def _descriptors(pid: int, kind: str) -> list[int]:
    """`pid`'s descriptors of a kind ("socket", "pipe")."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(kind + ":"):
                found.append(int(fd))
    return found


@contextlib.contextmanager
def _grabbed(pid: int, fd: int):
    """A copy of another process's descriptor (pidfd_getfd: the host is root), closed after."""
    pidfd = os.pidfd_open(pid)
    try:
        copy = libc.syscall(438, pidfd, fd, 0)
        if copy < 0:
            raise OSError(ctypes.get_errno(), f"pidfd_getfd({pid}, {fd})")
    finally:
        os.close(pidfd)
    try:
        yield copy
    finally:
        os.close(copy)


def probe_supervisors(pid: int, claims: dict, context: ProbeContext) -> list[str]:
    """The program leads its own session and group; the reaper and the launcher are alive, not
    stopped, non-dumpable (their /proc files belong to root) and their /proc values unchanged."""
    problems = []
    _, parent, group, session = _stat(pid)[:4]
    if int(group) != pid or int(session) != pid:
        problems.append(f"the program shares a group or session: pgrp {group}, session {session}, pid {pid}")
    reaper = int(parent)
    launcher = int(_stat(reaper)[1])
    values = {}
    for role, who in (("reaper", reaper), ("launcher", launcher)):
        if _stat(who)[0] in "TtZX":
            problems.append(f"the {role} is in state {_stat(who)[0]}")
        for name in ("oom_score_adj", "coredump_filter"):
            owner = os.stat(f"/proc/{who}/{name}").st_uid
            if owner != 0:
                problems.append(f"the {role}'s /proc/{name} belongs to uid {owner}: the {role} is dumpable")
            values[role, name] = Path(f"/proc/{who}/{name}").read_text().strip()
    for name in ("oom_score_adj", "coredump_filter"):
        if values["reaper", name] != values["launcher", name]:
            problems.append(f"the reaper's {name} was changed to {values['reaper', name]}")
    return problems


def probe_sockets(pid: int, claims: dict, context: ProbeContext) -> list[str]:
    """Every socket of every process of the run: its send buffer is the host's default and what
    it holds queued (SIOCOUTQ: the kernel memory it pins) stays within the documented bound."""
    default = int(Path("/proc/sys/net/core/wmem_default").read_text())
    count = queued = 0
    raised = []
    for who in _family(pid):
        for fd in _descriptors(who, "socket"):
            with _grabbed(who, fd) as copy, socket.socket(fileno=os.dup(copy)) as sock:
                size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                queued += struct.unpack("i", fcntl.ioctl(copy, termios.TIOCOUTQ, bytes(4)))[0]
            count += 1
            if size > default:
                raised.append(size)
    problems = [f"{len(raised)} sockets were raised past net.core.wmem_default ({default}): up to {max(raised)}"
                for _ in raised[:1]]
    if queued > count * socket_bytes_bound(default):
        problems.append(f"{count} sockets hold {queued >> 20} MiB, past {count} x {socket_bytes_bound(default)}")
    return problems


def socket_bytes_bound(default: int) -> int:
    """What one unix stream socket may hold queued (docs/sandbox.md): its send buffer, the default
    (the program cannot raise it), plus the one message that may start below the limit."""
    return default + 2**17


def probe_in_flight(pid: int, claims: dict, context: ProbeContext) -> list[str]:
    """Every unix socket of the run's network namespace is held by a descriptor of the run."""
    listed = len(Path(f"/proc/{pid}/net/unix").read_text().splitlines()) - 1
    held = sum(len(_descriptors(who, "socket")) for who in _family(pid))
    return [f"{listed - held} unix sockets of the run are held by no descriptor (in flight)"] if listed > held else []


def probe_locks(pid: int, claims: dict, context: ProbeContext) -> list[str]:
    """The host takes, on the host's own inodes, the locks the program tried to take."""
    problems = [] if claims.get("files") else ["the program named no file"]
    for path in claims.get("files", []):
        writable = path == "/dev/null"
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                problems.append(f"the host could not flock {path}: the program holds a lock on the host's inode")
            for name, command in (("OFD", fcntl.F_OFD_GETLK), ("POSIX", fcntl.F_GETLK)):
                answer = fcntl.fcntl(fd, command, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
                if struct.unpack("hhqqi4x", answer)[0] != fcntl.F_UNLCK:
                    problems.append(f"a lock on {path} stands against the host's write lock ({name} query)")
            if writable:
                try:
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_UNLCK, 0, 0, 0, 0))
                except OSError:
                    problems.append(f"the host could not take a write lock on {path}")
        finally:
            os.close(fd)
    return problems


def probe_pipes(pid: int, claims: dict, context: ProbeContext) -> list[str]:
    """Every pipe of the run keeps the default size; where the program's uid is a host user's
    (user-namespace mode), a new pipe of that uid elsewhere on the host still gets it too."""
    read_end, write_end = os.pipe()
    default = fcntl.fcntl(write_end, 1032)  # F_GETPIPE_SZ of a fresh pipe of ours
    os.close(read_end)
    os.close(write_end)
    sizes = []
    for who in _family(pid):
        for fd in _descriptors(who, "pipe"):
            with _grabbed(who, fd) as copy:
                sizes.append(fcntl.fcntl(copy, 1032))
    grown = [size for size in sizes if size > default]
    problems = [f"{len(grown)} of the run's {len(sizes)} pipes were grown, up to {max(grown)} bytes"] if grown else []
    if context.mode == "userns" and context.python:
        uid = int(next(line for line in open(f"/proc/{pid}/status") if line.startswith("Uid:")).split()[1])
        fresh = subprocess.run([context.python, "-I", "-S", "-c", "import fcntl, os; print(fcntl.fcntl(os.pipe()[1], 1032))"],
                               user=uid, group=uid, extra_groups=[], capture_output=True, text=True, timeout=30)
        if fresh.stdout.strip() != str(default):
            problems.append(f"a new pipe of uid {uid} on the host gets {fresh.stdout.strip() or fresh.stderr[-200:]} "
                            f"bytes, not {default}: the uid's pipe budget is spent")
    return problems


PROBES = {"supervisors": probe_supervisors, "sockets": probe_sockets, "in_flight": probe_in_flight,
          "locks": probe_locks, "pipes": probe_pipes}


class Prober:
    """Probes `cases` while they run: one thread scans /proc for the names the holding programs
    take, runs each one's probe, then releases it (SIGUSR1 through a pidfd, so a reused pid is
    never signalled). `problems[name]` lists what each probe found, or that it never ran."""

    def __init__(self, cases: list, context: ProbeContext):  # hostile_case.Case
        self.waiting = {case.marker: case for case in cases if case.probe}
        self.problems: dict[str, list[str]] = {case.name: [] for case in self.waiting.values()}
        self.context = context
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._scan, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for case in self.waiting.values():
            self.problems[case.name].append("the host never found the program holding (it never reached hold())")

    def _scan(self) -> None:
        while self.waiting and not self._stop.wait(0.02):
            for entry in filter(str.isdigit, os.listdir("/proc")):
                case = self.waiting.get(_comm(int(entry)))
                if case is not None:
                    self._probe(int(entry), case)

    def _probe(self, pid: int, case) -> None:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return  # it ended between the scan and now
        try:
            if _comm(pid) != case.marker:
                return  # the pid was reused between the scan and the pidfd
            del self.waiting[case.marker]
            try:
                claims = json.loads(Path(f"/proc/{pid}/cwd/claims.json").read_text())
                self.problems[case.name] += PROBES[case.probe](pid, claims, self.context)
            except Exception as error:  # a probe that cannot look is a failure, reported as one
                self.problems[case.name].append(f"the probe failed: {type(error).__name__}: {error}")
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: its stdout will say so
                signal.pidfd_send_signal(pidfd, signal.SIGUSR1)
        finally:
            os.close(pidfd)
