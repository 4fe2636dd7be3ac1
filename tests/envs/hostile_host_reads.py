"""Hostile cases that try to make the host's reader pay: the pipe flags that turn every write into
a read of its own (O_DIRECT, set through fcntl or by opening the pipe again), and a program that
dribbles bytes for its whole wall-clock budget. The suite bounds every case's host CPU
(test_sandbox_hostile.HOST_CPU_BOUND); these are the cases that pushed it to seconds."""

from __future__ import annotations

from tests.envs.hostile_case import Case

# After the attempts, 1-byte writes as fast as the program can: with O_DIRECT each would be a
# host read() of its own (about 500,000 per run); refused, the host reads them in batches.
_ATTEMPTS = """
            import fcntl, time
            try:
                fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_DIRECT)
                print('ALLOWED O_DIRECT on stdout', flush=True)
            except OSError as error:
                print('F_SETFL O_DIRECT refused', error.errno, flush=True)
            try:
                os.dup2(os.open('/proc/self/fd/1', os.O_WRONLY | os.O_DIRECT), 1)
                print('ALLOWED a reopened stdout with O_DIRECT', flush=True)
            except OSError as error:
                print('reopen refused', error.errno, flush=True)
            os.set_blocking(1, False)  # O_NONBLOCK is the program's own business: allowed
            os.set_blocking(1, True)
            """


def host_read_cases() -> list[Case]:
    return [
        Case("o_direct_output_storm", _ATTEMPTS + """
            end = time.monotonic() + 4
            while time.monotonic() < end:
                os.write(1, b'x')""", ("ok", "output_limit"),
             ("F_SETFL O_DIRECT refused 1", "reopen refused 1")),
        Case("byte_dribble_with_pauses", """
            import time
            for _ in range(6000):  # a byte per millisecond: the host wakes for each unless it waits
                os.write(1, b'x')
                time.sleep(0.001)
            print('dribbled', flush=True)""", ("ok", "timeout"), ("dribbled",)),
    ]
