"""What one DeepCoder answer costs the trainer's process: host CPU for parsing, extracting the
program, judging and feedback (the env's own work) and for supervising the sandbox runs (set-up,
the read loop, clean-up), for typical answers and hostile ones. Prints one JSON object and
writes it to --out.

    python benchmarks/deepcoder_host_cost.py --out docs/benchmarks/deepcoder_host_cost.json

Host CPU is process CPU (time.process_time: every thread of this process, the test threads
included, none of the sandboxed programs' own CPU, none of the waiting), so a loaded machine
changes it little; wall time is reported beside it. Answers:
- typical: per problem, its reference solution, a wrong program and one that does not compile,
  each inside a ```python fence;
- adversarial text: envs.checker.adversarial_texts at DeepCoder's longest reply (648,000
  characters), each as the answer;
- hostile programs: output storms (1-byte writes after trying O_DIRECT, a flood past the output
  cap), a busy loop, a byte dribble, a fork storm, each run once per test of a problem.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.checker import adversarial_texts, max_reply_chars  # noqa: E402
from envs.deepcoder import DeepCoderConfig, DeepCoderEnv, extract_code  # noqa: E402
from envs.parsing import format_response  # noqa: E402

HOSTILE_PROGRAMS = {
    "o_direct_storm": "import fcntl, os, time\ntry:\n    fcntl.fcntl(1, fcntl.F_SETFL, os.O_DIRECT)\nexcept OSError:\n"
                      "    pass\nend = time.monotonic() + 5\nwhile time.monotonic() < end:\n    os.write(1, b'x')\n",
    "output_flood": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "busy_loop": "while True:\n    pass\n",
    "byte_dribble": "import os, time\nfor _ in range(4000):\n    os.write(1, b'x')\n    time.sleep(0.001)\n",
    "fork_storm": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def step_cost(env: DeepCoderEnv, seed: int, answer: str) -> dict:
    env.reset(seed=seed)
    wall, cpu = time.perf_counter(), time.process_time()
    _, _, _, _, info = env.step(format_response([answer], think="t"))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    actions = info["action_infos"]
    sandbox = sum(action.get("sandbox_host_cpu_seconds", 0.0) for action in actions)
    runs = sum(len(action.get("verdicts", ())) for action in actions)
    return {"host_cpu_s": cpu, "env_cpu_s": cpu - sandbox, "sandbox_cpu_s": sandbox, "runs": runs,
            "sandbox_cpu_per_run_s": sandbox / runs if runs else 0.0, "wall_s": wall,
            "verdicts": sorted(set(v for action in actions for v in action.get("verdicts", ())))}


def summary(rows: list[dict]) -> dict:
    out = {"answers": len(rows)}
    for key in ("host_cpu_s", "env_cpu_s", "sandbox_cpu_s", "sandbox_cpu_per_run_s", "wall_s"):
        values = [row[key] for row in rows]
        out[key] = {"median": round(statistics.median(values), 4), "max": round(max(values), 4)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=8, help="builtin problems for typical answers")
    parser.add_argument("--shapes", type=int, default=0, help="adversarial texts to use (0: all)")
    parser.add_argument("--out", default="docs/benchmarks/deepcoder_host_cost.json", help="'' to only print")
    args = parser.parse_args()

    env = DeepCoderEnv(DeepCoderConfig())
    env.reset(seed=0)
    env.step(format_response(["print(1)"], think="t"))  # one-off costs (the root's plan) out of the figures
    seen, seeds = set(), []  # seeds of distinct problems that ship a reference solution
    for seed in range(10_000):
        env.reset(seed=seed)
        if env.problem.solution.strip() and env.index not in seen:
            seen.add(env.index)
            seeds.append(seed)
        if len(seeds) == args.problems:
            break
    typical, hostile_text, hostile_programs = [], [], {}
    for seed in seeds:
        env.reset(seed=seed)
        solution = env.problem.solution.strip()
        for kind, program in (("reference", solution), ("wrong", "print(0)"), ("syntax_error", "def f(:\n    pass")):
            row = step_cost(env, seed, f"```python\n{program}\n```")
            typical.append(dict(row, kind=kind))
        print(f"typical: problem {env.problem.problem_id}", file=sys.stderr)
    shapes = adversarial_texts(max_reply_chars(env))
    shapes = shapes[: args.shapes] if args.shapes else shapes
    worst_text = (0.0, "")
    for number, text in enumerate(shapes):
        row = step_cost(env, seeds[number % len(seeds)], text)
        hostile_text.append(row)
        worst_text = max(worst_text, (row["env_cpu_s"], ascii(text[:24])))
    print(f"adversarial texts: {len(shapes)}", file=sys.stderr)
    # What the feedback's compile would cost without MAX_COMPILE_CHARS, on the costliest shape.
    long_program = "1/" * (max_reply_chars(env) // 2) + "!"
    start = time.process_time()
    try:
        ast.parse(long_program)
    except (SyntaxError, RecursionError, MemoryError):
        pass
    uncapped_compile = time.process_time() - start
    # The fence pattern as it was (quadratic), on a fence and a blank run ending in "!": the figure
    # the possessive rewrite removes (envs.deepcoder._FENCE), at two lengths to show the growth.
    old_fence = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
    fence_seconds = {}
    for blanks in (8_000, 16_000, 32_000):
        start = time.process_time()
        old_fence.findall("```" + " " * blanks + "!")
        fence_seconds[str(blanks)] = round(time.process_time() - start, 4)
    start = time.process_time()
    extract_code("```" + " " * (max_reply_chars(env) - 4) + "!")
    fence_seconds[f"today_{max_reply_chars(env) - 4}"] = round(time.process_time() - start, 4)
    for name, program in HOSTILE_PROGRAMS.items():
        hostile_programs[name] = step_cost(env, seeds[0], program)
        print(f"hostile program: {name}", file=sys.stderr)

    result = {
        "benchmark": "deepcoder_host_cost",
        "command": "python " + " ".join([sys.argv[0]] + sys.argv[1:]),
        "cpu_model": cpu_model(), "cpus": os.cpu_count(), "load_average": [round(v, 2) for v in os.getloadavg()],
        "python": platform.python_version(), "kernel": platform.release(), "sandbox_mode": os.geteuid() == 0 and "root"
        or "userns", "max_reply_chars": max_reply_chars(env), "problems": len(seeds),
        "typical": summary(typical),
        "typical_by_kind": {kind: summary([r for r in typical if r["kind"] == kind])
                            for kind in ("reference", "wrong", "syntax_error")},
        "adversarial_text": dict(summary(hostile_text), worst_env_cpu_answer=worst_text[1]),
        "old_fence_s_by_blanks": fence_seconds,
        "uncapped_compile_s": {"chars": len(long_program), "seconds": round(uncapped_compile, 4)},
        "hostile_programs": {name: {key: (round(value, 4) if isinstance(value, float) else value)
                                    for key, value in row.items()} for name, row in hostile_programs.items()},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out} ({result['cpu_model']})", file=sys.stderr)


if __name__ == "__main__":
    main()
