"""One decode step's attention over the rollout's row cache, per way of storing and reading it; prints JSON.

    python benchmarks/row_attention.py [--rows 16] [--slots 300] [--new-tokens 33] [--threads 1]
                                       [--calls 300] [--out FILE]

`ragen2.rollout.kv_rows._row_attention` on the bundled model's shapes (9 query heads, 3 key/value
heads of 64), one query per row, `--slots` filled slots a row. The query comes in fp32, as it
leaves the rotary embedding under autocast. Cases, each the median of `--calls` calls:

  fp32, slice            fp32 cache, read [:slots] of a buffer of slots + new tokens (fp32 reads it so)
  fp32, whole rows       the same, read whole (masked past `slots`)
  bf16, as before        under bf16 autocast, keys kept in fp32 (as they leave the rotary embedding)
                         and read as a slice: every call casts the keys (the row cache before 2026-12-04)
  bf16, slice            keys and values kept in bf16, read as a slice
  bf16, whole rows       kept in bf16, read whole: the buffer of slots + new tokens (what the rollout does)
  bf16, whole rows x2    the same with twice the slots allocated (a multi-turn row after growth)

Per decode step the model makes this call once per layer (30 for SmolLM2-135M): `step_ms` is 30x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ragen2.bench.machine import machine_info
from ragen2.rollout.kv_rows import _row_attention

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 9, 3, 64, 30


def median_ms(fn, calls: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def case(rows: int, slots: int, capacity: int, key_dtype, value_dtype, whole: bool, autocast: bool, calls: int):
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(rows, KV_HEADS, capacity, HEAD_DIM, generator=generator).to(key_dtype)
    values = torch.randn(rows, KV_HEADS, capacity, HEAD_DIM, generator=generator).to(value_dtype)
    query = torch.randn(rows, HEADS, 1, HEAD_DIM, generator=generator)
    span = capacity if whole else slots
    group = HEADS // KV_HEADS
    mask = torch.zeros(rows, 1, group, span)
    mask[..., slots:] = float("-inf")
    key, value = keys[:, :, :span], values[:, :, :span]

    def call():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return _row_attention(None, query, key, value, mask)

    ms = median_ms(call, calls)
    return {"call_ms": round(ms, 4), "step_ms": round(ms * LAYERS, 2), "slots_read": span,
            "key_dtype": str(key_dtype).removeprefix("torch."), "contiguous": key.is_contiguous()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--slots", type=int, default=300, help="filled slots a row (prompt + tokens so far)")
    parser.add_argument("--new-tokens", type=int, default=33, help="slots allocated beyond --slots")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    if min(args.rows, args.slots, args.new_tokens, args.threads, args.calls) < 1:
        parser.error("every count must be >= 1")
    torch.set_num_threads(args.threads)
    n, s, c = args.rows, args.slots, args.slots + args.new_tokens
    f32, bf16 = torch.float32, torch.bfloat16
    cases = {
        "fp32, slice": (n, s, c, f32, f32, False, False),
        "fp32, whole rows": (n, s, c, f32, f32, True, False),
        "bf16, as before": (n, s, c, f32, bf16, False, True),
        "bf16, slice": (n, s, c, bf16, bf16, False, True),
        "bf16, whole rows": (n, s, c, bf16, bf16, True, True),
        "bf16, whole rows x2": (n, s, 2 * s, bf16, bf16, True, True),
    }
    report = {"command": "python benchmarks/row_attention.py " + " ".join(sys.argv[1:]), "machine": machine_info(),
              "shape": {"rows": n, "slots": s, "capacity": c, "heads": HEADS, "kv_heads": KV_HEADS,
                        "head_dim": HEAD_DIM, "layers": LAYERS},
              "cases": {name: case(*spec, args.calls) for name, spec in cases.items()}}
    before, now = report["cases"]["bf16, as before"]["call_ms"], report["cases"]["bf16, whole rows"]["call_ms"]
    report["bf16_as_before_over_whole_rows"] = round(before / now, 2)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
