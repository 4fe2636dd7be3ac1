"""Sandbox throughput: executions/s of a trivial program, beside a bare interpreter start.

    python benchmarks/sandbox_throughput.py [--seconds 3] [--threads 1,2,4] [--skip-env]

Prints one JSON object. `sandbox` runs `print(1)` through envs.sandbox.run_python (new
namespaces, read-only remounts, limits, uid drop, seccomp, output capture, cleanup);
`bare_subprocess` runs the same program with `subprocess.run([python, -I, -S, -c, ...])`
and no isolation, so `sandbox_vs_bare` is the price of the isolation on this machine.
`deepcoder_steps_per_s` is whole env steps (every test of a built-in problem, each in its
own sandbox) answered with the reference solution. Compare ratios within one run: the
absolute numbers move with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs import sandbox  # noqa: E402
from envs.sandbox import run_python  # noqa: E402

PROGRAM = "print(1)"


def rate(run_once, seconds: float, threads: int) -> dict:
    """Calls of `run_once` per second with `threads` callers, for about `seconds`."""
    deadline = time.perf_counter() + seconds
    counts = [0] * threads

    def worker(index: int) -> None:
        while time.perf_counter() < deadline:
            run_once()
            counts[index] += 1

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(worker, range(threads)))
    elapsed = time.perf_counter() - started
    return {"runs": sum(counts), "per_s": round(sum(counts) / elapsed, 2)}


def sandbox_once() -> None:
    result = run_python(PROGRAM)
    if result.verdict != "ok" or result.stdout != "1\n":
        raise RuntimeError(f"the sandbox failed the trivial program: {result}")


def bare_once() -> None:
    subprocess.run([sys.executable, "-I", "-S", "-c", PROGRAM], capture_output=True, check=True)


def deepcoder_steps(seconds: float) -> dict:
    import envs.deepcoder  # noqa: F401  (registers the env)
    import envs
    from envs.parsing import format_response

    env = envs.make("deepcoder")
    steps = tests = 0
    seed = 0
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        env.reset(seed=seed)
        seed += 1
        _, reward, _, _, info = env.step(format_response([env.problem.solution], think="benchmark"))
        if reward != 1.0:
            raise RuntimeError(f"a reference solution failed: {info['action_infos']}")
        steps += 1
        tests += info["action_infos"][0]["total"]
    elapsed = time.perf_counter() - started
    return {"steps": steps, "steps_per_s": round(steps / elapsed, 2), "tests_per_s": round(tests / elapsed, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per measurement")
    parser.add_argument("--threads", default="1,2,4", help="comma-separated caller thread counts")
    parser.add_argument("--skip-env", action="store_true", help="skip the deepcoder env measurement")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    # Let every caller thread run at once, so the figure is the machine's, not our queue's.
    sandbox._SLOTS = threading.BoundedSemaphore(max(threads + [2]))

    sandbox_once()  # warm the page cache before timing
    report: dict = {"machine": platform.machine(), "cpus": os.cpu_count(), "mode": sandbox.sandbox_mode(),
                    "python": platform.python_version(), "seconds_per_measurement": args.seconds}
    for count in threads:
        boxed = rate(sandbox_once, args.seconds, count)
        bare = rate(bare_once, args.seconds, count)
        report[f"threads_{count}"] = {"sandbox": boxed, "bare_subprocess": bare,
                                      "sandbox_vs_bare": round(boxed["per_s"] / bare["per_s"], 3)}
    if not args.skip_env:
        report["deepcoder_steps"] = deepcoder_steps(args.seconds)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
