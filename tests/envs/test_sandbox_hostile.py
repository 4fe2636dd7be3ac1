"""Hostile programs against the sandbox's second line: kernel interfaces beyond files and
network (io_uring, keyrings, bpf, namespaces), host socket files of every kind, shared
memory, stdin, supplementary groups, the allow-listed root, the supervisors (signals, /proc
files), kernel buffers past RLIMIT_AS, locks on host inodes and the per-uid pipe budget.

Each case (tests/envs/hostile_programs.py) asserts its verdict, text the program must print (so it really ran its attack)
and text it must never print; then the host side is checked by the host itself: nothing
reached its listeners (TCP and UDP on 127.0.0.1, stream / datagram / group-owned / abstract
unix sockets), its planted kernel key is intact, no process or key of the run's uid is
left, and host shared memory stayed small while the suite ran. Cases with a probe are also
checked mid-run, while the program holds what it took (`Prober`, `PROBES`). The same attacks
run once more as an unprivileged user (user-namespace mode) where this machine allows it.
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
import sys
import tempfile
import termios
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from envs import sandbox
from envs.sandbox import memory, processes_of_uid, run_python
from tests.envs.hostile_programs import CANARY, KEY_NAME, REPO, ROOMY, Case, Host, hostile_cases

GROUP = 4242  # owns the group-only socket (a stand-in for docker.sock)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


# --- the host side ----------------------------------------------------------------------------

def _keyctl(*args) -> int:
    return libc.syscall(250, *args)


def plant_key() -> int | None:
    """A user key in the host's session keyring, as a systemd service would hold one."""
    payload = CANARY.encode()
    key = libc.syscall(248, b"user", KEY_NAME.encode(), payload, len(payload), -3)
    return key if key >= 0 else None


def read_key(key: int) -> bytes:
    buffer = ctypes.create_string_buffer(256)
    size = _keyctl(11, key, buffer, 256)  # KEYCTL_READ
    return buffer.raw[:size] if size >= 0 else b""


def key_users() -> set[int]:
    try:
        return {int(line.split(":")[0]) for line in open("/proc/key-users")}
    except OSError:
        return set()


def files_of_uid(uid: int, *extra: Path) -> list[str]:
    """Entries owned by `uid` in the host's shared writable places (and `extra` dirs)."""
    found = []
    for directory in ("/tmp", "/var/tmp", "/dev/shm", *map(str, extra)):
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        found += [entry.path for entry in entries if _owner(entry) == uid]
    return found


def _owner(entry) -> int | None:
    try:
        return entry.stat(follow_symlinks=False).st_uid
    except OSError:
        return None  # it went away while we looked


def shmem_bytes() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("Shmem:"):
            return int(line.split()[1]) * 1024
    return 0


# --- the host side, mid-run: the probes of programs that hold (hostile_programs.HOLD) ------------

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

    def __init__(self, cases: list[Case], context: ProbeContext):
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

    def _probe(self, pid: int, case: Case) -> None:
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
            signal.pidfd_send_signal(pidfd, signal.SIGUSR1)
        finally:
            os.close(pidfd)


@pytest.fixture(scope="module")
def host():
    public = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="ragen2-hostile-", dir=public) as directory:
        path = Path(directory)
        path.chmod(0o777)
        made = {}
        for name, kind in (("stream", socket.SOCK_STREAM), ("group", socket.SOCK_STREAM), ("dgram", socket.SOCK_DGRAM)):
            made[name] = socket.socket(socket.AF_UNIX, kind)
            made[name].bind(str(path / f"{name}.sock"))
            if kind == socket.SOCK_STREAM:
                made[name].listen()
            os.chmod(path / f"{name}.sock", 0o777 if name != "group" else 0o770)
        if os.geteuid() == 0:
            os.chown(path / "group.sock", 0, GROUP)
        abstract = f"ragen2-abstract-{os.getpid()}"
        made["abstract"] = socket.socket(socket.AF_UNIX)
        made["abstract"].bind("\0" + abstract)
        made["abstract"].listen()
        made["tcp"] = socket.create_server(("127.0.0.1", 0))
        made["udp"] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made["udp"].bind(("127.0.0.1", 0))
        key = plant_key()
        try:
            yield Host(path, made["tcp"].getsockname()[1], made["udp"].getsockname()[1], abstract, key, made)
        finally:
            if key is not None:
                _keyctl(21, key)  # KEYCTL_INVALIDATE: the host's keyring as it was
            for sock in made.values():
                sock.close()


def assert_host_untouched(host: Host) -> None:
    for name, sock in host.sockets.items():
        sock.settimeout(0.05)
        with pytest.raises((socket.timeout, BlockingIOError)):
            sock.recv(1) if sock.type == socket.SOCK_DGRAM else sock.accept()
    if host.key is not None:
        assert read_key(host.key) == CANARY.encode(), "the planted key was changed"
    assert sorted(p.name for p in host.dir.iterdir()) == ["dgram.sock", "group.sock", "stream.sock"]


@pytest.fixture(scope="module")
def runs(host):
    """Every case once, in parallel, while a thread samples host shared memory."""
    cases = hostile_cases(host)
    baseline, peak, done = shmem_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], shmem_bytes())
            time.sleep(0.01)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(max_workers=len(cases)) as pool, pytest.MonkeyPatch.context() as patch, \
            Prober(cases, ProbeContext("root")) as prober:
        patch.setattr(sandbox, "_SLOTS", threading.BoundedSemaphore(8))
        results = list(pool.map(lambda case: run_python(case.program, case.stdin, ROOMY), cases))
    done.set()
    sampler.join()
    return {case.name: (case, result, prober.problems.get(case.name, [])) for case, result in zip(cases, results)}, \
        peak[0] - baseline


NAMES = [case.name for case in hostile_cases(Host(Path("/x"), 1, 1, "x", None), total_guard=False)]  # no probing at import


def judge(case: Case, verdict: str, stdout: str, stderr: str, exit_code: int | None = None,
          problems: list[str] = ()) -> None:
    assert verdict in case.verdicts, (case.name, verdict, stdout[-800:], stderr[-800:])
    if case.exit_code is not None:  # the verdict is the program's own, not its supervisors' death
        assert exit_code == case.exit_code, (case.name, exit_code, stdout[-800:], stderr[-800:])
    for text in case.required:
        assert text in stdout, (case.name, text, stdout[-800:], stderr[-800:])
    for text in case.forbidden:
        assert text not in stdout and text not in stderr, (case.name, text, stdout[-800:])
    assert not problems, (case.name, problems, stdout[-800:])  # what the host saw mid-run


@pytest.mark.parametrize("name", NAMES)
def test_hostile_case(runs, host, name):
    results, _ = runs
    case, result, problems = results[name]
    judge(case, result.verdict, result.stdout, result.stderr, result.exit_code, problems)
    assert_host_untouched(host)
    if result.uid is not None:  # root mode: nothing of the run's fresh uid is left in the kernel
        assert result.leaked_processes == 0 and processes_of_uid(result.uid) == []
        assert result.uid not in key_users()
        assert files_of_uid(result.uid, host.dir) == []


def test_suite_size_and_host_shared_memory(runs):
    results, shmem_growth = runs
    assert len(results) >= 25 and sum(bool(case.probe) for case, _, _ in results.values()) >= 8
    # Unbounded, the shm case alone would hold 2 GiB and the memfd one as much as it liked;
    # bounded: 128 MiB of SysV shm plus each run's work-dir tmpfs (16 MiB at most, 18 runs).
    assert shmem_growth < 600 * 2**20, shmem_growth


def test_total_memory_is_capped_by_the_cgroup_or_the_fallback_bound(runs):
    results, _ = runs
    case, result, _ = results["many_processes_filling_memory"]
    if memory.available():
        assert result.memory_guard.startswith("cgroup") and result.verdict == "memory_limit"
        assert 0 < result.memory_peak_bytes <= ROOMY.memory_bytes + memory.HEADROOM
    else:  # per-process limits only: each child stays under RLIMIT_AS, the documented bound
        assert result.memory_guard == "rlimits" and result.verdict == "ok"


def test_both_memory_guards_hold_shared_memory_and_socket_buffers():
    """The cgroup (where the host has one) and the per-process fallback both hold the shm case and
    the socket-buffer case (kernel memory RLIMIT_AS does not count; the host measures it mid-run)."""
    cases = [c for c in hostile_cases(Host(Path("/x"), 1, 1, "x", None))
             if c.name in ("sysv_shared_memory_beyond_the_limit", "socket_buffers_in_every_process")]
    guards = ["rlimits"] + (["cgroup"] if memory.available() else [])
    for guard in guards:
        with Prober(cases, ProbeContext(sandbox.sandbox_mode())) as prober:
            results = [run_python(case.program, limits=ROOMY, memory_guard=guard) for case in cases]
        for case, result in zip(cases, results):
            judge(case, result.verdict, result.stdout, result.stderr, result.exit_code, prober.problems.get(case.name))
            assert result.memory_guard == ("rlimits" if guard == "rlimits" else memory.available())


# --- the same attacks as an unprivileged user (user-namespace mode) -----------------------------

UNPRIVILEGED = 65534
DRIVER = r"""
import importlib.util, json, os, sys
repo, cases = sys.argv[1], json.load(sys.stdin)
spec = importlib.util.spec_from_file_location("sandbox_alone", os.path.join(repo, "envs", "sandbox", "__init__.py"),
                                              submodule_search_locations=[os.path.join(repo, "envs", "sandbox")])
box = importlib.util.module_from_spec(spec)
sys.modules["sandbox_alone"] = box
spec.loader.exec_module(box)
limits = box.SandboxLimits(cpu_seconds=2, wall_seconds=15)
out = []
for program, stdin in cases:
    r = box.run_python(program, stdin, limits)
    out.append([r.verdict, r.message, r.stdout, r.stderr, r.mode, r.memory_guard, r.exit_code])
print(json.dumps(out))
"""


def _unprivileged_python() -> str | None:
    """An interpreter the unprivileged uid can run (this one may live under root's home)."""
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            done = subprocess.run([candidate, "-I", "-S", "-c", "import ctypes"], user=UNPRIVILEGED,
                                  group=UNPRIVILEGED, extra_groups=[], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return candidate
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to an unprivileged uid needs root")
def test_unprivileged_user_namespace_mode(host):
    """As uid 65534 with the socket's group among its groups (the docker.sock situation)."""
    python = _unprivileged_python()
    if python is None:
        pytest.skip("no interpreter the unprivileged uid may run")
    unshare = "import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x10000000) != 0)"  # CLONE_NEWUSER
    probe = subprocess.run([python, "-I", "-S", "-c", unshare], user=UNPRIVILEGED,
                           group=UNPRIVILEGED, capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("this kernel refuses unprivileged user namespaces")
    cases = hostile_cases(host, total_guard=False)
    with Prober(cases, ProbeContext("userns", python)) as prober:  # the probes run as root, beside the driver
        done = subprocess.run([python, "-I", "-S", "-c", DRIVER, str(REPO)], input=json.dumps([[c.program, c.stdin]
                              for c in cases]), user=UNPRIVILEGED, group=UNPRIVILEGED, extra_groups=[GROUP],
                              capture_output=True, text=True, timeout=600, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    for case, (verdict, message, stdout, stderr, mode, guard, code) in zip(cases, json.loads(done.stdout)):
        assert (mode, guard) == ("userns", "rlimits"), (case.name, verdict, message)
        if case.name == "supplementary_groups_are_gone":
            # An unprivileged process cannot drop them (the kernel denies setgroups in a user
            # namespace it mapped itself); they map to the overflow gid and reach nothing: the
            # group-owned socket is absent from the root (host_unix_socket_files).
            assert verdict == "ok" and "groups" in stdout
            continue
        if case.name == "proc_shows_only_the_run" and "pids []" in stdout:
            case.required = ("sysctl refused", "no /sys")  # /proc refused in this user namespace: none at all
        judge(case, verdict, stdout, stderr, code, prober.problems.get(case.name))
    assert_host_untouched(host)

