"""The hostile programs of tests/envs/test_sandbox_hostile.py (a Case each, tests/envs/hostile_case.py):
`hostile_cases` assembles them for one Host. Here, the escapes: kernel interfaces beyond files and
network, host socket files of every kind, shared memory, stdin, supplementary groups, the
allow-listed root, namespaces, /proc, limits, a shell, inherited descriptors. Elsewhere, the cases
that hold for a host probe: the supervisors' signals and /proc files (hostile_supervisors.py),
kernel buffers past the address-space limit and the per-uid pipe budget (hostile_kernel_buffers.py),
locks on host inodes (hostile_host_locks.py), the host's reader (hostile_host_reads.py).

A case with a `probe` stops mid-run in `hold()` (named `marker`, its claims in claims.json)
until the host has checked its side and sent SIGUSR1 (tests/envs/sandbox_probes.py); it
prints "host probed" only if the host came."""

from __future__ import annotations

import os
import secrets
import sys
import textwrap

from envs.sandbox import SandboxLimits, memory
from tests.envs.hostile_case import REPO, X86, Case, Host
from tests.envs.hostile_host_locks import lock_cases
from tests.envs.hostile_host_reads import host_read_cases
from tests.envs.hostile_kernel_buffers import kernel_buffer_cases
from tests.envs.hostile_supervisors import supervisor_cases

# Defined in probed programs: the rendezvous with the host's probe (see the module docstring).
HOLD = """
def hold(claims=None):
    import json, signal
    with open('claims.json', 'w') as handle:
        json.dump(claims or {{}}, handle)
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR1}})
    libc.prctl(15, {marker!r}.encode(), 0, 0, 0)  # PR_SET_NAME
    released = signal.sigtimedwait({{signal.SIGUSR1}}, 12)
    print('host probed' if released else 'the host never came', flush=True)
"""


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
    cases += supervisor_cases() + kernel_buffer_cases() + lock_cases() + host_read_cases()
    for case in cases:
        hold = ""
        if case.probe:
            case.marker = "r2h" + secrets.token_hex(6)  # fresh per call: runs of two suites never meet
            hold = HOLD.format(marker=case.marker)
            case.required += ("host probed",)
        case.program = head + hold + textwrap.dedent(case.program)
    return [case for case in cases if X86 or not case.x86_only]

