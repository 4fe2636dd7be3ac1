"""`RAGEN2GRPOTrainer`: TRL's GRPOTrainer with RAGEN-2's SNR filter and collapse probe.

    trainer = RAGEN2GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                                snr_filter="snr-top-p", mi_probe=MIProbeArgs(every=10))

Where it hooks into TRL 1.16 (trl/trainer/grpo_trainer.py), and why there:

* `_calculate_rewards` returns the rewards gathered over all processes, [batch, reward functions];
  they are kept for the step. TRL computes advantages inline right after, with no hook between.
* `_generate_and_score_completions` returns the generation batch (advantages, masks). On it, in
  training only: the probe (before filtering, with the policy that sampled), then the filter:
  dropped completions get advantage 0 and loss-mask 0 (`tool_mask`, which only the loss reads),
  `num_items_in_batch` is recounted over the kept tokens (the default loss "dapo" divides by it, so
  the update is the one on the kept groups alone), and kept advantages take the kept-fraction
  scale. With per-sequence means ("grpo", "sapo", "luspo") and "dr_grpo" the dropped rows still
  count in the divisor. A 0-dim `ragen2_skip` flag rides along: TRL's shuffle and split pass 0-dim
  tensors to every micro-batch, so it reaches each `compute_loss` of that generation batch.
* `compute_loss` on a skipped batch returns a zero leaf without a forward: nothing backpropagates,
  so gradients stay None and the optimizer steps over no parameter (AdamW skips a None gradient:
  no momentum, no weight decay). The step counts (scheduler, global_step), as RAGEN counts it.
* Metrics go to TRL's `self._metrics["train"]`, which TRL averages into every log row, so each
  `report_to` backend (wandb, TensorBoard, trackio) gets them: the ones a TRL user reads (ESSENTIAL,
  alerts, the probe's dtype), or every `snr/` and `probe/` key with `ragen2_metrics="all"` (about 80).
  A stop (the filter's stop policy, when given one, or an alert the probe is told to stop on) sets
  `control.should_training_stop`.
"""

from __future__ import annotations

import logging

import torch
from trl import GRPOTrainer

import snr
from ragen2 import metric_names as names
from ragen2.integrations.trl.filtering import GroupFilter, SNRFilterArgs, drop_from_loss, group_rewards
from ragen2.integrations.trl.probe import CollapseProbe, MIProbeArgs, dtype_key

logger = logging.getLogger(__name__)

SKIP_KEY = "ragen2_skip"
# What a log row carries by default: what the filter kept and why, whether it stopped, the probe's
# headline numbers. Every key of both (spread min/max/variance, seq variants, each k) is opt-in.
ESSENTIAL = frozenset({
    names.SNR_KEPT_FRACTION, names.SNR_GROUPS_KEPT, names.SNR_SKIPPED, names.SNR_ZERO_SPREAD_GROUPS,
    names.SNR_REWARD_STD_MEAN, names.SNR_KEPT_REWARD_STD_MEAN, "snr/loss_scale", "snr/total_skips",
    "snr/consecutive_skips", "snr/stopped", names.PROBE_MI_ESTIMATE, names.PROBE_MI_ZSCORE_EMA,
    names.PROBE_RETRIEVAL_ACCURACY_AT_1, names.PROBE_RETRIEVAL_CHANCE_LEVEL_AT_1,
    names.PROBE_SKIPPED_TOO_FEW_GROUPS})
ESSENTIAL_PREFIXES = ("alert/", names.PROBE_DTYPE + "/")
METRIC_CHOICES = ("essential", "all")


class RAGEN2GRPOTrainer(GRPOTrainer):
    """GRPOTrainer + `snr_filter` (an `SNRFilterArgs`, a `snr.FilterConfig` or a preset name) and
    `mi_probe` (an `MIProbeArgs`); either may be None. `ragen2_metrics`: "essential" (default) logs
    the keys in ESSENTIAL and alerts, "all" every key of the filter and the probe. Every other
    argument is GRPOTrainer's."""

    def __init__(self, *args, snr_filter: SNRFilterArgs | snr.FilterConfig | str | None = None,
                 mi_probe: MIProbeArgs | None = None, ragen2_metrics: str = "essential", **kwargs):
        if ragen2_metrics not in METRIC_CHOICES:
            raise ValueError(f"ragen2_metrics must be one of {METRIC_CHOICES}; got {ragen2_metrics!r}")
        super().__init__(*args, **kwargs)
        self.ragen2_metrics = ragen2_metrics
        self.ragen2_filter = GroupFilter(SNRFilterArgs.coerce(snr_filter)) if snr_filter is not None else None
        if mi_probe is not None and not isinstance(mi_probe, MIProbeArgs):
            raise TypeError(f"mi_probe must be a MIProbeArgs or None; got {type(mi_probe).__name__}")
        pad = self._tokenizer.pad_token_id
        self.ragen2_probe = CollapseProbe(mi_probe, 0 if pad is None else pad) if mi_probe is not None else None
        self.ragen2_stop_reason: str | None = None
        self._ragen2_rewards: torch.Tensor | None = None
        self._ragen2_entropy: float | None = None  # the policy entropy TRL logged last, for the detector

    # --- hooks ------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._ragen2_rewards = rewards
        return rewards

    def _generate_and_score_completions(self, inputs):
        self._ragen2_rewards = None
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training or self._ragen2_rewards is None:
            return output  # evaluation is neither filtered nor probed
        rewards = group_rewards(self._ragen2_rewards, self.reward_weights, self.num_generations)
        step = self.state.global_step
        if self.ragen2_probe is not None:
            self._ragen2_probe_step(output, rewards, step)
        if self.ragen2_filter is not None:
            self._ragen2_filter_step(output, rewards)
        return output

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        skip = inputs.get(SKIP_KEY)
        if skip is not None and bool(skip) and self.model.training:
            # No forward, nothing to backpropagate: the parameters' gradients stay None.
            return torch.zeros((), device=self.accelerator.device, requires_grad=True)
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        entropies = self._metrics["train"].get("entropy")
        if entropies:
            self._ragen2_entropy = float(entropies[-1])
        return loss

    # --- the two instruments ----------------------------------------------------------------

    def _ragen2_log(self, metrics: dict[str, float]) -> None:
        everything = self.ragen2_metrics == "all"
        for key, value in metrics.items():
            if everything or key in ESSENTIAL or key.startswith(ESSENTIAL_PREFIXES):
                self._metrics["train"][key].append(float(value))

    def _ragen2_stop(self, reason: str, message: str) -> None:
        if self.ragen2_stop_reason is None:
            self.ragen2_stop_reason = reason
            logger.warning("ragen2: %s", message)
        self.control.should_training_stop = True

    def _ragen2_filter_step(self, output: dict, rewards: torch.Tensor) -> None:
        outcome = self.ragen2_filter.step(rewards)
        local = output["advantages"].shape[0]
        start = self.accelerator.process_index * local
        keep = outcome.sample_mask[start:start + local]
        drop_from_loss(output, keep, outcome.scale)
        loss_mask = output["completion_mask"] * output["tool_mask"]
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        output[SKIP_KEY] = torch.tensor(outcome.skip)
        self._ragen2_log(outcome.metrics)
        if outcome.decision is not None and outcome.decision.stop:
            self._ragen2_stop(outcome.decision.reason, outcome.decision.message)

    def _ragen2_probe_step(self, output: dict, rewards: torch.Tensor, step: int) -> None:
        probe = self.ragen2_probe
        metrics = None
        if probe.due(step):
            model = self.accelerator.unwrap_model(self.model)
            metrics = probe.measure(model, output["prompt_ids"], output["prompt_mask"], output["completion_ids"],
                                    output["completion_mask"], step,
                                    mixed_precision=str(self.accelerator.mixed_precision))
            metrics = self._ragen2_mean_over_processes(metrics, probe.keys)
            if metrics is None:
                self._ragen2_log({names.PROBE_SKIPPED_TOO_FEW_GROUPS: 1.0})
            elif probe.last_dtype is not None:  # every process scores alike: one setting, one model
                self._ragen2_log({dtype_key(probe.last_dtype): 1.0})
        reward_std = float(snr.group_spread(rewards)[1].mean())
        logged, _, stop_on = probe.observe(step, metrics, entropy=self._ragen2_entropy, reward_std=reward_std)
        self._ragen2_log(logged)
        if stop_on is not None:
            self._ragen2_stop(stop_on.kind, f"stopping: {stop_on.message}")

    def _ragen2_mean_over_processes(self, metrics: dict | None, keys: list[str]) -> dict | None:
        """Each process probes its own completions; the mean over processes feeds one EMA and one
        detector, identical everywhere, so every process takes the same stop decision."""
        if self.accelerator.num_processes == 1:
            return metrics
        device = self.accelerator.device
        row = (torch.tensor([metrics[k] for k in keys], dtype=torch.float64, device=device) if metrics is not None
               else torch.full((len(keys),), float("nan"), dtype=torch.float64, device=device))
        table = self.accelerator.gather(row).view(-1, len(keys))
        if torch.isnan(table).all():
            return None
        return dict(zip(keys, torch.nanmean(table, dim=0).tolist()))
