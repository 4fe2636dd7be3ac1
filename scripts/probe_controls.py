"""The collapse probe against known truth (issue 50, item 1): warm starts on grounded, template and
half-and-half reasoning, each audited with `ragen2 audit --model`.

    python scripts/probe_controls.py                    # 3 reasoning kinds x seeds 0 1 2 on FrozenLake, think mode
    python scripts/probe_controls.py --seeds 0 --kinds grounded template

Each model: `ragen2 demos` (demo seed = the seed) → `ragen2 sft` (trainer.seed = the seed, the same
steps and demos count for every kind) → `ragen2 audit --model RUN --json`. Grounded reasoning states
facts of its own input (positions), so the policy's reasoning should retrieve its own prompt far above
chance (1/N); template reasoning is one text for every input, so it should sit at chance; MI should
order them. Both are near-deterministic text: the case where RAGEN-2 says entropy cannot tell them
apart and MI can, so the token entropy is reported beside. The mixture trains on half of each.
Results merge into docs/benchmarks/probe_controls.json (key `results`, one object per model).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path("runs/probe_controls")
OUT = Path("docs/benchmarks/probe_controls.json")


def run(command: list[str]) -> None:
    print("$ " + shlex.join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def demos_file(kind: str, seed: int, env: str, episodes: int) -> tuple[Path, list[str]]:
    """The demos of one kind (the mixture: the first half of the grounded file, the second of the template)."""
    path = ROOT / f"{env}-{kind}-s{seed}.jsonl"
    if kind != "mixed":
        command = ["ragen2", "demos", "--env", env, "--reasoning", kind, "--episodes", str(episodes),
                   "--seed", str(seed), "--out", str(path)]
        run(command)
        return path, [shlex.join(command)]
    parts, commands = [], []
    for part in ("grounded", "template"):
        source, made = demos_file(part, seed, env, episodes)
        parts.append(source.read_text().splitlines(keepends=True))
        commands += made
    half = episodes // 2
    path.write_text("".join(parts[0][:half] + parts[1][half:]))  # different instances in each half
    return path, commands + [f"first {half} lines of the grounded file + the rest of the template file"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="frozen_lake")
    parser.add_argument("--kinds", nargs="+", default=["grounded", "template", "mixed"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=160)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--audit-arg", action="append", default=[],
                        help="extra ragen2 audit flags (default: 32 instances x 2, 32 rows, reasoning of turn 1)")
    args = parser.parse_args()
    ROOT.mkdir(parents=True, exist_ok=True)
    results = json.loads(OUT.read_text())["results"] if OUT.is_file() else []
    for seed in args.seeds:
        for kind in args.kinds:
            name = f"{args.env}-{kind}-s{seed}"
            demos, demo_commands = demos_file(kind, seed, args.env, args.episodes)
            sft = ["ragen2", "sft", "--demos", str(demos), "--steps", str(args.steps), "--seed", str(seed), "--quiet",
                   f"trainer.out={ROOT}", f"trainer.run_name={name}", "trainer.val_before=false",
                   f"trainer.num_threads={args.threads}", "trainer.val_groups=8", "sft.lr=1e-4"]
            if not (ROOT / name / "summary.json").is_file():
                run(sft)
            numbers = ROOT / f"{name}.audit.json"
            audit = ["ragen2", "audit", "--model", str(ROOT / name), "--env", args.env, "--groups", "32",
                     "--group-size", "2", "--num-samples", "32", "--max-new-tokens", "48", "--segment", "reasoning",
                     "--seed", "7", "--json", str(numbers), *args.audit_arg]
            run(audit)
            audited = json.loads(numbers.read_text())
            result = {"reasoning": kind, "seed": seed, "env": args.env,
                      "retrieval_at_1": audited.get("retrieval_accuracy@1"),
                      "chance": audited.get("retrieval_chance_level@1"), "mi": audited.get("mi_estimate"),
                      "mi_zscore": audited.get("mi_zscore"), "entropy": audited.get("policy_entropy"),
                      "rows": audited.get("num_rows"), "format_ok": audited.get("format_ok_fraction"),
                      "command": " && ".join(demo_commands + [shlex.join(sft), shlex.join(audit)])}
            results = [r for r in results if (r["reasoning"], r["seed"], r.get("env")) != (kind, seed, args.env)]
            results.append(result)
            OUT.write_text(json.dumps({"command": "python scripts/probe_controls.py", "results": results}, indent=1) + "\n")
            print(json.dumps({k: result[k] for k in ("reasoning", "seed", "retrieval_at_1", "chance", "mi", "entropy")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
