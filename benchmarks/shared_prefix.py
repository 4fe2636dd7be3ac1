"""Shared-prefix (or padding-free) passes on and off, side by side in one run: old log-probs and the update.

    python benchmarks/shared_prefix.py [--threads auto|N] [--repeats 2] [--env NAME] [--algo NAME]
                                       [--config RUN/config.yaml] [--switch shared_prefix|padding_free]
                                       [--whole-step] [--skip-phases] [--sides both|off|on] [--warm-up N]
                                       [--heap kept|default]
                                       [--out docs/benchmarks/shared_prefix.json] [KEY=VALUE ...]

`--switch padding_free` turns `optim.padding_free` off and on instead (shared prefix on both sides:
the off side is the padded shared-prefix passes). `--config` starts from a run's saved config
(e.g. a bench suite cell's) instead of configs/base.yaml with --env/--algo.

Model: the bundled SmolLM2-135M-Instruct on CPU, in the precision `model.dtype=auto` resolves to
here (or KEY=VALUE `model.dtype=float32`). Config: configs/base.yaml (the CPU default: 4 groups x 4,
32 new tokens) + presets and overrides. One real rollout gives the batch; then, `--repeats`
times, with `optim.shared_prefix` off and on (order alternating, so a busy spell on the shared
machine hits both):

- `old_log_probs`: the no-grad pass `learner.update_inputs` runs before the update (the default
  config skips it through the on-policy shortcut; it is timed here anyway, as configs with several
  mini-batches or a KL-in-reward term run it);
- `update`: `learner.ppo_update` as the trainer calls it (forward + backward + optimiser step).
  The weights are restored after each update, so both sides start from the rollout's weights and
  their loss metrics must agree.

Each phase reports its seconds (best of the repeats counts), the tokens fed to the decoder
(padding included) and the process's peak resident memory during the phase (VmHWM, reset before
each phase through /proc/self/clear_refs).

`--whole-step`: also whole training steps, `trainer.train_step` as `ragen2 train` runs its first
step (rollout, MI probe if due at step 0, filter, old log-probs if the config needs them, update;
the probe runs at step 0 unless `probe.every=0`), off and on alternating after one warm-up step.
Every timed step starts from the same weights, a fresh optimiser and the same sampling seed, so
both sides roll out the same tokens; each side reports its phase seconds (`time/*`, `probe/time_s`)
and the step's, and the JSON says which phase dominates what is left with the switch on.
`--off-as-before`: the off side (phases and whole steps) also runs the other changes of the same work
undone: transformers' own sdpa attention (key/value heads copied under a mask) instead of
ragen2.attention's, the MI probe scoring with the model run whole (the vocabulary head on every
prompt and pad position, rows padded) instead of the decoder and the head on scored positions only,
and the no-grad passes casting the weights once per micro-batch instead of once per pass. The off
side is then the step as it ran before; the on side is today's.
`--skip-phases` measures only the whole steps. `--heap kept` (the default) keeps freed memory in the
process as `ragen2` does (ragen2.heap); `--heap default` runs glibc's defaults, as before. It is
process-wide, so benchmarks/step_before_after.py runs each variant in a child (`--sides off|on`). Prints one JSON object and writes it to `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import tempfile
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import mi_probe
from ragen2 import attention, heap
from ragen2 import metric_names as names
from ragen2 import seeding
from ragen2.bench.machine import emit_report, machine_info
from ragen2.config import load_config, saved_config
from ragen2.engines.local import learner
from ragen2.engines.local import trainer
from ragen2.instruments import probe as probe_lib
from ragen2.rollout import rollout

ROOT = Path(__file__).resolve().parents[1]
SWITCHES = ("shared_prefix", "padding_free")  # the optim.* flag the sides turn off and on


def set_side(cfg, side: str, switch: str = "shared_prefix") -> None:
    setattr(cfg.optim, switch, side == "on")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_description() -> dict:
    """lscpu's model name and the bf16/AMX flags this CPU reports."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        lscpu = ""
    name = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "")
    flags = set()
    for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines() if Path("/proc/cpuinfo").is_file() else ():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    wanted = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx2")
    return {"model_name": name, "flags": {flag: flag in flags for flag in wanted}}


def reset_peak_rss() -> float | None:
    """Return freed heap to the OS (so the resident set is what is alive), reset VmHWM to it
    (Linux), and return that resident set in GB. Under ragen2.heap's kept heap nothing is returned:
    a trim would make the next phase fault its pages in again, the cost that policy removes; the
    resident set and peaks then include the free memory the heap keeps."""
    if not heap.state().startswith("freed memory kept"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _status_gb("VmRSS:")


def _status_gb(key: str) -> float | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return round(int(line.split()[1]) / 2 ** 20, 3)
    return None


class FedTokens:
    """Tokens fed to a decoder body while enabled (padding included)."""

    def __init__(self, body):
        self.count = 0
        body.register_forward_pre_hook(lambda module, args, kwargs: self._add(kwargs), with_kwargs=True)

    def _add(self, kwargs):
        ids, embeds = kwargs.get("input_ids"), kwargs.get("inputs_embeds")
        self.count += ids.numel() if ids is not None else embeds.shape[0] * embeds.shape[1]


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def timed_cpu(fn):
    """(result, wall seconds, this process's CPU seconds): on a shared machine the CPU time
    counts the work done, the wall time also the waits for a core."""
    cpu = time.process_time()
    result, wall = timed(fn)
    return result, wall, time.process_time() - cpu


def phase(name: str, fn, fed: FedTokens, record: dict):
    """Run and time `fn`; record seconds, decoder tokens and the peak resident set above the
    live set at its start (the smallest over repeats: the first update also allocates the
    optimiser's moments)."""
    live = reset_peak_rss()
    before = fed.count
    result, seconds, cpu_seconds = timed_cpu(fn)
    peak = _status_gb("VmHWM:")
    entry = record.setdefault(name, {"runs_s": [], "cpu_runs_s": []})
    entry["runs_s"].append(round(seconds, 3))
    entry["cpu_runs_s"].append(round(cpu_seconds, 3))
    entry["best_s"] = min(entry["runs_s"])
    entry["best_cpu_s"] = min(entry["cpu_runs_s"])
    entry["decoder_tokens_fed"] = fed.count - before
    if live is not None and peak is not None:
        entry.setdefault("rss_live_at_start_gb", []).append(live)
        entry.setdefault("peak_rss_gb", []).append(peak)
        entry["peak_above_start_gb"] = min(round(p - s, 3) for p, s in zip(entry["peak_rss_gb"],
                                                                             entry["rss_live_at_start_gb"]))
    return result


def group_prefixes(batch) -> list[int]:
    """Longest common token prefix of each group's rows."""
    out = []
    for group in sorted(set(batch.group_ids.tolist())):
        rows = (batch.group_ids == group).nonzero().flatten()
        ids, lengths = batch.input_ids[rows], batch.attention_mask[rows].sum(1)
        same = (ids == ids[:1]).all(0) & (torch.arange(ids.shape[1]) < lengths.min())
        out.append(int(same.long().cumprod(0).sum()))
    return out


def pick_threads(choice: str) -> tuple[int, str]:
    load = os.getloadavg()[0]
    if choice != "auto":
        torch.set_num_threads(int(choice))
        return torch.get_num_threads(), f"set by --threads {choice}"
    cores = len(os.sched_getaffinity(0))
    if load > cores - 1:  # something else keeps a core busy: two OpenMP threads would wait on each other
        torch.set_num_threads(1)
        return 1, f"auto: load average {load:.1f} on {cores} cores, so 1 thread"
    return torch.get_num_threads(), f"auto: load average {load:.1f} on {cores} cores, torch's default"


def off_side(off_as_before: bool, switch: str = "shared_prefix") -> str:
    if switch == "padding_free":
        return "padding-free off: the padded shared-prefix passes, everything else today's"
    return ("as before: shared prefix off, transformers' sdpa, the probe scoring the whole model, "
            "weights cast per micro-batch in the no-grad passes"
            if off_as_before else "shared prefix off (padded passes), everything else today's")


def side_state(side: str, models, off_as_before: bool):
    """The code state a side runs in: `as_before` for the off side when asked, else today's."""
    return as_before(models) if side == "off" and off_as_before else contextlib.nullcontext()


def phase_comparison(cfg, models, optimizers, batch, repeats: int, on_policy: bool, restore,
                     off_as_before: bool = False, sides: tuple[str, ...] = ("off", "on"),
                     warm_up: int = 0, switch: str = "shared_prefix") -> dict:
    """The old-log-prob pass and the update, off and on alternating, on one rollout's batch
    (`sides`: one of them only, for a child of benchmarks/step_before_after.py). `warm_up`
    untimed passes and updates a side first: a process's first updates also fault in the heap
    and the optimiser's moments."""
    fed = FedTokens(models.policy.get_decoder())
    results: dict[str, dict] = {side: {} for side in sides}
    old_by_side, metrics_by_side = {}, {}
    for _ in range(warm_up):
        for side in sides:
            set_side(cfg, side, switch)
            with side_state(side, models, off_as_before):
                learner.ppo_update(models, optimizers, learner.update_inputs(models, batch, cfg, old_log_probs=True),
                                   cfg, torch.Generator().manual_seed(0))
            restore()
    for repeat in range(repeats):
        for side in (sides if repeat % 2 == 0 else sides[::-1]):
            set_side(cfg, side, switch)
            with side_state(side, models, off_as_before):
                data = phase("old_log_probs", lambda: learner.update_inputs(models, batch, cfg, old_log_probs=True),
                             fed, results[side])
            old_by_side[side] = data.old_log_probs
            log(f"[{repeat}] {side}: old log-probs {results[side]['old_log_probs']['runs_s'][-1]:.1f} s "
                f"({results[side]['old_log_probs']['cpu_runs_s'][-1]:.1f} s CPU)")
        for side in (sides if repeat % 2 == 0 else sides[::-1]):
            set_side(cfg, side, switch)
            with side_state(side, models, off_as_before):
                data = learner.update_inputs(models, batch, cfg, old_log_probs=not on_policy)  # untimed
                metrics_by_side[side] = phase("update", lambda: learner.ppo_update(
                    models, optimizers, data, cfg, torch.Generator().manual_seed(0)), fed, results[side])
            restore()
            log(f"[{repeat}] {side}: update {results[side]['update']['runs_s'][-1]:.1f} s "
                f"({results[side]['update']['cpu_runs_s'][-1]:.1f} s CPU)")
    if len(sides) == 1:
        return {sides[0]: results[sides[0]], "update_metrics": metrics_by_side[sides[0]],
                "off_side": off_side(off_as_before, switch), "warm_up_updates": warm_up}
    mask = batch.response_mask.bool()
    diff = (old_by_side["on"] - old_by_side["off"])[mask].abs().max().item()
    scale = old_by_side["off"][mask].abs().max().item()
    compared = {k: (metrics_by_side["off"][k], metrics_by_side["on"][k]) for k in metrics_by_side["off"]
                if not k.startswith(names.TIME)}
    return {
        "off": results["off"], "on": results["on"],
        "speedup_wall": {name: round(results["off"][name]["best_s"] / results["on"][name]["best_s"], 2)
                         for name in ("old_log_probs", "update")},
        "speedup_cpu": {name: round(results["off"][name]["best_cpu_s"] / results["on"][name]["best_cpu_s"], 2)
                        for name in ("old_log_probs", "update")},
        "target_speedup": 2.5,
        "off_side": off_side(off_as_before, switch),
        "agreement": {"old_log_probs_max_abs_diff": diff, "old_log_probs_max_abs": scale,
                      "update_metrics_off_on": compared},
    }


def log_probs_pass_as_before(model, tokens, cfg, attention=0.0):
    """The old/reference pass before one autocast context spanned it: a context (and a cast of
    every weight) per micro-batch, inside policy_log_probs."""
    shared = cfg.optim.shared_prefix
    return learner.batched(lambda i, a, m: learner.policy_log_probs(model, learner.TokenRows(i, a, m),
                                                                    cfg.rollout.temperature, shared_prefix=shared)[0],
                           cfg.optim.micro_batch_size, tokens.input_ids, tokens.attention_mask, tokens.response_mask,
                           pack=shared, attention=attention)


@contextlib.contextmanager
def as_before(models):
    """transformers' sdpa in every model, the probe scoring the whole model (padded rows), and the
    no-grad passes casting the weights per micro-batch, for the block."""
    today_scoring, today_pass = mi_probe.cross_score, learner.log_probs_pass
    mi_probe.cross_score = functools.partial(today_scoring, split_head=False)
    learner.log_probs_pass = log_probs_pass_as_before
    try:
        with attention.transformers_sdpa(models.policy, models.reference, getattr(models.critic, "backbone", None)):
            yield
    finally:
        mi_probe.cross_score, learner.log_probs_pass = today_scoring, today_pass


def whole_steps(cfg, models, repeats: int, restore, off_as_before: bool = False,
                sides: tuple[str, ...] = ("off", "on"), switch: str = "shared_prefix") -> dict:
    """Whole `trainer.train_step`s with the switch off and on, alternating after a warm-up; each
    from the rollout's weights (`restore`), a fresh optimiser, step 0 and the same seeds."""
    results: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        def one_step(side: str) -> dict:
            restore()
            set_side(cfg, side, switch)
            run = trainer.setup(cfg, Path(tmp) / f"run-{side}", quiet=True, models=models)
            probe_cpu: list[float] = []
            real_measure = probe_lib.Probe.measure

            def measure_timed(self, *args, **kwargs):  # the probe's CPU seconds, beside its logged wall time
                started = time.process_time()
                try:
                    return real_measure(self, *args, **kwargs)
                finally:
                    probe_cpu.append(time.process_time() - started)

            probe_lib.Probe.measure = measure_timed
            cpu = time.process_time()
            try:
                with side_state(side, models, off_as_before):
                    metrics = trainer.train_step(run).metrics
            finally:
                step_cpu = time.process_time() - cpu
                probe_lib.Probe.measure = real_measure
                run.services.log.close()
            phases = {k.removeprefix(names.TIME).removesuffix("_s"): round(v, 3) for k, v in metrics.items()
                      if k.startswith(names.TIME)}
            if names.PROBE_TIME_S in metrics:
                phases["probe"] = round(metrics[names.PROBE_TIME_S], 3)
            # CPU seconds of this process: on a shared machine the work, without the waits for a core
            cpu_phases = {"step": round(step_cpu, 3), **({"probe": round(sum(probe_cpu), 3)} if probe_cpu else {})}
            return {"phases_s": phases, "cpu_phases_s": cpu_phases, "reward_mean": metrics.get(names.ROLLOUT_REWARD_MEAN),
                    "update_metrics": {k: metrics[k] for k in (names.ACTOR_ENTROPY, names.ACTOR_GRAD_NORM, names.ACTOR_PG_LOSS)
                                       if k in metrics},
                    # what the probe found, to compare the probe's precisions (probe.dtype) on one batch
                    "probe_metrics": {k: metrics[k] for k in (names.PROBE_MI_ESTIMATE, names.PROBE_MI_ZSCORE,
                                                              names.PROBE_RETRIEVAL_ACCURACY_AT_1, names.PROBE_DTYPE)
                                      if k in metrics}}

        one_step(sides[-1])  # warm-up: first-call costs (allocator, kernels) stay out of the timed steps
        log("whole step: warm-up done")
        for repeat in range(repeats):
            for side in (sides if repeat % 2 == 0 else sides[::-1]):
                results[side].append(one_step(side))
                log(f"[{repeat}] {side}: step {results[side][-1]['phases_s']['step']:.1f} s "
                    f"{results[side][-1]['phases_s']}")
    best = {side: min(runs, key=lambda r: r["phases_s"]["step"]) for side, runs in results.items()}
    if len(sides) == 1:
        return {sides[0]: results[sides[0]], "best_step_s": {sides[0]: best[sides[0]]["phases_s"]["step"]},
                "best_phases_s": {sides[0]: best[sides[0]]["phases_s"]}, "off_side": off_side(off_as_before, switch)}
    # The step's own phases; what the trainer times outside them (probe, batch building) is "other".
    named = (names.PHASE_ROLLOUT, "probe", names.PHASE_OLD_LOG_PROBS, names.PHASE_REF_LOG_PROBS, names.PHASE_VALUES,
             names.PHASE_ADVANTAGES, names.PHASE_FILTER, names.PHASE_UPDATE)
    left = {name: best["on"]["phases_s"][name] for name in named if name in best["on"]["phases_s"]}
    left["other"] = round(best["on"]["phases_s"]["step"] - sum(left.values()), 3)
    return {
        "off": results["off"], "on": results["on"],
        "best_step_s": {side: best[side]["phases_s"]["step"] for side in best},
        "speedup_step": round(best["off"]["phases_s"]["step"] / best["on"]["phases_s"]["step"], 2),
        "speedup_update": round(best["off"]["phases_s"][names.PHASE_UPDATE] / best["on"]["phases_s"][names.PHASE_UPDATE],
                                2),
        "target_speedup_step": 2.0,
        "on_phases_s": left,
        "on_dominant_phase": max(left, key=left.get),
        "on_dominant_share": round(max(left.values()) / best["on"]["phases_s"]["step"], 3),
        "same_rollout_rewards": [r["reward_mean"] for side in ("off", "on") for r in results[side]],
        "off_side": off_side(off_as_before, switch),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", default="auto", help="torch threads, or auto: 1 when the machine is busy")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--env", default=None)
    parser.add_argument("--algo", default=None)
    parser.add_argument("--config", default=None, help="a run's config.yaml to start from (instead of --env/--algo)")
    parser.add_argument("--switch", choices=SWITCHES, default="shared_prefix",
                        help="the optim flag the sides turn off and on")
    parser.add_argument("--whole-step", action="store_true", help="also time whole training steps off and on")
    parser.add_argument("--skip-phases", action="store_true", help="only the whole steps (with --whole-step)")
    parser.add_argument("--off-as-before", action="store_true",
                        help="the off side also with transformers' sdpa and the whole-model probe scoring")
    parser.add_argument("--warm-up", type=int, default=0,
                        help="untimed old-log-prob passes and updates per side before the timed phases")
    parser.add_argument("--sides", choices=("both", "off", "on"), default="both",
                        help="time one side only (a child of benchmarks/step_before_after.py)")
    parser.add_argument("--heap", choices=("kept", "default"), default="kept",
                        help="kept: freed memory stays in the process, as `ragen2` runs (ragen2.heap); "
                             "default: glibc's defaults, as before")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "shared_prefix.json"),
                        help="where the JSON goes too ('' = stdout only)")
    parser.add_argument("overrides", nargs="*", help="config KEY=VALUE overrides")
    args = parser.parse_args()
    if args.heap == "kept":
        heap.keep_freed_memory()
    sides = ("off", "on") if args.sides == "both" else (args.sides,)
    threads, threads_reason = pick_threads(args.threads)
    load_start = os.getloadavg()
    overrides = ["model.device=cpu", *([] if args.whole_step else ["probe.every=0"]), *args.overrides]
    if args.switch == "padding_free" and args.off_as_before:
        parser.error("--off-as-before undoes the shared-prefix work; it goes with --switch shared_prefix")
    # the other flag fixed, so only the switch differs: padding-free passes share prompts themselves,
    # so the shared-prefix comparison runs padded; the padding-free one shares prompts on both sides
    overrides.insert(0, "optim.padding_free=false" if args.switch == "shared_prefix" else "optim.shared_prefix=true")
    cfg = (saved_config(args.config, overrides) if args.config else
           load_config(env=args.env, algo=args.algo, overrides=overrides))
    choices = []
    (models, load_s) = timed(lambda: learner.build_models(cfg, report=choices.append))
    log(f"models loaded in {load_s:.1f} s; {choices[0].describe() if choices else cfg.model.dtype}")
    optimizers = learner.build_optimizers(models, cfg)
    generator = torch.Generator().manual_seed(cfg.trainer.seed)
    batch, rollout_s = timed(lambda: rollout(models.policy, models.tokenizer, trainer.env_factory(cfg),
                                             seeding.step_seeds(cfg, 0), cfg.rollout, generator))
    log(f"rollout: {len(batch)} rows in {rollout_s:.1f} s")
    trainable = [p for p in models.policy.parameters() if p.requires_grad]
    if models.critic is not None:
        trainable += [p for p in models.critic.parameters() if p.requires_grad]
    snapshot = [p.detach().clone() for p in trainable]
    rows = len(batch)
    on_policy = learner.reuses_current_log_probs(cfg.optim, rows) and models.reference is None

    def restore():
        with torch.no_grad():
            for p, saved in zip(trainable, snapshot):
                p.copy_(saved)

    report = {
        "machine": machine_info(), "cpu": cpu_description(), "torch_threads": threads,
        "threads_reason": threads_reason, "load_avg_at_start": [round(x, 2) for x in load_start],
        "switch": f"optim.{args.switch}", "config_file": args.config,
        "model": cfg.model.name, "dtype": cfg.model.dtype, "precision_choice": [c.describe() for c in choices],
        "config": {"env": cfg.env.name, "algo": cfg.algo.name, "groups_x_size":
                   f"{cfg.rollout.num_groups}x{cfg.rollout.group_size}", "max_turns": cfg.rollout.max_turns,
                   "max_new_tokens": cfg.rollout.max_new_tokens, "mini_batch": cfg.optim.mini_batch_size,
                   "micro_batch": cfg.optim.micro_batch_size, "ppo_epochs": cfg.optim.ppo_epochs,
                   "probe_every": cfg.probe.every,
                   "update_packs_by_prefix": learner.packs_by_prefix(cfg.optim.model_copy(
                       update={"shared_prefix": True}), rows), "on_policy_update": on_policy},
        "batch": {"rows": rows, "padded_width": int(batch.input_ids.shape[1]), "real_tokens": batch.num_tokens,
                  "response_tokens": batch.num_response_tokens, "group_shared_prefix_tokens": group_prefixes(batch),
                  "rollout_s": round(rollout_s, 2)},
    }
    if not args.skip_phases:
        report.update(phase_comparison(cfg, models, optimizers, batch, args.repeats, on_policy, restore,
                                       args.off_as_before, sides, args.warm_up, args.switch))
    if args.whole_step:
        report["whole_step"] = whole_steps(cfg, models, args.repeats, restore, args.off_as_before, sides, args.switch)
    report["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    emit_report(report, args.out)


if __name__ == "__main__":
    main()
