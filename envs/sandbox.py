"""Run untrusted Python (model-written code) in a sandbox built from Linux's own mechanisms.

    result = run_python("print(int(input()) * 2)", stdin="21\n")
    result.verdict, result.stdout          # ("ok", "42\n")

In force for every run (each point is checked by tests/test_sandbox.py):
- its own session and process group; an empty environment (PATH, LANG, HOME=TMPDIR=cwd);
- new PID, network, mount, IPC and UTS namespaces: it sees only its own processes, has no
  network (not even loopback), and when it exits our reaper (the namespace's init) exits,
  so the kernel kills everything it spawned, daemons included;
- the filesystem remounted read-only in its mount namespace, except its work directory, a
  size-capped tmpfs that vanishes with it; /root, /home, the temp dir (other runs' files)
  and `hide_paths` (e.g. the expected outputs) are covered (Python is mapped back in);
- limits on CPU seconds, address space, file size, processes, open files; no core dumps;
- as root: a fresh random uid with no capabilities (RLIMIT_NPROC counts this run only;
  leftovers of that uid are killed); otherwise a user namespace, capabilities dropped;
- no_new_privs and a seccomp filter refusing new user namespaces (inside one it could
  mount an unbounded tmpfs) and AF_UNIX sockets (host daemons listen on socket files);
- a wall-clock deadline, then SIGKILL to the group; stdout and stderr read with a byte cap.
Nothing filters the code's text: containment comes from the kernel, not from strings.

`run_python` never raises: a sandbox that cannot start is the verdict `sandbox_error`.
Verdicts: ok | runtime_error | timeout | memory_limit | output_limit | killed | sandbox_error
(tests add `wrong_answer` on top). Only the standard library is importable (`python -I -S`).
"""
from __future__ import annotations

import contextlib
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

# The runner's exit codes for limits hit inside the program (a program exiting with them
# on purpose only mislabels its own failure).
MEMORY_EXIT, DISK_EXIT = 213, 214
HIDDEN_BY_DEFAULT = ("/root", "/home")
# Runs at once (more queue). A run mostly waits on process start-up and teardown, so twice the cores.
_SLOTS = threading.BoundedSemaphore(2 * max(2, os.cpu_count() or 2))


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 2  # RLIMIT_CPU (whole seconds); SIGKILL one second later
    wall_seconds: float = 6.0  # from launch to the last byte; then the group is killed
    memory_bytes: int = 256 * 2**20  # RLIMIT_AS
    max_output_bytes: int = 1 * 2**20  # stdout cap; stderr keeps the same cap
    max_processes: int = 8  # RLIMIT_NPROC (threads count too); total memory <= this x memory_bytes
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


def sandbox_mode() -> str:
    """'root' when we can create namespaces and pick uids directly, else 'userns'."""
    return "root" if os.geteuid() == 0 else "userns"


def run_python(program: str, stdin: str | bytes = "", limits: SandboxLimits | None = None, *,
               files: dict[str, str | bytes] | None = None, hide_paths: tuple[str, ...] = ()) -> SandboxResult:
    """Run `program` (Python source) in the sandbox; `files` are placed beside it (read-only)."""
    limits = limits if limits is not None else SandboxLimits()
    try:
        with _SLOTS:
            return _run(program, stdin, limits, dict(files or {}), tuple(hide_paths))
    except Exception as error:  # the contract: a verdict, never an exception
        return SandboxResult("sandbox_error", f"the sandbox failed: {type(error).__name__}: {error}")


def _run(program, stdin, limits: SandboxLimits, files: dict, hide_paths: tuple) -> SandboxResult:
    for name in files:
        if not isinstance(name, str) or not name or "/" in name or name in (".", "..", "program.py", ".stdin"):
            return SandboxResult("sandbox_error", f"bad file name {name!r}: a plain name other than program.py")
    for path in hide_paths:
        if not isinstance(path, str) or not os.path.isabs(path):
            return SandboxResult("sandbox_error", f"hide_paths must be absolute paths, got {path!r}")
    mode = sandbox_mode()
    uid = 10_000_000 + secrets.randbelow(1_000_000_000) if mode == "root" else os.geteuid()
    tmp = tempfile.mkdtemp(prefix="ragen2-sandbox-")
    status_r = status_w = -1
    try:
        work = os.path.join(tmp, "work")  # made, and covered by its tmpfs, inside the namespace
        files = {"program.py": program, **files}
        for name, content in {**files, ".stdin": stdin}.items():
            data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else bytes(content)
            with open(os.path.join(tmp, name), "wb") as handle:
                handle.write(data)
        status_r, status_w = os.pipe()
        config = {
            "mode": mode, "uid": uid, "gid": uid if mode == "root" else os.getegid(), "host_pid": os.getpid(),
            "status_fd": status_w, "inputs": tmp, "work": work, "files": sorted(files),
            "hide": [os.path.normpath(p) for p in (*HIDDEN_BY_DEFAULT, tempfile.gettempdir(), *hide_paths)],
            "keep": sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}),
            "limits": {"cpu": limits.cpu_seconds, "memory": limits.memory_bytes, "nproc": limits.max_processes,
                       "fsize": limits.max_file_bytes, "nofile": limits.max_open_files,
                       "disk": limits.disk_bytes, "backstop": int(limits.wall_seconds) + 5},
            "memory_exit": MEMORY_EXIT, "disk_exit": DISK_EXIT,
        }
        with open(os.path.join(tmp, ".stdin"), "rb") as stdin_file:
            started = time.monotonic()
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _LAUNCHER, repr(config)],
                stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={}, cwd=tmp,
                start_new_session=True, close_fds=True, pass_fds=(status_w,))
        os.close(status_w)
        status_w = -1
        outputs, overflow, timed_out = _collect(process, status_r, limits, started + limits.wall_seconds)
        process.wait()
        wall = time.monotonic() - started
        # A normal exit already ended the PID namespace (the reaper exits only after the
        # kernel has killed and reaped everything in it); after a kill it may still be ending.
        ended_normally = process.returncode == 0 and not (timed_out or overflow)
        leaked = _kill_uid(uid) if mode == "root" and not ended_normally else 0
        return _classify(outputs, overflow, timed_out, limits, mode, uid, leaked, wall)
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)


def _collect(process: subprocess.Popen, status_fd: int, limits: SandboxLimits, deadline: float):
    """Read stdout, stderr and the status pipe until all close, the deadline passes or a cap is hit."""
    names = {process.stdout.fileno(): "stdout", process.stderr.fileno(): "stderr", status_fd: "status"}
    caps = {"stdout": limits.max_output_bytes, "stderr": limits.max_output_bytes, "status": 1 << 16}
    buffers = {name: bytearray() for name in names.values()}
    overflow, timed_out = None, False
    with selectors.DefaultSelector() as selector:
        for fd in names:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and overflow is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                name = names[key.fd]
                buffers[name] += chunk
                if len(buffers[name]) > caps[name]:
                    overflow = name
                    break
    if timed_out or overflow:
        with contextlib.suppress(ProcessLookupError):  # the reaper dies with the group, and its namespace with it
            os.killpg(process.pid, signal.SIGKILL)
    process.stdout.close()
    process.stderr.close()
    return buffers, overflow, timed_out


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


def _classify(outputs, overflow, timed_out, limits, mode, uid, leaked, wall) -> SandboxResult:
    stdout = outputs["stdout"][: limits.max_output_bytes].decode("utf-8", "replace")
    stderr = outputs["stderr"][-limits.max_output_bytes:].decode("utf-8", "replace")
    status = _parse_status(outputs["status"].decode("utf-8", "replace"))
    common = dict(stdout=stdout, stderr=stderr, exit_code=status.get("exit_code"), signal=status.get("signal"),
                  cpu_seconds=float(status.get("cpu", 0.0)), wall_seconds=wall, mode=mode,
                  uid=uid if mode == "root" else None, leaked_processes=leaked)
    # The error line of a traceback (processes' tracebacks may interleave): unindented, not its header.
    last_error = next((line for line in reversed(stderr.splitlines())
                       if line.strip() and not line[0].isspace() and not line.startswith("Traceback")), "")

    def verdict(name: str, message: str) -> SandboxResult:
        return SandboxResult(name, message, **common)

    if "setup_error" in status:
        return verdict("sandbox_error", f"the sandbox could not start: {status['setup_error']}")
    if overflow in ("stdout", "stderr"):
        return verdict("output_limit", f"{overflow} passed {limits.max_output_bytes} bytes; the run was killed")
    cpu_hit = common["cpu_seconds"] >= limits.cpu_seconds - 0.05 or status.get("signal") == "SIGXCPU"
    if cpu_hit and (status.get("signal") or status.get("exit_code")):
        return verdict("timeout", f"CPU time limit of {limits.cpu_seconds} s exceeded")
    if timed_out:
        return verdict("timeout", f"wall-clock limit of {limits.wall_seconds:g} s exceeded; its processes were killed")
    if "exit_code" not in status and "signal" not in status:
        return verdict("sandbox_error", "the sandbox ended without reporting the program's exit")
    code, sig = status.get("exit_code"), status.get("signal")
    if code == MEMORY_EXIT or (sig in ("SIGABRT", "SIGSEGV") and "MemoryError" in stderr):
        megabytes = limits.memory_bytes // 2**20
        return verdict("memory_limit", f"memory limit of {megabytes} MiB exceeded ({last_error or sig})")
    if code == DISK_EXIT:
        return verdict("output_limit", f"file size / work-directory limit exceeded ({last_error})")
    if sig is not None:
        return verdict("killed", f"killed by {sig}" + (f" ({last_error})" if last_error else ""))
    if code != 0:
        return verdict("runtime_error", f"exit code {code}: {last_error or 'no error message'}")
    return verdict("ok", "exited normally")


# The launcher runs as `python -I -S -c _LAUNCHER config`: it builds the namespaces, forks
# the reaper (pid 1 of the new PID namespace), which forks the program's process. It is a
# string, not a module, so that starting it imports only what it needs.
_LAUNCHER = r'''
import ctypes, os, resource, sys, builtins, atexit, errno, _signal
C = eval(sys.argv[1], {"__builtins__": {}})  # a dict literal the host wrote (repr of str/int/list)
STATUS = C["status_fd"]
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
NS = 0x00020000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x40000000  # mount uts ipc pid net
NEWUSER, RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 0x10000000, 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
KEPT_FLAGS = {"nosuid": NOSUID, "nodev": NODEV, "noexec": NOEXEC, "noatime": 1024, "nodiratime": 2048,
              "relatime": 1 << 21}
INSIDE_UID = 1000  # userns mode: the caller's uid as seen inside (not 0, so exec drops capabilities)

def report(**fields):  # "key=value" lines: no json import, which would double the start-up time
    text = "".join(f"{key}={' '.join(str(value).split())}\n" for key, value in fields.items())
    os.write(STATUS, text.encode())

def check(rc, what):
    if rc != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")

def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")

def isolate():
    userns = C["mode"] == "userns"
    check(libc.unshare(NS | (NEWUSER if userns else 0)), "unshare (namespaces unavailable?)")
    if userns:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{INSIDE_UID} {C['uid']} 1"),
                           ("gid_map", f"{INSIDE_UID} {C['gid']} 1")):
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(text)
    mount(None, "/", None, REC | PRIVATE)  # nothing below propagates back to the host
    inputs = {}  # read before the temp dir is covered
    for name in C["files"]:
        with open(os.path.join(C["inputs"], name), "rb") as handle:
            inputs[name] = handle.read()
    keep = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in C["keep"]]
    for path in C["hide"]:
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", NOSUID | NODEV, "size=64k,mode=755")
        elif os.path.exists(path):
            mount("/dev/null", path, None, BIND)
    for path, fd in keep:  # the Python installation, if a hidden path covered it
        if not os.path.isdir(path):
            os.makedirs(path, 0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, BIND | REC)
        os.close(fd)
    owner = INSIDE_UID if userns else C["uid"]
    os.makedirs(C["work"], 0o755, exist_ok=True)  # inside the empty tmpfs that covers the temp dir
    mount("tmpfs", C["work"], "tmpfs", NOSUID | NODEV,
          f"size={C['limits']['disk']},nr_inodes=4096,mode=700,uid={owner},gid={owner}")
    for name, data in inputs.items():
        with open(os.path.join(C["work"], name), "wb") as handle:
            handle.write(data)
    for fields in (line.split() for line in open("/proc/self/mountinfo")):  # this namespace's view only
        point = fields[4].encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")
        options = fields[5].split(",")
        if point == C["work"] or "ro" in options:
            continue
        flags = REMOUNT | BIND | RDONLY | sum(KEPT_FLAGS.get(option, 0) for option in options)
        try:
            mount(None, point, None, flags)
        except OSError:
            if point == "/":
                raise
    os.chdir(C["work"])

def drop_privileges():
    L = C["limits"]
    for limit, value in ((resource.RLIMIT_CORE, (0, 0)), (resource.RLIMIT_CPU, (L["cpu"], L["cpu"] + 1)),
                         (resource.RLIMIT_AS, (L["memory"],) * 2), (resource.RLIMIT_FSIZE, (L["fsize"],) * 2),
                         (resource.RLIMIT_NOFILE, (L["nofile"],) * 2), (resource.RLIMIT_NPROC, (L["nproc"],) * 2)):
        resource.setrlimit(limit, value)
    if C["mode"] == "root":
        os.setgroups([])
        os.setresgid(C["gid"], C["gid"], C["gid"])
        os.setresuid(C["uid"], C["uid"], C["uid"])  # leaving uid 0 drops every capability
    else:
        header, no_capabilities = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()  # v3 layout
        check(libc.capset(header, no_capabilities), "capset")
    check(libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    forbid_user_namespaces()
    os.environ.clear()
    os.environ.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME=C["work"], TMPDIR=C["work"], LANG="C.UTF-8")

def forbid_user_namespaces():
    """Seccomp: refuse CLONE_NEWUSER (unshare, clone), setns, and AF_UNIX sockets (a socket
    file on the host, e.g. a database's, is reachable through the filesystem; socketpair()
    stays). clone3 hides its flags, so it gets ENOSYS and libc falls back to clone; x32
    calls get ENOSYS too."""
    numbers = {"x86_64": (0xC000003E, 272, 56, 308, 41),
               "aarch64": (0xC00000B7, 97, 220, 268, 198)}.get(os.uname().machine)
    if numbers is None:
        raise OSError(f"no seccomp filter for {os.uname().machine}")
    arch, unshare, clone, setns, socket = numbers
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, KILL, EPERM, ENOSYS = 0x7FFF0000, 0x80000000, 0x50000 | errno.EPERM, 0x50000 | errno.ENOSYS
    program = [  # (code, k, jump-if-true label, jump-if-false label); seccomp_data: nr@0, arch@4, arg0@16
        (LD, 4, None, None), (JEQ, arch, "nr", "kill"), ("kill", RET, KILL),
        ("nr", LD, 0), (JGE, 0x40000000, "enosys", None), (JEQ, 435, "enosys", None),
        (JEQ, setns, "eperm", None), (JEQ, socket, "family", None), (JEQ, unshare, "flags", None),
        (JEQ, clone, "flags", "allow"), ("flags", LD, 16), (JSET, 0x10000000, "eperm", "allow"),
        ("family", LD, 16), (JEQ, 1, "eperm", "allow"),  # AF_UNIX
        ("allow", RET, ALLOW), ("enosys", RET, ENOSYS), ("eperm", RET, EPERM),
    ]
    labels, rows = {}, []
    for entry in program:
        if isinstance(entry[0], str):
            labels[entry[0]] = len(rows)
            entry = (entry[1], entry[2], None, None)
        rows.append(entry)
    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
    jump = lambda here, label: 0 if label is None else labels[label] - here - 1
    table = (Filter * len(rows))(*[Filter(code, jump(i, t), jump(i, f), k) for i, (code, k, t, f) in enumerate(rows)])
    check(libc.prctl(22, 2, ctypes.byref(Program(len(rows), table)), 0, 0), "prctl(PR_SET_SECCOMP)")

def run_program():
    main = type(sys)("__main__")
    main.__file__, main.__builtins__ = "program.py", builtins
    sys.modules["__main__"], sys.argv, sys.path[:0] = main, ["program.py"], [C["work"]]
    try:
        with open("program.py", "rb") as handle:
            code = compile(handle.read(), "program.py", "exec")
        exec(code, main.__dict__)
        status = 0
    except SystemExit as error:  # what the interpreter itself would do with it
        status = 0 if error.code is None else error.code & 0xFF if isinstance(error.code, int) else 1
        if not isinstance(error.code, (int, type(None))):
            print(error.code, file=sys.stderr)
    except MemoryError:
        status = C["memory_exit"]
        print("MemoryError", file=sys.stderr)
    except BaseException as error:
        import traceback  # only now: most runs never need it
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        number = getattr(error, "errno", None)
        limit_codes = {errno.ENOMEM: C["memory_exit"], errno.EFBIG: C["disk_exit"], errno.ENOSPC: C["disk_exit"]}
        status = limit_codes.get(number, 1)
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    return status

def reaper():
    check(libc.prctl(1, 9, 0, 0, 0), "prctl(PR_SET_PDEATHSIG, SIGKILL)")
    try:
        mount("proc", "/proc", "proc", NOSUID | NODEV | NOEXEC | RDONLY)  # only this namespace's processes
    except OSError:
        pass  # not allowed in some user namespaces: the host's /proc stays, read-only
    child = os.fork()
    if child == 0:
        try:
            drop_privileges()
        except BaseException as error:
            report(setup_error=f"dropping privileges failed: {error}")
            os._exit(1)
        os.close(STATUS)  # from here on the program runs: it must not be able to forge our report
        os._exit(run_program())
    while True:  # reap orphans too; when the program ends, our exit ends the namespace
        pid, wait_status, usage = os.wait4(-1, 0)
        if pid == child:
            break
    fields = {"cpu": usage.ru_utime + usage.ru_stime}
    if os.WIFSIGNALED(wait_status):
        fields["signal"] = os.WTERMSIG(wait_status)
    else:
        fields["exit_code"] = os.WEXITSTATUS(wait_status)
    report(**fields)

try:
    check(libc.prctl(1, 9, 0, 0, 0), "prctl(PR_SET_PDEATHSIG, SIGKILL)")  # the host dies: we die
    if os.getppid() != C["host_pid"]:
        os._exit(0)
    isolate()
    pid = os.fork()
    if pid == 0:
        try:
            reaper()
        except BaseException as error:
            report(setup_error=f"reaper: {error}")
        os._exit(0)
    _signal.alarm(C["limits"]["backstop"])  # if the host never kills us, we still end
    os.waitpid(pid, 0)
except BaseException as error:
    report(setup_error=f"{type(error).__name__}: {error}")
os._exit(0)
'''
