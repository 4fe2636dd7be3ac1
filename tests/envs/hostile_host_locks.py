"""Hostile cases that lock host inodes the sandbox's root binds (flock, POSIX and OFD locks,
leases); each holds while the host takes the same locks (tests/envs/sandbox_probes.py)."""

from __future__ import annotations

from tests.envs.hostile_case import Case


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
