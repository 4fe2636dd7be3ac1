"""The PPO controller subclass that brings ragen2's filter, skip accounting and MI probe into OpenRLHF.

`openrlhf.trainer.ppo_trainer.PPOTrainer` is a `ray.remote` class; its underlying class is
`PPOTrainer.__ray_actor_class__`. `RagenPPOTrainer` subclasses that and overrides:

- `train_step(rollout_samples, global_step)`: every `probe.every` steps the MI probe scores the
  step's samples (before filtering, as in the local engine) through the actor group's
  `forward`; then the SNR filter keeps whole groups in their original order, trimmed to the
  batch unit (`selection`); an empty result skips the update: the step is counted, its row
  goes to metrics.jsonl (as the local engine's, `snr/skipped` = 1), its metrics are held for
  OpenRLHF's loggers, and nothing is trained or checkpointed for it. The next trained step logs
  `ragen2/skipped_steps` (since the last log) and `ragen2/skipped_steps_total`.
- Rollout metrics (`rollout/...`) are over all of the step's rollouts, in the local engine's
  definitions (`selection.rollout_metrics`); OpenRLHF's own, over the trained samples only, are
  kept as `trained/...`.
- completions.jsonl (`trainer.log_completions`): the step's best and worst samples, before the
  filter, with each turn's text decoded from the sample (`completions.pick_samples`).
- `save_logs_and_checkpoints`: nothing on a skipped step (the global step did not advance, so
  OpenRLHF would log or save that step twice); checkpoints every `trainer.save_every` rollout
  steps, as the local engine counts them.
- `evaluate`: the flags pass `--eval.steps 1`, so `fit` asks after every rollout step, skipped or
  not; it runs when the local engine validates: every `trainer.val_every` steps and after the
  last step (the total, or the stop policy's), even when that step was skipped. OpenRLHF's own
  count (trained steps only) would drop the final evaluation after a single skip.
- `save_best_checkpoint`: nothing. The local engine keeps the last `trainer.keep_last`
  checkpoints (`--ckpt.max_num`) and no "best" one (a DeepSpeed checkpoint per improving eval).
- `__init__`: the prompt loader in dataset order (OpenRLHF's shuffles), so step k trains on the
  local engine's step-k instances (`flags.dataset_rows`).
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
from ragen2 import metric_names as names
from ragen2.config import ProbeSection
from ragen2.engines.openrlhf import SETTINGS_ENV
from ragen2.engines.openrlhf.completions import pick_samples
from ragen2.engines.openrlhf.probe_scoring import probe_metrics
from ragen2.engines.openrlhf.run_files import RunFiles
from ragen2.engines.openrlhf.selection import SkipLedger, rollout_metrics, select_samples
from ragen2.instruments.probe import Probe

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
        self.settings = settings
        self.group_size = int(settings["group_size"])
        self.unit = int(settings["batch_unit"])
        self.filter = snr.FilterConfig.from_dict(settings["filter"])
        self.stop_policy = snr.StopPolicy(snr.StopConfig(**settings["stop"]))
        self.ledger = SkipLedger()
        self.probe = Probe(ProbeSection(**settings["probe"]), tokenizer)
        self.prefill = settings["prefill"]
        self.tokenizer = tokenizer
        self.log_completions = int(settings.get("log_completions", 0))
        self.total_steps = int(settings["total_steps"])
        self.val_every = int(settings["val_every"])
        self.save_every = int(settings["save_every"])
        self.step = 0  # rollout steps, skipped ones included (the local engine's run.step)
        self.skipped_now = False
        # this step's string fields (probe/dtype): for our rows only, since OpenRLHF's loggers
        # (TensorBoard's add_scalar) take numbers
        self.row_labels: dict[str, str] = {}
        self.stop_reason: str | None = None
        self.files = RunFiles(settings["run_dir"]) if settings.get("run_dir") else None


class RagenPPOTrainer(_Base):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ragen_keep_dataset_order()
        self._ragen_setup(load_settings(), self.tokenizer)

    def _ragen_keep_dataset_order(self) -> None:
        """OpenRLHF's prompt loader shuffles (ppo_trainer.prepare_datasets); ours reads the rows in
        the order flags.dataset_rows wrote them: step k's num_groups rows are the local step k's."""
        loader = self.prompts_dataloader
        ordered = self.strategy.setup_dataloader(loader.dataset, 1, True, False, loader.collate_fn,
                                                 num_workers=self.args.data.dataloader_num_workers)
        self.prompts_dataloader = self.samples_generator.prompts_dataloader = ordered

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
        metrics = rollout_metrics(rollout_samples, state.group_size)
        state.row_labels = {}
        if state.probe.due(step):
            micro = self.args.rollout.micro_batch_size
            probed = probe_metrics(state.probe, rollout_samples, state.group_size, step,
                                   self._actor_log_probs, state.prefill, micro_batch_size=micro)
            state.row_labels = {names.PROBE_DTYPE: probed.pop(names.PROBE_DTYPE)}
            metrics.update(probed)
        chosen = select_samples(rollout_samples, state.group_size, state.filter, state.unit)
        metrics.update(chosen.metrics)
        if state.files is not None:
            state.files.log_completions(step, pick_samples(rollout_samples, state.group_size, state.log_completions,
                                                           state.tokenizer, state.prefill, chosen.kept_groups))
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
            if self.ragen.files is not None:
                self.ragen.files.log_step(self.ragen.step - 1, metrics, self.ragen.row_labels)
            logger.info(f"ragen2: step skipped (no group kept); {self.ragen.ledger.total} skipped so far")
            return {}, global_step
        self.ragen.skipped_now = False
        status, next_step = super().train_step(kept, global_step)
        status = {("trained/" + k.removeprefix(names.ROLLOUT) if k.startswith(names.ROLLOUT) else k): v
                  for k, v in status.items()}
        status.update(self.ragen.ledger.flush())
        status.update(metrics)
        return status, next_step

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        if self.ragen.skipped_now:
            return
        if self.ragen.files is not None:  # the step just trained: index ragen.step - 1, as the local engine's
            self.ragen.files.log_step(self.ragen.step - 1, logs_dict, self.ragen.row_labels)
        # OpenRLHF saves when global_step (trained steps) % save_steps == 0; the local engine counts rollout steps
        due = bool(self.ragen.save_every) and self.ragen.step % self.ragen.save_every == 0
        self.args.ckpt.save_steps = 1 if due else float("inf")
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)

    def ragen_eval_due(self) -> bool:
        """The local engine's rule: after every val_every-th step and after the last one."""
        state = self.ragen
        periodic = bool(state.val_every) and state.step % state.val_every == 0
        return periodic or state.step >= state.total_steps or state.stop_reason is not None

    def save_best_checkpoint(self, eval_metrics, global_step, client_states=None):
        return None  # see the module doc: only the last --ckpt.max_num regular checkpoints are kept

    @torch.no_grad()
    def evaluate(self, global_step, **generate_kwargs):
        if not self.ragen_eval_due():
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
