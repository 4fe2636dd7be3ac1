"""Check that a refactor changed no number: the same fixed-seed jobs on an earlier commit and on
this tree must give the same metrics (timings aside) and bit-identical weights.

    python scripts/same_behaviour.py --base COMMIT [--new COMMIT | --pick C1,C2,...] [--out DIR] [--jobs main,ppo,sft]

Each commit runs from a detached git worktree (as scripts/bench_background.sh pins its code), put
ahead of the editable install on PYTHONPATH; without --new this tree runs the same commands.
`--pick` runs the base with only the named commits applied on top (git cherry-pick -n in the
worktree), `--revert` runs the base with the named commits taken out (git revert -n, in the order
given: newest first): a change's own effect, when other work was committed between its commits. Jobs, each in
its own child process with one torch thread:

- main: the README's main job (`--filter snr-top-p`), 3 steps (a probe step, the packed update).
- ppo: 1 step of PPO with a critic, a reference and a KL loss, two epochs of two mini-batches and a
  gradient decomposition: old log-probs, the critic's loss and `grad_decomp` are all exercised.
- sft: 2 steps of `ragen2 sft` on 16 answer-only Bandit demos.

Prints one JSON line per job and exits 1 on any difference. Numbers repeat bit for bit only on the
same kind of CPU, thread count and dtype, which a run of both sides on one machine gives.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = ["--quiet", "trainer.num_threads=1", "model.dtype=float32"]
JOBS = {
    "main": ["train", "--filter", "snr-top-p", "--steps", "3", *COMMON],
    "ppo": ["train", "--algo", "ppo", "--steps", "1", "optim.ppo_epochs=2", "optim.mini_batch_size=8",
            "algo.kl_coef=0.01", "probe.grad_every=1", "probe.every=0", *COMMON],
    "sft": ["sft", "--steps", "2", "sft.batch_episodes=8", "trainer.val_before=false", *COMMON],
}
# Wall-clock readings differ run to run; everything else in a row must repeat.
TIMING = re.compile(r"(^time/|^throughput/|_s$|per_s$|eta)")


def run_jobs(code: Path, out: Path, jobs: list[str], demos: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONSAFEPATH="1", OMP_NUM_THREADS="1")
    for job in jobs:
        if (out / job / "summary.json").is_file():
            continue  # a finished job of an earlier call (the base side is reused)
        extra = ["--demos", str(demos)] if job == "sft" else []
        command = [sys.executable, "-m", "ragen2.cli", *JOBS[job], *extra, "--out", str(out),
                   f"trainer.run_name={job}"]
        subprocess.run(command, env=env, cwd=code, check=True)


def run_commit(commit: str, out: Path, jobs: list[str], demos: Path, picks: tuple[str, ...] = (),
               reverts: tuple[str, ...] = ()) -> None:
    worktree = Path(tempfile.mkdtemp(prefix="ragen2-code-")) / "code"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(worktree), commit], check=True)
    try:
        for pick in picks:
            subprocess.run(["git", "-C", str(worktree), "cherry-pick", "-n", pick], check=True)
        for revert in reverts:
            subprocess.run(["git", "-C", str(worktree), "revert", "-n", revert], check=True)
        run_jobs(worktree, out, jobs, demos)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not TIMING.search(k)} for line in lines if line.strip()]


def tensors_digest(path: Path) -> str:
    """sha256 of a safetensors file's tensors (names, dtypes, shapes, bytes), not of the file: its
    header's metadata is written in a different order by each process, so equal weights can make
    unequal files."""
    import torch
    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(path), framework="pt") as handle:
        for name in sorted(handle.keys()):
            tensor = handle.get_tensor(name).contiguous()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def weight_digests(run_dir: Path) -> dict[str, str]:
    """Digest of every weights file of the newest checkpoint (policy, critic) and of RUN/model."""
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    files = sorted(checkpoints[-1].rglob("*.safetensors")) + sorted((run_dir / "model").glob("*.safetensors"))
    return {str(path.relative_to(checkpoints[-1] if "checkpoints" in str(path) else run_dir)): tensors_digest(path)
            for path in files}


def compare(base: Path, new: Path) -> dict:
    base_rows, new_rows = rows(base), rows(new)
    differing = sorted({key for a, b in zip(base_rows, new_rows) for key in a.keys() | b.keys()
                        if a.get(key) != b.get(key) and not (a.get(key) != a.get(key) and b.get(key) != b.get(key))})
    base_weights, new_weights = weight_digests(base), weight_digests(new)
    return {"steps": [len(base_rows), len(new_rows)], "metric_keys": len(base_rows[0]) if base_rows else 0,
            "metrics_differing": differing, "weight_files": len(base_weights),
            "weights_identical": bool(base_weights) and base_weights == new_weights,
            "same": len(base_rows) == len(new_rows) and not differing and bool(base_weights)
            and base_weights == new_weights}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--new", default=None, help="a commit to run instead of this tree")
    parser.add_argument("--pick", default=None, help="commits applied to the base for the new side, comma-separated")
    parser.add_argument("--revert", default=None, help="commits taken out of the base, newest first, comma-separated")
    parser.add_argument("--out", default=None, help="keeps both sides' runs (default: a temporary folder)")
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--only-base", action="store_true", help="run the base side only (start it early)")
    args = parser.parse_args(argv)
    jobs = args.jobs.split(",")
    out = Path(args.out or tempfile.mkdtemp(prefix="ragen2-same-behaviour-"))
    out.mkdir(parents=True, exist_ok=True)
    demos = out / "bandit_demos.jsonl"
    if "sft" in jobs and not demos.is_file():
        subprocess.run([sys.executable, "-m", "ragen2.cli", "demos", "--env", "bandit", "--episodes", "16",
                        "--out", str(demos)], check=True, cwd=REPO)
    run_commit(args.base, out / "base", jobs, demos, reverts=tuple(args.revert.split(",")) if args.revert else ())
    if args.only_base:
        return 0
    if args.pick:
        run_commit(args.base, out / "new", jobs, demos, tuple(args.pick.split(",")))
    elif args.new:
        run_commit(args.new, out / "new", jobs, demos)
    else:
        run_jobs(REPO, out / "new", jobs, demos)
    base = f"{args.base} - {args.revert}" if args.revert else args.base
    new = f"{args.base} + {args.pick}" if args.pick else args.new or "working tree"
    same = True
    for job in jobs:
        result = compare(out / "base" / job, out / "new" / job)
        same &= result["same"]
        print(json.dumps({"job": job, "base": base, "new": new, **result}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
