"""Frozen weights under bf16 autocast, cast once per context (now) against at every use (before); prints JSON.

    python benchmarks/frozen_weight_casts.py [--repeats 2] [--threads 1] [--new-tokens 32]
                                             [--lora-rank 8] [--out FILE]

autocast caches its cast of a weight only when the weight requires grad. A frozen model's were
cast again at every use until `ragen2.precision.autocast` lent each frozen linear layer one copy
per context. Two places pay for that, measured here on the bundled SmolLM2-135M-Instruct in bf16:

  reference pass   the KL term's frozen reference model (`algo.kl_coef > 0`, as `grpo` sets): its
                   log-prob pass over a step's batch, 4 groups x 4 rows (Sokoban first-turn prompts
                   of ~280 tokens, each group's shared, and `--new-tokens` reply tokens), micro-batches
                   of 4, shared-prefix on (each micro-batch's prefix forward and suffix forward both
                   use every weight);
  LoRA rollout     a LoRA policy (adapters on the attention projections, `--lora-rank`): one
                   `generate` call of 16 distinct prompts x `--new-tokens` tokens; its frozen base
                   layers were cast at every decode step.

"before" is the same code with the lending switched off (`precision._frozen_copies` returning
nothing: autocast alone). Sides alternate within each repeat; the fastest run counts. The
outputs are compared too: the log-probs and the sampled tokens must be identical.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # generation.py's prompts

from generation import build_prompts  # noqa: E402

from ragen2 import precision  # noqa: E402
from ragen2.bench.machine import machine_info  # noqa: E402
from ragen2.engines.local.learner import log_probs_pass  # noqa: E402
from ragen2.models import LoraSettings, apply_lora, load_policy, load_tokenizer  # noqa: E402
from ragen2.rollout import generate  # noqa: E402


def lending(enabled: bool):
    original = precision._frozen_copies

    def switch():
        precision._frozen_copies = original if enabled else (lambda layers, dtype: {})
    return switch


def reference_batch(prompts: list[list[int]], new_tokens: int, pad: int):
    """4 groups x 4 rows: a group's rows share its prompt, then `new_tokens` random reply tokens."""
    g = torch.Generator().manual_seed(0)
    rows = [p + torch.randint(100, 49152, (new_tokens,), generator=g).tolist() for p in prompts[:4] for _ in range(4)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        attn[i, :len(row)] = 1
        mask[i, len(row) - new_tokens:len(row)] = 1
    return ids, attn, mask


def alternate(run, repeats: int) -> tuple[dict, dict]:
    """{side: [seconds per repeat]}, {side: last output}; sides alternate within each repeat."""
    times, outputs = {"before": [], "now": []}, {}
    for _ in range(repeats):
        for side in ("before", "now"):
            lending(side == "now")()
            started = time.perf_counter()
            outputs[side] = run()
            times[side].append(round(time.perf_counter() - started, 3))
            print(f"{run.__name__} {side}: {times[side][-1]} s", file=sys.stderr, flush=True)
    lending(True)()
    return times, outputs


def summary(times: dict) -> dict:
    best = {side: min(runs) for side, runs in times.items()}
    return {"runs_s": times, "best_s": best, "before_over_now": round(best["before"] / best["now"], 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    if min(args.repeats, args.threads, args.new_tokens, args.lora_rank) < 1:
        parser.error("every count must be >= 1")
    torch.set_num_threads(args.threads)
    load_at_start = list(os.getloadavg())
    tokenizer = load_tokenizer("bundled")
    prompts = build_prompts(tokenizer, 16)
    pad = tokenizer.pad_token_id

    reference = precision.set_compute_dtype(load_policy("bundled").eval().requires_grad_(False), torch.bfloat16)
    ids, attn, mask = reference_batch(prompts, args.new_tokens, pad)

    @torch.no_grad()
    def reference_pass():
        return log_probs_pass(reference, ids, attn, mask, 1.0, 4, shared_prefix=True)

    reference_pass()  # warm-up
    ref_times, ref_out = alternate(reference_pass, args.repeats)

    lora = apply_lora(load_policy("bundled"), LoraSettings(rank=args.lora_rank))
    precision.set_compute_dtype(lora, torch.bfloat16)
    sampling = dict(max_new_tokens=args.new_tokens, temperature=1.0, pad_token_id=pad, tokenizer=tokenizer,
                    stop_strings=(), eos_token_ids=())

    def lora_rollout():
        return generate(lora, prompts, generator=torch.Generator().manual_seed(0), **sampling)

    generate(lora, prompts[:2], generator=torch.Generator().manual_seed(0), **{**sampling, "max_new_tokens": 2})
    lora_times, lora_out = alternate(lora_rollout, args.repeats)

    report = {
        "command": "python benchmarks/frozen_weight_casts.py " + " ".join(sys.argv[1:]),
        "machine": machine_info(), "load_avg_at_start": load_at_start, "dtype": "bfloat16",
        "reference_pass": {"rows": int(ids.shape[0]), "width": int(ids.shape[1]), "micro_batch": 4,
                           "reply_tokens": args.new_tokens, **summary(ref_times),
                           "log_probs_identical": bool(torch.equal(ref_out["before"], ref_out["now"]))},
        "lora_rollout": {"prompts": len(prompts), "new_tokens": args.new_tokens, "lora_rank": args.lora_rank,
                         **summary(lora_times),
                         "tokens_identical": [r.token_ids for r in lora_out["before"]] == [r.token_ids for r in lora_out["now"]],
                         "logprobs_identical": [r.logprobs for r in lora_out["before"]] == [r.logprobs for r in lora_out["now"]]},
        "load_avg_at_end": list(os.getloadavg()),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
