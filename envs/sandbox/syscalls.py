"""The seccomp policy: the system calls a Python test program may make (an allow-list).

Everything not listed fails with EPERM. Left out on purpose, among others: io_uring (it
opens sockets and files without the calls checked here), keyctl / add_key / request_key
(kernel keyrings outlive the run), bpf, perf_event_open, ptrace, process_vm_*, userfaultfd,
memfd_create (unaccounted shared memory), SysV message queues and semaphores, mount,
umount, pivot_root, chroot, unshare, setns, set*uid / set*gid, chown, personality, kexec,
reboot, module loading, flock (the root's files are the host's inodes: a lock there holds
against the host), sendmsg / sendmmsg (SCM_RIGHTS would keep sockets alive in flight, past
the descriptor limit that bounds their buffers; send / sendto remain). Some calls are
allowed only with safe arguments (checked in BPF): socket() for AF_INET / AF_INET6 only (the
network namespace has no route out; AF_UNIX could reach a socket file or, through a datagram
socket, any host listener), socketpair() for AF_UNIX SOCK_STREAM only (asyncio's and
multiprocessing's self-pipes: a connected stream pair cannot be pointed elsewhere), fcntl()
with the commands of FCNTL_ALLOWED only and F_SETFL without O_DIRECT, open() and openat()
without O_DIRECT (HOST_READ_FLAGS says why), setsockopt() without the buffer-size options,
clone() without any CLONE_NEW* flag, prlimit64() on the caller itself only (in
user-namespace mode the reaper shares the program's uid, and lowering its limits would end
the run unreported). clone3 hides its flags in memory, so it gets ENOSYS and libc falls back
to clone. Numbers are from the kernel's asm/unistd_64.h (x86_64) and asm-generic/unistd.h
(aarch64).
"""
from __future__ import annotations

import errno
import functools
import struct

# Allowed without conditions (the legacy names x86_64 still has are missing on aarch64).
ALLOWED = {
    "x86_64": {
    'accept': 43, 'accept4': 288, 'access': 21, 'alarm': 37, 'arch_prctl': 158, 'bind': 49, 'brk': 12,
    'chdir': 80, 'chmod': 90, 'clock_getres': 229, 'clock_gettime': 228, 'clock_nanosleep': 230,     'close': 3, 'close_range': 436, 'connect': 42, 'copy_file_range': 326, 'creat': 85, 'dup': 32, 'dup2': 33,
    'dup3': 292, 'epoll_create': 213, 'epoll_create1': 291, 'epoll_ctl': 233, 'epoll_pwait': 281,
    'epoll_pwait2': 441, 'epoll_wait': 232, 'eventfd': 284, 'eventfd2': 290, 'execve': 59, 'execveat': 322,
    'exit': 60, 'exit_group': 231, 'faccessat': 269, 'faccessat2': 439, 'fadvise64': 221, 'fallocate': 285,
    'fchdir': 81, 'fchmod': 91, 'fchmodat': 268, 'fdatasync': 75, 'fgetxattr': 193,
    'flistxattr': 196, 'fork': 57, 'fstat': 5, 'fstatfs': 138, 'fsync': 74, 'ftruncate': 77,
    'futex': 202, 'futimesat': 261, 'get_robust_list': 274, 'getcpu': 309, 'getcwd': 79, 'getdents': 78,
    'getdents64': 217, 'getegid': 108, 'geteuid': 107, 'getgid': 104, 'getgroups': 115, 'getitimer': 36,
    'getpeername': 52, 'getpgid': 121, 'getpgrp': 111, 'getpid': 39, 'getppid': 110, 'getpriority': 140,
    'getrandom': 318, 'getresgid': 120, 'getresuid': 118, 'getrlimit': 97, 'getrusage': 98, 'getsid': 124,
    'getsockname': 51, 'getsockopt': 55, 'gettid': 186, 'gettimeofday': 96, 'getuid': 102, 'getxattr': 191,
    'ioctl': 16, 'kill': 62, 'lgetxattr': 192, 'link': 86, 'linkat': 265, 'listen': 50, 'listxattr': 194,
    'llistxattr': 195, 'lseek': 8, 'lstat': 6, 'madvise': 28, 'mincore': 27, 'mkdir': 83, 'mkdirat': 258,
    'mmap': 9, 'mprotect': 10, 'mremap': 25, 'msync': 26, 'munmap': 11, 'nanosleep': 35, 'newfstatat': 262,
    'pause': 34, 'pipe': 22, 'pipe2': 293, 'poll': 7, 'ppoll': 271, 'prctl': 157,
    'pread64': 17, 'preadv': 295, 'preadv2': 327, 'pselect6': 270, 'pwrite64': 18,
    'pwritev': 296, 'pwritev2': 328, 'read': 0, 'readahead': 187, 'readlink': 89, 'readlinkat': 267,
    'readv': 19, 'recvfrom': 45, 'recvmmsg': 299, 'recvmsg': 47, 'rename': 82, 'renameat': 264,
    'renameat2': 316, 'restart_syscall': 219, 'rmdir': 84, 'rseq': 334, 'rt_sigaction': 13,
    'rt_sigpending': 127, 'rt_sigprocmask': 14, 'rt_sigqueueinfo': 129, 'rt_sigreturn': 15,
    'rt_sigsuspend': 130, 'rt_sigtimedwait': 128, 'sched_get_priority_max': 146, 'sched_get_priority_min': 147,
    'sched_getaffinity': 204, 'sched_getparam': 143, 'sched_getscheduler': 145, 'sched_rr_get_interval': 148,
    'sched_setaffinity': 203, 'sched_yield': 24, 'select': 23, 'sendfile': 40, 
    'sendto': 44, 'set_robust_list': 273, 'set_tid_address': 218, 'setitimer': 38, 'setpgid': 109,
    'setpriority': 141, 'setrlimit': 160, 'setsid': 112, 'shmat': 30, 'shmctl': 31,
    'shmdt': 67, 'shmget': 29, 'shutdown': 48, 'sigaltstack': 131, 'signalfd': 282, 'signalfd4': 289,
    'splice': 275, 'stat': 4, 'statfs': 137, 'statx': 332, 'symlink': 88,
    'symlinkat': 266, 'sysinfo': 99, 'tee': 276, 'tgkill': 234, 'time': 201, 'timer_create': 222,
    'timer_delete': 226, 'timer_getoverrun': 225, 'timer_gettime': 224, 'timer_settime': 223,
    'timerfd_create': 283, 'timerfd_gettime': 287, 'timerfd_settime': 286, 'times': 100, 'tkill': 200,
    'truncate': 76, 'umask': 95, 'uname': 63, 'unlink': 87, 'unlinkat': 263, 'utime': 132, 'utimensat': 280,
    'utimes': 235, 'vfork': 58, 'wait4': 61, 'waitid': 247, 'write': 1, 'writev': 20,
    },
    "aarch64": {
    'accept': 202, 'accept4': 242, 'bind': 200, 'brk': 214, 'chdir': 49, 'clock_getres': 114,
    'clock_gettime': 113, 'clock_nanosleep': 115, 'close': 57, 'close_range': 436,
    'connect': 203, 'copy_file_range': 285, 'dup': 23, 'dup3': 24, 'epoll_create1': 20, 'epoll_ctl': 21,
    'epoll_pwait': 22, 'epoll_pwait2': 441, 'eventfd2': 19, 'execve': 221, 'execveat': 281, 'exit': 93,
    'exit_group': 94, 'faccessat': 48, 'faccessat2': 439, 'fadvise64': 223, 'fallocate': 47, 'fchdir': 50,
    'fchmod': 52, 'fchmodat': 53, 'fdatasync': 83, 'fgetxattr': 10, 'flistxattr': 13, 
    'fstat': 80, 'fstatat': 79, 'fstatfs': 44, 'fsync': 82, 'ftruncate': 46, 'futex': 98,
    'get_robust_list': 100, 'getcpu': 168, 'getcwd': 17, 'getdents64': 61, 'getegid': 177, 'geteuid': 175,
    'getgid': 176, 'getgroups': 158, 'getitimer': 102, 'getpeername': 205, 'getpgid': 155, 'getpid': 172,
    'getppid': 173, 'getpriority': 141, 'getrandom': 278, 'getresgid': 150, 'getresuid': 148, 'getrlimit': 163,
    'getrusage': 165, 'getsid': 156, 'getsockname': 204, 'getsockopt': 209, 'gettid': 178, 'gettimeofday': 169,
    'getuid': 174, 'getxattr': 8, 'ioctl': 29, 'kill': 129, 'lgetxattr': 9, 'linkat': 37, 'listen': 201,
    'listxattr': 11, 'llistxattr': 12, 'lseek': 62, 'madvise': 233, 'mincore': 232, 'mkdirat': 34, 'mmap': 222,
    'mprotect': 226, 'mremap': 216, 'msync': 227, 'munmap': 215, 'nanosleep': 101, 'newfstatat': 79,
    'pipe2': 59, 'ppoll': 73, 'prctl': 167, 'pread64': 67, 'preadv': 69, 'preadv2': 286,
    'pselect6': 72, 'pwrite64': 68, 'pwritev': 70, 'pwritev2': 287, 'read': 63,
    'readahead': 213, 'readlinkat': 78, 'readv': 65, 'recvfrom': 207, 'recvmmsg': 243, 'recvmsg': 212,
    'renameat': 38, 'renameat2': 276, 'restart_syscall': 128, 'rseq': 293, 'rt_sigaction': 134,
    'rt_sigpending': 136, 'rt_sigprocmask': 135, 'rt_sigqueueinfo': 138, 'rt_sigreturn': 139,
    'rt_sigsuspend': 133, 'rt_sigtimedwait': 137, 'sched_get_priority_max': 125, 'sched_get_priority_min': 126,
    'sched_getaffinity': 123, 'sched_getparam': 121, 'sched_getscheduler': 120, 'sched_rr_get_interval': 127,
    'sched_setaffinity': 122, 'sched_yield': 124, 'sendfile': 71, 
    'sendto': 206, 'set_robust_list': 99, 'set_tid_address': 96, 'setitimer': 103, 'setpgid': 154,
    'setpriority': 140, 'setrlimit': 164, 'setsid': 157, 'shmat': 196, 'shmctl': 195,
    'shmdt': 197, 'shmget': 194, 'shutdown': 210, 'sigaltstack': 132, 'signalfd4': 74,     'splice': 76, 'statfs': 43, 'statx': 291, 'symlinkat': 36, 'sysinfo': 179, 'tee': 77,
    'tgkill': 131, 'timer_create': 107, 'timer_delete': 111, 'timer_getoverrun': 109, 'timer_gettime': 108,
    'timer_settime': 110, 'timerfd_create': 85, 'timerfd_gettime': 87, 'timerfd_settime': 86, 'times': 153,
    'tkill': 130, 'truncate': 45, 'umask': 166, 'uname': 160, 'unlinkat': 35, 'utimensat': 88, 'wait4': 260,
    'waitid': 95, 'write': 64, 'writev': 66,
    },
}
# Checked on their arguments, or needed by the launcher before the filter is installed.
SPECIAL = {
    "x86_64": {'socket': 41, 'socketpair': 53, 'fcntl': 72, 'setsockopt': 54, 'clone': 56, 'clone3': 435, 'pivot_root': 155, 'mount_setattr': 442, 'keyctl': 250, 'umount2': 166, 'mount': 165, 'setgroups': 116, 'prlimit64': 302, 'open': 2, 'openat': 257},
    "aarch64": {'socket': 198, 'socketpair': 199, 'fcntl': 25, 'setsockopt': 208, 'clone': 220, 'clone3': 435, 'pivot_root': 41, 'mount_setattr': 442, 'keyctl': 219, 'umount2': 39, 'mount': 40, 'setgroups': 159, 'prlimit64': 261, 'openat': 56},
}
# AUDIT_ARCH_* values: a call made through another ABI (x32, ia32) is killed.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
CONDITIONAL = ("socket", "socketpair", "fcntl", "setsockopt", "clone", "clone3", "prlimit64", "open", "openat")
# fcntl commands a program may use (descriptor flags, status flags, dup, reading a pipe's size).
# Refused, among others: every lock command (F_SETLK, F_SETLKW, F_GETLK, F_OFD_*: the root's
# files are the host's inodes, so a lock there holds against the host and other runs),
# F_SETLEASE, F_NOTIFY, F_SETOWN*/F_SETSIG (signals to a chosen process), F_SETPIPE_SZ (it
# spends the uid's pipe budget, shared with the host in user-namespace mode), F_ADD_SEALS.
FCNTL_ALLOWED = (0, 1, 2, 3, 1030, 1032)  # DUPFD GETFD SETFD GETFL DUPFD_CLOEXEC GETPIPE_SZ
F_SETFL = 4  # allowed without HOST_READ_FLAGS (O_NONBLOCK, O_APPEND, O_ASYNC, O_NOATIME only touch its own side)
# Status flags that change how the host reads the program's pipes: O_DIRECT, the only one. It
# makes a pipe's writes packets: every host read() returns one write(), so 1-byte writes cost the
# trainer a read call per byte (500,000 calls, 2.5-4.6 s of its CPU per run, measured). Refused in
# F_SETFL and in open()/openat() (reopening /proc/self/fd/1 would give a new description with it);
# no ioctl sets it. The other F_SETFL flags act on the program's side only (O_ASYNC signals the
# descriptor's owner, and none can be set: hostile_supervisors.py). Its value differs by arch.
HOST_READ_FLAGS = {"x86_64": 0o40000, "aarch64": 0o200000}
# setsockopt(SOL_SOCKET, ...) options refused: SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE.
# Socket buffers are kernel memory RLIMIT_AS does not count; at the host's default size the
# descriptor limit bounds them (docs/sandbox.md).
SOCKET_BUFFER_OPTIONS = (7, 8, 32, 33)


def policy(machine: str) -> dict:
    """What the launcher needs to build the filter on `machine` (os.uname().machine)."""
    if machine not in ALLOWED:
        raise OSError(f"no seccomp policy for {machine} (x86_64 and aarch64 are supported)")
    allowed = ALLOWED[machine]
    for name in CONDITIONAL:
        if name in allowed:  # a table edit must not silently drop an argument check
            raise AssertionError(f"{name} must only be allowed with its argument check")
    shm = sorted(allowed[name] for name in ("shmget", "shmat", "shmctl", "shmdt"))  # refused without shm limits
    return {"arch": AUDIT_ARCH[machine], "allow": sorted(set(allowed.values())), "shm": shm,
            "host_read_flags": HOST_READ_FLAGS[machine], **SPECIAL[machine]}


CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
LD, JEQ, JGE, JSET, JA, AND, RET = 0x20, 0x15, 0x35, 0x45, 0x05, 0x54, 0x06  # classic BPF opcodes (K forms)
ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x50000 | errno.EPERM, 0x50000 | errno.ENOSYS  # SECCOMP_RET_ERRNO | errno


def assemble(machine: str, shm_allowed: bool) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) rows. seccomp_data: nr at 0, arch at 4, args from 16.
    Allowed numbers come as "if equal fall through to RET ALLOW, else skip it" pairs, so
    no jump is long; the checked calls have their own short blocks."""
    p = policy(machine)
    allow = [n for n in p["allow"] if shm_allowed or n not in p["shm"]]
    code = [
        (None, LD, 4, None, None), (None, JEQ, p["arch"], "nr", None), (None, RET, KILL, None, None),
        ("nr", LD, 0, None, None), (None, JGE, 0x40000000, "enosys", None),  # the x32 ABI
        (None, JEQ, p["clone3"], "enosys", None), (None, JEQ, p["socket"], "socket", None),
        (None, JEQ, p["socketpair"], "pair", None), (None, JEQ, p["clone"], "clone", None),
        (None, JEQ, p["prlimit64"], "prlimit", None), (None, JEQ, p["fcntl"], "fcntl", None),
        (None, JEQ, p["setsockopt"], "sockopt", None), (None, JEQ, p["openat"], "openat", None),
        *([(None, JEQ, p["open"], "open", None)] if "open" in p else []), (None, JA, "chain", None, None),
        ("enosys", RET, ENOSYS, None, None),
        ("socket", LD, 16, None, None), (None, JEQ, 2, "ok1", None), (None, JEQ, 10, "ok1", None),  # INET, INET6
        (None, RET, EPERM, None, None), ("ok1", RET, ALLOW, None, None),
        ("pair", LD, 16, None, None), (None, JEQ, 1, None, "no2"), (None, LD, 24, None, None),  # AF_UNIX and
        (None, AND, 0xF, None, None), (None, JEQ, 1, "ok2", None), ("no2", RET, EPERM, None, None),  # STREAM
        ("ok2", RET, ALLOW, None, None),
        ("clone", LD, 16, None, None), (None, JSET, CLONE_NEW_ANY, "no3", None), (None, RET, ALLOW, None, None),
        ("no3", RET, EPERM, None, None),
        ("prlimit", LD, 16, None, None), (None, JEQ, 0, "ok4", None), (None, RET, EPERM, None, None),  # pid 0
        ("ok4", RET, ALLOW, None, None),
        ("fcntl", LD, 24, None, None),  # the command (an int: the low word is all the kernel reads)
        *[(None, JEQ, command, "ok5", None) for command in FCNTL_ALLOWED],
        (None, JEQ, F_SETFL, None, "no5"), (None, LD, 32, None, None),  # F_SETFL: its flags (arg 2)
        (None, JSET, p["host_read_flags"], "no5", None),
        ("ok5", RET, ALLOW, None, None), ("no5", RET, EPERM, None, None),
        ("openat", LD, 32, None, None), (None, JSET, p["host_read_flags"], "no7", None),  # openat's flags: arg 2
        (None, RET, ALLOW, None, None), ("no7", RET, EPERM, None, None),
        ("open", LD, 24, None, None), (None, JSET, p["host_read_flags"], "no8", None),  # open's flags: arg 1
        (None, RET, ALLOW, None, None), ("no8", RET, EPERM, None, None),
        ("sockopt", LD, 24, None, None), (None, JEQ, 1, None, "ok6"), (None, LD, 32, None, None),  # SOL_SOCKET:
        *[(None, JEQ, option, "no6", None) for option in SOCKET_BUFFER_OPTIONS],  # the option name
        ("ok6", RET, ALLOW, None, None), ("no6", RET, EPERM, None, None),
    ]
    rows, labels = [], {}
    for label, op, k, jt, jf in code:
        if label:
            labels[label] = len(rows)
        rows.append((op, k, jt, jf))
    labels["chain"] = len(rows)
    for number in allow:
        rows += [(JEQ, number, None, 1), (RET, ALLOW, None, None)]
    rows.append((RET, EPERM, None, None))

    def offset(here: int, target) -> int:
        distance = 0 if target is None else target if isinstance(target, int) else labels[target] - here - 1
        if not 0 <= distance < 256:
            raise AssertionError(f"seccomp program: a jump of {distance} at row {here}")
        return distance
    out = []
    for i, (op, k, jt, jf) in enumerate(rows):
        if op == JA:
            out.append((op, 0, 0, labels[k] - i - 1))
        else:
            out.append((op, offset(i, jt), offset(i, jf), k))
    return out


@functools.lru_cache(maxsize=None)
def filter_hex(machine: str, shm_allowed: bool) -> str:
    """The filter as struct sock_filter[] bytes (hex, for the launcher's config)."""
    return b"".join(struct.pack("=HBBI", *row) for row in assemble(machine, shm_allowed)).hex()


def evaluate(machine: str, shm_allowed: bool, nr: int, args: tuple[int, ...] = (), arch: int | None = None) -> int:
    """Run the filter on one call, as the kernel would (for tests): the SECCOMP_RET_* value."""
    rows = assemble(machine, shm_allowed)
    data = [nr, AUDIT_ARCH[machine] if arch is None else arch, 0, 0]  # nr, arch, ip (2 words)
    for value in (tuple(args) + (0,) * 6)[:6]:
        data += [value & 0xFFFFFFFF, value >> 32]
    pc, accumulator = 0, 0
    while True:
        op, jt, jf, k = rows[pc]
        if op == LD:
            accumulator = data[k // 4]
        elif op == AND:
            accumulator &= k
        elif op == RET:
            return k
        elif op == JA:
            pc += k
        else:
            taken = {JEQ: accumulator == k, JGE: accumulator >= k, JSET: bool(accumulator & k)}[op]
            pc += jt if taken else jf
        pc += 1
