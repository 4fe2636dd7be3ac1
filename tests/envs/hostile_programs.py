"""The hostile programs of tests/envs/test_sandbox_hostile.py: each Case is a program that tries
one way out of the sandbox (kernel interfaces beyond files and network, host socket files of
every kind, shared memory, stdin, supplementary groups, the allow-listed root, the supervisors'
signals and /proc files, kernel buffers past the address-space limit, locks on host inodes,
the per-uid pipe budget), the verdicts it may get, text it must print (it really ran its
attack) and text it must never print. Written against a Host (its listeners and planted key);
the test file builds the Host and judges.

A case with a `probe` stops mid-run in `hold()` (named `marker`, its claims in claims.json)
until the host has checked its side and sent SIGUSR1 (tests/envs/sandbox_probes.py); it
prints "host probed" only if the host came."""

from __future__ import annotations

import os
import secrets
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from envs.sandbox import SandboxLimits, memory

CANARY = "ragen2-key-canary-51d0"
KEY_NAME = "ragen2-planted-key"
ROOMY = SandboxLimits(cpu_seconds=2, wall_seconds=15)
REPO = Path(__file__).resolve().parents[2]
X86 = os.uname().machine == "x86_64"


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
    exit_code: int | None = None  # the program's own exit status, where the verdict must be its own
    probe: str = ""  # the host-side check run while the program holds (test_sandbox_hostile.PROBES)
    marker: str = ""  # the name (comm) the program takes while it holds: how the host finds it


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
    cases += supervisor_cases() + kernel_buffer_cases() + lock_cases()
    for case in cases:
        hold = ""
        if case.probe:
            case.marker = "r2h" + secrets.token_hex(6)  # fresh per call: runs of two suites never meet
            hold = HOLD.format(marker=case.marker)
            case.required += ("host probed",)
        case.program = head + hold + textwrap.dedent(case.program)
    return [case for case in cases if X86 or not case.x86_only]


def supervisor_cases() -> list[Case]:
    """The reaper (pid 1 inside) and the launcher (outside the PID namespace): signals the program
    can send them, directly, to its groups or through SIGIO, and their /proc files."""
    return [
        Case("every_signal_to_every_pid_and_group", """
            import signal, struct, time
            me, group = os.getpid(), os.getpgrp()
            print('own session', os.getsid(0) == me, 'own group', group == me)
            unignorable = {signal.SIGKILL, signal.SIGSTOP, 32, 33}  # glibc keeps 32 and 33 for itself
            for number in range(1, 65):
                if number not in unignorable:
                    signal.signal(number, signal.SIG_IGN)
            targets = [0, -1, 1, os.getppid(), *range(2, 33), *range(-32, -1)]
            sent = 0
            for number in range(1, 65):
                for target in targets:
                    if number in unignorable and target in (0, me, -group):
                        continue  # itself: the verdict would be its own death, not the sandbox's
                    try:
                        os.kill(target, number)
                        sent += 1
                    except OSError:
                        pass
            tgkill, sigqueue = (234, 129) if os.uname().machine == 'x86_64' else (131, 138)
            for number in range(1, 65):  # the other ways to name the reaper: its thread, a queued signal
                info = ctypes.create_string_buffer(struct.pack('iii', number, 0, -1), 128)  # SI_QUEUE
                sent += (libc.syscall(tgkill, 1, 1, number) == 0) + (libc.syscall(sigqueue, 1, number, info) == 0)
            time.sleep(0.3)  # signals are delivered before kill() returns; handlers may lag
            print('signals sent', sent > 0)
            hold()
            sys.exit(3)""", ("runtime_error",), ("own session True own group True", "signals sent True"),
             exit_code=3, probe="supervisors"),
        Case("supervisor_proc_files", """
            for pid in sorted({1, os.getppid()}):
                for name, text in (('oom_score_adj', '1000'), ('coredump_filter', '0x7f'), ('clear_refs', '5'),
                                   ('timerslack_ns', '1')):
                    try:
                        with open(f'/proc/{pid}/{name}', 'w') as handle:
                            handle.write(text)
                        print('ESCAPED wrote', pid, name)
                    except OSError as error:
                        print('denied', name, error.errno)
                for name in ('mem', 'environ', 'fd/0', 'fd/1', 'fd/2', 'fd/3', 'fd/4', 'fd/5'):
                    try:
                        os.close(os.open(f'/proc/{pid}/{name}', os.O_RDONLY if name[0] in 'em' else os.O_WRONLY))
                        print('ESCAPED opened', pid, name)
                    except OSError as error:
                        print('denied', name, error.errno)
            hold()""", ("ok",), ("denied oom_score_adj", "denied coredump_filter", "denied clear_refs"),
             probe="supervisors"),
        Case("sigio_owner_signals_to_the_supervisors", """
            import fcntl, signal, struct
            read_end, write_end = os.pipe()
            for name, command, argument in (('F_SETOWN reaper', 8, 1), ('F_SETSIG SIGINT', 10, signal.SIGINT),
                                            ('F_SETOWN_EX group', 15, struct.pack('ii', 2, 1)),
                                            ('F_SETOWN group 0', 8, 0)):
                try:
                    fcntl.fcntl(read_end, command, argument)
                    print('ALLOWED', name)
                except OSError as error:
                    print('denied', name, error.errno)
            fcntl.fcntl(read_end, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
            a, b = socket.socketpair()  # ioctl is not filtered: FIOSETOWN makes the reaper a socket's owner
            owned = libc.ioctl(a.fileno(), 0x8901, ctypes.byref(ctypes.c_int(1)))  # and the kernel drops
            libc.ioctl(a.fileno(), 0x5452, ctypes.byref(ctypes.c_int(1)))  # its SIGIO (FIOASYNC): init's shield
            for _ in range(20):  # each write would be a signal to the owner, were there one
                os.write(write_end, b'x')
                os.read(read_end, 1)
                b.send(b'x')
                a.recv(1)
            print('socket owner set' if owned == 0 else 'socket owner refused')
            hold()
            sys.exit(4)""", ("runtime_error",), ("denied F_SETOWN reaper", "denied F_SETSIG SIGINT", "socket owner set"),
             exit_code=4, probe="supervisors"),
    ]


def kernel_buffer_cases() -> list[Case]:
    """Kernel memory that RLIMIT_AS does not count: socket buffers raised past the host's default,
    socket pairs kept alive in flight (SCM_RIGHTS cycles), pipes grown towards the uid's budget."""
    # Up to max_processes processes, each filling what its descriptors hold; they wait at the end
    # so that the host probes them all alive.
    fork_all = """
            def in_every_process(work, escaped, count=7):  # -> (what work() kept here, children's escapes)
                ready_r, ready_w = os.pipe()
                for _ in range(count):
                    try:
                        if os.fork() == 0:
                            os.close(ready_r)
                            kept = work()
                            os.write(ready_w, b'+' if escaped(kept) else b'.')
                            os.close(ready_w)
                            time.sleep(60)  # until the program ends: its namespace takes us along
                            os._exit(0)
                    except OSError:
                        break
                os.close(ready_w)
                kept = work()
                ready = b''.join(iter(lambda: os.read(ready_r, 8), b''))  # until every child is ready
                os.close(ready_r)
                return kept, ready.count(b'+')
            """
    return [
        Case("socket_buffers_in_every_process", fork_all + """
            import time

            def fill():  # as many pairs as the descriptors allow, each end asked for 64 MiB, all full
                pairs, queued, answers = [], 0, set()
                while len(pairs) < 30:
                    try:
                        pair = socket.socketpair()
                    except OSError:
                        break
                    for end in pair:
                        for option in (7, 8, 32, 33):  # SO_SNDBUF, SO_RCVBUF and their FORCE forms: 64 MiB
                            refused = libc.setsockopt(end.fileno(), 1, option, ctypes.byref(ctypes.c_int(1 << 26)), 4)
                            answers.add(f'refused buffer option {option} {ctypes.get_errno()}' if refused
                                        else f'ALLOWED buffer option {option}')
                        end.setblocking(False)
                        try:
                            while True:
                                queued += end.send(bytes(65536))
                        except BlockingIOError:
                            pass
                    pairs.append(pair)
                return pairs, queued, answers
            (pairs, queued, answers), _ = in_every_process(fill, lambda kept: False)
            print(*sorted(answers), sep='\\n')
            print('pairs', len(pairs), 'queued KiB here', queued >> 10)
            hold()""", ("ok",), ("refused buffer option 7", "refused buffer option 8", "pairs 30"),
             probe="sockets"),
        Case("socket_pairs_kept_alive_in_flight", """
            import array
            keep, inside = socket.socketpair()  # what it sends into `keep` waits in `inside`'s queue
            sent, refused = 0, None
            for _ in range(200):
                a, b = socket.socketpair()
                a.setblocking(False)
                try:
                    while True:
                        a.send(bytes(65536))
                except BlockingIOError:
                    pass
                try:  # a full pair, alive with no descriptor of its own: past the descriptor limit
                    keep.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [a.fileno(), b.fileno()]))])
                    sent += 1
                except OSError as error:
                    refused = error.errno
                a.close()
                b.close()
            print('ALLOWED pairs in flight', sent) if sent else print('refused sendmsg', refused)
            hold()""", ("ok",), ("refused sendmsg 1",), probe="in_flight"),
        Case("pipes_grown_towards_the_uid_budget", fork_all + """
            import fcntl, time

            def grow():  # a pipe per descriptor (one end is enough to keep it), each asked for 1 MiB
                pipes, grown, refused = [], 0, None
                for _ in range(59):
                    read_end, write_end = os.pipe()
                    try:
                        fcntl.fcntl(write_end, 1031, 1 << 20)  # F_SETPIPE_SZ
                        grown += 1
                    except OSError as error:
                        refused = error.errno
                    os.close(read_end)
                    pipes.append(write_end)
                return pipes, grown, refused
            (pipes, grown, refused), children_grew = in_every_process(grow, lambda kept: kept[1])
            print('ALLOWED F_SETPIPE_SZ', grown, children_grew) if grown or children_grew else \
                print('refused F_SETPIPE_SZ', refused)
            print('pipes', len(pipes))
            hold()""", ("ok",), ("refused F_SETPIPE_SZ 1", "pipes 59"), probe="pipes"),
    ]


def lock_cases() -> list[Case]:
    """Locks on the host inodes the root binds (interpreter, libc, loader cache, stdlib, /dev/null):
    the host takes the same locks while the program holds whatever it got."""
    files = """
            import fcntl, struct
            files = [sys.executable, os.__file__, '/etc/ld.so.cache', '/dev/null']
            try:
                files += sorted({line.split()[-1] for line in open('/proc/self/maps') if '/libc.so' in line})
            except OSError:
                pass  # no /proc in this user namespace: the other files still share their inodes
            handles = []
            """
    return [
        Case("flock_on_host_files", files + """
            for path in files:
                handle = open(path, 'rb')
                handles.append(handle)
                for name, operation in (('exclusive', fcntl.LOCK_EX), ('shared', fcntl.LOCK_SH)):
                    try:
                        fcntl.flock(handle, operation | fcntl.LOCK_NB)
                        print('ESCAPED', name, 'flock on', path)
                        break
                    except OSError as error:
                        print('refused', name, 'flock', os.path.basename(path), error.errno)
            hold({'files': files})""", ("ok",), ("refused exclusive flock ld.so.cache 1", "refused shared flock null 1"),
             probe="locks"),
        Case("posix_and_ofd_locks_on_host_files", files + """
            for path in files:
                writable = path == '/dev/null'
                handle = open(path, 'r+b' if writable else 'rb')
                handles.append(handle)
                kind = fcntl.F_WRLCK if writable else fcntl.F_RDLCK  # a read-only file takes read locks
                for name, command in (('posix', fcntl.F_SETLK), ('ofd', fcntl.F_OFD_SETLK), ('query', fcntl.F_GETLK)):
                    try:  # struct flock: type, whence, start, length (0: to the end), pid
                        fcntl.fcntl(handle, command, struct.pack('hhqqi4x', kind, 0, 0, 0, 0))
                        print('ESCAPED', name, 'lock on', path)
                    except OSError as error:
                        print('refused', name, os.path.basename(path), error.errno)
                try:
                    fcntl.fcntl(handle, fcntl.F_SETLEASE, fcntl.F_RDLCK)
                    print('ESCAPED lease on', path)
                except OSError as error:
                    print('refused lease', os.path.basename(path), error.errno)
            try:  # the cost: its own files take no locks either (sqlite3 needs ':memory:')
                fcntl.lockf(open('mine', 'w'), fcntl.LOCK_EX | fcntl.LOCK_NB)
                print('own file locked')
            except OSError as error:
                print('own file lock refused', error.errno)
            hold({'files': files})""", ("ok",), ("refused posix null 1", "refused ofd null 1", "refused posix os.py 1"),
             probe="locks"),
    ]
