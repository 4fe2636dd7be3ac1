"""Does `torch.compile` pay for a decode step on this CPU? Prints JSON.

    python benchmarks/compiled_decode.py [--dtype float32|bfloat16] [--batch 16] [--prompt-tokens 276]
                                         [--new-tokens 24] [--threads 1] [--out FILE]

Issue 31 item 5 named "a static cache and torch.compile" as one way for the rollout's decoder to
reach 2x a plain cached loop. This measures that way alone, on transformers' own path: the
bundled SmolLM2-135M-Instruct with transformers' StaticCache (fixed shapes, what compilation
needs), one forward per token at batch `--batch`, greedy, the same prompts on every side; the
model's forward eager, then compiled (`torch.compile(model.forward)`, inductor, static shapes; the
compile time is reported apart), then eager again, so a drift of the machine shows as a
difference between the two eager runs. Each side: the median of the timed decode steps after two
untimed ones. Prompts are random token ids (`--prompt-tokens` each; the step's cost depends on
lengths, not content). bfloat16: autocast over the fp32 weights, as the rollout runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ragen2.bench.machine import emit_report, machine_info  # noqa: E402
from ragen2.models import load_policy  # noqa: E402

UNTIMED_STEPS = 2


def decode_steps_ms(model, forward, ids: torch.Tensor, new_tokens: int, cache_len: int, autocast: bool) -> list[float]:
    """Milliseconds of each one-token forward after a prefill of `ids`, on a fresh static cache
    of `cache_len` positions (the same for every call, so the compiled shapes never change)."""
    from transformers import StaticCache

    batch, prompt = ids.shape
    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    times = []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, cache=cache, use_cache=True,
                       cache_position=torch.arange(prompt)).logits
        token = logits[:, -1:].argmax(-1)
        for step in range(new_tokens):
            started = time.perf_counter()
            logits = forward(input_ids=token, cache=cache, use_cache=True,
                             cache_position=torch.tensor([prompt + step])).logits
            times.append((time.perf_counter() - started) * 1e3)
            token = logits[:, -1:].argmax(-1)
    return times[UNTIMED_STEPS:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=276)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.new_tokens <= UNTIMED_STEPS:
        parser.error(f"--new-tokens must be more than the {UNTIMED_STEPS} untimed steps")
    torch.set_num_threads(args.threads)
    model = load_policy("bundled", device="cpu", dtype=torch.float32).eval()
    ids = torch.randint(100, model.config.vocab_size, (args.batch, args.prompt_tokens),
                        generator=torch.Generator().manual_seed(0))
    autocast = args.dtype == "bfloat16"
    load_start = [round(x, 2) for x in os.getloadavg()]

    cache_len = args.prompt_tokens + args.new_tokens + 1
    eager_first = decode_steps_ms(model, model.forward, ids, args.new_tokens, cache_len, autocast)
    compiled = torch.compile(model.forward, dynamic=False)
    started = time.perf_counter()
    decode_steps_ms(model, compiled, ids, 1 + UNTIMED_STEPS, cache_len, autocast)  # compiles
    compile_s = time.perf_counter() - started
    compiled_steps = decode_steps_ms(model, compiled, ids, args.new_tokens, cache_len, autocast)
    eager_again = decode_steps_ms(model, model.forward, ids, args.new_tokens, cache_len, autocast)

    medians = {"eager": round(statistics.median(eager_first), 1),
               "compiled": round(statistics.median(compiled_steps), 1),
               "eager_again": round(statistics.median(eager_again), 1)}
    emit_report({
        "machine": machine_info(), "load_avg_at_start": load_start,
        "model": "SmolLM2-135M-Instruct (bundled), transformers StaticCache",
        "dtype": args.dtype, "batch": args.batch, "prompt_tokens": args.prompt_tokens,
        "timed_decode_steps": args.new_tokens - UNTIMED_STEPS,
        "compile_s": round(compile_s, 1),
        "median_decode_step_ms": medians,
        "eager_over_compiled": round(min(medians["eager"], medians["eager_again"]) / medians["compiled"], 3),
        "runs_ms": {"eager": [round(t, 1) for t in eager_first], "compiled": [round(t, 1) for t in compiled_steps],
                    "eager_again": [round(t, 1) for t in eager_again]},
    }, args.out)


if __name__ == "__main__":
    main()
