"""Split each bucket's task norm in RAGEN-2's figure into how large its groups' gradients are and
how much they point one way (issue 50 item 3, a reading of the committed files; no model is run):

    python scripts/gradient_bucket_coherence.py docs/benchmarks/gradient_buckets.json \
        docs/benchmarks/gradient_buckets_seed0.json docs/benchmarks/gradient_buckets_seed2.json --out docs/benchmarks/gradient_buckets_coherence.json

Why: RAGEN-2's bound is per prompt (||g_task|| <= C * sqrt(Var(R|x))), but the figure plots the norm
of a bucket's gradient, the share-weighted sum of its groups' own gradients. That norm equals
`group_norm` (the share-weighted mean of the groups' own task norms, what the bound speaks about)
times `coherence` (<= 1 by the triangle inequality; 1 when all the groups' gradients point the same
way). A bucket can then fall while its groups' gradients grow, if they point apart.

The shares are the ones scripts/gradient_buckets.py summed with: each group's tokens over the
bucket's under a token-weighted loss aggregation, else its sequences (group_size each, so equal).
`group_points` lists the groups bucket by bucket, in the buckets' order, so the first `groups` of
them are the first bucket's. A coherence above 1 (beyond rounding) means the file's groups do not
add up to its buckets, and is an error, not a number.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ragen2.engines.local.grad_decomp import TOKEN_WEIGHTED  # the shares gradient_buckets.py summed with

ROUNDING = 1e-6  # float32 norms, summed in a different order than the file's bucket norm


class CoherenceError(ValueError):
    pass


def nondecreasing(values: list[float]) -> bool | None:
    """RAGEN-2's reading of its figure (the norm rises over the buckets); None with under two."""
    return all(a <= b for a, b in zip(values, values[1:])) if len(values) > 1 else None


def checkpoint_coherence(checkpoint: dict, source: str) -> dict:
    points, buckets, start = checkpoint["group_points"], [], 0
    if sum(b["groups"] for b in checkpoint["buckets"]) != len(points):
        raise CoherenceError(f"{source} step {checkpoint['step']} {checkpoint['advantage']}: the buckets hold "
                             f"{sum(b['groups'] for b in checkpoint['buckets'])} groups, group_points {len(points)}")
    by_tokens = checkpoint["loss_agg"] in TOKEN_WEIGHTED
    for bucket in checkpoint["buckets"]:
        members = points[start:start + bucket["groups"]]
        start += bucket["groups"]
        weights = [p["tokens"] if by_tokens else 1 for p in members]
        group_norm = sum(w * p["task_norm"] for w, p in zip(weights, members)) / max(1, sum(weights))
        coherence = bucket["task_norm"] / group_norm if group_norm > 0 else None
        if coherence is not None and coherence > 1 + ROUNDING:
            raise CoherenceError(f"{source} step {checkpoint['step']} {checkpoint['advantage']} {bucket['bucket']}: "
                                 f"bucket norm {bucket['task_norm']:.6g} exceeds its groups' weighted mean "
                                 f"{group_norm:.6g}: group_points do not match the buckets")
        buckets.append({"bucket": bucket["bucket"], "groups": bucket["groups"], "mean_variance": bucket["mean_variance"],
                         "task_norm": bucket["task_norm"], "group_norm": group_norm, "coherence": coherence})
    spread = [b for b in buckets if b["mean_variance"] > 0]
    scored = [b for b in buckets if b["coherence"] is not None]
    return {"step": checkpoint["step"], "advantage": checkpoint["advantage"], "loss_agg": checkpoint["loss_agg"],
            "task_norm_nondecreasing": nondecreasing([b["task_norm"] for b in spread]),
            "group_norm_nondecreasing": nondecreasing([b["group_norm"] for b in spread]),
            "least_coherent_bucket": min(scored, key=lambda b: b["coherence"])["bucket"] if scored else None,
            "last_bucket": buckets[-1]["bucket"] if buckets else None, "buckets": buckets}


def coherence_of_files(files: list[Path]) -> dict:
    runs, counts = [], {}
    for path in files:
        data = json.loads(path.read_text())
        try:
            checkpoints = [checkpoint_coherence(c, str(path)) for c in data["checkpoints"]]
        except KeyError as error:
            raise CoherenceError(f"{path}: no {error}: not a scripts/gradient_buckets.py output") from None
        runs.append({"file": str(path), "seed": data["seed"], "checkpoints": checkpoints})
        for c in checkpoints:
            tally = counts.setdefault(c["advantage"], {"checkpoints": 0, "task_norm_nondecreasing": 0,
                                                        "group_norm_nondecreasing": 0,
                                                        "least_coherent_is_last": 0})
            tally["checkpoints"] += 1
            tally["task_norm_nondecreasing"] += bool(c["task_norm_nondecreasing"])
            tally["group_norm_nondecreasing"] += bool(c["group_norm_nondecreasing"])
            tally["least_coherent_is_last"] += c["least_coherent_bucket"] == c["last_bucket"]
    return {"runs": runs, "counts": counts}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="scripts/gradient_buckets.py outputs")
    parser.add_argument("--out", type=Path, help="also write the result, with its command, here")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        sys.exit(f"not found: {missing}")
    try:
        result = {"command": "python scripts/gradient_bucket_coherence.py " +
                             " ".join(sys.argv[1:] if argv is None else argv),
                  **coherence_of_files(args.files)}
    except CoherenceError as error:
        sys.exit(f"cannot split the bucket norms: {error}")
    text = json.dumps(result, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    for run in result["runs"]:
        for c in run["checkpoints"]:
            print(f"seed {run['seed']} step {c['step']} {c['advantage']}: " + "; ".join(
                f"var {b['mean_variance']:.3g} bucket {b['task_norm']:.3g} = groups {b['group_norm']:.3g} x "
                f"coherence {b['coherence'] if b['coherence'] is None else round(b['coherence'], 2)}"
                for b in c["buckets"]))
    print(json.dumps(result["counts"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
