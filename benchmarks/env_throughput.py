"""Env throughput: steps/s and resets/s per registered env, sandbox executions/s of a trivial
program (benchmarks/sandbox_throughput.py), and Sokoban rooms/s against gym-sokoban's generator
(measured side by side by benchmarks/sokoban_generation.py).

    python benchmarks/env_throughput.py [--seconds 2] [--envs sokoban,countdown] [--skip-rooms]

Prints one JSON object. A step is one parsed model turn carrying one random valid action,
so the figure includes the parser, as the trainer pays it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import envs
from envs.parsing import format_response
from ragen2.bench.machine import machine_info


def measure_env(name: str, seconds: float) -> dict:
    env = envs.make(name)
    rng = np.random.default_rng(0)
    steps = resets = 0
    reset_time = step_time = 0.0
    deadline = time.perf_counter() + seconds
    seed = 0
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        env.reset(seed=seed)
        reset_time += time.perf_counter() - started
        resets += 1
        seed += 1
        done = False
        while not done:
            response = format_response([env.sample_action(rng)], think="benchmark")
            started = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(response)
            step_time += time.perf_counter() - started
            steps += 1
            done = terminated or truncated
    return {
        "steps": steps,
        "steps_per_s": round(steps / step_time, 1),
        "resets_per_s": round(resets / reset_time, 1),
        "mean_steps_per_episode": round(steps / resets, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time budget per env")
    parser.add_argument("--envs", default="", help="comma-separated env names (default: all)")
    parser.add_argument("--skip-rooms", action="store_true", help="skip the Sokoban generator comparison")
    args = parser.parse_args()

    names = [n for n in args.envs.split(",") if n] or [entry.name for entry in envs.specs()]
    result = {
        "machine": machine_info(with_torch=False),
        "envs": {},
    }
    for name in names:
        print(f"measuring {name} …", file=sys.stderr)
        result["envs"][name] = measure_env(name, args.seconds)
    import sandbox_throughput

    print("measuring sandbox executions of print(1) …", file=sys.stderr)
    sandbox_throughput.sandbox_once()  # warm up
    result["sandbox_print1"] = sandbox_throughput.rate(sandbox_throughput.sandbox_once, args.seconds, 1)
    if not args.skip_rooms:
        import sokoban_generation

        print("measuring Sokoban room generation (ours vs gym-sokoban) …", file=sys.stderr)
        result["sokoban_rooms"] = sokoban_generation.measure(seconds_per_setting=max(args.seconds, 5.0))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
