# The sandbox launcher. The host runs this file's text as `python -I -S -c TEXT CONFIG`
# (it is not imported: starting it imports only what it needs). Three processes:
#   launcher (host PID namespace): joins the run's memory cgroup, creates the namespaces,
#       builds the allow-listed root in a tmpfs, forks the reaper, waits;
#   reaper (pid 1 of the new PID namespace): mounts /proc, limits SysV shm, makes the root
#       read-only, mounts the work dir, pivots into the root, forks the program, reaps
#       everything, reports the program's exit on the status pipe; its exit ends the
#       namespace, so the kernel kills whatever the program left behind;
#   program: leaves our session and process group, drops to a fresh uid (root mode) or no
#       capabilities (user namespace), sets limits, installs the seccomp allow-list
#       (assembled by the host), runs the code.
# The program must not reach its supervisors: in its own session it can name neither the
# launcher's group nor (outside its PID namespace) the launcher; the reaper, its namespace's
# init, has no signal handler, so the kernel drops every signal sent to it from inside; both
# are non-dumpable, so their /proc files are root's, not the program's uid's (userns mode).
import ctypes, os, resource, sys, builtins, atexit, errno, _signal

C = eval(sys.argv[1], {"__builtins__": {}})  # a dict literal the host wrote (repr of str/int/list/tuple)
STATUS, SYS, ROOT, WORK = C["status_fd"], C["syscalls"], C["root"], C["work"]  # SYS: numbers the launcher calls
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
libc.syscall.restype = ctypes.c_long
NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = (
    0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
KEPT_FLAGS = {"nosuid": NOSUID, "nodev": NODEV, "noexec": NOEXEC, "noatime": 1024, "nodiratime": 2048,
              "relatime": 1 << 21}
INSIDE_UID = 1000  # userns mode: the caller's uid as seen inside (not 0, so exec drops capabilities)
USERNS = C["mode"] == "userns"


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


def write(path, text):
    with open(path, "w") as handle:
        handle.write(text)


def build_root(inputs):
    """The program's filesystem: an empty tmpfs holding only what the host's plan lists (the
    interpreter, its shared libraries, its standard library, a few device nodes)."""
    mount("tmpfs", ROOT, "tmpfs", NOSUID | NODEV, "size=1m,nr_inodes=8192,mode=755")
    for kind, path, *rest in C["plan"]:
        target = ROOT + path
        if kind != "dir":
            os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        if kind == "dir":
            os.makedirs(target, 0o755, exist_ok=True)
        elif kind == "symlink":
            if not os.path.lexists(target):
                os.symlink(rest[0], target)
        elif kind == "file":
            if not os.path.exists(target):
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
            mount(path, target, None, BIND)
        elif kind == "tree":
            os.makedirs(target, 0o755, exist_ok=True)
            try:
                mount(path, target, None, BIND)
            except OSError as error:  # a mount below it would be revealed: take it along
                if error.errno != errno.EINVAL:
                    raise
                mount(path, target, None, BIND | REC)
        elif kind == "cover":  # an empty directory over what an allowed tree must not show
            mount("tmpfs", target, "tmpfs", NOSUID | NODEV, "size=4k,nr_inodes=16,mode=755")
    for name in ("proc", WORK.lstrip("/")):
        os.makedirs(os.path.join(ROOT, name), 0o755, exist_ok=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{ROOT}/dev/{name}")
    return inputs


def make_read_only():
    """Every mount of the root read-only and nosuid, in one call where the kernel has it."""
    attr = (ctypes.c_uint64 * 4)(RDONLY | NOSUID, 0, 0, 0)  # struct mount_attr: set, clear, propagation, userns
    if libc.syscall(SYS["mount_setattr"], -100, ROOT.encode(), 0x8000, ctypes.byref(attr), 32) == 0:
        return  # 0x8000: AT_RECURSIVE
    if ctypes.get_errno() not in (errno.ENOSYS, errno.EINVAL):
        check(-1, "mount_setattr")
    for fields in reversed([line.split() for line in open("/proc/self/mountinfo")]):  # kernels before 5.12
        point = fields[4].encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")
        if point == ROOT or point.startswith(ROOT + "/"):
            flags = REMOUNT | BIND | RDONLY | NOSUID | sum(KEPT_FLAGS.get(o, 0) for o in fields[5].split(","))
            mount(None, point, None, flags)


def isolate():
    check(libc.unshare(NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWPID | NEWNET | (NEWUSER if USERNS else 0)),
          "unshare (namespaces unavailable?)")
    if USERNS:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{INSIDE_UID} {C['uid']} 1"),
                           ("gid_map", f"{INSIDE_UID} {C['gid']} 1")):
            write(f"/proc/self/{name}", text)
    mount(None, "/", None, REC | PRIVATE)  # nothing below propagates back to the host
    inputs = {}
    for name in C["files"]:
        with open(os.path.join(C["inputs"], name), "rb") as handle:
            inputs[name] = handle.read()
    return build_root(inputs)


def finish_root(inputs):
    """In the reaper (pid 1 of the new PID namespace): /proc of this namespace only, shm limits,
    the root read-only, then the writable work dir; then the root replaces "/"."""
    make_read_only()
    status = {"proc": 0, "shm": 0}
    try:  # mounted after the read-only pass: the program may set its own oom_score_adj
        mount("proc", ROOT + "/proc", "proc", NOSUID | NODEV | NOEXEC)
        status["proc"] = 1
    except OSError:
        pass  # refused in some user namespaces: no /proc then (never the host's)
    if status["proc"] and C["shm_bytes"]:
        try:  # per IPC namespace; only the namespace's root may change them, and the program is not root
            for name, value in (("shmmax", C["shm_bytes"]), ("shmall", C["shm_bytes"] // 4096), ("shmmni", 32),
                                ("shm_rmid_forced", 1)):
                write(f"{ROOT}/proc/sys/kernel/{name}", str(value))
            status["shm"] = 1
        except OSError:
            pass  # then the seccomp filter refuses shmget
    owner = INSIDE_UID if USERNS else C["uid"]
    work = ROOT + WORK
    mount("tmpfs", work, "tmpfs", NOSUID | NODEV,
          f"size={C['limits']['disk']},nr_inodes=4096,mode=700,uid={owner},gid={owner}")
    for name, data in inputs.items():
        with open(os.path.join(work, name), "wb") as handle:
            handle.write(data)
    os.chdir(ROOT)
    check(libc.syscall(SYS["pivot_root"], b".", b"."), "pivot_root")
    check(libc.umount2(b".", 2), "umount the host's root")  # MNT_DETACH: the host's tree is gone from here
    os.chdir(WORK)
    return status


def install_seccomp(shm_allowed):
    """The host assembled the BPF (syscalls.py); here it is only handed to the kernel."""
    code = bytes.fromhex(C["seccomp"]["with_shm" if shm_allowed else "without_shm"])
    table = ctypes.create_string_buffer(code, len(code))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    program = Program(len(code) // 8, ctypes.addressof(table))
    check(libc.prctl(22, 2, ctypes.byref(program), 0, 0), "prctl(PR_SET_SECCOMP)")


def drop_privileges(shm_limited):
    os.setsid()  # kill(0, ...) and killpg() now reach the program's own processes only
    # Dumpable, so that in userns mode its /proc files are its own (the reaper's stay root's). In root
    # mode the uid switch below makes it non-dumpable again (the kernel's rule on a credential
    # change): its /proc/self files are root's there; it still reads them (a process always may).
    check(libc.prctl(4, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE, 1)")
    L = C["limits"]
    # RLIMIT_NPROC counts per uid within a user namespace (Linux >= 5.14): in userns mode the
    # launcher and the reaper share the program's uid there, so they are added.
    nproc = L["nproc"] + (2 if USERNS else 0)
    for limit, value in ((resource.RLIMIT_CORE, (0, 0)), (resource.RLIMIT_CPU, (L["cpu"], L["cpu"] + 1)),
                         (resource.RLIMIT_AS, (L["memory"],) * 2), (resource.RLIMIT_FSIZE, (L["fsize"],) * 2),
                         (resource.RLIMIT_NOFILE, (L["nofile"],) * 2), (resource.RLIMIT_NPROC, (nproc,) * 2)):
        resource.setrlimit(limit, value)
    try:
        write("/proc/self/oom_score_adj", "1000")  # under memory pressure the program goes first
    except OSError:
        pass
    # A fresh anonymous session keyring (owned by the launcher's uid, gone with the run): the
    # host's session keyring is no longer possessed, so not even /proc/keys lists its keys.
    libc.syscall(SYS["keyctl"], 1, None)  # KEYCTL_JOIN_SESSION_KEYRING; ENOSYS without keys: nothing to hide
    if not USERNS:
        os.setgroups([])  # the host user's supplementary groups stay behind
        os.setresgid(C["gid"], C["gid"], C["gid"])
        os.setresuid(C["uid"], C["uid"], C["uid"])  # leaving uid 0 drops every capability
    else:
        for cap in range(64):  # the bounding set, then every set: exec cannot bring one back
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP; EINVAL past the last capability
                break
        header, no_capabilities = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()  # v3 layout
        check(libc.capset(header, no_capabilities), "capset")
    check(libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    install_seccomp(shm_limited)
    os.environ.clear()
    os.environ.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME=WORK, TMPDIR=WORK, LANG="C.UTF-8")


def run_program():
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # KeyboardInterrupt, as in any Python
    main = type(sys)("__main__")
    main.__file__, main.__builtins__ = "program.py", builtins
    sys.modules["__main__"], sys.argv, sys.path[:0] = main, ["program.py"], [WORK]
    sys.executable = C["python"]
    limit_hit = []  # a MemoryError the interpreter would only print (atexit callbacks, __del__)

    def unraisable(info, default=sys.unraisablehook):
        if isinstance(info.exc_value, MemoryError):
            limit_hit.append(C["memory_exit"])
        default(info)
    sys.unraisablehook = unraisable
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
        os.write(2, b"MemoryError\n")  # print() itself may need memory
    except BaseException as error:
        number = getattr(error, "errno", None)
        limit_codes = {errno.ENOMEM: C["memory_exit"], errno.EFBIG: C["disk_exit"], errno.ENOSPC: C["disk_exit"]}
        status = limit_codes.get(number, 1)
        try:
            import traceback  # only now: most runs never need it
            traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        except MemoryError:
            status = C["memory_exit"]
            os.write(2, f"{type(error).__name__} (and MemoryError printing it)\n".encode())
    try:  # what the interpreter does at exit: join threads, run atexit callbacks, flush
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except MemoryError:
        limit_hit.append(C["memory_exit"])
    except BaseException:
        pass
    return limit_hit[0] if limit_hit and status in (0, 1) else status


def reaper(inputs):
    check(libc.prctl(1, 9, 0, 0, 0), "prctl(PR_SET_PDEATHSIG, SIGKILL)")
    status = finish_root(inputs)
    report(proc=status["proc"], shm=status["shm"], started=1)  # the wall clock starts now, not at launch
    child = os.fork()
    if child == 0:
        try:
            drop_privileges(status["shm"])
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
    # No handler: the kernel then drops every signal the program sends the reaper (a namespace's
    # init), where Python's SIGINT handler would turn one into a KeyboardInterrupt, an error verdict.
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    check(libc.prctl(1, 9, 0, 0, 0), "prctl(PR_SET_PDEATHSIG, SIGKILL)")  # the host dies: we die
    if os.getppid() != C["host_pid"]:
        os._exit(0)
    if C["cgroup"]:  # before anything is forked: every process of the run is counted
        write(C["cgroup"], str(os.getpid()))
    try:  # the reaper inherits it and the program raises its own (needs CAP_SYS_RESOURCE: best effort)
        write("/proc/self/oom_score_adj", "-1000")
    except OSError:
        pass
    files = isolate()
    # After the uid_map writes (a non-dumpable process's /proc files are root's): the reaper
    # inherits it, so the program cannot write /proc/1/{oom_score_adj,coredump_filter,clear_refs}
    # nor open /proc/1/fd/* (the status pipe) in userns mode, where it shares their uid.
    check(libc.prctl(4, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE, 0)")
    pid = os.fork()
    if pid == 0:
        try:
            reaper(files)
        except BaseException as error:
            report(setup_error=f"reaper: {type(error).__name__}: {error}")
        os._exit(0)
    _signal.alarm(C["limits"]["backstop"])  # if the host never kills us, we still end
    os.waitpid(pid, 0)
except BaseException as error:
    report(setup_error=f"{type(error).__name__}: {error}")
os._exit(0)
