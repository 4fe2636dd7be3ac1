"""What the MI probe costs; prints JSON.

    python benchmarks/mi_probe_cost.py [--groups 8] [--group-size 4] [--max-new-tokens 64]
                                       [--mode first_turn] [--num-samples 64] [--every 5] [--threads 2]

On a real rollout batch of the bundled SmolLM2-135M-Instruct (think-mode Bandit, the CPU
default training config otherwise), measured in one process so the numbers are ratios on
the same machine state:

1. probe time (cross-scoring + estimators, as the trainer runs it) vs one old-log-prob pass
   over the same batch (the cheapest pass a training step makes);
2. batched cross-scoring (one KV-cached prefill per prompt, reasoning rows in micro-batches)
   vs the naive loop (one full forward per (reasoning, prompt) pair) on the same pairs, with
   the largest |L_batched - L_naive| as a check that they compute the same thing;
3. one full training step (`trainer.train_step`, probe off; its rollout is the batch probed
   above), and the probe's amortised share
   of step time at `--every` (probe time / (every x step time); targets: speed-up >= 5x,
   share <= 5%);
4. the prefix all prompts share (the system text) encoded once (the default) vs once per prompt,
   alternating `--repeats` times;
5. the scoring in fp32 (`probe.dtype=float32`) vs under autocast to the policy's compute dtype
   (`probe.dtype=policy`, the default: bf16 where `model.dtype=auto` picks it) on the same pairs:
   time, the largest and mean |L difference|, both sides' MI, retrieval@1 and each row's best
   column, alternating `--repeats` times;
6. the scoring path: today's (the decoder, then the head only on positions that predict a scored
   token; key/value heads kept grouped under a mask, ragen2.attention) vs the model run whole
   (the head on every prompt and pad position) with transformers' sdpa, alternating;
7. rows packed (several rows in one row of a micro-batch, each under its own mask: the default)
   vs right-padded to their micro-batch's longest, alternating: time, the largest |L difference|,
   and the reasoning positions each feeds per prompt;
8. the share of the fp32 scoring spent inside the model's linear layers (the decoder's projections
   and the output head; each call timed by hooks, `--repeats` runs, the fastest counts), with the
   rate they ran at (2 x rows x inputs x outputs FLOPs a call): the bound on what any other
   change can buy while the linears stay fp32 is 1 / that share.

`--comparisons` picks which of 4-8 run (all by default).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

import mi_probe
from ragen2 import metric_names as names
from ragen2 import attention, precision
from ragen2.instruments import probe as probe_lib
from ragen2.engines.local import trainer
from ragen2.bench.machine import machine_info
from ragen2.config import ProbeSection, load_config
from ragen2.engines.local import learner


def timed(fn, *args, **kwargs):
    started = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - started


def alternate(sides: dict, repeats: int) -> tuple[dict, dict]:
    """Each side's no-argument callable `repeats` times, alternating so that a busy spell hits every
    side: (seconds of each run per side, the last result per side)."""
    runs, last = {name: [] for name in sides}, {}
    for _ in range(repeats):
        for name, run in sides.items():
            last[name], seconds = timed(run)
            runs[name].append(round(seconds, 3))
    return runs, last


COMPARISONS = ("system_prefix", "scoring_dtype", "scoring_path", "packing", "linear_share")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--mode", choices=("first_turn", "trajectory"), default="first_turn")
    parser.add_argument("--num-samples", type=int, default=ProbeSection().num_samples)
    parser.add_argument("--every", type=int, default=ProbeSection().every, help="probe cadence for the share")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-naive", action="store_true", help="leave out the (slow) naive loop")
    parser.add_argument("--segment", choices=("auto", "reasoning", "reply"), default="auto",
                        help="what the probe scores (auto: as the trainer resolves it for the env)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each comparison's sides")
    parser.add_argument("--comparisons", nargs="+", choices=COMPARISONS, default=list(COMPARISONS),
                        help="which alternating comparisons to run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cfg = load_config(env="bandit", overrides=[
        f"rollout.num_groups={args.groups}", f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"rollout.temperature={args.temperature}",
        "probe.every=0", "trainer.total_steps=1", "model.device=cpu"])
    with tempfile.TemporaryDirectory() as folder:
        run, load_s = timed(trainer.setup, cfg, Path(folder) / "run", quiet=True)
        policy, tokenizer = run.services.models.policy, run.services.models.tokenizer

        # 3. a real training step (probe off); the batch it rolled out is the one probed
        step_result, step_s = timed(trainer.train_step, run)
        step_metrics, batch = step_result.metrics, step_result.batch
        # auto: as the trainer resolved it for the env in setup (reply for an answer-only env)
        segment = cfg.probe.segment if args.segment == "auto" else args.segment
        probe = probe_lib.Probe(ProbeSection(every=1, mode=args.mode, num_samples=args.num_samples,
                                             segment=segment), tokenizer)

        # 1. the probe as the trainer runs it vs one old-log-prob pass
        probe_metrics, probe_s = timed(probe.measure, policy, batch, 0)
        ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask
        micro = cfg.optim.micro_batch_size
        _, old_log_prob_s = timed(learner.batched, lambda i, a, m: learner.policy_log_probs(
            policy, learner.TokenRows(i, a, m), cfg.rollout.temperature)[0], micro, ids, attn, mask)

        # 2. batched vs naive cross-scoring on the same pairs
        prompts, reasonings, owners = probe.pairs(batch, 0)
        result = {}
        if len(set(owners)) >= 2:
            fast, fast_s = timed(mi_probe.cross_score, policy, prompts, reasonings, owners,
                                 pad_token_id=probe.pad_id)
            result.update(cross_score_batched_s=fast_s)
            def score(**kwargs):
                return mi_probe.cross_score(policy, prompts, reasonings, owners, pad_token_id=probe.pad_id, **kwargs)

            def score_in_compute_dtype():
                with precision.autocast(policy):
                    return score()

            distinct = [list(p) for p in {tuple(p) for p in prompts}]
            if "system_prefix" in args.comparisons:
                # 4. the system prefix every prompt shares: encoded once (default) vs once per prompt
                runs, scores = alternate({"whole_prompts": lambda: score(share_system_prefix=False),
                                          "shared_system_prefix": score}, args.repeats)
                result["system_prefix"] = {
                    "runs_s": runs,
                    "speedup_best": round(min(runs["whole_prompts"]) / min(runs["shared_system_prefix"]), 3),
                    "max_abs_diff_L": float((scores["whole_prompts"].L - scores["shared_system_prefix"].L).abs().max()),
                    "prompt_tokens": sum(len(p) for p in distinct),
                    "shared_prefix_tokens": mi_probe.cross_scoring._shared_prefix_length(distinct),
                    "scored_pair_tokens": sum(len(z) for z in reasonings) * len(distinct)}
            if "scoring_dtype" in args.comparisons:
                # 5. the scoring in fp32 (as the probe runs it) vs in the policy's compute dtype (autocast)
                runs, scores = alternate({"fp32": score, "compute_dtype": score_in_compute_dtype}, args.repeats)
                estimates = {}
                for name, side in scores.items():
                    L, L_sum, owner, columns, _ = probe_lib.usable_scores(side)
                    estimates[name] = (L, {k: float(v) for k, v in mi_probe.mi_metrics_both(
                        L, L_sum, owner, column_ids=columns).items()
                        if k in ("mi_estimate", "mi_estimate_seq", "mi_zscore", "retrieval_accuracy@1")})
                difference = (estimates["fp32"][0] - estimates["compute_dtype"][0]).abs()
                result["scoring_dtype"] = {
                    "compute_dtype": str(precision.compute_dtype(policy)), "runs_s": runs,
                    "speedup_best": round(min(runs["fp32"]) / min(runs["compute_dtype"]), 3),
                    "max_abs_diff_L": float(difference.max()), "mean_abs_diff_L": float(difference.mean()),
                    "max_abs_L": float(estimates["fp32"][0].abs().max()),
                    "mean_abs_L": float(estimates["fp32"][0].abs().mean()),
                    "pairs": list(difference.shape),
                    # rows whose best-scoring column (the retrieval guess) differs between the precisions
                    "rows_best_column_differs": int((estimates["fp32"][0].argmax(dim=1)
                                                     != estimates["compute_dtype"][0].argmax(dim=1)).sum()),
                    "metrics": {name: value[1] for name, value in estimates.items()}}
            if "scoring_path" in args.comparisons:  # 6. today's path vs the model run whole, sdpa
                result["scoring_path"] = compare_scoring_paths(policy, score, lambda: score(split_head=False),
                                                               args.repeats)
            if "packing" in args.comparisons:  # 7. rows packed (default) vs right-padded
                runs, scores = alternate({"padded": lambda: score(pack=False), "packed": score}, args.repeats)
                fed = [len(z) - 1 for z in reasonings]
                order = sorted(range(len(fed)), key=lambda i: -fed[i])
                micro = 16  # cross_score's default micro-batch, as the probe calls it
                padded_positions = sum(max(fed[i] for i in order[s:s + micro]) * len(order[s:s + micro])
                                       for s in range(0, len(fed), micro))
                packed_positions = sum(len(packs) * max(sum(fed[i] for i in pack) for pack in packs)
                                       for packs in mi_probe.cross_scoring._packed_micro_batches(order, fed, micro))
                result["packing"] = {
                    "runs_s": runs,
                    "speedup_best": round(min(runs["padded"]) / min(runs["packed"]), 3),
                    "max_abs_diff_L": float((scores["padded"].L - scores["packed"].L).abs().max()),
                    # decoder positions each prompt's rows take (pads included), and their real tokens
                    "fed_positions_per_prompt": {"padded": padded_positions, "packed": packed_positions,
                                                 "real_tokens": sum(fed)}}
            if "linear_share" in args.comparisons:  # 8. time inside the linear layers
                result["linear_share"] = linear_share(policy, score, args.repeats)
            if not args.skip_naive:
                naive, naive_s = timed(mi_probe.cross_score_naive, policy, prompts, reasonings, owners)
                result.update(cross_score_naive_s=naive_s, batched_speedup=naive_s / fast_s,
                              max_abs_diff_L=float((fast.L - naive.L).abs().max()))

    reasoning_tokens = [len(z) for z in reasonings]
    step_s_reported = step_metrics[names.TIME_STEP_S]
    out = {
        "machine": machine_info(),
        "model": "SmolLM2-135M-Instruct (bundled), CPU",
        # what item 1 (the probe as the trainer runs it) scored in: probe.dtype's default
        "probe_dtype": probe_metrics.get(names.PROBE_DTYPE),
        "batch": {"groups": args.groups, "group_size": args.group_size, "rows": len(batch),
                  "padded_width": int(ids.shape[1]), "tokens": batch.num_tokens,
                  "response_tokens": batch.num_response_tokens, "reasoning_spans": len(batch.reasoning_spans)},
        "probe": {"mode": args.mode, "segment": probe.cfg.segment, "columns": len(prompts), "distinct_prompts": len({tuple(p) for p in prompts}),
                  "rows": len(reasonings), "reasoning_tokens_mean": (sum(reasoning_tokens) / len(reasoning_tokens)
                                                                     if reasoning_tokens else 0.0),
                  "skipped": bool(probe_metrics.get(names.PROBE_SKIPPED_TOO_FEW_GROUPS)),
                  "mi_estimate": probe_metrics.get(names.PROBE_MI_ESTIMATE),
                  "retrieval_accuracy@1": probe_metrics.get(names.PROBE_RETRIEVAL_ACCURACY_AT_1)},
        "seconds": {"model_load": load_s, "train_step": step_s, "train_step_logged": step_s_reported,
                    "rollout": step_metrics[names.TIME_ROLLOUT_S], "probe": probe_s,
                    "old_log_prob_pass": old_log_prob_s, **result},
        "probe_over_old_log_prob_pass": probe_s / old_log_prob_s,
        "probe_every": args.every,
        # the trainer leaves probe time out of time/step_s, so the share is against the logged step time
        "amortised_share_of_step_time": probe_s / (args.every * step_s_reported) if args.every else 0.0,
        "targets": {"batched_speedup_min": 5.0, "amortised_share_max": 0.05},
    }
    if "batched_speedup" in result:
        out["batched_speedup"] = result["batched_speedup"]
    out["meets_targets"] = {
        "batched_speedup": out.get("batched_speedup", 0.0) >= 5.0 if "batched_speedup" in out else None,
        "amortised_share": out["amortised_share_of_step_time"] <= 0.05,
    }
    print(json.dumps(out, indent=1))
    return 0


def linear_share(policy, score, repeats: int) -> dict:
    """The scoring's seconds, and the seconds and FLOPs of its calls to the policy's linear layers."""
    inside = {"seconds": 0.0, "flops": 0}
    started = {}

    def before(layer, args):
        started[id(layer)] = time.perf_counter()

    def after(layer, args, output):
        inside["seconds"] += time.perf_counter() - started.pop(id(layer))
        inside["flops"] += 2 * args[0].numel() * layer.out_features  # rows x inputs x outputs, twice

    linears = [m for m in policy.modules() if isinstance(m, torch.nn.Linear)]
    hooks = [h for m in linears for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    best = None
    try:
        for _ in range(repeats):
            inside.update(seconds=0.0, flops=0)
            _, seconds = timed(score)
            if best is None or seconds < best["scoring_s"]:
                best = {"scoring_s": round(seconds, 3), "linear_s": round(inside["seconds"], 3),
                        "linear_gflop": round(inside["flops"] / 1e9, 1)}
    finally:
        for hook in hooks:
            hook.remove()
    best["linear_share"] = round(best["linear_s"] / best["scoring_s"], 3)
    best["linear_gflop_per_s"] = round(best["linear_gflop"] / best["linear_s"], 1)
    best["bound_if_the_rest_took_no_time"] = round(1 / best["linear_share"], 2)
    return best


def compare_scoring_paths(policy, score_today, score_whole, repeats: int) -> dict:
    """Today's scoring path vs the whole model under transformers' sdpa, alternating."""
    def as_before():
        with attention.transformers_sdpa(policy):
            return score_whole()

    runs, scores = alternate({"whole_model_sdpa": as_before, "today": score_today}, repeats)
    return {"runs_s": runs, "speedup_best": round(min(runs["whole_model_sdpa"]) / min(runs["today"]), 3),
            "max_abs_diff_L": float((scores["whole_model_sdpa"].L - scores["today"].L).abs().max()),
            "attention": policy.config._attn_implementation}


if __name__ == "__main__":
    sys.exit(main())
