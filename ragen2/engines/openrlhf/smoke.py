"""GPU smoke test of the OpenRLHF engine (scripts/gpu_smoke.sh): two short real runs, checked, one JSON line.

    scripts/gpu_smoke.sh [--dry] [--model HF_ID_OR_DIR] [--gpus N] [--out DIR]

On one GPU node with the `[openrlhf]` extra: GRPO on Bandit (2 steps: MI probe, an evaluation
after each step, a checkpoint each step) and PPO with critic and KL (1 step), each launched as
`ragen2 train --engine openrlhf` prints it, with two changes: the agent file is smoke_agent.py
(ragen2's agent, recording every generate and sample index) and
`--algo.advantage.is_correction_level token --algo.advantage.is_correction_threshold 0 1e9` so
that OpenRLHF logs `vllm_kl` (rollout vs trainer log-probs; the band is wide open, so every
token keeps its importance weight, about 1). Checks: exit 0; the metrics present; |vllm_kl| <
0.02; one full weight sync per trained step and engine (vLLM's worker logs each tensor); every
generate's finish/stop reason as vLLM 0.29.0 defines it; both evaluations on the same instances
with indices 0..G-1; peak GPU memory (nvidia-smi, every second) under 95%.

`--dry` runs everything up to the first step that needs a GPU (the commands, their files, the
agent file loaded as OpenRLHF loads it where OpenRLHF is installed) and stops there: CPU is enough.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from ragen2 import metric_names as names
from ragen2.engines.openrlhf import SMOKE_LOG_ENV as LOG_ENV

DEFAULT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
COMMON = ["--filter", "none", "model.dtype=bfloat16", "rollout.num_groups=4", "rollout.group_size=4",
          "rollout.max_new_tokens=64", "optim.micro_batch_size=2", "optim.mini_batch_size=16", "trainer.val_groups=2"]
CASES = {
    "grpo": ["--env", "bandit", "--algo", "grpo", "--steps", "2", "algo.kl_coef=0", "probe.every=1",
             "probe.num_samples=8", "trainer.val_every=1", "trainer.save_every=1", "trainer.keep_last=1"],
    "ppo": ["--env", "bandit", "--algo", "ppo", "--steps", "1", "algo.kl_coef=0.01"],
}
EXPECTED = {"grpo": ("policy_loss", names.ROLLOUT_REWARD_MEAN, "vllm_kl"),
            "ppo": ("policy_loss", "critic_loss", "kl", "vllm_kl")}
CORRECTION = ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_threshold", "0", "1e9"]
RUN_TIMEOUT_S = 270  # both runs within 10 minutes
MAX_VLLM_KL, MAX_MEMORY_FRACTION = 0.02, 0.95


def planned_command(case: str, model: str, gpus: int, out: Path) -> list[str]:
    """`ragen2 train --engine openrlhf --dry-run ...`'s printed command, made the smoke's. The CLI runs as
    a child (the engine sits below the command line and does not import it)."""
    args = ["train", "--engine", "openrlhf", "--dry-run", "--model", model, "--gpus-per-node", str(gpus),
            "--out", str(out / case), *CASES[case], *COMMON, f"trainer.run_name={case}"]
    done = subprocess.run([sys.executable, "-m", "ragen2.cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: ragen2 train {shlex.join(args[1:])} refused: {done.stderr.strip()}")
    lines = done.stdout.splitlines()
    command = shlex.split(lines[lines.index(next(l for l in lines if l.startswith("# OpenRLHF "))) + 1])
    agent = command.index("--train.agent_func_path") + 1
    command[agent] = str(Path(__file__).resolve().with_name("smoke_agent.py"))
    return command + CORRECTION


def load_agent_as_openrlhf_does() -> str:
    """The smoke agent through OpenRLHF's own loader, where OpenRLHF imports (not on a bare CPU box)."""
    try:
        from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
    except Exception as error:  # noqa: BLE001 - openrlhf (or vllm / flash_attn) not installed here
        return f"not checked ({type(error).__name__}: {error})"[:200]
    executor = _load_agent_executor(str(Path(__file__).resolve().with_name("smoke_agent.py")))
    return f"{type(executor).__module__}.{type(executor).__name__}"


class GpuMemory:
    """Peak used / total memory over all GPUs, polled with nvidia-smi every second."""

    def __init__(self):
        self.peak, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.wait(1.0):
            done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True)
            for line in done.stdout.splitlines():
                used, total = (float(x) for x in line.split(","))
                self.peak = max(self.peak, used / total)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_case(case: str, command: list[str], out: Path) -> dict:
    log, smoke_log = out / f"{case}.log", out / f"{case}.smoke.jsonl"
    env = dict(os.environ, RAY_DEDUP_LOGS="0", **{LOG_ENV: str(smoke_log)})  # count every worker's sync lines
    started = time.time()
    with open(log, "w") as handle:
        try:
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                  timeout=RUN_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    result = {"exit": code, "wall_s": round(time.time() - started, 1), "log": str(log)}
    return result | check_case(case, out / case / case, log.read_text(), smoke_log)


def check_case(case: str, run_dir: Path, log: str, smoke_log: Path) -> dict:
    failures = []
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] \
        if (run_dir / "metrics.jsonl").is_file() else []
    trained = [r for r in rows if "policy_loss" in r]
    for key in EXPECTED[case]:
        if not trained or any(key not in r for r in trained):
            failures.append(f"metric {key} missing")
    kls = [r["vllm_kl"] for r in trained if "vllm_kl" in r]
    if any(abs(kl) >= MAX_VLLM_KL for kl in kls):
        failures.append(f"|vllm_kl| >= {MAX_VLLM_KL}: {kls}")
    first = next((line.split("update weight: ", 1)[1].split(",")[0] for line in log.splitlines()
                  if "update weight: " in line), None)
    syncs = sum(1 for line in log.splitlines() if first and f"update weight: {first}," in line)
    engines = max(1, len({line.split("pid=")[1].split(")")[0] for line in log.splitlines()
                          if first and f"update weight: {first}," in line and "pid=" in line}))
    if syncs != len(trained) * engines:
        failures.append(f"{syncs} full weight syncs for {len(trained)} trained steps x {engines} engines")
    smoke = [json.loads(line) for line in smoke_log.read_text().splitlines()] if smoke_log.is_file() else []
    generates = [r for r in smoke if r["kind"] == "generate"]
    if not generates or not all(r["ok"] for r in generates):
        failures.append(f"vLLM stop semantics broken in {sum(not r['ok'] for r in generates)} of {len(generates)}")
    if case == "grpo":
        from ragen2.config import saved_config
        from ragen2.seeding import validation_seeds

        val = set(validation_seeds(saved_config(run_dir / "config.yaml")))
        numbered = [(r["seed"], r["member"]) for r in smoke if r["kind"] == "member" and r["seed"] in val]
        half = len(numbered) // 2
        expected = sorted((seed, k) for seed in val for k in range(4))
        if len(numbered) != 2 * len(expected) or sorted(numbered[:half]) != expected or sorted(numbered[half:]) != expected:
            failures.append(f"evaluations not on the same instances with indices 0..G-1: {numbered}")
        if [r["step"] for r in rows if names.VAL_REWARD_MEAN in r] != [0, 1]:
            failures.append("not evaluated after steps 0 and 1")
        if not (run_dir / "checkpoints" / "_actor" / "global_step2").is_dir():
            failures.append("no checkpoint global_step2")
        if not any(k.startswith(names.PROBE) for r in trained for k in r):
            failures.append("no probe/ metrics")
    finishes = {}
    for r in generates:
        finishes[f"{r['finish']}:{type(r['stop_reason']).__name__}"] = finishes.get(
            f"{r['finish']}:{type(r['stop_reason']).__name__}", 0) + 1
    return {"trained_steps": len(trained), "vllm_kl": kls, "weight_syncs": syncs, "generates": len(generates),
            "finishes": finishes, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_smoke.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry", action="store_true", help="stop before the first step that needs a GPU")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of this node to use (default 1)")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_smoke"))
    args = parser.parse_args(argv)
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    commands = {case: planned_command(case, args.model, args.gpus, args.out) for case in CASES}
    report = {"mode": "dry" if args.dry else "gpu", "model": args.model, "agent": load_agent_as_openrlhf_does(),
              "commands": {case: shlex.join(command) for case, command in commands.items()}}
    if args.dry:
        print(json.dumps(report | {"ok": True, "stopped_before": "launching the runs (GPU only)"}))
        return 0
    import torch

    if not torch.cuda.is_available():
        print(json.dumps(report | {"ok": False, "failures": ["no CUDA GPU here: run with --dry on CPU"]}))
        return 2
    with GpuMemory() as memory:
        cases = {case: run_case(case, command, args.out) for case, command in commands.items()}
    failures = [f"{case}: {f}" for case, result in cases.items() for f in result["failures"]]
    failures += [f"{case}: exit {r['exit']}" for case, r in cases.items() if r["exit"] != 0]
    if memory.peak >= MAX_MEMORY_FRACTION:
        failures.append(f"peak GPU memory {memory.peak:.1%} >= {MAX_MEMORY_FRACTION:.0%}")
    report.pop("commands")
    print(json.dumps(report | {"ok": not failures, "failures": failures, "peak_memory_fraction": round(memory.peak, 3),
                               "wall_s": round(time.time() - started, 1), "cases": cases}))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
