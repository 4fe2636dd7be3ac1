"""Do hostile cases always get the same verdict? Runs both hostile suites N times (all cases of a
round at once, as the tests do, the holding ones probed by the host as the tests probe them)
while a busy loop holds a core, and prints JSON: per case, the verdicts seen; `flaky` lists
cases that got more than one; `failed` lists runs the tests would fail (verdict, printed
text, exit code or what the host's probe found), by round.

    python tests/envs/sandbox_flake_check.py [--rounds 10] [--no-busy] [--unprivileged]

`--unprivileged` also runs the second suite as uid 65534 (user-namespace mode) each round,
as test_sandbox_hostile.test_unprivileged_user_namespace_mode does (root only).

A tool run by hand (minutes), not a test: pytest collects only test_*.py. It lives here because
it reruns the cases that tests/envs/test_sandbox.py and tests/envs/hostile_programs.py define.
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
import textwrap
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a script: import the suites as pytest does

from envs import sandbox  # noqa: E402
from envs.sandbox import run_python  # noqa: E402
from tests.envs import hostile_case, hostile_programs as hostile  # noqa: E402
from tests.envs import test_sandbox as plain, test_sandbox_hostile as judged  # noqa: E402
from tests.envs.sandbox_probes import ProbeContext, Prober  # noqa: E402


def judge_plain(case, result) -> None:
    """What test_sandbox.test_hostile_case_is_contained asserts of the run itself."""
    assert result.verdict in case.verdicts and result.message, (result.verdict, result.message)
    for text in case.forbidden:
        assert text not in result.stdout and text not in result.stderr, text


def host_objects(directory: Path) -> tuple[plain.Host, hostile_case.Host]:
    listener = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(directory / "daemon.sock"))
    unix.listen()
    victim = directory / "precious.txt"
    victim.write_text("keep me")
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    return (plain.Host(directory, victim, None, listener.getsockname()[1], listener, unix),
            hostile_case.Host(directory, listener.getsockname()[1], udp.getsockname()[1], "x", None))


def one_round(first_host, second_host, seen, failed, number: int, unprivileged: str | None) -> None:
    """Both suites at once (fresh cases, so fresh probe markers), then the userns run if asked."""
    first, second = plain.hostile_cases(first_host), hostile.hostile_cases(second_host)
    table = ([(f"test_sandbox:{c.name}", c, textwrap.dedent(c.program), "", c.limits) for c in first]
             + [(f"hostile:{c.name}", c, c.program, c.stdin, hostile_case.ROOMY) for c in second])
    with Prober(second, ProbeContext(sandbox.sandbox_mode())) as prober, \
            ThreadPoolExecutor(max_workers=len(table)) as pool:
        results = list(pool.map(lambda entry: run_python(entry[2], entry[3], entry[4]), table))
    for (name, case, *_), result in zip(table, results):
        seen[name].append(result.verdict)
        try:
            if name.startswith("hostile:"):
                judged.judge(case, result.verdict, result.stdout, result.stderr, result.exit_code,
                             prober.problems.get(case.name))
            else:
                judge_plain(case, result)
        except AssertionError as error:
            failed[name].append(f"round {number}: {str(error)[:300]}")
    if unprivileged:
        cases = hostile.hostile_cases(second_host, total_guard=False)
        for case, (row, problems) in zip(cases, judged.run_unprivileged(cases, unprivileged)):
            seen[f"userns:{case.name}"].append(row[0])
            try:
                judged.judge_unprivileged(case, row, problems)
            except AssertionError as error:
                failed[f"userns:{case.name}"].append(f"round {number}: {str(error)[:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--no-busy", action="store_true", help="do not start the busy loop")
    parser.add_argument("--unprivileged", action="store_true", help="also run the second suite as uid 65534")
    args = parser.parse_args()
    python = judged._unprivileged_python() if args.unprivileged and os.geteuid() == 0 else None
    if args.unprivileged and python is None:
        parser.error("--unprivileged needs root and an interpreter uid 65534 may run")
    busy = None if args.no_busy else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    seen: dict[str, list[str]] = defaultdict(list)
    failed: dict[str, list[str]] = defaultdict(list)
    sandbox._SLOTS = threading.BoundedSemaphore(8)  # as the test fixtures do
    started = time.monotonic()
    try:
        # as the suites' fixtures: outside the temp dir the sandbox covers, where the host allows it
        public = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
        with tempfile.TemporaryDirectory(prefix="ragen2-flake-", dir=public) as directory:
            os.chmod(directory, 0o777)
            first_host, second_host = host_objects(Path(directory))
            for number in range(args.rounds):
                one_round(first_host, second_host, seen, failed, number, python)
    finally:
        if busy is not None:
            busy.send_signal(signal.SIGKILL)
            busy.wait()
    flaky = {name: verdicts for name, verdicts in seen.items() if len(set(verdicts)) > 1}
    print(json.dumps({"rounds": args.rounds, "busy_loop": busy is not None, "unprivileged": bool(python),
                      "cases": len(seen), "seconds": round(time.monotonic() - started, 1),
                      "load_average": os.getloadavg(), "flaky": flaky, "failed": dict(failed),
                      "verdicts": {name: sorted(set(v)) for name, v in seen.items()}}, indent=1))


if __name__ == "__main__":
    main()
