"""Page faults and seconds of consecutive updates, freed memory kept in the process or not.

    python benchmarks/heap_faults.py [--updates 5] [--threads 1] [--out docs/benchmarks/heap_faults.json]

What ragen2.heap changes, seen directly: one child process per allocation policy (`kept`, as
`ragen2` runs; `default`, glibc's), each rolling out the CPU default batch (configs/base.yaml)
and running `--updates` consecutive updates on it (weights restored after each, so every update
does the same work), recording each update's wall seconds and the minor page faults the process
took during it (getrusage). Prints one JSON object and writes it to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def child(policy: str, updates: int, threads: int) -> dict:
    import torch

    from ragen2 import heap, seeding
    from ragen2 import metric_names as names
    from ragen2.config import load_config
    from ragen2.engines.local import learner, trainer
    from ragen2.rollout import rollout

    if policy == "kept":
        heap.keep_freed_memory()
    torch.set_num_threads(threads)
    cfg = load_config(overrides=["model.device=cpu", "probe.every=0"])
    models = learner.build_models(cfg)
    optimizers = learner.build_optimizers(models, cfg)
    batch = rollout(models.policy, models.tokenizer, trainer.env_factory(cfg), seeding.step_seeds(cfg, 0),
                    cfg.rollout, torch.Generator().manual_seed(cfg.trainer.seed))
    snapshot = [p.detach().clone() for p in models.policy.parameters()]
    data = learner.update_inputs(models, batch, cfg, old_log_probs=False)
    runs = []
    for _ in range(updates):
        faults, started = minor_faults(), time.perf_counter()
        metrics = learner.ppo_update(models, optimizers, data, cfg, torch.Generator().manual_seed(0))
        runs.append({"seconds": round(time.perf_counter() - started, 3), "minor_faults": minor_faults() - faults,
                     "grad_norm": metrics.get(names.ACTOR_GRAD_NORM)})
        with torch.no_grad():
            for p, saved in zip(models.policy.parameters(), snapshot):
                p.copy_(saved)
    return {"policy": policy, "heap": heap.state(), "dtype": cfg.model.dtype, "rows": len(batch),
            "updates": runs, "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "heap_faults.json"))
    parser.add_argument("--child", choices=("kept", "default"), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        Path(args.child_out).write_text(json.dumps(child(args.child, args.updates, args.threads)))
        return
    from ragen2.bench.machine import emit_report, machine_info

    load_start = [round(x, 2) for x in os.getloadavg()]
    policies = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in ("default", "kept"):
            out = Path(tmp) / f"{policy}.json"
            print(f"{policy}: {args.updates} updates in a child", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, __file__, "--child", policy, "--child-out", str(out),
                            "--updates", str(args.updates), "--threads", str(args.threads)], check=True, cwd=ROOT)
            policies[policy] = json.loads(out.read_text())
    report = {"machine": machine_info(with_torch=False), "load_avg_at_start": load_start,
              "load_avg_at_end": [round(x, 2) for x in os.getloadavg()], "threads": args.threads,
              "policies": policies}
    emit_report(report, args.out)


if __name__ == "__main__":
    main()
