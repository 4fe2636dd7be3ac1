"""Hostile programs against the sandbox's second line: kernel interfaces beyond files and
network (io_uring, keyrings, bpf, namespaces), host socket files of every kind, shared
memory, stdin, supplementary groups, and the allow-listed root.

Each case asserts its verdict, text the program must print (so it really ran its attack)
and text it must never print; then the host side is checked by the host itself: nothing
reached its listeners (TCP and UDP on 127.0.0.1, stream / datagram / group-owned / abstract
unix sockets), its planted kernel key is intact, no process or key of the run's uid is
left, and host shared memory stayed small while the suite ran. The same attacks run once
more as an unprivileged user (user-namespace mode) where this machine allows it.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from envs import sandbox
from envs.sandbox import SandboxLimits, memory, processes_of_uid, run_python

CANARY = "ragen2-key-canary-51d0"
KEY_NAME = "ragen2-planted-key"
GROUP = 4242  # owns the group-only socket (a stand-in for docker.sock)
ROOMY = SandboxLimits(cpu_seconds=2, wall_seconds=15)
REPO = Path(__file__).resolve().parents[2]
X86 = os.uname().machine == "x86_64"
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


@dataclass
class Host:
    dir: Path
    tcp_port: int
    udp_port: int
    abstract: str
    key: int | None
    sockets: dict = field(default_factory=dict)  # name -> bound socket

    def path(self, name: str) -> str:
        return str(self.dir / f"{name}.sock")


@dataclass
class Case:
    name: str
    program: str
    verdicts: tuple[str, ...]
    required: tuple[str, ...] = ()  # the program got as far as its attack
    forbidden: tuple[str, ...] = ("ESCAPED", "ALLOWED", "CONNECTED", "SENT", "FOUND", CANARY, KEY_NAME)
    stdin: str = ""
    x86_only: bool = False


def hostile_cases(h: Host, total_guard: bool | None = None) -> list[Case]:
    total_guard = memory.available() is not None if total_guard is None else total_guard
    head = "import ctypes, os, socket, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
    cases = [
        Case("io_uring_cannot_be_set_up", """
            params = ctypes.create_string_buffer(120)
            fd = libc.syscall(425, 8, params)  # io_uring_setup: IORING_OP_SOCKET / OPENAT would bypass socket()
            print('ESCAPED io_uring', fd) if fd >= 0 else print('denied io_uring', ctypes.get_errno())""",
             ("ok",), ("denied io_uring 1",), x86_only=True),
        Case("datagram_socketpair_and_host_dgram_socket", f"""
            for attempt in ('pair', 'dgram'):
                try:
                    if attempt == 'pair':
                        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                    else:
                        a = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    a.sendto(b'x', {h.path('dgram')!r})
                    print('SENT', attempt)
                except OSError as error:
                    print('denied', attempt, error.errno)""", ("ok",), ("denied pair 1", "denied dgram 1")),
        Case("host_unix_socket_files", f"""
            for name in ('stream', 'group', 'dgram'):
                path = {str(h.dir)!r} + '/' + name + '.sock'
                print('ESCAPED visible', path) if os.path.exists(path) else print('absent', name)
                try:
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(path)
                    print('CONNECTED', name)
                except OSError as error:
                    print('denied', name, error.errno)
            a, b = socket.socketpair()  # allowed (asyncio needs it), but a connected pair cannot be re-aimed
            try:
                a.connect({h.path('stream')!r})
                print('CONNECTED through a socketpair')
            except OSError as error:
                print('pair stays put', error.errno)""", ("ok",), ("absent stream", "absent group", "denied group 1")),
        Case("abstract_unix_socket_and_loopback", f"""
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect('\\0' + {h.abstract!r})
                print('CONNECTED abstract')
            except OSError as error:
                print('denied abstract', error.errno)
            try:
                socket.create_connection(('127.0.0.1', {h.tcp_port}), timeout=1)
                print('CONNECTED tcp')
            except OSError as error:
                print('no tcp', error.errno)
            try:
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {h.udp_port}))
                print('SENT udp')
            except OSError as error:
                print('no udp', error.errno)""", ("ok",), ("denied abstract 1", "no tcp", "no udp")),
        Case("sysv_shared_memory_beyond_the_limit", f"""
            libc.shmat.restype = ctypes.c_void_p
            libc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
            big = libc.shmget(0, 2 * 2**30, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
            print('ESCAPED 2 GiB segment') if big >= 0 else print('2 GiB refused')
            total = 0
            for _ in range(32):
                sid = libc.shmget(0, 64 * 2**20, 0o1600)
                if sid < 0:
                    break
                address = libc.shmat(sid, None, 0)
                if address is None or address == ctypes.c_void_p(-1).value:
                    break
                ctypes.memset(address, 1, 64 * 2**20)
                total += 64
            print('attached', total, 'MiB')
            if total > {SandboxLimits().memory_bytes // 2**20 // 2}:
                print('ESCAPED the shm limit')""", ("ok",), ("2 GiB refused", "attached")),
        Case("memfd_is_refused", """
            try:
                os.memfd_create('hoard')
                print('ALLOWED memfd')
            except OSError as error:
                print('denied memfd', error.errno)
            print('ESCAPED /dev/shm') if os.path.exists('/dev/shm') else print('no /dev/shm')""",
             ("ok",), ("denied memfd 1", "no /dev/shm")),
        Case("many_processes_filling_memory", """
            import time
            children = []
            for _ in range(6):
                pid = os.fork()
                if pid == 0:
                    block = b'x' * (150 * 2**20)  # written, so resident: 6 x 150 MiB in all
                    time.sleep(1.5)
                    os._exit(0)
                children.append(pid)
            for pid in children:
                os.waitpid(pid, 0)
            print('parent done')""", ("memory_limit",) if total_guard else ("ok",), ("parent done",)),
        Case("kernel_keyrings", """
            attempts = [('session id', lambda: libc.syscall(250, 0, -3, 0)),
                        ('add_key', lambda: libc.syscall(248, b'user', b'mine', b'v', 1, -3)),
                        ('request_key', lambda: libc.syscall(249, b'user', b'ragen2-planted-key', None, 0)),
                        ('clear', lambda: libc.syscall(250, 7, -3)),
                        ('search', lambda: libc.syscall(250, 10, -3, b'user', b'ragen2-planted-key', 0))]
            for name, attempt in attempts:
                print('ALLOWED', name) if attempt() >= 0 else print('denied', name, ctypes.get_errno())
            try:
                print('keys:', open('/proc/keys').read())
            except OSError as error:
                print('no /proc/keys', error.errno)""", ("ok",), ("denied add_key 1", "denied clear 1"), x86_only=True),
        Case("stdin_is_a_pipe_the_host_feeds", """
            import stat
            print('pipe' if stat.S_ISFIFO(os.fstat(0).st_mode) else 'ESCAPED stdin is not a pipe')
            print('read', len(sys.stdin.read()))
            try:
                open('/proc/self/fd/0', 'w').write('into my own pipe at most')
                print('wrote to its own pipe')
            except OSError as error:
                print('denied', error.errno)""", ("ok",), ("pipe", "read 600000"), stdin="hello\n" * 100_000),
        Case("supplementary_groups_are_gone", """
            print('groups', os.getgroups())
            print([line for line in open('/proc/self/status') if line.startswith('Groups')])""",
             ("ok",), ("groups []",) if os.geteuid() == 0 else ()),
        Case("the_root_holds_no_data_packages_or_checkout", f"""
            hits, seen = [], 0
            markers = ('deepcoder', '.jsonl', 'ragen2', 'pyproject', '.git', 'pyvenv.cfg', 'envs')
            for top, dirs, files in os.walk('/'):
                if top.startswith('/proc'):
                    dirs[:] = []
                    continue
                for name in dirs + files:
                    seen += 1
                    full = os.path.join(top, name)
                    if any(marker in name for marker in markers):
                        hits.append(full)
                    if name in ('site-packages', 'dist-packages') and os.listdir(full):
                        hits.append(full)
            for path in ({str(REPO)!r}, {sys.prefix!r} + '/lib', '/usr/lib/python3/dist-packages', '/tmp', '/home'):
                if os.path.exists(path):
                    hits.append(path)
            print('FOUND', hits) if hits else print('clean root of', seen, 'entries')""", ("ok",), ("clean root of",)),
        Case("namespace_mount_and_root_escapes", """
            attempts = {'unshare user': lambda: libc.unshare(0x10000000), 'unshare mount': lambda: libc.unshare(0x20000),
                        'clone newuser': lambda: libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0),
                        'clone3': lambda: libc.syscall(435, 0, 0),
                        'setns': lambda: libc.setns(os.open('/proc/self/ns/mnt', os.O_RDONLY), 0),
                        'mount': lambda: libc.mount(b'none', b'/sandbox', b'tmpfs', 0, None),
                        'umount': lambda: libc.umount2(b'/', 2), 'chroot': lambda: libc.chroot(b'/'),
                        'pivot_root': lambda: libc.syscall(155, b'.', b'.')}
            for name, attempt in attempts.items():
                rc = attempt()
                if rc == 0 and name.startswith('clone'):
                    os._exit(0)  # a child made anyway: it must not print
                print('ESCAPED', name) if rc >= 0 else print('denied', name)""",
             ("ok",), ("denied unshare user", "denied clone newuser", "denied pivot_root"), x86_only=True),
        Case("kernel_interfaces_are_outside_the_allow_list", """
            calls = {'bpf': 321, 'perf_event_open': 298, 'ptrace': 101, 'process_vm_readv': 310, 'userfaultfd': 323,
                     'personality': 135, 'kcmp': 312, 'open_by_handle_at': 304, 'init_module': 175, 'iopl': 172,
                     'mlockall': 151, 'pidfd_getfd': 438, 'fanotify_init': 300, 'inotify_init1': 294,
                     'fsopen': 430, 'open_tree': 428, 'setuid': 105, 'setgroups': 116, 'chown': 92, 'msgget': 68,
                     'semget': 64, 'add_key': 248, 'io_uring_enter': 426, 'swapon': 167, 'reboot': 169}
            for name, number in calls.items():
                rc = libc.syscall(number, 0, 0, 0, 0, 0)
                code = ctypes.get_errno()
                print('ALLOWED', name) if rc >= 0 else print('denied', name) if code == 1 else print('ODD', name, code)""",
             ("ok",), ("denied bpf", "denied ptrace", "denied msgget"), forbidden=("ALLOWED", "ODD"), x86_only=True),
        Case("proc_shows_only_the_run", """
            print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
            for path in ('/proc/1/environ', '/proc/1/mem', '/proc/1/root/sandbox'):
                try:
                    (os.listdir if path.endswith('sandbox') else lambda p: open(p, 'rb').read(64))(path)
                    print('read', path)
                except OSError as error:
                    print('denied', path, error.errno)
            try:
                open('/proc/sys/kernel/shmmax', 'w').write('18446744073692774399')
                print('ESCAPED wrote shmmax')
            except OSError as error:
                print('sysctl refused', error.errno)
            print('sys' if os.path.exists('/sys') else 'no /sys', open('/proc/self/cgroup').read().strip())""",
             ("ok",), ("pids [1, 2]", "sysctl refused", "no /sys")),
        Case("limits_cannot_be_raised", """
            import resource
            for limit in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_NPROC):
                try:
                    resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
                    print('ESCAPED raised', limit)
                except (OSError, ValueError):
                    print('kept', limit)
            try:
                resource.prlimit(1, resource.RLIMIT_CPU, (1, 1))  # the reaper would die before reporting
                print('ESCAPED limited the reaper')
            except OSError as error:
                print('reaper kept', error.errno)""", ("ok",), ("kept 9", "reaper kept")),
        Case("no_shell_but_python_runs", """
            import subprocess
            print('ESCAPED a shell') if os.path.exists('/bin/sh') else print('no shell')
            out = subprocess.run([sys.executable, '-I', '-S', '-c', 'print(6 * 7)'], capture_output=True, text=True)
            print('child says', out.stdout.strip(), out.stderr.strip()[-200:])""", ("ok",), ("no shell", "child says 42")),
        Case("no_inherited_descriptors", """
            extra = []
            for fd in range(3, 1024):
                try:
                    os.fstat(fd)
                    extra.append(fd)
                except OSError:
                    pass
            print('ESCAPED fds', extra) if extra else print('only 0 1 2')""", ("ok",), ("only 0 1 2",)),
    ]
    for case in cases:
        case.program = head + textwrap.dedent(case.program)
    return [case for case in cases if X86 or not case.x86_only]


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
    with ThreadPoolExecutor(max_workers=len(cases)) as pool, pytest.MonkeyPatch.context() as patch:
        patch.setattr(sandbox, "_SLOTS", threading.BoundedSemaphore(8))
        results = list(pool.map(lambda case: run_python(case.program, case.stdin, ROOMY), cases))
    done.set()
    sampler.join()
    return {case.name: (case, result) for case, result in zip(cases, results)}, peak[0] - baseline


NAMES = [case.name for case in hostile_cases(Host(Path("/x"), 1, 1, "x", None), total_guard=False)]  # no probing at import


def judge(case: Case, verdict: str, stdout: str, stderr: str) -> None:
    assert verdict in case.verdicts, (case.name, verdict, stdout[-800:], stderr[-800:])
    for text in case.required:
        assert text in stdout, (case.name, text, stdout[-800:], stderr[-800:])
    for text in case.forbidden:
        assert text not in stdout and text not in stderr, (case.name, text, stdout[-800:])


@pytest.mark.parametrize("name", NAMES)
def test_hostile_case(runs, host, name):
    results, _ = runs
    case, result = results[name]
    judge(case, result.verdict, result.stdout, result.stderr)
    assert_host_untouched(host)
    if result.uid is not None:  # root mode: nothing of the run's fresh uid is left in the kernel
        assert result.leaked_processes == 0 and processes_of_uid(result.uid) == []
        assert result.uid not in key_users()
        assert files_of_uid(result.uid, host.dir) == []


def test_suite_size_and_host_shared_memory(runs):
    results, shmem_growth = runs
    assert len(results) >= 15
    # Unbounded, the shm case alone would hold 2 GiB and the memfd one as much as it liked;
    # bounded: 128 MiB of SysV shm plus each run's work-dir tmpfs (16 MiB at most, 18 runs).
    assert shmem_growth < 600 * 2**20, shmem_growth


def test_total_memory_is_capped_by_the_cgroup_or_the_fallback_bound(runs):
    results, _ = runs
    case, result = results["many_processes_filling_memory"]
    if memory.available():
        assert result.memory_guard.startswith("cgroup") and result.verdict == "memory_limit"
        assert 0 < result.memory_peak_bytes <= ROOMY.memory_bytes + memory.HEADROOM
    else:  # per-process limits only: each child stays under RLIMIT_AS, the documented bound
        assert result.memory_guard == "rlimits" and result.verdict == "ok"


def test_both_memory_guards_refuse_shared_memory_hoards():
    """The cgroup (where the host has one) and the per-process fallback both hold the shm case."""
    case = next(c for c in hostile_cases(Host(Path("/x"), 1, 1, "x", None)) if c.name.startswith("sysv_shared"))
    guards = ["rlimits"] + (["cgroup"] if memory.available() else [])
    for guard in guards:
        result = run_python(case.program, limits=ROOMY, memory_guard=guard)
        judge(case, result.verdict, result.stdout, result.stderr)
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
    out.append([r.verdict, r.message, r.stdout, r.stderr, r.mode, r.memory_guard])
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
    done = subprocess.run([python, "-I", "-S", "-c", DRIVER, str(REPO)], input=json.dumps([[c.program, c.stdin]
                          for c in cases]), user=UNPRIVILEGED, group=UNPRIVILEGED, extra_groups=[GROUP],
                          capture_output=True, text=True, timeout=600, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    for case, (verdict, message, stdout, stderr, mode, guard) in zip(cases, json.loads(done.stdout)):
        assert (mode, guard) == ("userns", "rlimits"), (case.name, verdict, message)
        if case.name == "supplementary_groups_are_gone":
            # An unprivileged process cannot drop them (the kernel denies setgroups in a user
            # namespace it mapped itself); they map to the overflow gid and reach nothing: the
            # group-owned socket is absent from the root (host_unix_socket_files).
            assert verdict == "ok" and "groups" in stdout
            continue
        if case.name == "proc_shows_only_the_run" and "pids []" in stdout:
            case.required = ("sysctl refused", "no /sys")  # /proc refused in this user namespace: none at all
        judge(case, verdict, stdout, stderr)
    assert_host_untouched(host)

