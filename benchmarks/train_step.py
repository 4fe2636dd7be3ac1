"""Where a training step's time goes, and how close the update runs to the machine's matmul peak.

    python benchmarks/train_step.py [--threads 1] [--repeats 2] [--gen-new-tokens 64] [--gen-batch 16] [KEY=VALUE ...]

Model: the bundled SmolLM2-135M-Instruct in fp32 on CPU. Config: configs/base.yaml (+ KEY=VALUE
overrides, e.g. `optim.micro_batch_size=8`), with the MI probe off (it is timed on its own).
Prints one JSON object:

- `matmul`: fp32 `torch.mm` of two 2048x2048 matrices, best of several, measured at the start,
  between the parts and at the end; the best of all is the peak the MFU divides by.
- `train_step`: the phase times of one `trainer.train_step` (after a warm-up step).
- `update`: `learner.ppo_update` on a real rollout batch, best of `--repeats`. Tokens are every
  real (non-pad) token of every row in every forward of the update (prompt and environment
  text included, not only the sampled tokens) x PPO epochs. Two MFUs:
    mfu           = 6 * N * tokens / seconds / peak, N = all parameters (the tied embedding /
                    LM head counted once): the usual 6·N·D estimate. It counts the LM head on every
                    token, but the engine runs the head only on the positions that predict a
                    sampled token, so this credits work that was skipped.
    mfu_executed  = (6 * (N - V*H) * fed_tokens + 6 * V*H * head_rows) / seconds / peak: the
                    body on every token fed (padding included) and the head on the rows it
                    really ran; attention scores (small at these lengths) are not counted.
- `generation`: `generate` on G distinct first-turn prompts in one batch vs one prompt at a time
  (`generate_one_at_a_time`), lengths pinned (no stop strings, no EOS: every sequence gets
  exactly `--gen-new-tokens`), tokens/s and their ratio; the 1-token runs show the prefill share.

Other work on the machine moves the numbers: compare figures from one run, and read the load averages.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

import envs
from envs.prompt import first_turn_messages
from ragen2 import metric_names as names
from ragen2 import models as model_lib
from ragen2 import seeding
from ragen2.engines.local import trainer
from ragen2.bench.machine import machine_info
from ragen2.config import load_config
from ragen2.engines.local import learner
from ragen2.rollout import rollout
from ragen2.rollout.chat import ChatFormat
from ragen2.rollout.generation import shared_prefix_length, generate, generate_one_at_a_time

MATMUL_N = 2048


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def matmul_flops(repeats: int = 6) -> float:
    """Best fp32 FLOP/s of an n x n x n `torch.mm` (2 n^3 FLOPs each)."""
    a, b = torch.randn(MATMUL_N, MATMUL_N), torch.randn(MATMUL_N, MATMUL_N)
    torch.mm(a, b)  # warm-up: MKL picks its kernels and threads on the first call
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * MATMUL_N ** 3 / best


class ForwardCounter:
    """Counts, while enabled, the tokens the decoder is fed and the rows the LM head projects."""

    def __init__(self, policy):
        self.enabled = False
        self.fed_tokens = self.real_tokens = self.head_rows = 0
        policy.get_decoder().register_forward_pre_hook(self._decoder, with_kwargs=True)
        policy.get_output_embeddings().register_forward_pre_hook(self._head)

    def _decoder(self, module, args, kwargs):
        if self.enabled:
            # shared-prefix passes call the decoder with input_ids positionally or with embeddings,
            # and with a 4-D mask: count positions fed, and real ones only from a 2-D padding mask.
            # With optim.shared_prefix on, each row's mask also counts its group's prefix, which
            # runs once per group: the 6·N·tokens MFU then overstates; measure it with it off.
            ids = kwargs.get("input_ids", args[0] if args else None)
            fed = ids.numel() if ids is not None else kwargs["inputs_embeds"].shape[:2].numel()
            attn = kwargs.get("attention_mask")
            self.fed_tokens += fed
            self.real_tokens += int(attn.sum()) if attn is not None and attn.dim() == 2 else fed

    def _head(self, module, args):
        if self.enabled:
            self.head_rows += args[0].reshape(-1, args[0].shape[-1]).shape[0]

    def reset(self):
        self.fed_tokens = self.real_tokens = self.head_rows = 0


def parameter_counts(policy) -> tuple[int, int]:
    """(all unique parameters, LM-head parameters V*H)."""
    unique = {p.data_ptr(): p.numel() for p in policy.parameters()}
    return sum(unique.values()), policy.get_output_embeddings().weight.numel()


def timed_update(run, batch, counter) -> tuple[float, dict]:
    """The update's inputs (learner.update_inputs, untimed) then one timed `ppo_update`, as
    trainer.update_on runs them."""
    cfg, models = run.cfg, run.services.models
    data = learner.update_inputs(models, batch, cfg)
    counter.reset()
    counter.enabled = True
    started = time.perf_counter()
    learner.ppo_update(models, run.services.optimizers, data, cfg, run.state.generator)
    seconds = time.perf_counter() - started
    counter.enabled = False
    return seconds, {"fed_tokens": counter.fed_tokens, "real_tokens": counter.real_tokens,
                     "head_rows": counter.head_rows}


def generation_prompts(tokenizer, count: int, env_name: str) -> list[list[int]]:
    chat, prompts = ChatFormat(tokenizer), []
    for seed in range(count):
        env = envs.make(env_name)
        observation, _ = env.reset(seed=seed)
        prompts.append(chat.prompt_ids(first_turn_messages(env, observation, None)))
    if len({tuple(p) for p in prompts}) != count:
        raise SystemExit(f"{env_name} gave repeated prompts: generate prefills a shared prompt once, "
                         "which would flatter batching; pick another --gen-env")
    return prompts


def bench_generation(model, tokenizer, args) -> dict:
    prompts = generation_prompts(tokenizer, args.gen_batch, args.gen_env)
    pinned = dict(temperature=1.0, top_p=1.0, stop_strings=(), eos_token_ids=(),
                  pad_token_id=tokenizer.pad_token_id, tokenizer=tokenizer)

    def once(fn, new_tokens) -> float:
        started = time.perf_counter()
        results = fn(model, prompts, max_new_tokens=new_tokens, generator=torch.Generator().manual_seed(0), **pinned)
        if any(len(r.token_ids) != new_tokens for r in results):
            raise RuntimeError("generation lengths were not pinned")
        return time.perf_counter() - started

    n, g = args.gen_new_tokens, args.gen_batch
    generate(model, prompts[:2], max_new_tokens=2, **pinned)  # warm-up
    # Batched and one-at-a-time alternate, so a busy spell on the shared machine hits both.
    best = {}
    for _ in range(args.repeats):
        for key, fn, tokens in (("batched", generate, n), ("single", generate_one_at_a_time, n),
                                ("batched_1", generate, 1), ("single_1", generate_one_at_a_time, 1)):
            best[key] = min(best.get(key, float("inf")), once(fn, tokens))
            log(f"{key} x{tokens} tokens: {best[key]:.2f} s (best so far)")
    batched_s, single_s, batched_1_s, single_1_s = best["batched"], best["single"], best["batched_1"], best["single_1"]
    return {
        "env": args.gen_env, "sequences": g, "new_tokens_each": n,
        "prompt_tokens": {"min": min(map(len, prompts)), "max": max(map(len, prompts)),
                          "shared_prefix": shared_prefix_length(prompts)},
        "batched": {"seconds": round(batched_s, 2), "tokens_per_s": round(g * n / batched_s, 1),
                    "prefill_and_1_token_s": round(batched_1_s, 2)},
        "one_at_a_time": {"seconds": round(single_s, 2), "tokens_per_s": round(g * n / single_s, 1),
                          "prefill_and_1_token_s": round(single_1_s, 2)},
        "speedup": round(single_s / batched_s, 2),
        "target_speedup": 6.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default); on a shared, loaded machine 1 avoids OpenMP "
                             "threads waiting on each other")
    parser.add_argument("--repeats", type=int, default=2, help="runs per measurement; the fastest counts")
    parser.add_argument("--gen-new-tokens", type=int, default=64)
    parser.add_argument("--gen-batch", type=int, default=16)
    parser.add_argument("--gen-env", default="sokoban", help="env whose first-turn prompts are generated from")
    parser.add_argument("--skip", nargs="*", default=(), choices=("train_step", "update", "generation"))
    parser.add_argument("overrides", nargs="*", help="config KEY=VALUE overrides")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    peaks = {"start": matmul_flops()}
    cfg = load_config(overrides=["model.device=cpu", "probe.every=0", *args.overrides])
    started = time.perf_counter()
    policy = model_lib.load_policy(cfg.model.name, dtype=cfg.model.dtype)
    tokenizer = model_lib.load_tokenizer(cfg.model.name)
    load_s = time.perf_counter() - started
    models = learner.Models(policy, tokenizer, None, None, torch.device("cpu"))
    if cfg.algo.uses_critic or cfg.algo.kl_coef > 0:
        models = learner.build_models(cfg)  # critic / reference as the config asks
    counter = ForwardCounter(models.policy)
    report = {"machine": machine_info(), "model": f"{cfg.model.name} ({cfg.model.dtype})",
              "model_load_s": round(load_s, 2), "load_avg_at_start": os.getloadavg()[0],
              "config": {"algo": cfg.algo.name, "env": cfg.env.name, "groups_x_size":
                         f"{cfg.rollout.num_groups}x{cfg.rollout.group_size}",
                         "max_new_tokens": cfg.rollout.max_new_tokens, "mini_batch": cfg.optim.mini_batch_size,
                         "micro_batch": cfg.optim.micro_batch_size, "ppo_epochs": cfg.optim.ppo_epochs}}

    with tempfile.TemporaryDirectory() as run_dir:
        run = trainer.setup(cfg, Path(run_dir), quiet=True, models=models)
        if "train_step" not in args.skip:
            trainer.train_step(run)  # warm-up: first-call costs (allocator, MKL) stay out of the numbers
            run.state.step += 1
            metrics = trainer.train_step(run).metrics
            run.state.step += 1
            log(f"train step: {metrics[names.TIME_STEP_S]:.1f} s")
            report["train_step"] = {k.removeprefix(names.TIME): v for k, v in metrics.items() if k.startswith(names.TIME)}
            report["train_step"]["update_tokens_per_s"] = round(metrics.get(names.THROUGHPUT_UPDATE, 0), 1)
            report["train_step"]["rollout_tokens_per_s"] = round(metrics[names.THROUGHPUT_ROLLOUT], 1)
        peaks["after_train_step"] = matmul_flops()
        if "update" not in args.skip:
            batch = rollout(models.policy, tokenizer, trainer.env_factory(cfg), seeding.step_seeds(cfg, 99),
                            cfg.rollout, run.state.generator)
            runs = []
            for _ in range(args.repeats):
                runs.append(timed_update(run, batch, counter))
                log(f"update: {runs[-1][0]:.1f} s")
            seconds, counts = min(runs, key=lambda r: r[0])
            report["update"] = {"seconds": round(seconds, 3), "all_runs_s": [round(r[0], 3) for r in runs],
                                "rows": len(batch), "padded_width": batch.input_ids.shape[1],
                                "response_tokens": batch.num_response_tokens, **counts}
        peaks["after_update"] = matmul_flops()
        run.services.log.close()
    if "generation" not in args.skip:
        report["generation"] = bench_generation(models.policy, tokenizer, args)
        peaks["end"] = matmul_flops()

    peak = max(peaks.values())
    report["matmul"] = {"n": MATMUL_N, "peak_gflops": round(peak / 1e9, 1),
                        "gflops_at": {k: round(v / 1e9, 1) for k, v in peaks.items()}}
    if "update" in report:
        u = report["update"]
        n_params, head = parameter_counts(models.policy)
        tokens = u["real_tokens"]
        executed = 6 * (n_params - head) * u["fed_tokens"] + 6 * head * u["head_rows"]
        u.update(params=n_params, lm_head_params=head, tokens_per_s=round(tokens / u["seconds"], 1),
                 mfu=round(6 * n_params * tokens / u["seconds"] / peak, 3),
                 mfu_executed=round(executed / u["seconds"] / peak, 3), target_mfu=0.6)
    report["load_avg_at_end"] = os.getloadavg()[0]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
