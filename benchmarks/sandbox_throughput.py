"""Sandbox throughput: executions/s of a trivial program, beside a bare interpreter start.

    python benchmarks/sandbox_throughput.py [--seconds 3] [--threads 1,2,4] [--skip-env] [--baseline REV]

Prints one JSON object. `sandbox` runs `print(1)` through envs.sandbox.run_python (new
namespaces, read-only remounts, limits, uid drop, seccomp, output capture, cleanup);
`bare_subprocess` runs the same program with `subprocess.run([python, -I, -S, -c, ...])`
and no isolation, so `sandbox_vs_bare` is the price of the isolation on this machine.
`deepcoder_steps_per_s` is whole env steps (every test of a built-in problem, each in its
own sandbox) answered with the reference solution. Compare ratios within one run: the
absolute numbers move with the machine's load. `--baseline REV` also measures the sandbox
as it was at git revision REV (its envs/sandbox/ or envs/sandbox.py, loaded beside today's), alternating
the two in the same run, so `after_vs_before` compares like with like.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from envs import sandbox
from envs.sandbox import run_python
from ragen2.bench.machine import machine_info

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


def sandbox_once(runner=run_python) -> None:
    result = runner(PROGRAM)
    if result.verdict != "ok" or result.stdout != "1\n":
        raise RuntimeError(f"the sandbox failed the trivial program: {result}")


def load_baseline(revision: str):
    """The sandbox as it was at `revision`: the package envs/sandbox/ (or, before it was split,
    the single file envs/sandbox.py), loaded beside today's under another name."""
    root = Path(__file__).resolve().parents[1]
    where = Path(tempfile.mkdtemp(prefix="ragen2-baseline-"))
    package = subprocess.run(["git", "-C", str(root), "cat-file", "-e", f"{revision}:envs/sandbox/__init__.py"],
                             capture_output=True).returncode == 0
    if package:
        archive = subprocess.run(["git", "-C", str(root), "archive", revision, "envs/sandbox"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
        directory = where / "envs" / "sandbox"
        spec = importlib.util.spec_from_file_location("sandbox_baseline", directory / "__init__.py",
                                                      submodule_search_locations=[str(directory)])
    else:
        source = subprocess.run(["git", "-C", str(root), "show", f"{revision}:envs/sandbox.py"], capture_output=True,
                                text=True, check=True).stdout
        (where / "sandbox_baseline.py").write_text(source)
        spec = importlib.util.spec_from_file_location("sandbox_baseline", where / "sandbox_baseline.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_baseline"] = module  # dataclasses (and the package's relative imports) look it up
    spec.loader.exec_module(module)
    return module


def bare_once() -> None:
    subprocess.run([sys.executable, "-I", "-S", "-c", PROGRAM], capture_output=True, check=True)


def deepcoder_steps(seconds: float, runner=None) -> dict:
    import envs.deepcoder  # noqa: F401  (registers the env)
    import envs
    from envs.parsing import format_response

    # The baseline sandbox behind the same env code: every env module that calls run_python.
    users = [module for name, module in list(sys.modules.items())
             if name.startswith("envs.") and not name.startswith("envs.sandbox")
             and getattr(module, "run_python", None) is run_python]
    for module in users if runner is not None else ():
        module.run_python = runner

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
    for module in users:
        module.run_python = run_python
    return {"steps": steps, "steps_per_s": round(steps / elapsed, 2), "tests_per_s": round(tests / elapsed, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per measurement")
    parser.add_argument("--threads", default="1,2,4", help="comma-separated caller thread counts")
    parser.add_argument("--skip-env", action="store_true", help="skip the deepcoder env measurement")
    parser.add_argument("--baseline", default="", help="git revision whose sandbox to measure too")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of baseline and current (with --baseline)")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    # Let every caller thread run at once, so the figure is the machine's, not our queue's.
    sandbox._SLOTS = threading.BoundedSemaphore(max(threads + [2]))

    sandbox_once()  # warm the page cache (and the root's plan) before timing
    report: dict = {"machine": machine_info(with_torch=False), "mode": sandbox.sandbox_mode(),
                    "memory_guard": run_python(PROGRAM).memory_guard, "seconds_per_measurement": args.seconds}
    if args.baseline:
        old = load_baseline(args.baseline)
        old._SLOTS = sandbox._SLOTS
        sandbox_once(old.run_python)
        before, after = [], []
        for _ in range(args.rounds):  # alternate, so load changes hit both alike
            before.append(rate(lambda: sandbox_once(old.run_python), args.seconds, 1)["per_s"])
            after.append(rate(sandbox_once, args.seconds, 1)["per_s"])
        report["print1_single_thread"] = {"baseline": args.baseline, "before_per_s": before, "after_per_s": after,
                                          "after_vs_before": round(sum(after) / sum(before), 3),
                                          # medians: one stalled measurement on a shared machine moves a mean
                                          "after_vs_before_median": round(statistics.median(after)
                                                                          / statistics.median(before), 3)}
        if not args.skip_env:
            report["deepcoder_steps_before"] = deepcoder_steps(args.seconds, old.run_python)
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
