"""The PPO controller subclass that brings ragen2's filter, skip accounting and MI probe into OpenRLHF.

`openrlhf.trainer.ppo_trainer.PPOTrainer` is a `ray.remote` class; its underlying class is
`PPOTrainer.__ray_actor_class__`. `RagenPPOTrainer` subclasses that and overrides:

- `train_step(rollout_samples, global_step)`: every `probe.every` steps the MI probe scores the
  step's samples (before filtering, as in the local engine) through the actor group's
  `forward`; then the SNR filter keeps whole groups in their original order, trimmed to the
  batch unit (`selection`); an empty result skips the update: the step is counted, its
  metrics are held, and nothing is logged, checkpointed or evaluated for it. The next trained
  step logs `ragen2/skipped_steps` (since the last log) and `ragen2/skipped_steps_total`.
- `save_logs_and_checkpoints` and `evaluate`: do nothing on a skipped step (the global step did
  not advance, so OpenRLHF would log, save or evaluate that step twice).
- The stop policy (`snr.StopPolicy`, consecutive skips / spread collapse) ends the run by
  making the sample generator report an exhausted dataset, so `fit` returns normally and
  `train_ppo_ray` saves the model.

How it is installed (`install`): run-module patching. `launch.main` replaces the module
attribute `openrlhf.trainer.ppo_trainer.PPOTrainer` with `ray.remote(RagenPPOTrainer)` before
running `openrlhf.cli.train_ppo_ray` as `__main__`; its `train()` imports `PPOTrainer` from that
module when called, so it creates ours. Ray ships the class to the worker that hosts the
controller by reference (this module must be importable there: ragen2 is installed on every
node), and the settings travel in the job's runtime environment (`SETTINGS_ENV`), which Ray sets
in every worker. A worker setup hook is not needed: only the controller's class changes, and the
DeepSpeed and vLLM workers run OpenRLHF's own code (plus our agent module, loaded by path).
"""

from __future__ import annotations

import json
import os

import ray
import torch
from openrlhf.trainer import ppo_trainer as _ppo_trainer_module
from openrlhf.utils.logging_utils import init_logger

import snr
from ragen2.config import ProbeSection
from ragen2.engines.openrlhf import SETTINGS_ENV
from ragen2.engines.openrlhf.probe_scoring import probe_metrics
from ragen2.engines.openrlhf.run_files import RunFiles
from ragen2.engines.openrlhf.selection import SkipLedger, select_samples

logger = init_logger(__name__)

_OriginalRemote = _ppo_trainer_module.PPOTrainer
_Base = getattr(_OriginalRemote, "__ray_actor_class__", _OriginalRemote)


def load_settings(text: str | None = None) -> dict:
    raw = os.environ.get(SETTINGS_ENV) if text is None else text
    if not raw:
        raise RuntimeError(f"{SETTINGS_ENV} is not set in this Ray worker: start the run with "
                           "`ragen2 train --engine openrlhf` (or python -m ragen2.engines.openrlhf.launch)")
    settings = json.loads(raw)
    if settings.get("version") != 1:
        raise RuntimeError(f"unknown ragen2 settings version {settings.get('version')!r}")
    return settings


class RagenState:
    """Everything the subclass adds, kept apart from OpenRLHF's attributes."""

    def __init__(self, settings: dict, tokenizer):
        from ragen2.probe import Probe

        self.settings = settings
        self.group_size = int(settings["group_size"])
        self.unit = int(settings["batch_unit"])
        self.filter = snr.FilterConfig.from_dict(settings["filter"])
        self.stop_policy = snr.StopPolicy(snr.StopConfig(**settings["stop"]))
        self.ledger = SkipLedger()
        self.probe = Probe(ProbeSection(**settings["probe"]), tokenizer)
        self.prefill = settings["prefill"]
        self.step = 0  # rollout steps, skipped ones included (the local engine's run.step)
        self.skipped_now = False
        self.stop_reason: str | None = None
        self.files = RunFiles(settings["run_dir"]) if settings.get("run_dir") else None


class RagenPPOTrainer(_Base):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ragen_setup(load_settings(), self.tokenizer)

    def _ragen_setup(self, settings: dict, tokenizer) -> None:
        self.ragen = RagenState(settings, tokenizer)
        generator = getattr(self, "samples_generator", None)
        if generator is not None:
            original = generator.generate_samples

            def generate_samples(**kwargs):
                if self.ragen.stop_reason is not None:  # an exhausted dataset ends fit() normally
                    return [], None, 0, True
                return original(**kwargs)

            generator.generate_samples = generate_samples

    # --- the actor group's forward, for the probe ---------------------------------------

    def _actor_log_probs(self, sequences, action_masks, attention_masks):
        """Log-probs from the actor's DeepSpeed workers, one tensor per micro-batch, in order."""
        group = self.actor_model_group
        duplicates = self.args.ds.ring_attn_size * self.args.ds.tensor_parallel_size
        ranks = max(1, len(group._actor_handlers) // duplicates)
        count = len(sequences)
        while len(sequences) < ranks:  # every rank needs a chunk; the extra results are dropped
            sequences, action_masks, attention_masks = (sequences + sequences[-1:], action_masks + action_masks[-1:],
                                                        attention_masks + attention_masks[-1:])
        refs = group.async_run_method_batch(method_name="forward", sequences=sequences, action_mask=action_masks,
                                            attention_mask=attention_masks)
        results = [item for chunk in ray.get(refs)[::duplicates] for item in chunk]
        return results[:count]

    # --- one step ------------------------------------------------------------------------

    def ragen_before_update(self, rollout_samples: list):
        """Probe, filter and stop policy for one step: (samples to train on or None, metrics)."""
        state = self.ragen
        step, state.step = state.step, state.step + 1
        metrics: dict = {}
        if state.probe.due(step):
            micro = self.args.rollout.micro_batch_size
            metrics.update(probe_metrics(state.probe, rollout_samples, state.group_size, step,
                                         self._actor_log_probs, state.prefill, micro_batch_size=micro))
        chosen = select_samples(rollout_samples, state.group_size, state.filter, state.unit)
        metrics.update(chosen.metrics)
        if chosen.reason == "batch_unit":
            decision = state.stop_policy.update(True)
        else:
            decision = state.stop_policy.observe(chosen.selection)
        metrics.update(state.stop_policy.metrics())
        if decision.stop:
            state.stop_reason = decision.reason
            logger.info(f"ragen2: stopping after this step: {decision.message}")
            metrics["ragen2/stopped"] = 1.0
        return (None if chosen.skip else chosen.samples), metrics

    def train_step(self, rollout_samples, global_step: int):
        kept, metrics = self.ragen_before_update(rollout_samples)
        if kept is None:
            self.ragen.skipped_now = True
            self.ragen.ledger.skipped(metrics)
            logger.info(f"ragen2: step skipped (no group kept); {self.ragen.ledger.total} skipped so far")
            return {}, global_step
        self.ragen.skipped_now = False
        status, next_step = super().train_step(kept, global_step)
        status.update(self.ragen.ledger.flush())
        status.update(metrics)
        return status, next_step

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        if self.ragen.skipped_now:
            return
        if self.ragen.files is not None:  # the step just trained: index ragen.step - 1, as the local engine's
            self.ragen.files.log_step(self.ragen.step - 1, logs_dict)
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)

    @torch.no_grad()
    def evaluate(self, global_step, **generate_kwargs):
        if self.ragen.skipped_now:
            return {}
        result = super().evaluate(global_step, **generate_kwargs)
        if self.ragen.files is not None:
            self.ragen.files.log_eval(self.ragen.step - 1, result)
        return result

    def fit(self, *args, **kwargs):
        """OpenRLHF's loop; then summary.json (only when it returns: a crashed run has none)."""
        result = super().fit(*args, **kwargs)
        if self.ragen.files is not None:
            self.ragen.files.finish(self.ragen.step, self.ragen.ledger.total, self.ragen.stop_reason)
        return result


RemoteRagenPPOTrainer = ray.remote(RagenPPOTrainer)


def install() -> None:
    """Make `openrlhf.trainer.ppo_trainer.PPOTrainer` ours (see the module doc)."""
    _ppo_trainer_module.PPOTrainer = RemoteRagenPPOTrainer
