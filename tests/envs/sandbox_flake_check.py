"""Do hostile cases always get the same verdict? Runs both hostile suites N times (all cases of a
round at once, as the tests do) while a busy loop holds a core, and prints JSON: per case,
the verdicts seen; `flaky` lists cases that got more than one.

    python tests/envs/sandbox_flake_check.py [--rounds 10] [--no-busy]

A tool run by hand (minutes), not a test: pytest collects only test_*.py. It lives here because
it reruns the cases that tests/envs/test_sandbox.py and tests/envs/hostile_programs.py define; run as
a script, this folder is on sys.path, so it imports them as plain modules.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import test_sandbox as plain
import hostile_programs as hostile
from envs import sandbox
from envs.sandbox import run_python


def cases(directory: Path) -> list[tuple[str, str, str, object]]:
    """(suite:name, program, stdin, limits) for every case of both suites, against live host objects."""
    listener = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(directory / "daemon.sock"))
    unix.listen()
    victim = directory / "precious.txt"
    victim.write_text("keep me")
    first = plain.hostile_cases(plain.Host(directory, victim, None, listener.getsockname()[1], listener, unix))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    second = hostile.hostile_cases(hostile.Host(directory, listener.getsockname()[1], udp.getsockname()[1], "x", None))
    import textwrap
    return ([(f"test_sandbox:{c.name}", textwrap.dedent(c.program), "", c.limits) for c in first]
            + [(f"hostile:{c.name}", c.program, c.stdin, hostile.ROOMY) for c in second])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--no-busy", action="store_true", help="do not start the busy loop")
    args = parser.parse_args()
    busy = None if args.no_busy else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    seen: dict[str, list[str]] = defaultdict(list)
    sandbox._SLOTS = threading.BoundedSemaphore(8)  # as the test fixtures do
    started = time.monotonic()
    try:
        # as the suites' fixtures: outside the temp dir the sandbox covers, where the host allows it
        public = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
        with tempfile.TemporaryDirectory(prefix="ragen2-flake-", dir=public) as directory:
            os.chmod(directory, 0o777)
            table = cases(Path(directory))
            for _ in range(args.rounds):
                with ThreadPoolExecutor(max_workers=len(table)) as pool:
                    results = list(pool.map(lambda c: run_python(c[1], c[2], c[3]), table))
                for (name, *_), result in zip(table, results):
                    seen[name].append(result.verdict)
    finally:
        if busy is not None:
            busy.send_signal(signal.SIGKILL)
            busy.wait()
    flaky = {name: verdicts for name, verdicts in seen.items() if len(set(verdicts)) > 1}
    print(json.dumps({"rounds": args.rounds, "busy_loop": busy is not None, "cases": len(seen),
                      "seconds": round(time.monotonic() - started, 1), "load_average": os.getloadavg(),
                      "flaky": flaky, "verdicts": {name: sorted(set(v)) for name, v in seen.items()}}, indent=1))


if __name__ == "__main__":
    main()
