"""The collapse probe against known truth (issue 50, item 1): warm starts on grounded, template and
half-and-half reasoning, each audited with `ragen2 audit --model`.

    python scripts/probe_controls.py                    # 3 reasoning kinds x seeds 0 1 2 on FrozenLake, think mode
    python scripts/probe_controls.py --seeds 0 --kinds grounded template --steps 10 40 80
    python scripts/probe_controls.py --table                 # the markdown table of docs/evidence.md
    python scripts/probe_controls.py --check ENV MODEL_DIR   # the known-truth check alone, on any model

Each model: `ragen2 demos` (demo seed = the seed) → `ragen2 sft` (trainer.seed = the seed, the same
steps and demos count for every kind) → `ragen2 audit --model RUN --json`, at each of `--steps` (the
run is resumed to the next count: the learning rate is constant after warm-up, so it is one run).
Grounded demos state facts of their own input (positions), template demos one text for every input;
the mixture trains on half of each. What the *model* writes is checked against the truth directly:
on held-out instances (demos seed 1000), greedy reasoning is parsed for a fact of its input (the
player's cell on a grid, Countdown's target and numbers), and `states_own_input` is the share that
names the true one (a model that copied the demos' format without reading its input names a fixed
or wrong one). The probe should follow that truth:
reasoning that names its own position retrieves its prompt far above chance (1/N), a template
sits at chance, MI orders them. Both are near-deterministic text: the case where RAGEN-2 says
entropy cannot tell them apart and MI can, so the token entropy is reported beside.
Results merge into docs/benchmarks/probe_controls.json (key `results`, one object per model and step).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ragen2.bench.machine import cpu_name

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


HELD_OUT_DEMO_SEED = 1000
POSITION = re.compile(r"\((\d+), (\d+)\)")


def player_cell(user_turn: str) -> tuple[int, int] | None:
    """(row, column) of the player in a FrozenLake or Sokoban observation (P, or X / √ / S: the player
    on a hole, the goal or a target)."""
    grid = user_turn.split("State:\n", 1)[-1].split("You have", 1)[0].strip("\n").splitlines()
    for row, line in enumerate(grid):
        for column, char in enumerate(line):
            if char in "PX√S":
                return row, column
    return None


def states_own_input(env: str, user_turn: str, reasoning: str) -> bool:
    """Whether the reasoning names a fact of its own input, read off the observation: the player's
    cell first (grid games, as the grounded demos begin), or Countdown's target and numbers."""
    if env == "countdown":
        state = re.search(r"Target: (\d+), nums: \[([\d, ]+)\]", user_turn)
        stated = re.search(r"target is (\d+) and the numbers are ([\d, ]+\d)", reasoning)
        return bool(state and stated) and (state.group(1), state.group(2).replace(" ", "")) == (
            stated.group(1), stated.group(2).replace(" ", ""))
    stated = POSITION.search(reasoning)
    return bool(stated) and tuple(map(int, stated.groups())) == player_cell(user_turn)


def own_input_check(model_dir: Path, env: str, prompts: int = 32) -> dict:
    """Greedy first-turn reasoning on held-out instances (demos seed 1000): the share that names its
    own input (`states_own_input`), and the share of distinct reasoning texts (1/prompts: one text
    for every input)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    held_out = ROOT / f"{env}-held-out.jsonl"
    if not held_out.is_file():
        run(["ragen2", "demos", "--env", env, "--reasoning", "grounded", "--episodes", str(prompts),
             "--seed", str(HELD_OUT_DEMO_SEED), "--out", str(held_out)])
    tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    named, texts = 0, []
    for line in held_out.read_text().splitlines()[:prompts]:
        messages = json.loads(line)["messages"][:2]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=48, do_sample=False)
        reasoning = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).split("</think>")[0]
        texts.append(reasoning)
        named += states_own_input(env, messages[1]["content"], reasoning)
    return {"states_own_input": named / len(texts), "distinct_reasoning_share": len(set(texts)) / len(texts),
            "check_prompts": len(texts)}


SUMMARY_KEYS = ("states_own_input", "distinct_reasoning_share", "retrieval_at_1", "chance", "mi", "mi_zscore", "entropy")


def summary(results: list[dict]) -> list[dict]:
    """One object per env, reasoning and SFT steps: each measure's mean, min and max over seeds."""
    keys = sorted({(r["env"], r["reasoning"], r["sft_steps"]) for r in results},
                  key=lambda k: (k[0], ["grounded", "mixed", "template"].index(k[1]), k[2]))
    rows = []
    for env, kind, steps in keys:
        group = [r for r in results if (r["env"], r["reasoning"], r["sft_steps"]) == (env, kind, steps)]
        row = {"env": env, "reasoning": kind, "sft_steps": steps, "seeds": sorted(r["seed"] for r in group),
               "seed_count": len(group)}
        for key in SUMMARY_KEYS:
            values = [r[key] for r in group]
            row[key] = {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}
        rows.append(row)
    return rows


def write_results(path: Path, results: list[dict], **fields) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.update(fields, results=results, summary=summary(results))
    path.write_text(json.dumps(data, indent=1) + "\n")


def table(path: Path) -> str:
    """The summary as the markdown table docs/evidence.md shows (`--table`): mean, and min to max
    over seeds where there are several."""
    out = ["| env | reasoning | SFT steps | seeds | states its own input | distinct reasoning | retrieval@1 | chance "
           "| MI (nats) | MI z-score | entropy (nats/token) |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(stats: dict, several: bool, digits: int = 3) -> str:
        shown = f"{stats['mean']:.{digits}f}"
        return f"{shown} ({stats['min']:.{digits}f} to {stats['max']:.{digits}f})" if several else shown

    for row in summary(json.loads(path.read_text())["results"]):
        several = len(row["seeds"]) > 1
        digits = {"mi": 4, "mi_zscore": 2}
        cells = " | ".join(cell(row[key], several, digits.get(key, 3)) for key in SUMMARY_KEYS)
        out.append(f"| {row['env']} | {row['reasoning']} | {row['sft_steps']} | {len(row['seeds'])} | {cells} |")
    return "\n".join(out)


def main() -> int:
    if sys.argv[1:] == ["--table"]:
        print(table(OUT))
        return 0
    if sys.argv[1:2] == ["--check"]:  # --check ENV MODEL_DIR: the known-truth check alone, on any model
        env, model_dir = sys.argv[2], Path(sys.argv[3])
        checked = {"env": env, "model": str(model_dir), **own_input_check(model_dir, env),
                   "command": shlex.join(["python", "scripts/probe_controls.py", *sys.argv[1:]])}
        data = json.loads(OUT.read_text()) if OUT.is_file() else {"results": []}
        checked_models = [c for c in data.get("checked_models", []) if c["model"] != str(model_dir)] + [checked]
        write_results(OUT, data["results"], checked_models=checked_models)
        print(json.dumps(checked))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="frozen_lake")
    parser.add_argument("--kinds", nargs="+", default=["grounded", "template", "mixed"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=160)
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 40, 80],
                        help="SFT step counts to audit at (one run, resumed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT, help="results JSON, merged into (read again before each write)")
    parser.add_argument("--audit-arg", action="append", default=[],
                        help="extra ragen2 audit flags (default: 32 instances x 2, 32 rows, reasoning of turn 1)")
    args = parser.parse_args()
    ROOT.mkdir(parents=True, exist_ok=True)
    results = json.loads(args.out.read_text())["results"] if args.out.is_file() else []
    for seed in args.seeds:
        for kind in args.kinds:
            name = f"{args.env}-{kind}-s{seed}"
            demos, demo_commands = None, []
            for steps in sorted(args.steps):
                if any((r["reasoning"], r["seed"], r.get("env"), r.get("sft_steps")) == (kind, seed, args.env, steps)
                       for r in results):
                    continue
                if demos is None:
                    demos, demo_commands = demos_file(kind, seed, args.env, args.episodes)
                run_dir = ROOT / name
                done = json.loads((run_dir / "summary.json").read_text())["steps"] if (
                    run_dir / "summary.json").is_file() else 0
                if done > steps:
                    print(f"{name} has trained {done} steps, past {steps}: delete it to audit {steps}", file=sys.stderr)
                    continue
                sft = ["ragen2", "sft", "--demos", str(demos), "--steps", str(steps), "--seed", str(seed), "--quiet",
                       f"trainer.out={ROOT}", f"trainer.run_name={name}", "trainer.val_before=false",
                       f"trainer.num_threads={args.threads}", "trainer.val_groups=8", "trainer.keep_last=1",
                       "sft.lr=1e-4"]
                if done < steps:
                    run(["ragen2", "sft", "--resume", str(run_dir), f"sft.steps={steps}", "--quiet"] if done else sft)
                numbers = ROOT / f"{name}-{steps}.audit.json"
                audit = ["ragen2", "audit", "--model", str(run_dir), "--env", args.env, "--groups", "32",
                         "--group-size", "2", "--num-samples", "32", "--max-new-tokens", "48", "--segment",
                         "reasoning", "--seed", "7", "--json", str(numbers), *args.audit_arg]
                run(audit)
                audited = json.loads(numbers.read_text())
                summary = json.loads((run_dir / "summary.json").read_text())
                result = {"reasoning": kind, "seed": seed, "env": args.env, "sft_steps": steps,
                          "retrieval_at_1": audited.get("retrieval_accuracy@1"),
                          "chance": audited.get("retrieval_chance_level@1"), "mi": audited.get("mi_estimate"),
                          "mi_zscore": audited.get("mi_zscore"), "entropy": audited.get("policy_entropy"),
                          **own_input_check(run_dir / "model", args.env),
                          "val_success": summary.get("val_success_rate"), "rows": audited.get("num_rows"),
                          "format_ok": audited.get("format_ok_fraction"), "dtype": audited.get("dtype"),
                          "command": " && ".join(demo_commands + [shlex.join(sft), shlex.join(audit)])}
                results = json.loads(args.out.read_text())["results"] if args.out.is_file() else []
                results = [r for r in results if (r["reasoning"], r["seed"], r.get("env"), r.get("sft_steps"))
                           != (kind, seed, args.env, steps)]
                results.append(result)
                write_results(args.out, results, command="python scripts/probe_controls.py", cpu=cpu_name())
                print(json.dumps({k: result[k] for k in ("reasoning", "seed", "sft_steps", "retrieval_at_1", "chance",
                                                         "mi", "entropy", "states_own_input")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
