"""What the SNR filter costs, and what it saves; prints JSON.

    python benchmarks/filter_overhead.py [--threads 1] [--repeats 3] [--select-calls 2000] [KEY=VALUE ...]

Model: the bundled SmolLM2-135M-Instruct in fp32 on CPU; config: configs/base.yaml with the
filter off, the MI probe off and max_new_tokens 16 (+ KEY=VALUE overrides; the algo preset
is `--algo ppo`, not an override).

1. `selection`: `snr.select_groups` timed over `--select-calls` calls per preset on [P, G]
   rewards drawn like Bandit's (-0.1 format penalty, 0.1 safe arm, 0 or 1 risky arm), for the
   CPU default shape and paper-scale shapes, against the measured time of one real training
   step (`trainer.train_step`, filter off, after a warm-up step). The trainer's own filter
   phase (`time/filter_s`: building the [P, G] matrix from the trajectories + selection) is
   reported beside it. Target: selection <= 0.01% of a step.
2. `update_vs_kept`: on ONE rollout batch (the one that timed step produced), the update
   phase on `batch.select_groups(kept)` for kept = the top 1..P groups by reward variance
   (stable ranking, so the kept sets are nested). Before each timing the policy (and critic)
   weights are restored and a fresh optimiser is built, so every measurement starts from the
   same state. Timed: `learner.ppo_update` alone, and the old-log-prob pass that precedes it
   (also done only on kept rows). The order of the kept counts is shuffled in each repeat so
   load drift on a shared machine does not line up with the kept fraction. Ratios are given for
   the minimum over repeats (the least-disturbed run, the verdict) and for the median. Two
   linear predictions: time(full) x kept fraction (rows), and time(full) x kept tokens / all
   tokens. Target: measured / predicted within 10%.

Everything runs on a shared machine: compare numbers from one run, and read `load_avg`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import snr
from ragen2 import metric_names as names
from ragen2.engines.local import trainer
from ragen2.bench.machine import machine_info
from ragen2.config import load_config
from ragen2.engines.local import learner

SHAPES = [(4, 4), (8, 16), (64, 16), (128, 16)]  # CPU default, then paper-scale [P, G]
PRESETS = ["starpo-s", "snr-top-p", "snr-top-k", "snr-min-p"]
FILTER_PHASE_S = names.TIME_FILTER_S


def bandit_like_rewards(num_groups: int, group_size: int, generator: torch.Generator) -> torch.Tensor:
    """Rewards with Bandit's values: invalid -0.1, safe 0.1, risky 1.0 w.p. 0.25 else 0."""
    choice = torch.randint(0, 3, (num_groups, group_size), generator=generator)
    risky = (torch.rand(num_groups, group_size, generator=generator) < 0.25).double()
    return torch.where(choice == 0, torch.full_like(risky, -0.1),
                       torch.where(choice == 1, torch.full_like(risky, 0.1), risky))


def time_selection(calls: int, run_shape: tuple[int, int]) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    results = []
    # the run's own shape too, when an override moved it off the list: the verdict compares at it
    for num_groups, group_size in dict.fromkeys([*SHAPES, run_shape]):
        # Many distinct matrices, cycled, so no call sees a cached answer (there is none, but
        # this also times realistic variety in how many groups tie or have zero spread).
        matrices = [bandit_like_rewards(num_groups, group_size, generator) for _ in range(64)]
        for preset in PRESETS:
            config = snr.load_preset(preset)
            for m in matrices[:8]:
                snr.select_groups(m, config)  # warm-up
            started = time.perf_counter()
            for i in range(calls):
                snr.select_groups(matrices[i % len(matrices)], config)
            per_call = (time.perf_counter() - started) / calls
            results.append({"shape": [num_groups, group_size], "preset": preset, "seconds_per_call": per_call})
    return results


def update_inputs(run, batch):
    """The update's inputs of a (filtered) batch (learner.update_inputs, as trainer.update_on
    builds them, old log-probs included) and the seconds its old log-probs took."""
    timer = trainer.Timer()
    data = learner.update_inputs(run.services.models, batch, run.cfg, timer=timer)
    return data, timer.seconds[names.PHASE_OLD_LOG_PROBS]


def restore(run, saved: dict) -> learner.Optimizers:
    """Same weights, fresh optimisers (returned): every timed update starts from the same state."""
    models = run.services.models
    models.policy.load_state_dict(saved["policy"])
    if models.critic is not None:
        models.critic.load_state_dict(saved["critic"])
    return learner.build_optimizers(models, run.cfg)


def time_update_vs_kept(run, batch, repeats: int) -> dict:
    rewards = batch.reward_matrix()
    num_groups = rewards.shape[0]
    models = run.services.models
    saved = {"policy": copy.deepcopy(models.policy.state_dict())}
    if models.critic is not None:
        saved["critic"] = copy.deepcopy(models.critic.state_dict())
    subsets = {}
    for k in range(1, num_groups + 1):
        # top_k_abs on the variance with a stable sort: kept sets for k = 1..P are nested.
        config = snr.FilterConfig(strategy="top_k_abs", value=k, metric="reward_variance", include_zero=True)
        selection = snr.select_groups(rewards, config)
        subsets[k] = (selection.kept.tolist(), batch.select_groups(selection.kept))
    timings = {k: {"update_s": [], "old_log_probs_s": []} for k in subsets}
    order_rng = torch.Generator().manual_seed(1)
    optimizers = restore(run, saved)  # warm-up: first-call allocations are not charged to any k
    data, _ = update_inputs(run, subsets[1][1])
    learner.ppo_update(models, optimizers, data, run.cfg, torch.Generator().manual_seed(0))
    for _ in range(repeats):
        for k in [list(subsets)[i] for i in torch.randperm(len(subsets), generator=order_rng).tolist()]:
            optimizers = restore(run, saved)
            data, old_seconds = update_inputs(run, subsets[k][1])
            started = time.perf_counter()
            learner.ppo_update(models, optimizers, data, run.cfg, torch.Generator().manual_seed(0))
            timings[k]["update_s"].append(time.perf_counter() - started)
            timings[k]["old_log_probs_s"].append(old_seconds)
    restore(run, saved)

    full_rows, full_tokens = len(subsets[num_groups][1]), subsets[num_groups][1].num_tokens
    rows = []
    for k, (kept, sub) in subsets.items():
        fraction, token_share = k / num_groups, sub.num_tokens / full_tokens
        row = {"kept_groups": k, "kept_fraction": fraction, "kept_group_ids": kept, "rows": len(sub),
               "tokens": sub.num_tokens, "token_share": round(token_share, 4),
               "update_s_all_repeats": [round(t, 3) for t in timings[k]["update_s"]],
               "old_log_probs_s_all_repeats": [round(t, 3) for t in timings[k]["old_log_probs_s"]]}
        for stat_name, stat in (("min", min), ("median", statistics.median)):
            update, full = stat(timings[k]["update_s"]), stat(timings[num_groups]["update_s"])
            phase = update + stat(timings[k]["old_log_probs_s"])
            full_phase = full + stat(timings[num_groups]["old_log_probs_s"])
            row[stat_name] = {"update_s": round(update, 3),
                              "update_over_fraction_prediction": round(update / (full * fraction), 4),
                              "update_over_token_prediction": round(update / (full * token_share), 4),
                              "update_phase_s": round(phase, 3),
                              "update_phase_over_fraction_prediction": round(phase / (full_phase * fraction), 4)}
        rows.append(row)
    # The minimum is the least-disturbed measurement on a shared machine; the median is printed beside it.
    worst = {name: round(max(abs(r[name]["update_over_fraction_prediction"] - 1) for r in rows), 4)
             for name in ("min", "median")}
    return {"groups": num_groups, "group_size": batch.group_size, "rows_full": full_rows, "tokens_full": full_tokens,
            "repeats": repeats, "by_kept": rows, "worst_deviation_from_fraction_prediction": worst,
            "within_10_percent": worst["min"] <= 0.10}


def dumps(report: dict) -> str:
    """JSON with floats cut to 4 significant digits: the timings are not more precise than that."""
    def cut(value):
        if isinstance(value, float):
            return float(f"{value:.4g}")
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        if isinstance(value, list):
            return [cut(v) for v in value]
        return value
    return json.dumps(cut(report), indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default=None, help="algo preset (default: base.yaml's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 is faster on a loaded machine)")
    parser.add_argument("--repeats", type=int, default=3, help="timings per kept count (min and median reported)")
    parser.add_argument("--select-calls", type=int, default=2000, help="select_groups calls per preset and shape")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()

    cfg = load_config(algo=args.algo, filter="none",
                      overrides=["probe.every=0", "rollout.max_new_tokens=16", *args.overrides])
    selection = time_selection(args.select_calls, (cfg.rollout.num_groups, cfg.rollout.group_size))
    run = trainer.setup(cfg, Path(tempfile.mkdtemp(prefix="filter-overhead-")), quiet=True)
    warmup = trainer.train_step(run).metrics
    run.state.step += 1
    result = trainer.train_step(run)
    step, batch = result.metrics, result.batch  # the step's own rollout, reused for the update timings
    step_s = step[names.TIME_STEP_S]

    worst = max(r["seconds_per_call"] for r in selection if r["shape"] == [cfg.rollout.num_groups,
                                                                           cfg.rollout.group_size])
    update = time_update_vs_kept(run, batch, args.repeats)
    print(dumps({
        "machine": {**machine_info(), "load_avg_start": [round(x, 2) for x in load_before]},
        "config": {"algo": cfg.algo.name, "advantage": cfg.algo.advantage, "num_groups": cfg.rollout.num_groups,
                   "group_size": cfg.rollout.group_size, "max_new_tokens": cfg.rollout.max_new_tokens,
                   "micro_batch_size": cfg.optim.micro_batch_size, "mini_batch_size": cfg.optim.mini_batch_size},
        "step": {"step_s": step_s, "warmup_step_s": warmup[names.TIME_STEP_S],
                 "phases_s": {k.removeprefix(names.TIME)[:-2]: v for k, v in step.items() if k.startswith(names.TIME) and k.endswith("_s")},
                 "trainer_filter_phase_s": step[FILTER_PHASE_S],
                 "trainer_filter_phase_fraction_of_step": step[FILTER_PHASE_S] / step_s},
        "selection": {"calls_per_point": args.select_calls, "by_shape_and_preset": selection,
                      "slowest_at_run_shape_s": worst,
                      "slowest_at_run_shape_fraction_of_step": worst / step_s,
                      "slowest_any_shape_fraction_of_step": max(r["seconds_per_call"] for r in selection) / step_s,
                      "target_fraction": 1e-4,
                      "meets_target": max(r["seconds_per_call"] for r in selection) / step_s <= 1e-4},
        "update_vs_kept": update,
    }))


if __name__ == "__main__":
    main()
