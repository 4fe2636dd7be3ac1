"""Batched generation: the rollout's session against a plain Hugging Face cached loop and `generate`; prints JSON.

    python benchmarks/generation.py [--new-tokens 64] [--batch 16] [--repeats 1] [--random-init]
                                    [--threads N] [--dtype float32|bfloat16] [--skip-single]
                                    [--before COMMIT] [--skip-hf-generate]

Side by side in one run, alternating within each repeat so a busy spell hits every side:
  session      `ragen2.rollout.generate`: the model's own forward over the row KV cache (kv_rows.py);
  hf_loop      a plain Hugging Face cached loop: left-padded prompts, the model's DynamicCache and
               attention, one forward per token, the same sampler and generator;
  hf_generate  Hugging Face `model.generate` (sampling, exactly N tokens each);
  before       (--before COMMIT) the rollout's `generate` as it was at COMMIT, loaded from git:
               e.g. 504257a, our own Llama/Qwen2 decoder (fast_decoder.py) that kv_rows replaced,
               or 0017fdb, the row cache before it kept bf16 keys and read whole rows.
Each also with 1 new token, so the prefill cost can be split from the decode cost. The decode
rate is also read per step: every one-token forward of a side is timed and the median step
counts (16 rows each, no stops), which a busy spell on a loaded machine moves far less than a
whole run. Every side runs under the model's compute dtype (--dtype bfloat16: autocast over fp32 weights, one context
around each call, as the rollout does).

Model: the bundled SmolLM2-135M-Instruct (ragen2.models.load_policy("bundled")) when it loads,
else a random-init model of the same architecture (`--random-init` forces that). Prompts are
RAGEN first-turn Sokoban prompts (distinct rooms) through the chat template, or random ids of
the same lengths without a tokenizer. Equal work: no stop strings, no EOS, `--new-tokens` each.
Also: group prefill (P=2 prompts x G=b/2 copies vs b distinct prompts, 1 new token), and
one prompt at a time (unless --skip-single).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ragen2 import precision
from ragen2.bench.machine import machine_info
from ragen2.rollout.generation import GenerationResult, generate, generate_one_at_a_time, sample_tokens

ROOT = Path(__file__).resolve().parents[1]  # the git checkout --before is read from


def smollm2_architecture():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def load_model(random_init: bool):
    if not random_init:
        try:
            from ragen2.models import load_policy, load_tokenizer

            started = time.perf_counter()
            model, tokenizer = load_policy("bundled").eval(), load_tokenizer("bundled")
            return model, tokenizer, "SmolLM2-135M-Instruct (bundled)", time.perf_counter() - started
        except Exception as error:  # noqa: BLE001 - any failure means: fall back, and say why
            print(f"bundled model unavailable ({type(error).__name__}: {error}); using random init", file=sys.stderr)
    started = time.perf_counter()
    return smollm2_architecture(), None, "random-init SmolLM2-135M architecture", time.perf_counter() - started


def build_prompts(tokenizer, batch: int) -> list[list[int]]:
    import envs
    from envs.prompt import first_turn_messages

    prompts = []
    for i in range(batch):
        env = envs.make("sokoban")  # distinct seeds, distinct rooms: no prompt is shared
        observation, _ = env.reset(seed=i)
        messages = first_turn_messages(env, observation, max_response_words=100)
        if tokenizer is not None:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:  # ~4 characters per token, as for English BPE
            length = sum(len(m["content"]) for m in messages) // 4
            prompts.append(torch.randint(100, 49152, (length,), generator=torch.Generator().manual_seed(i)).tolist())
    if len({tuple(p) for p in prompts}) != len(prompts):
        raise RuntimeError("benchmark prompts must be distinct: generate prefills a shared prompt once")
    return prompts


def left_padded(prompts, pad_token_id):
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt):] = torch.tensor(prompt)
        mask[row, longest - len(prompt):] = 1
    return ids, mask


@torch.no_grad()
def hf_loop(model, prompts, *, max_new_tokens, generator=None, pad_token_id=0, temperature=1.0, top_p=1.0,
            **_ignored) -> list[GenerationResult]:
    """A plain Hugging Face cached loop: the model's forward, DynamicCache and attention; no stops."""
    ids, mask = left_padded(prompts, pad_token_id)
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    results = [GenerationResult(token_ids=[], logprobs=[]) for _ in prompts]
    with precision.autocast(model):
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    use_cache=True, logits_to_keep=1)
        position = mask.sum(-1)
        for step in range(max_new_tokens):
            tokens, logprobs = sample_tokens(out.logits[:, -1], temperature, top_p, generator)
            for result, token, logprob in zip(results, tokens.tolist(), logprobs.tolist()):
                result.token_ids.append(token)
                result.logprobs.append(logprob)
            if step == max_new_tokens - 1:
                break
            mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=-1)
            cache = getattr(out, "cache", None)
            cache = out.past_key_values if cache is None else cache
            out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=position[:, None],
                        use_cache=True, **{cache_name: cache})
            position = position + 1
    return results


@torch.no_grad()
def hf_generate(model, prompts, *, max_new_tokens, pad_token_id=0, **_ignored) -> list[GenerationResult]:
    """Hugging Face `model.generate` on the same prompts: left-padded, sampling, exactly
    max_new_tokens each (min = max, no stop); seeded through torch's global RNG (its only way)."""
    ids, mask = left_padded(prompts, pad_token_id)
    torch.manual_seed(0)
    with precision.autocast(model):
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             pad_token_id=pad_token_id)
    return [GenerationResult(token_ids=row[ids.shape[1]:].tolist()) for row in out]


def generate_at(commit: str, workdir: Path, steps: StepTimes):
    """`generate` of the package ragen2/rollout as it was at `commit`, importable beside today's.

    Every module of the package at that commit is copied as package `before_rollout`, its imports
    of `ragen2.rollout` pointed there (the rest of ragen2 is today's). A commit that still had
    our own decoder (`fast_decoder`, before issue 31) gets its forward timed like the model's.
    """
    listing = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{commit}:ragen2/rollout"],
                             check=True, capture_output=True, text=True).stdout.split()
    package = workdir / "before_rollout"
    package.mkdir()
    for name in (n for n in listing if n.endswith(".py")):
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:ragen2/rollout/{name}"],
                                check=True, capture_output=True, text=True).stdout
        source = source.replace("ragen2.rollout", "before_rollout")
        # its own name for the row attention it registers, so the two sides never swap functions
        source = source.replace('"ragen2_kv_rows"', '"ragen2_kv_rows_before"')
        (package / name).write_text(source)
    sys.path.insert(0, str(workdir))
    try:
        module = importlib.import_module("before_rollout.generation")
        importlib.import_module("before_rollout.session")  # generate imports it lazily, after the path is gone
        if (package / "fast_decoder.py").exists():
            decoder = importlib.import_module("before_rollout.fast_decoder").FastDecoder
            decoder.forward = steps.wrap(decoder.forward)
    finally:
        sys.path.remove(str(workdir))
    return module.generate


class StepTimes:
    """Times every forward that feeds one token per row (a decode step), for the side that runs now."""

    def __init__(self, model):
        self.side, self.times, self.started = None, {}, None
        model.register_forward_pre_hook(self._before, with_kwargs=True)
        model.register_forward_hook(self._after, with_kwargs=True)

    def _before(self, _module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.started = time.perf_counter() if ids is not None and ids.shape[1] == 1 else None

    def _after(self, _module, _args, _kwargs, _out):
        self.record(self.started)

    def record(self, started):
        if started is not None and self.side is not None:
            self.times.setdefault(self.side, []).append(time.perf_counter() - started)

    def wrap(self, forward):
        """For a forward that is not the model's (the --before decoder's own)."""
        def timed_forward(decoder, input_ids, *args, **kwargs):
            started = time.perf_counter() if input_ids.shape[1] == 1 else None
            out = forward(decoder, input_ids, *args, **kwargs)
            self.record(started)
            return out
        return timed_forward


def timed(fn, *args, **kwargs):
    started = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="runs per measurement; the fastest counts")
    parser.add_argument("--random-init", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="compute precision of every side (bfloat16: autocast over fp32 weights)")
    parser.add_argument("--skip-single", action="store_true", help="skip the (slow) one-at-a-time runs")
    parser.add_argument("--before", metavar="COMMIT", help="also time the rollout's generate as it was at COMMIT")
    parser.add_argument("--skip-hf-generate", action="store_true", help="skip Hugging Face `generate` (the slowest side)")
    args = parser.parse_args()
    if args.batch < 1 or args.new_tokens < 2 or args.repeats < 1:
        parser.error("--batch and --repeats must be >= 1 and --new-tokens >= 2 (decode = all tokens but the first)")
    if args.threads:
        torch.set_num_threads(args.threads)
    load_at_start = os.getloadavg()

    model, tokenizer, model_name, load_s = load_model(args.random_init)
    precision.set_compute_dtype(model, args.dtype)
    prompts = build_prompts(tokenizer, args.batch)
    pad = tokenizer.pad_token_id if tokenizer is not None else 0
    equal = dict(temperature=1.0, top_p=1.0, stop_strings=(), eos_token_ids=(), pad_token_id=pad, tokenizer=tokenizer)
    sides = {"session": generate, "hf_loop": hf_loop}
    if not args.skip_hf_generate:
        sides["hf_generate"] = hf_generate
    workdir = tempfile.TemporaryDirectory()
    steps = StepTimes(model)
    if args.before:
        sides["before"] = generate_at(args.before, Path(workdir.name), steps)
    for fn in sides.values():
        fn(model, prompts[:2], max_new_tokens=2, generator=torch.Generator().manual_seed(0), **equal)  # warm-up

    n, b = args.new_tokens, args.batch
    best: dict[str, float] = {}
    for _ in range(args.repeats):
        for tokens in (n, 1):
            for name, fn in sides.items():
                key = name if tokens == n else f"{name}_1"
                steps.side = name
                results, seconds = timed(fn, model, prompts, max_new_tokens=tokens,
                                         generator=torch.Generator().manual_seed(0), **equal)
                steps.side = None
                assert all(len(r.token_ids) == tokens for r in results)
                best[key] = min(best.get(key, float("inf")), seconds)
                print(f"{key}: {seconds:.2f} s (best {best[key]:.2f})", file=sys.stderr, flush=True)
    workdir.cleanup()

    def decode_rate(name):
        total, prefill = best[name], best[f"{name}_1"]
        return round(b * (n - 1) / (total - prefill), 1) if total > prefill else None

    report = {
        "command": "python benchmarks/generation.py " + " ".join(sys.argv[1:]),
        "model": model_name,
        "model_load_s": round(load_s, 2),
        "machine": machine_info(),
        "load_avg_at_start": [round(x, 2) for x in load_at_start],
        "dtype": args.dtype,
        "batch": b,
        "new_tokens_each": n,
        "repeats": args.repeats,
        "prompt_tokens": {"min": min(map(len, prompts)), "max": max(map(len, prompts)),
                          "total": sum(map(len, prompts))},
    }
    for name in sides:
        step_s = statistics.median(steps.times[name])
        report[name] = {"seconds": round(best[name], 2), "tokens_per_s": round(b * n / best[name], 1),
                        "decode_tokens_per_s": decode_rate(name), "prefill_s": round(best[f"{name}_1"], 2),
                        "decode_steps_timed": len(steps.times[name]),
                        "decode_step_ms_median": round(1000 * step_s, 1),
                        "decode_tokens_per_s_median_step": round(b / step_s, 1)}
    hf_step = statistics.median(steps.times["hf_loop"])
    for name in [s for s in sides if s != "hf_loop"]:
        report[f"{name}_decode_vs_hf_loop"] = round(hf_step / statistics.median(steps.times[name]), 2)
        report[f"{name}_total_vs_hf_loop"] = round(best["hf_loop"] / best[name], 2)
    report["decode_target_vs_hf_loop"] = 2.0

    if not args.skip_single:
        _, single_s = timed(generate_one_at_a_time, model, prompts, max_new_tokens=n,
                            generator=torch.Generator().manual_seed(0), **equal)
        report["one_at_a_time"] = {"seconds": round(single_s, 2), "tokens_per_s": round(b * n / single_s, 1),
                                   "batched_speedup": round(single_s / best["session"], 2)}
    if b >= 4 and b % 2 == 0:
        grouped = [prompts[i // (b // 2)] for i in range(b)]  # 2 groups of b/2 identical prompts
        _, grouped_s = timed(generate, model, grouped, max_new_tokens=1, **equal)
        report["group_prefill"] = {"groups_x_members": f"2x{b // 2}", "prefill_s": round(grouped_s, 2),
                                   "distinct_prompts_prefill_s": round(best["session_1"], 2)}
    report["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
