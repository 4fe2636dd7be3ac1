"""Bundled model load times: GGUF dequantise + cache build once, then loads from the safetensors cache.

    python benchmarks/model_load.py [--cache DIR] [--repeats 3]

Without --cache the cache goes to a fresh temporary directory (deleted afterwards), so the first
load is a real conversion. Prints one JSON object: seconds for the first load (build + load) and
for cached loads, the parameter count, the cache size, and how far the cached model's logits and
the cached tokenizer's ids are from those of the model and tokenizer loaded straight from the GGUF.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from ragen2 import bundled_model, models
from ragen2.bench.machine import machine_info

PROMPT = [
    {"role": "system", "content": "You're a helpful assistant. "},
    {"role": "user", "content": "Turn 1:\nState:\n#####\n#_P_#\n#_X_#\n#_O_#\n#####\nYou have 10 actions left. "
                                "Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer>"},
]


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def load_from_cache():
    return models.load_policy("bundled"), models.load_tokenizer("bundled")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="cache directory (default: a fresh temporary one, removed at the end)")
    parser.add_argument("--repeats", type=int, default=3, help="cached loads to time (median reported)")
    args = parser.parse_args(argv)
    temporary = None if args.cache else tempfile.mkdtemp(prefix="ragen2-model-load-")
    os.environ["RAGEN2_CACHE"] = args.cache or temporary
    try:
        gguf = bundled_model.bundled_gguf_path()
        cache_dir, build_s = timed(lambda: models.resolve_model_source("bundled"))
        (policy, tokenizer), first_load_rest_s = timed(load_from_cache)
        cached_s = []
        for _ in range(max(1, args.repeats)):
            del policy, tokenizer
            (policy, tokenizer), seconds = timed(load_from_cache)
            cached_s.append(seconds)

        (gguf_model, gguf_tokenizer), gguf_load_s = timed(lambda: bundled_model._dequantise_gguf(gguf))
        text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        gguf_ids = gguf_tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            cached_logits, gguf_logits = policy(ids).logits, gguf_model(ids).logits
        cache_bytes = sum(f.stat().st_size for f in Path(cache_dir).iterdir() if f.is_file())
        report = {
            "model": bundled_model.BUNDLED_GGUF,
            "first_load_s": round(build_s + first_load_rest_s, 2),
            "first_load_build_cache_s": round(build_s, 2),
            "cached_load_s": round(statistics.median(cached_s), 2),
            "cached_load_runs_s": [round(s, 2) for s in cached_s],
            "gguf_direct_load_s": round(gguf_load_s, 2),
            "params": sum(p.numel() for p in policy.parameters()),
            "dtype": str(policy.dtype),
            "cache_mb": round(cache_bytes / 2**20, 1),
            "prompt_tokens": ids.shape[1],
            "tokenizer_ids_equal_gguf": torch.equal(ids, gguf_ids),
            "chat_template_equal_gguf": tokenizer.chat_template == gguf_tokenizer.chat_template,
            "logits_max_abs_diff_vs_gguf": (cached_logits - gguf_logits).abs().max().item(),
            "logits_max_abs": gguf_logits.abs().max().item(),
            "transformers": transformers.__version__,
            "machine": machine_info(),
        }
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
