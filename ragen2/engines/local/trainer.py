"""The training loop of the local engine: StarPO rollouts → SNR filter → PPO/GRPO update.

`train_step` is the data flow of one training step (rollout, probe, filter, old/ref log-probs and
values, advantages, update), one call per line, returning what it observed (a `StepResult`: the
batch, the selection, the metrics); `train` wraps it with seeding, validation, checkpoints, logging
and the stoppers (engines/local/stoppers), asked once per step. A run is its checkpointed
`RunState` and its `RunServices` (engines/local/run).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

import snr
from snr.selection import select_groups
from snr.stopping import LOW_VALIDATIONS
from ragen2 import heap
from ragen2 import metric_names as names
from ragen2 import precision
from ragen2.algos import losses
from ragen2.config import Config
from ragen2.engines.local import checkpoint as ckpt
from ragen2.engines.local import dynamic_sampling, grad_decomp, learner
from ragen2.engines.local.interrupts import Interrupts, StepAbandoned, restore_rng, rng_snapshot
from ragen2.engines.local.run import Run, RunServices, RunState, StepResult, env_factory
from ragen2.engines.local.stoppers import Stop, first_stop
from ragen2.engines.local.stoppers import interrupted as interrupt_stop
from ragen2.instruments import completions
from ragen2.instruments import probe as probe_lib
from ragen2.progress import LiveLine
# the concrete modules, not the packages' lazy re-exports: static tools then see the step's stages
from ragen2.rollout.agent_loop import evaluate
from ragen2.rollout.batch import RolloutBatch, adjusted_rows, ragen_size_divisor
from ragen2.run_dir import (warm_start_of, DirectoryGuard, RunDirectoryGone, RunLog, checkpoint_name, read_steps,
                            write_config, write_summary)
from ragen2.run_dir import summary as run_summary
from ragen2.seeding import validation_sampling_seed, validation_seeds

__all__ = ["Run", "RunServices", "RunState", "ResumeError", "StepResult", "env_factory", "setup", "train",
           "train_step", "validate"]


class Timer:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        started = time.perf_counter()
        yield
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started

    def metrics(self) -> dict[str, float]:
        return {names.phase_seconds(phase): round(seconds, 4) for phase, seconds in self.seconds.items()}


def group_signal(batch: RolloutBatch, signal: str) -> torch.Tensor | None:
    """[P, G] values of the filter's signal when it is not the reward (filter.signal=success)."""
    return None if signal == "reward" else batch.signal_matrix(signal)


def train_step(run: Run) -> StepResult:
    """One step: rollout, probe, filter, old/ref log-probs and values, advantages, update; then
    the collapse watch. Returns what it observed; whether the run stops is the loop's question."""
    cfg, state, services, timer = run.cfg, run.state, run.services, Timer()
    models = services.models
    step_started = time.perf_counter()
    with timer(names.PHASE_ROLLOUT), services.interrupts.abandonable():  # only the sampling RNG moves: safe to drop
        sampled = dynamic_sampling.sample(run)  # one rollout; filter.max_rounds > 1: DAPO's refill rounds
    batch, metrics = sampled.batch, dynamic_sampling.report(run, sampled)  # rollout/*, sampling/* budget
    metrics.update(state.probe.maybe_run(state.step, models.policy, batch))  # timed on its own
    metrics.update(decompose_prefilter(run, batch))  # probe.grad_prefilter: before the filter
    with timer(names.PHASE_FILTER):
        signal = group_signal(batch, cfg.filter.signal)
        selection = select_groups(batch.reward_matrix(), cfg.filter, signal=signal)
    metrics.update(selection.metrics)
    recorded = completions.pick(batch, cfg.trainer.log_completions, selection.kept.tolist())  # no RNG
    filter_decision = state.stop_policy.observe(selection)
    metrics.update(state.stop_policy.metrics())
    metrics[names.UPDATE_TOKENS] = metrics[names.UPDATE_OPTIMIZER_STEPS] = 0.0  # a skipped step spends none
    if not selection.skip:
        kept = adjust_rows(run, batch.select_groups(selection.kept), batch.input_ids.shape[0])
        metrics[names.UPDATE_ROWS] = float(kept.input_ids.shape[0])
        if kept.input_ids.shape[0]:  # delete mode can leave none
            metrics.update(update_on(run, kept, selection, timer))
            metrics.update(update_budget(cfg, kept, metrics))
    metrics.update(timer.metrics())
    # The whole step, probe and gradient decomposition included (the loop adds validation).
    metrics[names.TIME_STEP_S] = round(time.perf_counter() - step_started, 4)
    rollout_s = timer.seconds[names.PHASE_ROLLOUT]
    metrics[names.THROUGHPUT_ROLLOUT] = metrics[names.SAMPLING_TOKENS] / max(rollout_s, 1e-9)
    alerts, collapse_alert = state.watch.observe(state.step, metrics, services.log)  # alerts -> events
    metrics.update(alerts)
    return StepResult(metrics, batch, selection, recorded, filter_decision, collapse_alert)


def decompose_prefilter(run: Run, batch: RolloutBatch) -> dict:
    """probe.grad_prefilter, on decomposition steps: `grad_prefilter/...` of the batch before the
    filter (RAGEN-2's `gradient_analysis_log_prefilter`), skipped steps too, on its own update inputs."""
    cfg, models = run.cfg, run.services.models
    if not (cfg.probe.grad_prefilter and grad_decomp.due(cfg, run.state.step)):
        return {}
    data = learner.update_inputs(models, batch, cfg)
    return grad_decomp.maybe_decompose(models, cfg, run.state.step, batch, data, prefix=names.GRAD_PREFILTER)


def update_budget(cfg: Config, batch: RolloutBatch, metrics: dict) -> dict:
    """What the update spent, for the bench's budget columns: tokens through it (every epoch)
    and optimiser steps taken (ppo_update's mini-batches, less those skipped as non-finite)."""
    mini_batches = cfg.optim.ppo_epochs * math.ceil(batch.input_ids.shape[0] / cfg.optim.mini_batch_size)
    return {names.UPDATE_TOKENS: float(batch.num_tokens * cfg.optim.ppo_epochs),
            names.UPDATE_OPTIMIZER_STEPS: float(mini_batches - metrics[names.ACTOR_NONFINITE_SKIPPED_MINIBATCHES])}


def adjust_rows(run: Run, kept: RolloutBatch, rollout_rows: int) -> RolloutBatch:
    """RAGEN-2's batch adjustment (optim.batch_adjust) of the rows the filter kept.

    A mini-batch larger than the whole rollout means "one step over the batch" here; RAGEN-2's
    configs never have one, and padding to it would multiply the batch, so it counts as the rollout."""
    cfg = run.cfg
    divisor = ragen_size_divisor(cfg.rollout.num_groups, min(cfg.optim.mini_batch_size, rollout_rows))
    order = adjusted_rows(kept.input_ids.shape[0], divisor, cfg.optim.batch_adjust, run.state.generator)
    return kept if order == list(range(kept.input_ids.shape[0])) else kept.take_rows(order)


def needs_old_log_probs(run: Run, rows: int) -> bool:
    """False when one optimiser step covers the batch: the update's own first forward then gives
    the old log-probs (ratio exactly 1), and the separate pass would be wasted work. Still needed
    for a KL-in-reward penalty (it enters the advantages) and for a gradient decomposition."""
    cfg = run.cfg
    kl_in_reward = run.services.models.reference is not None and cfg.algo.kl_mode == "reward"
    if kl_in_reward or grad_decomp.due(cfg, run.state.step):
        return True
    # critic warm-up: no policy loss, so no ratio to take
    return trains_actor(run) and not learner.reuses_current_log_probs(cfg.optim, rows)


def trains_actor(run: Run) -> bool:
    """False during the critic warm-up: the first `optim.critic_warmup_steps` steps (skipped ones count)."""
    return run.state.step >= run.cfg.optim.critic_warmup_steps


def update_on(run: Run, batch: RolloutBatch, selection, timer: Timer) -> dict:
    cfg, state, models = run.cfg, run.state, run.services.models
    batch = batch.to(models.device)
    mask = batch.response_mask
    # the one builder of the update's inputs; the decomposition takes the same ones
    data = learner.update_inputs(models, batch, cfg, needs_old_log_probs(run, batch.input_ids.shape[0]), timer)
    old, ref = data.old_log_probs, data.ref_log_probs
    decomposition = grad_decomp.maybe_decompose(models, cfg, state.step, batch, data)  # timed apart (grad/time_s)
    scale = snr.kept_fraction_scale(selection.kept_fraction, cfg.algo.filter_loss_scaling)
    train_actor = trains_actor(run)
    with timer(names.PHASE_UPDATE):
        metrics = learner.ppo_update(models, run.services.optimizers, data, cfg, state.generator,
                                     learner.UpdateOptions(scale, train_actor, run.services.live.update()))
    metrics["actor/frozen_for_critic_warmup"] = float(not train_actor)
    tokens = batch.num_tokens * cfg.optim.ppo_epochs
    metrics[names.THROUGHPUT_UPDATE] = tokens / max(timer.seconds[names.PHASE_UPDATE], 1e-9)
    metrics.update(decomposition)
    if ref is None:
        metrics[names.UPDATE_KL_TO_REF] = 0.0
    elif old is not None:
        metrics[names.UPDATE_KL_TO_REF] = float(losses.kl_loss(old, ref, mask, cfg.algo.kl_estimator))
    else:  # on-policy: the update's first forward is the rollout policy, its KL term is this
        metrics[names.UPDATE_KL_TO_REF] = metrics.get(names.ACTOR_KL_LOSS, 0.0)
    state.nonfinite_skips += int(metrics[names.ACTOR_NONFINITE_SKIPPED_MINIBATCHES])
    metrics["actor/nonfinite_skips_total"] = float(state.nonfinite_skips)
    return metrics


def validate(run: Run) -> dict:
    cfg = run.cfg
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(validation_sampling_seed(cfg))
    models = run.services.models
    metrics = evaluate(models.policy, models.tokenizer, run.services.make_val_env, validation_seeds(cfg),
                       dataclasses.replace(cfg.rollout, temperature=cfg.trainer.val_temperature), generator,
                       progress=run.services.live.rollout("validation"))
    metrics[names.TIME_VALIDATION_S] = round(time.perf_counter() - started, 4)
    return metrics


def check_run_dir(run: Run) -> None:
    """Stop before writing into a directory that is no longer this run's (run_dir.DirectoryGuard)."""
    run.services.dir_guard.check(run.state.step)


def save(run: Run) -> None:
    check_run_dir(run)
    state, services = run.state, run.services
    saved = ckpt.Saved(services.models, services.optimizers, state.generator)
    options = ckpt.SaveOptions.of(run.cfg.trainer, lambda line: services.log.event("checkpoint_size", message=line))
    path = ckpt.save_checkpoint(run.run_dir, state.step, saved, state.to_json(), options)
    services.log.event("checkpoint", path=str(path), step=state.step)


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
    if not cfg.trainer.keep_freed_memory:
        heap.return_freed_memory()
    segment_note = probe_lib.resolve_run_segment(cfg)  # probe.segment=auto: recorded as resolved
    torch.manual_seed(cfg.trainer.seed)
    choices = []
    if models is None:
        models = learner.build_models(cfg, report=choices.append)
    elif cfg.model.dtype == "auto":  # models built by the caller: record what they compute in
        cfg.model.dtype = str(precision.compute_dtype(models.policy)).removeprefix("torch.")
    optimizers = learner.build_optimizers(models, cfg)
    state = RunState.fresh(cfg, models.tokenizer)
    latest = None
    if resume and ckpt.complete_checkpoints(run_dir):
        latest = restore(run_dir, models, optimizers, state, cfg, warn)
    make_env, make_val_env = env_factory(cfg), env_factory(cfg, cfg.env.val_name)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(run_dir, cfg)
    dir_guard = DirectoryGuard(run_dir)
    log = RunLog(run_dir, cfg.trainer.total_steps, json.loads(cfg.model_dump_json()), resume_step=state.step,
                 use_wandb=cfg.trainer.wandb, use_tensorboard=cfg.trainer.tensorboard, quiet=quiet,
                 print_completions=cfg.trainer.print_completions)
    services = RunServices(models, optimizers, make_env, make_val_env, log, dir_guard, Interrupts(quiet=quiet),
                           LiveLine(enabled=LiveLine.wanted(quiet), total_steps=cfg.trainer.total_steps,
                                    first_step=state.step))  # the plan: the live line's whole-run ETA
    for choice in choices:
        log.event("precision", message=choice.describe(), dtype=choice.dtype)
    log.event("heap", message=heap.state())
    warm_start = warm_start_of(cfg.model.name)
    if warm_start is not None:  # which warm start this run began from (bench cells are compared on it)
        log.event("warm_start", message=f"starts from {warm_start['warm_start']}", **warm_start)
    if segment_note:
        log.event("probe_segment", message=segment_note, segment=cfg.probe.segment)
    padding_note = learner.padding_free_refusal("optim.padding_free", cfg.optim.padding_free, models.policy,
                                                "the update and the log-prob and value passes")
    if padding_note:
        log.event("padding_free", message=padding_note)
    if latest is not None:
        log.event("resume", message=f"resumed from {latest} at step {state.step}", step=state.step)
    return Run(cfg, run_dir, state, services)


def restore(run_dir: Path, models: learner.Models, optimizers: learner.Optimizers, state: RunState,
            cfg: Config, warn) -> Path:
    """Load the newest checkpoint that loads into the models, optimisers and `state`; its path."""
    loaded = ckpt.load_latest(run_dir, models, optimizers, state.generator, warn)
    if loaded is None:
        raise ResumeError(f"{run_dir}: every checkpoint is damaged; nothing to resume from")
    latest, saved = loaded
    state.load_json(saved)
    recorded = saved.get("num_threads")
    if recorded is not None and recorded != cfg.trainer.num_threads:
        warn(f"warning: the checkpoint was written with {recorded} torch threads, this run uses "
             f"{cfg.trainer.num_threads}: steps from here will not repeat an uninterrupted run bit for bit")
    return latest


def train(run: Run, on_step=None) -> dict:
    """Run the remaining steps; returns the summary (also written to summary.json, unless the
    run was interrupted: then `summary["interrupted"]` names the signal and the run resumes).

    `on_step(result)` sees each step's `StepResult` once its row is logged (run.state.step is
    still that step's index): how a script observes the batches without wrapping the trainer."""
    interrupts = run.services.interrupts
    interrupts.install()
    try:
        return _train_loop(run, on_step)
    except RunDirectoryGone:
        run.services.log.close()
        raise
    finally:
        interrupts.restore()


def _train_loop(run: Run, on_step) -> dict:
    cfg, state, services = run.cfg, run.state, run.services
    started = time.time()
    stop: Stop | None = None
    if cfg.trainer.val_before and state.step == 0 and validate_before(run) is None:
        return _interrupted(run, started, interrupt_stop(run))
    while state.step < cfg.trainer.total_steps:
        snapshot = rng_snapshot(state.generator)
        try:
            result = train_step(run)
        except StepAbandoned:  # nothing but the RNG had moved: put it back, the step never happened
            restore_rng(state.generator, snapshot)
            stop = interrupt_stop(run)
            break
        last = state.step + 1 == cfg.trainer.total_steps
        if validation_due(run, result, last):
            validate_step(run, result)
        stop = first_stop(run, result)  # the step's one decision
        services.live.stop()
        if stop is not None and not stop.interrupted:
            result.metrics["stop_reason"] = stop.reason
            services.log.event("stop", reason=stop.reason, message=stop.message, step=state.step)
        check_run_dir(run)
        services.log.step(state.step, result.metrics, result.completions)
        if on_step is not None:
            on_step(result)
        state.step += 1
        stop = stop or interrupt_stop(run)  # a signal during the logging: honoured now
        if (cfg.trainer.save_every and state.step % cfg.trainer.save_every == 0) or last or stop:
            save(run)
        if stop:
            break
    stop = stop or interrupt_stop(run)  # a signal while the last step was saved
    if stop is not None and stop.interrupted:
        return _interrupted(run, started, stop)
    summary = summarise(read_steps(run.run_dir), stop.reason if stop else None, time.time() - started, run)
    write_summary(run.run_dir, summary)
    services.log.close()
    return summary


def validation_due(run: Run, result: StepResult, last: bool) -> bool:
    """trainer.val_every, the last step, or a step a watcher stops the run on (a finished run
    validates its end; an interrupted one is saved to resume, not finished)."""
    every = run.cfg.trainer.val_every
    ending = result.watchers_stop and not run.services.interrupts.requested
    return bool(every and (run.state.step + 1) % every == 0) or last or ending


def validate_step(run: Run, result: StepResult) -> None:
    """Validate after the step into its row; RAGEN-2's low-validation-success rule observes it
    unless the run stops anyway (a watcher asked, or a signal arrived)."""
    metrics = result.metrics
    try:
        with run.services.interrupts.abandonable():
            metrics.update(validate(run))
    except StepAbandoned:
        metrics["val/abandoned"] = 1.0  # the update happened: keep the step, without its validation
    metrics[names.TIME_STEP_S] = round(metrics[names.TIME_STEP_S] + metrics.get(names.TIME_VALIDATION_S, 0.0), 4)
    stopping = result.watchers_stop or run.services.interrupts.requested
    if names.VAL_SUCCESS_RATE in metrics and not stopping:
        policy = run.state.stop_policy
        result.validation_decision = policy.observe_validation(metrics[names.VAL_SUCCESS_RATE])
        # written again (the stop policy's metrics were taken before it saw this validation); taking them
        # all here instead would move snr/stopped on the step a low-validation stop fires
        metrics[LOW_VALIDATIONS] = float(policy.low_validations)


def validate_before(run: Run) -> dict | None:
    """trainer.val_before: the untrained model on the validation instances, as an event (the
    summary reads it back, also after a resume); None when interrupted."""
    try:
        with run.services.interrupts.abandonable():
            metrics = validate(run)
    except StepAbandoned:
        return None
    finally:
        run.services.live.stop()
    check_run_dir(run)
    success, seconds = metrics.get(names.VAL_SUCCESS_RATE, float("nan")), metrics.get(names.TIME_VALIDATION_S, 0)
    run.services.log.event("validation_before", step=0, metrics=metrics,
                           message=f"validation before training: success {success:.3f} ({seconds:.0f}s)")
    return metrics


def _interrupted(run: Run, started: float, stop: Stop) -> dict:
    """Stop on a signal: make sure the last completed step is on disk, then say how to continue."""
    step, log = run.state.step, run.services.log
    latest = ckpt.latest_checkpoint(run.run_dir)
    if step > 0 and (latest is None or latest.name != checkpoint_name(step)):
        save(run)  # the step in progress was abandoned: models and RNG are as the last one left them
        latest = ckpt.latest_checkpoint(run.run_dir)
    resume = f"ragen2 train --resume {run.run_dir}"
    if latest is None:
        message = f"{stop.signal} before the first step finished: nothing to resume; start again"
    else:
        message = f"{stop.signal}: stopped after step {step}; continue with: {resume}"
    log.event("stop", reason=stop.reason, signal=stop.signal, message=message, step=step)
    log.close()
    summary = summarise(read_steps(run.run_dir), stop.reason, time.time() - started, run)
    summary["interrupted"] = stop.signal
    summary["resume_command"] = resume if latest is not None else None
    return summary


def summarise(rows: list[dict], stop_reason, wall_s: float, run: Run) -> dict:
    """summary.json (ragen2.run_dir's schema), with what only this engine counts."""
    return run_summary(rows, run_dir=run.run_dir, engine="local", stop_reason=stop_reason, wall_s=wall_s,
                       nonfinite_skips=run.state.nonfinite_skips,
                       config=dataclasses.asdict(run.cfg.filter) | {"algo": run.cfg.algo.name,
                                                                        "env": run.cfg.env.name})
