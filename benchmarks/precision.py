"""fp32 against bf16 mixed precision on this machine; prints JSON.

    python benchmarks/precision.py [--batch 16] [--new-tokens 64] [--update-rows 4] [--update-len 256]
                                   [--repeats 2] [--random-init] [--threads N]

In one process, alternating fp32 and bf16 so both see the same machine load:
1. matmul 1024^2 GFLOP/s in each dtype, and what `model.dtype=auto` picks here and why;
2. the update: forward + backward of the policy loss on rows x len tokens (bf16 = autocast
   over fp32 weights, as the trainer runs it);
3. the rollout: batched sampling of `--new-tokens` for `--batch` Sokoban prompts (the rollout's generation session);
4. the mismatch the RL ratio sees: mean and max |log pi_rollout - log pi_update| over the sampled
   tokens, for fp32 sampling + fp32 update, bf16 + bf16 (the policy `auto` runs), and bf16
   sampling + fp32 update (what mixing precisions would cost).
Model: the bundled SmolLM2-135M-Instruct, else a random-init model of its architecture.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

from generation import build_prompts, load_model
from ragen2 import precision
from ragen2.bench.machine import machine_info
from ragen2.engines.local import learner
from ragen2.rollout.generation import generate


def time_update(model, rows: int, length: int) -> float:
    ids = torch.randint(100, model.config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    started = time.perf_counter()
    log_probs, _ = learner.policy_log_probs(model, learner.TokenRows(ids, mask, mask))
    (-log_probs.sum() / mask.sum()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def sample(model, prompts, new_tokens: int):
    started = time.perf_counter()
    results = generate(model, prompts, max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, stop_strings=(),
                       generator=torch.Generator().manual_seed(0))
    return results, time.perf_counter() - started


@torch.no_grad()
def mismatch(update_model, prompts, results) -> dict:
    gaps = []
    for prompt, result in zip(prompts, results):
        ids = torch.tensor([list(prompt) + result.token_ids])
        response = torch.zeros_like(ids)
        response[:, len(prompt):] = 1
        forced, _ = learner.policy_log_probs(update_model, learner.TokenRows(ids, torch.ones_like(ids), response))
        gaps.append((forced[0, len(prompt):] - torch.tensor(result.logprobs)).abs())
    gap = torch.cat(gaps)
    return {"mean": float(gap.mean()), "max": float(gap.max()), "tokens": int(gap.numel())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--update-rows", type=int, default=4)
    parser.add_argument("--update-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--random-init", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    fp32, tokenizer, model_name, _ = load_model(args.random_init)
    bf16 = precision.set_compute_dtype(copy.deepcopy(fp32), torch.bfloat16)
    variants = {"float32": fp32, "bfloat16": bf16}
    prompts = build_prompts(tokenizer, args.batch)
    flags = precision.cpu_bf16_flags()
    gflops = {name: precision.matmul_gflops(precision.DTYPES[name], seconds=0.5) for name in variants}
    choice = precision.choose_cpu_dtype(flags)  # the flags decide; gflops is reported beside it

    update_s = {name: [] for name in variants}
    rollout_s = {name: [] for name in variants}
    results = {}
    for name, model in variants.items():  # warm-up: first calls pay allocation and kernel choice
        time_update(model, 1, 16)
        sample(model, prompts[:2], 2)
    for _ in range(args.repeats):
        for name, model in variants.items():
            update_s[name].append(time_update(model, args.update_rows, args.update_len))
            results[name], seconds = sample(model, prompts, args.new_tokens)
            rollout_s[name].append(seconds)
    update = {name: statistics.median(times) for name, times in update_s.items()}
    rollout = {name: statistics.median(times) for name, times in rollout_s.items()}
    sampled = {name: sum(len(r.token_ids) for r in results[name]) for name in variants}
    report = {
        "benchmark": "precision",
        "machine": machine_info(),
        "model": model_name,
        "matmul_1024_gflops": {name: round(value, 1) for name, value in gflops.items()},
        "auto_picks": {"dtype": choice.dtype, "reason": choice.reason},
        "update": {"rows": args.update_rows, "tokens_per_row": args.update_len,
                   "seconds": {name: round(value, 3) for name, value in update.items()},
                   "all_seconds": update_s, "bf16_speedup": round(update["float32"] / update["bfloat16"], 2)},
        "rollout": {"batch": args.batch, "new_tokens": args.new_tokens,
                    "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
                    "tokens_per_s": {name: round(sampled[name] / rollout[name], 1) for name in variants},
                    "all_seconds": rollout_s, "bf16_speedup": round(rollout["float32"] / rollout["bfloat16"], 2)},
        "logprob_mismatch": {
            "fp32_rollout_fp32_update": mismatch(fp32, prompts, results["float32"]),
            "bf16_rollout_bf16_update": mismatch(bf16, prompts, results["bfloat16"]),
            "bf16_rollout_fp32_update": mismatch(fp32, prompts, results["bfloat16"]),
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
