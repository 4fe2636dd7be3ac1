"""Hostile cases that hoard kernel memory RLIMIT_AS does not count: socket buffers, socket pairs
kept alive in flight, pipes grown towards the uid's budget. Each holds while the host probes
what the kernel keeps for it (tests/envs/sandbox_probes.py)."""

from __future__ import annotations

from tests.envs.hostile_case import Case


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
