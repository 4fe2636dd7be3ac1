"""The training loop of the local engine: StarPO rollouts → SNR filter → PPO/GRPO update.

`train_step` is the data flow of one training step (rollout, probe, filter, old/ref log-probs and
values, advantages, update), one call per line; `train` wraps
it with seeding, validation, checkpoints and logging.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

import envs
import snr
from ragen2.engines.local import checkpoint as ckpt
from ragen2.instruments import completions
from ragen2.instruments import grad_decomp
from ragen2 import precision
from ragen2.instruments import probe as probe_lib
from ragen2.algos import losses
from ragen2.config import Config
from ragen2.engines.local import learner
from ragen2.engines.local.interrupts import Interrupts, StepAbandoned, restore_rng, rng_snapshot
from ragen2.progress import LiveLine
from ragen2.rollout import RolloutBatch, evaluate, rollout
from ragen2.rollout.batch import adjusted_rows, ragen_size_divisor
from ragen2.run_dir import (DirectoryGuard, RunDirectoryGone, RunLog, checkpoint_name, read_steps,
                            write_config, write_summary)
from ragen2.run_dir import summary as run_summary
from ragen2.seeding import step_seeds, validation_sampling_seed, validation_seeds


@dataclass
class Run:
    cfg: Config
    run_dir: Path
    models: learner.Models
    optimizers: learner.Optimizers
    generator: torch.Generator
    stop_policy: snr.StopPolicy
    probe: probe_lib.Probe
    log: RunLog
    watch: probe_lib.CollapseWatch  # collapse alerts over the logged series
    step: int = 0
    nonfinite_skips: int = 0
    summary: dict = field(default_factory=dict)
    interrupts: Interrupts = field(default_factory=Interrupts)
    live: LiveLine = field(default_factory=LiveLine)  # the live progress line (off unless a terminal)
    completions: list = field(default_factory=list)  # this step's recorded trajectories (ragen2.instruments.completions)
    dir_guard: DirectoryGuard | None = None  # stops the run if run_dir is removed or replaced under it


class Timer:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        started = time.perf_counter()
        yield
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started

    def metrics(self) -> dict[str, float]:
        return {f"time/{phase}_s": round(seconds, 4) for phase, seconds in self.seconds.items()}


def env_factory(cfg: Config, name: str | None = None):
    entry = envs.spec(name or cfg.env.name)
    env_config = entry.make_config(**(cfg.env.overrides if name is None else {}))
    return lambda: entry.env_cls(env_config)


def group_rewards(batch: RolloutBatch) -> torch.Tensor:
    """[P, G] trajectory rewards, group-major, for the filter."""
    return batch.reward_matrix()


def train_step(run: Run) -> dict:
    """One step: rollout, probe, filter, old/ref log-probs and values, advantages, update."""
    cfg, models, timer = run.cfg, run.models, Timer()
    step_started = time.perf_counter()
    with timer("rollout"), run.interrupts.abandonable():  # only the sampling RNG moves: safe to drop
        batch = rollout(models.policy, models.tokenizer, env_factory(cfg), step_seeds(cfg, run.step),
                        cfg.rollout, run.generator, progress=run.live.rollout("rollout"))
    metrics = batch.metrics()
    metrics.update(run.probe.maybe_run(run.step, models.policy, batch))  # timed on its own
    metrics.update(grad_decomp.maybe_decompose_prefilter(run, batch))  # probe.grad_prefilter: before the filter
    with timer("filter"):
        selection = snr.select_groups(group_rewards(batch), cfg.filter)
    metrics.update(selection.metrics)
    run.completions = completions.pick(batch, cfg.trainer.log_completions, selection.kept.tolist())  # no RNG
    decision = run.stop_policy.observe(selection)
    metrics.update(run.stop_policy.metrics())
    metrics["update/tokens"] = metrics["update/optimizer_steps"] = 0.0  # a skipped step spends none
    if not selection.skip:
        kept = adjust_rows(run, batch.select_groups(selection.kept), batch.input_ids.shape[0])
        metrics["batch/update_rows"] = float(kept.input_ids.shape[0])
        if kept.input_ids.shape[0]:  # delete mode can leave none
            metrics.update(update_on(run, kept, selection, timer))
            metrics.update(update_budget(cfg, kept, metrics))
    metrics.update(timer.metrics())
    # The whole step, probe and gradient decomposition included (the loop adds validation).
    metrics["time/step_s"] = round(time.perf_counter() - step_started, 4)
    metrics["throughput/rollout_tokens_per_s"] = batch.num_response_tokens / max(timer.seconds["rollout"], 1e-9)
    metrics.update(run.watch.observe(run.step, metrics, run.log))  # alerts -> events (+ stop_reason if configured)
    if decision.stop:
        metrics["stop_reason"] = decision.reason
        run.log.event("stop", reason=decision.reason, message=decision.message, step=run.step)
    return metrics


def update_budget(cfg: Config, batch: RolloutBatch, metrics: dict) -> dict:
    """What the update spent, for the bench's budget columns: tokens through it (every epoch)
    and optimiser steps taken (ppo_update's mini-batches, less those skipped as non-finite)."""
    mini_batches = cfg.optim.ppo_epochs * math.ceil(batch.input_ids.shape[0] / cfg.optim.mini_batch_size)
    return {"update/tokens": float(batch.num_tokens * cfg.optim.ppo_epochs),
            "update/optimizer_steps": float(mini_batches - metrics["actor/nonfinite_skipped_minibatches"])}


def adjust_rows(run: Run, kept: RolloutBatch, rollout_rows: int) -> RolloutBatch:
    """RAGEN-2's batch adjustment (optim.batch_adjust) of the rows the filter kept.

    A mini-batch larger than the whole rollout means "one step over the batch" here; RAGEN-2's
    configs never have one, and padding to it would multiply the batch, so it counts as the rollout."""
    cfg = run.cfg
    divisor = ragen_size_divisor(cfg.rollout.num_groups, min(cfg.optim.mini_batch_size, rollout_rows))
    order = adjusted_rows(kept.input_ids.shape[0], divisor, cfg.optim.batch_adjust, run.generator)
    return kept if order == list(range(kept.input_ids.shape[0])) else kept.take_rows(order)


def needs_old_log_probs(run: Run, rows: int) -> bool:
    """False when one optimiser step covers the batch: the update's own first forward then gives
    the old log-probs (ratio exactly 1), and the separate pass would be wasted work. Still needed
    for a KL-in-reward penalty (it enters the advantages) and for a gradient decomposition."""
    cfg = run.cfg
    kl_in_reward = run.models.reference is not None and cfg.algo.kl_mode == "reward"
    if kl_in_reward or grad_decomp.due(cfg, run.step):
        return True
    # critic warm-up: no policy loss, so no ratio to take
    return trains_actor(run) and not learner.reuses_current_log_probs(cfg.optim, rows)


def trains_actor(run: Run) -> bool:
    """False during the critic warm-up: the first `optim.critic_warmup_steps` steps (skipped ones count)."""
    return run.step >= run.cfg.optim.critic_warmup_steps


def update_on(run: Run, batch: RolloutBatch, selection, timer: Timer) -> dict:
    cfg, models = run.cfg, run.models
    batch = batch.to(models.device)
    mask = batch.response_mask
    data = learner.update_inputs(models, batch, cfg, needs_old_log_probs(run, batch.input_ids.shape[0]), timer)
    old, ref = data.old_log_probs, data.ref_log_probs
    decomposition = grad_decomp.maybe_decompose(run, batch, data)  # diagnostic, timed apart (grad/time_s)
    scale = snr.kept_fraction_scale(selection.kept_fraction, cfg.algo.filter_loss_scaling)
    train_actor = trains_actor(run)
    with timer("update"):
        metrics = learner.ppo_update(models, run.optimizers, data, cfg, run.generator, loss_scale=scale,
                                   train_actor=train_actor, on_micro_batch=run.live.update())
    metrics["actor/frozen_for_critic_warmup"] = float(not train_actor)
    tokens = batch.num_tokens * cfg.optim.ppo_epochs
    metrics["throughput/update_tokens_per_s"] = tokens / max(timer.seconds["update"], 1e-9)
    metrics.update(decomposition)
    if ref is None:
        metrics["update/kl_to_ref"] = 0.0
    elif old is not None:
        metrics["update/kl_to_ref"] = float(losses.kl_loss(old, ref, mask, cfg.algo.kl_estimator))
    else:  # on-policy: the update's first forward is the rollout policy, its KL term is this
        metrics["update/kl_to_ref"] = metrics.get("actor/kl_loss", 0.0)
    run.nonfinite_skips += int(metrics["actor/nonfinite_skipped_minibatches"])
    metrics["actor/nonfinite_skips_total"] = float(run.nonfinite_skips)
    return metrics


def validate(run: Run) -> dict:
    cfg = run.cfg
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(validation_sampling_seed(cfg))
    metrics = evaluate(run.models.policy, run.models.tokenizer, env_factory(cfg, cfg.env.val_name),
                       validation_seeds(cfg), dataclasses.replace(cfg.rollout, temperature=cfg.trainer.val_temperature),
                       generator,
                       progress=run.live.rollout("validation"))
    metrics["time/validation_s"] = round(time.perf_counter() - started, 4)
    return metrics


def _state(run: Run) -> dict:
    return {"stop_policy": run.stop_policy.state_dict(), "probe": run.probe.state_dict(),
            "collapse_detector": run.watch.state_dict(), "nonfinite_skips": run.nonfinite_skips,
            "num_threads": torch.get_num_threads()}


def check_run_dir(run: Run) -> None:
    """Stop before writing into a directory that is no longer this run's (run_dir.DirectoryGuard)."""
    if run.dir_guard is not None:
        run.dir_guard.check(run.step)


def save(run: Run) -> None:
    check_run_dir(run)
    path = ckpt.save_checkpoint(run.run_dir, run.step, run.models, run.optimizers, run.generator,
                                _state(run), run.cfg.trainer.keep_last,
                                save_optimizer=run.cfg.trainer.save_optimizer,
                                report=lambda line: run.log.event("checkpoint_size", message=line))
    run.log.event("checkpoint", path=str(path), step=run.step)


class ResumeError(RuntimeError):
    """A run directory that cannot be resumed; nothing in it was changed."""


def apply_threads(cfg: Config, warn=print) -> None:
    """Pin torch's thread count from the config, resolving 0 to this process's default (recorded).

    Always through torch.set_num_threads, even when torch already reports the count: the call also
    sets MKL's own thread count and turns MKL's dynamic threading off, and a process that never made
    it keeps MKL's defaults (dynamic on), under which MKL may split small matmuls differently (seen on
    Intel AVX512). A run's numbers then depended on whether earlier code in the process had set the
    count: a resumed or in-process run differed from a fresh child at step 0.
    """
    wanted = cfg.trainer.num_threads or torch.get_num_threads()
    cfg.trainer.num_threads = wanted
    torch.set_num_threads(wanted)
    if torch.get_num_threads() != wanted:
        warn(f"warning: torch runs {torch.get_num_threads()} threads, not the run's {wanted}: "
             "its numbers will not repeat bit for bit")


def setup(cfg: Config, run_dir: Path, resume: bool = False, quiet: bool = False, models=None) -> Run:
    """Build everything a run needs; on resume, restore the newest checkpoint that loads.

    Nothing is written into `run_dir` until the models exist and the checkpoint (if any) has
    loaded, so a bad model name or a damaged run directory leaves it as it was."""
    def warn(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    apply_threads(cfg, warn)
    segment_note = probe_lib.resolve_run_segment(cfg)  # probe.segment=auto: recorded as resolved
    torch.manual_seed(cfg.trainer.seed)
    choices = []
    if models is None:
        models = learner.build_models(cfg, report=choices.append)
    elif cfg.model.dtype == "auto":  # models built by the caller: record what they compute in
        cfg.model.dtype = str(precision.compute_dtype(models.policy)).removeprefix("torch.")
    optimizers = learner.build_optimizers(models, cfg)
    generator = torch.Generator().manual_seed(cfg.trainer.seed)
    run = Run(cfg, run_dir, models, optimizers, generator, snr.StopPolicy(cfg.stop),
              probe_lib.Probe(cfg.probe, models.tokenizer), log=None,  # type: ignore[arg-type]
              watch=probe_lib.CollapseWatch(cfg.probe, cfg.trainer.total_steps), interrupts=Interrupts(quiet=quiet),
              live=LiveLine(enabled=LiveLine.wanted(quiet)))
    resume_step, latest = 0, None
    if resume and ckpt.complete_checkpoints(run_dir):
        loaded = ckpt.load_latest(run_dir, models, optimizers, generator, warn)
        if loaded is None:
            raise ResumeError(f"{run_dir}: every checkpoint is damaged; nothing to resume from")
        latest, state = loaded
        run.step = resume_step = state["step"]
        run.stop_policy.load_state_dict(state["stop_policy"])
        run.probe.load_state_dict(state["probe"])
        if "collapse_detector" in state:  # absent in checkpoints written before the detector was wired
            run.watch.load_state_dict(state["collapse_detector"])
        run.nonfinite_skips = state["nonfinite_skips"]
        recorded = state.get("num_threads")
        if recorded is not None and recorded != cfg.trainer.num_threads:
            warn(f"warning: the checkpoint was written with {recorded} torch threads, this run uses "
                 f"{cfg.trainer.num_threads}: steps from here will not repeat an uninterrupted run bit for bit")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(run_dir, cfg)
    run.dir_guard = DirectoryGuard(run_dir)
    run.log = RunLog(run_dir, cfg.trainer.total_steps, json.loads(cfg.model_dump_json()),
                     resume_step=resume_step, use_wandb=cfg.trainer.wandb,
                     use_tensorboard=cfg.trainer.tensorboard, quiet=quiet,
                     print_completions=cfg.trainer.print_completions)
    for choice in choices:
        run.log.event("precision", message=choice.describe(), dtype=choice.dtype)
    if segment_note:
        run.log.event("probe_segment", message=segment_note, segment=cfg.probe.segment)
    if latest is not None:
        run.log.event("resume", message=f"resumed from {latest} at step {resume_step}", step=resume_step)
    return run


def train(run: Run) -> dict:
    """Run the remaining steps; returns the summary (also written to summary.json, unless the
    run was interrupted: then `summary["interrupted"]` names the signal and the run resumes)."""
    run.interrupts.install()
    try:
        return _train_loop(run)
    except RunDirectoryGone:
        run.log.close()
        raise
    finally:
        run.interrupts.restore()


def _train_loop(run: Run) -> dict:
    cfg = run.cfg
    started = time.time()
    stop_reason = None
    if cfg.trainer.val_before and run.step == 0:
        if validate_before(run) is None:
            return _interrupted(run, started)
    while run.step < cfg.trainer.total_steps:
        snapshot = rng_snapshot(run.generator)
        try:
            metrics = train_step(run)
        except StepAbandoned:  # nothing but the RNG had moved: put it back, the step never happened
            restore_rng(run.generator, snapshot)
            stop_reason = "interrupted"
            break
        last = run.step + 1 == cfg.trainer.total_steps or "stop_reason" in metrics
        if (cfg.trainer.val_every and (run.step + 1) % cfg.trainer.val_every == 0) or last:
            try:
                with run.interrupts.abandonable():
                    metrics.update(validate(run))
            except StepAbandoned:
                metrics["val/abandoned"] = 1.0  # the update happened: keep the step, without its validation
            metrics["time/step_s"] = round(metrics["time/step_s"] + metrics.get("time/validation_s", 0.0), 4)
            last = _watch_validation(run, metrics) or last
        run.live.stop()
        check_run_dir(run)
        run.log.step(run.step, metrics, run.completions)
        run.step += 1
        if run.interrupts.requested:
            stop_reason = "interrupted"
        if (cfg.trainer.save_every and run.step % cfg.trainer.save_every == 0) or last or stop_reason:
            save(run)
        if stop_reason or "stop_reason" in metrics:
            stop_reason = stop_reason or metrics["stop_reason"]
            break
    if stop_reason == "interrupted" or run.interrupts.requested:
        return _interrupted(run, started)
    summary = summarise(read_steps(run.run_dir), stop_reason, time.time() - started, run)
    write_summary(run.run_dir, summary)
    run.log.close()
    return summary


def validate_before(run: Run) -> dict | None:
    """trainer.val_before: the untrained model on the validation instances, as an event (the
    summary reads it back, also after a resume); None when interrupted."""
    try:
        with run.interrupts.abandonable():
            metrics = validate(run)
    except StepAbandoned:
        return None
    finally:
        run.live.stop()
    check_run_dir(run)
    run.log.event("validation_before", step=0, metrics=metrics,
                  message=f"validation before training: success {metrics.get('val/success_rate', float('nan')):.3f} "
                          f"({metrics.get('time/validation_s', 0):.0f}s)")
    return metrics


def _watch_validation(run: Run, metrics: dict) -> bool:
    """RAGEN-2's low-validation-success stop; True when it ends the run at this step."""
    if "val/success_rate" not in metrics or "stop_reason" in metrics:
        return False
    decision = run.stop_policy.observe_validation(metrics["val/success_rate"])
    metrics["snr/low_validations"] = float(run.stop_policy.low_validations)
    if decision.stop:
        metrics["stop_reason"] = decision.reason
        run.log.event("stop", reason=decision.reason, message=decision.message, step=run.step)
    return decision.stop


def _interrupted(run: Run, started: float) -> dict:
    """Stop on a signal: make sure the last completed step is on disk, then say how to continue."""
    latest = ckpt.latest_checkpoint(run.run_dir)
    if run.step > 0 and (latest is None or latest.name != checkpoint_name(run.step)):
        save(run)  # the step in progress was abandoned: models and RNG are as the last one left them
        latest = ckpt.latest_checkpoint(run.run_dir)
    resume = f"ragen2 train --resume {run.run_dir}"
    if latest is None:
        message = f"{run.interrupts.signal_name} before the first step finished: nothing to resume; start again"
    else:
        message = f"{run.interrupts.signal_name}: stopped after step {run.step}; continue with: {resume}"
    run.log.event("stop", reason="interrupted", signal=run.interrupts.signal_name, message=message, step=run.step)
    run.log.close()
    summary = summarise(read_steps(run.run_dir), "interrupted", time.time() - started, run)
    summary["interrupted"] = run.interrupts.signal_name
    summary["resume_command"] = resume if latest is not None else None
    return summary


def summarise(rows: list[dict], stop_reason, wall_s: float, run: Run) -> dict:
    """summary.json (ragen2.run_dir's schema), with what only this engine counts."""
    return run_summary(rows, run_dir=run.run_dir, engine="local", stop_reason=stop_reason, wall_s=wall_s,
                       nonfinite_skips=run.nonfinite_skips,
                       config=dataclasses.asdict(run.cfg.filter) | {"algo": run.cfg.algo.name,
                                                                        "env": run.cfg.env.name})
