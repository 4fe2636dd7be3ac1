"""Hostile cases against the sandbox's supervisors, the reaper (pid 1 inside) and the launcher:
signals to every pid and group, SIGIO ownership, writes to their /proc files. All of them hold
for the host's `supervisors` probe (tests/envs/sandbox_probes.py)."""

from __future__ import annotations

from tests.envs.hostile_case import Case


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
