"""Run untrusted Python (model-written code) in a sandbox built from Linux's own mechanisms.

    result = run_python("print(int(input()) * 2)", stdin="21\n")
    result.verdict, result.stdout          # ("ok", "42\n")

In force for every run (each point is checked by tests/envs/test_sandbox.py; the threat model,
and what holds on which kind of host, are in docs/sandbox.md):
- new PID, network, mount, IPC, UTS and cgroup namespaces: it sees only its own processes,
  has no network (not even loopback), and when it exits our reaper (the namespace's init)
  exits, so the kernel kills everything it spawned, daemons included;
- a filesystem root built from an allow-list (rootfs.py): the interpreter, its shared
  libraries and standard library, read-only, and a fresh size-capped tmpfs work dir. Problem
  data, site-packages, any checkout, /tmp, /dev/shm and the host's socket files are absent;
- stdin is a pipe the host feeds; stdout and stderr are pipes read with a byte cap and a cap on
  read calls (a program dribbling bytes cannot make the host spin: see _collect); each result
  records the host CPU its run cost (`host_cpu_seconds`);
- memory: a memory cgroup per run where the host offers one (memory.py: the run's total,
  shared memory included); always RLIMIT_AS per process, SysV shm limited in its IPC
  namespace (or refused), memfd refused;
- limits on CPU seconds, file size, processes, open files; no core dumps;
- as root: a fresh random uid, no supplementary groups, no capabilities (RLIMIT_NPROC
  counts this run only; leftovers of that uid are killed); otherwise a user namespace with
  the bounding set and every capability dropped;
- a fresh session keyring, no_new_privs, and a default-deny seccomp allow-list (syscalls.py):
  no file locks (the root's files are the host's inodes), no descriptor passing, no larger
  socket buffers or pipes (kernel memory RLIMIT_AS does not count);
- its own session and process group; the reaper keeps no signal handler (so, as its PID
  namespace's init, it gets none of the program's signals) and, with the launcher, is
  non-dumpable (their /proc files are root's even where they share the program's uid);
- a wall-clock deadline, then SIGKILL to the launcher's group (the reaper with it, and so
  the whole PID namespace).
Nothing filters the code's text: containment comes from the kernel, not from strings.

`run_python` never raises: a sandbox that cannot start is the verdict `sandbox_error`.
Verdicts: ok | runtime_error | timeout | memory_limit | output_limit | killed | sandbox_error
(tests add `wrong_answer` on top). Only the standard library is importable (`python -I -S`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import memory, rootfs, syscalls  # relative: the package also loads standalone (tests run it unprivileged)

# The runner's exit codes for limits hit inside the program (a program exiting with them
# on purpose only mislabels its own failure).
MEMORY_EXIT, DISK_EXIT = 213, 214
SETUP_SECONDS = 60.0  # launch to the program's start (then its wall_seconds): only a stalled host needs it
WORK_DIR = "/sandbox"  # the program's cwd, HOME and TMPDIR inside its root
MEMORY_GUARDS = ("auto", "cgroup", "rlimits")
_LAUNCHER = (Path(__file__).parent / "launcher.py").read_text()
# Runs at once (more queue). A run mostly waits on process start-up and teardown, so twice the cores.
_SLOTS = threading.BoundedSemaphore(2 * max(2, os.cpu_count() or 2))
# The host's read loop, bounded in calls: the first FREE_READS reads are immediate (a normal run
# needs a handful); after them a short read (under COALESCE_BYTES) waits COALESCE_SECONDS so that
# a program writing a byte at a time is read in batches, and past MAX_READ_CALLS the run is killed
# (verdict output_limit). At about 20 us of host CPU per call, 2048 calls cost the host at most
# ~40 ms; with 10 ms pauses a run needs over 19 s of dribbling to reach the cap.
FREE_READS, COALESCE_BYTES, COALESCE_SECONDS, MAX_READ_CALLS = 128, 4096, 0.01, 2048


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 2  # RLIMIT_CPU (whole seconds); SIGKILL one second later
    wall_seconds: float = 6.0  # from the program's start to its last byte; then the group is killed
    memory_bytes: int = 256 * 2**20  # RLIMIT_AS per process; with a memory cgroup the run's total too
                                     # (+16 MiB for launcher and reaper); SysV shm gets half of it
    max_output_bytes: int = 1 * 2**20  # stdout cap; stderr keeps the same cap
    max_processes: int = 8  # RLIMIT_NPROC (threads count too)
    max_file_bytes: int = 8 * 2**20  # RLIMIT_FSIZE
    disk_bytes: int = 16 * 2**20  # size of the tmpfs work directory
    max_open_files: int = 64

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_bytes", "max_output_bytes", "max_processes",
                     "max_file_bytes", "disk_bytes", "max_open_files"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SandboxLimits.{name} must be a positive int, got {value!r}")
        if not (isinstance(self.wall_seconds, (int, float)) and 0 < self.wall_seconds <= 3600):
            raise ValueError(f"SandboxLimits.wall_seconds must be in (0, 3600], got {self.wall_seconds!r}")
        if self.memory_bytes < 32 * 2**20:
            raise ValueError("SandboxLimits.memory_bytes below 32 MiB cannot start Python")


@dataclass(frozen=True)
class SandboxResult:
    verdict: str
    message: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: str | None = None  # the signal that ended the program, by name
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    mode: str = ""  # "root" (fresh uid) or "userns"
    uid: int | None = None  # the host uid the program ran as (root mode)
    leaked_processes: int = 0  # processes of that uid alive 2 s after the run ended (root mode)
    memory_guard: str = ""  # "cgroup-v2" | "cgroup-v1" (total capped) | "rlimits" (per process)
    memory_peak_bytes: int = 0  # the run's peak total memory, as its cgroup counted it (0 without one)
    host_cpu_seconds: float = 0.0  # CPU the calling thread spent on this run (set-up, supervision, clean-up)
    read_calls: int = 0  # the host's reads and writes on the run's pipes


def sandbox_mode() -> str:
    """'root' when we can create namespaces and pick uids directly, else 'userns'."""
    return "root" if os.geteuid() == 0 else "userns"


def run_python(program: str, stdin: str | bytes = "", limits: SandboxLimits | None = None, *,
               files: dict[str, str | bytes] | None = None, hide_paths: tuple[str, ...] = (),
               memory_guard: str = "auto") -> SandboxResult:
    """Run `program` (Python source) in the sandbox; `files` are placed beside it (read-only).

    `hide_paths`: host paths that must stay invisible even if they lie inside what the root
    allows (everything else is absent anyway). `memory_guard`: "auto" (a memory cgroup where
    the host offers one), "cgroup" (required: sandbox_error without one) or "rlimits"."""
    limits = limits if limits is not None else SandboxLimits()
    # This thread's CPU only: runs go on in parallel threads, and waiting costs nothing.
    started = time.thread_time()
    try:
        with _SLOTS:
            result = _run(program, stdin, limits, dict(files or {}), tuple(hide_paths), memory_guard)
    except Exception as error:  # the contract: a verdict, never an exception
        result = SandboxResult("sandbox_error", f"the sandbox failed: {type(error).__name__}: {error}")
    return dataclasses.replace(result, host_cpu_seconds=time.thread_time() - started)


def _run(program, stdin, limits: SandboxLimits, files: dict, hide_paths: tuple, memory_guard: str) -> SandboxResult:
    for name in files:
        if not isinstance(name, str) or not name or "/" in name or name in (".", "..", "program.py"):
            return SandboxResult("sandbox_error", f"bad file name {name!r}: a plain name other than program.py")
    for path in hide_paths:
        if not isinstance(path, str) or not os.path.isabs(path):
            return SandboxResult("sandbox_error", f"hide_paths must be absolute paths, got {path!r}")
    if memory_guard not in MEMORY_GUARDS:
        return SandboxResult("sandbox_error", f"memory_guard must be one of {list(MEMORY_GUARDS)}, got {memory_guard!r}")
    if not isinstance(program, str):
        return SandboxResult("sandbox_error", f"the program must be text, got {type(program).__name__}")
    stdin_data = stdin.encode("utf-8", "surrogatepass") if isinstance(stdin, str) else bytes(stdin)
    try:
        plan = rootfs.with_hidden(rootfs.plan(), hide_paths)
    except rootfs.RootPlanError as error:
        return SandboxResult("sandbox_error", f"the sandbox could not start: {error}")
    cgroup = None
    if memory_guard == "cgroup" or (memory_guard == "auto" and memory.available()):
        try:
            cgroup = memory.RunCgroup.create(limits.memory_bytes, limits.max_processes)
        except OSError as error:
            if memory_guard == "cgroup":
                return SandboxResult("sandbox_error", f"the sandbox could not start: memory cgroup: {error}")
    mode, machine = sandbox_mode(), os.uname().machine
    uid = 10_000_000 + secrets.randbelow(1_000_000_000) if mode == "root" else os.geteuid()
    tmp = tempfile.mkdtemp(prefix="ragen2-sandbox-")
    status_r = status_w = -1
    try:
        os.mkdir(os.path.join(tmp, "root"))  # becomes the program's "/" (a tmpfs) inside the namespace
        files = {"program.py": program, **files}
        os.mkdir(os.path.join(tmp, "inputs"), 0o700)
        for name, content in files.items():
            data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else bytes(content)
            with open(os.path.join(tmp, "inputs", name), "wb") as handle:
                handle.write(data)
        status_r, status_w = os.pipe()
        config = {
            "mode": mode, "uid": uid, "gid": uid if mode == "root" else os.getegid(), "host_pid": os.getpid(),
            "status_fd": status_w, "inputs": os.path.join(tmp, "inputs"), "root": os.path.join(tmp, "root"),
            "work": WORK_DIR, "files": sorted(files), "plan": plan, "python": rootfs.interpreter(),
            "syscalls": syscalls.policy(machine), "cgroup": cgroup.procs if cgroup else "",
            "seccomp": {"with_shm": syscalls.filter_hex(machine, True),
                        "without_shm": syscalls.filter_hex(machine, False)},
            "shm_bytes": limits.memory_bytes // 2,  # SysV shm in its IPC namespace, all segments together
            "limits": {"cpu": limits.cpu_seconds, "memory": limits.memory_bytes, "nproc": limits.max_processes,
                       "fsize": limits.max_file_bytes, "nofile": limits.max_open_files,
                       "disk": limits.disk_bytes, "backstop": int(SETUP_SECONDS + limits.wall_seconds) + 5},
            "memory_exit": MEMORY_EXIT, "disk_exit": DISK_EXIT,
        }
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER, repr(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={}, cwd=tmp,
            start_new_session=True, close_fds=True, pass_fds=(status_w,))
        os.close(status_w)
        status_w = -1
        outputs, overflow, timed_out, calls = _collect(process, status_r, stdin_data, limits, started + SETUP_SECONDS)
        process.wait()
        wall = time.monotonic() - started
        # A normal exit already ended the PID namespace (the reaper exits only after the
        # kernel has killed and reaped everything in it); after a kill it may still be ending.
        ended_normally = process.returncode == 0 and not (timed_out or overflow)
        leaked = _kill_uid(uid) if mode == "root" and not ended_normally else 0
        usage = {"oom_kills": 0, "peak_bytes": 0}
        if cgroup is not None:
            usage = cgroup.usage()
            cgroup.remove()
            cgroup = None
        guard = memory.available() if config["cgroup"] else "rlimits"
        result = _classify(outputs, overflow, timed_out, limits, mode, uid, leaked, wall, guard, usage)
        return dataclasses.replace(result, read_calls=calls)
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        if cgroup is not None:
            cgroup.remove()
        shutil.rmtree(tmp, ignore_errors=True)


def _collect(process: subprocess.Popen, status_fd: int, stdin: bytes, limits: SandboxLimits, deadline: float):
    """Feed stdin; read stdout, stderr and the status pipe until all close, the deadline passes
    or a cap is hit. `deadline` bounds the set-up; once the reaper reports that the program
    starts, the program's own wall clock replaces it (so a loaded machine's slow start-up is
    never the program's timeout)."""
    names = {process.stdout.fileno(): "stdout", process.stderr.fileno(): "stderr", status_fd: "status"}
    caps = {"stdout": limits.max_output_bytes, "stderr": limits.max_output_bytes, "status": 1 << 16}
    buffers = {name: bytearray() for name in names.values()}
    overflow, timed_out, calls = None, False, 0
    pending, sent = memoryview(stdin), 0
    with selectors.DefaultSelector() as selector:
        for fd in names:
            selector.register(fd, selectors.EVENT_READ)
        if stdin:
            os.set_blocking(process.stdin.fileno(), False)
            selector.register(process.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            process.stdin.close()
        while len(selector.get_map()) > (0 if process.stdin.closed else 1) and overflow is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in selector.select(remaining):
                calls += 1
                if calls > MAX_READ_CALLS:
                    overflow = "calls"
                    break
                if key.fd not in names:  # stdin: as much as the pipe takes, then close it (EOF)
                    try:
                        sent += os.write(key.fd, pending[sent:sent + (1 << 16)])
                    except (BrokenPipeError, BlockingIOError) as error:
                        if isinstance(error, BlockingIOError):
                            continue
                        sent = len(pending)  # the program closed its stdin: it reads no more
                    if sent >= len(pending):
                        selector.unregister(key.fd)
                        process.stdin.close()
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                if calls > FREE_READS and len(chunk) < COALESCE_BYTES:
                    time.sleep(COALESCE_SECONDS)  # let a dribble pile up in the pipe: one read takes it all
                name = names[key.fd]
                if name == "status" and b"started=" in chunk and b"started=" not in buffers[name]:
                    deadline = time.monotonic() + limits.wall_seconds
                buffers[name] += chunk
                if len(buffers[name]) > caps[name]:
                    overflow = name
                    break
    if not process.stdin.closed:
        process.stdin.close()
    if timed_out or overflow:
        with contextlib.suppress(ProcessLookupError):  # the reaper dies with the group, and its namespace with it
            os.killpg(process.pid, signal.SIGKILL)
    process.stdout.close()
    process.stderr.close()
    return buffers, overflow, timed_out, calls


def processes_of_uid(uid: int) -> list[int]:
    """Host pids of live (not zombie) processes whose real uid is `uid`."""
    found, needle = [], f"\nUid:\t{uid}\t".encode()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status", "rb") as handle:
                text = handle.read()
        except OSError:
            continue  # it ended while we looked
        if needle in text and not any(state in text for state in (b"\nState:\tZ", b"\nState:\tX")):
            found.append(int(entry))
    return found


def _kill_uid(uid: int, grace_seconds: float = 2.0) -> int:
    """SIGKILL every process of `uid` until none is left; return how many outlived the grace
    (after a kill the kernel may still be tearing the PID namespace down)."""
    deadline = time.monotonic() + grace_seconds
    while True:
        pids = processes_of_uid(uid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not pids or time.monotonic() > deadline:
            return len(pids)
        time.sleep(0.005)



def _parse_status(text: str) -> dict:
    """The launcher's `key=value` lines → {exit_code: int, signal: name, cpu: float, setup_error: str}."""
    status: dict = {}
    for key, _, value in (line.partition("=") for line in text.splitlines()):
        try:
            if key == "signal":
                number = int(value)
                status[key] = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
            elif key in ("exit_code", "cpu", "setup_error"):
                status[key] = {"exit_code": int, "cpu": float, "setup_error": str}[key](value)
        except ValueError:
            status.setdefault("setup_error", f"unreadable status line {key}={value[:80]}")
    return status


def _classify(outputs, overflow, timed_out, limits, mode, uid, leaked, wall, guard, usage) -> SandboxResult:
    stdout = outputs["stdout"][: limits.max_output_bytes].decode("utf-8", "replace")
    stderr = outputs["stderr"][-limits.max_output_bytes:].decode("utf-8", "replace")
    status = _parse_status(outputs["status"].decode("utf-8", "replace"))
    common = dict(stdout=stdout, stderr=stderr, exit_code=status.get("exit_code"), signal=status.get("signal"),
                  cpu_seconds=float(status.get("cpu", 0.0)), wall_seconds=wall, mode=mode,
                  uid=uid if mode == "root" else None, leaked_processes=leaked, memory_guard=guard,
                  memory_peak_bytes=usage["peak_bytes"])
    # The error line of a traceback (processes' tracebacks may interleave): unindented, not its header.
    last_error = next((line for line in reversed(stderr.splitlines())
                       if line.strip() and not line[0].isspace() and not line.startswith("Traceback")), "")

    def verdict(name: str, message: str) -> SandboxResult:
        return SandboxResult(name, message, **common)

    if "setup_error" in status:
        return verdict("sandbox_error", f"the sandbox could not start: {status['setup_error']}")
    if overflow in ("stdout", "stderr"):
        return verdict("output_limit", f"{overflow} passed {limits.max_output_bytes} bytes; the run was killed")
    if overflow == "calls":
        return verdict("output_limit", f"the output came in more than {MAX_READ_CALLS} pieces; the run was killed")
    megabytes = limits.memory_bytes // 2**20
    if usage["oom_kills"]:  # the kernel killed inside the run's cgroup: its total memory was spent
        return verdict("memory_limit", f"the run's total memory limit of {megabytes} MiB was reached "
                                       f"({usage['oom_kills']} process(es) killed by the kernel)")
    cpu_hit = common["cpu_seconds"] >= limits.cpu_seconds - 0.05 or status.get("signal") == "SIGXCPU"
    if cpu_hit and (status.get("signal") or status.get("exit_code")):
        return verdict("timeout", f"CPU time limit of {limits.cpu_seconds} s exceeded")
    if timed_out:
        return verdict("timeout", f"wall-clock limit of {limits.wall_seconds:g} s exceeded; its processes were killed")
    if "exit_code" not in status and "signal" not in status:
        return verdict("sandbox_error", "the sandbox ended without reporting the program's exit")
    code, sig = status.get("exit_code"), status.get("signal")
    if code == MEMORY_EXIT or (sig in ("SIGABRT", "SIGSEGV") and "MemoryError" in stderr):
        return verdict("memory_limit", f"memory limit of {megabytes} MiB exceeded ({last_error or sig})")
    if code == DISK_EXIT:
        return verdict("output_limit", f"file size / work-directory limit exceeded ({last_error})")
    if sig is not None:
        return verdict("killed", f"killed by {sig}" + (f" ({last_error})" if last_error else ""))
    if code != 0:
        return verdict("runtime_error", f"exit code {code}: {last_error or 'no error message'}")
    return verdict("ok", "exited normally")
