"""RAGEN-2's SNR filter on a TRL GRPO batch: which groups train, and how the batch says so.

Pure torch over TRL's tensors (no TRL import), so it is tested without TRL. The ranking, the
strategies, the skip rule and the kept-fraction scale are `snr`'s own functions; this module only
reshapes TRL's rewards into `snr`'s [num_groups, G] matrix and turns a `snr.Selection` into the
loss mask and advantages TRL's `_compute_loss` reads.

TRL lays a generation batch out group-major: the G completions of one prompt are consecutive, and
the rewards are gathered over all processes before the per-group baseline, so every process sees
the same matrix and takes the same decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

import snr
from snr import FilterConfig, StopConfig, StopDecision, StopPolicy


@dataclass(frozen=True)
class SNRFilterArgs:
    """What `RAGEN2GRPOTrainer(snr_filter=...)` filters with.

    filter        a `snr.FilterConfig`, or a preset name / YAML path for `snr.load_preset`
                  ("snr-top-p": RAGEN-2's top-p 0.9 on the variance; "starpo-s": top 25% by std).
    stop          None (default): the filter never ends the run, TRL's max_steps does. A
                  `snr.StopConfig()` opts into RAGEN-2's stop rules (5 skipped steps in a row,
                  spread collapse), as `ragen2 train` runs them; a preset name alone never does.
    loss_scaling  none | linear | sqrt: advantages x the kept fraction's factor (`snr.kept_fraction_scale`).
    """

    filter: FilterConfig | str | Path = "snr-top-p"
    stop: StopConfig | None = None
    loss_scaling: str = "none"

    def __post_init__(self) -> None:
        if not isinstance(self.filter, FilterConfig):
            object.__setattr__(self, "filter", snr.load_preset(self.filter))
        if self.filter.max_rounds > 1:  # TRL's trainer generates the batch; the filter only selects from it
            raise ValueError(f"max_rounds={self.filter.max_rounds}: dynamic sampling (extra generation rounds) runs "
                             "in ragen2's local engine only; here the filter selects from the batch TRL generated")
        if self.stop is not None and not isinstance(self.stop, StopConfig):
            raise TypeError(f"stop must be a snr.StopConfig or None; got {type(self.stop).__name__}")
        if self.loss_scaling not in snr.LOSS_SCALINGS:
            raise ValueError(f"loss_scaling must be one of {', '.join(snr.LOSS_SCALINGS)}; got {self.loss_scaling!r}")

    @classmethod
    def coerce(cls, value: "SNRFilterArgs | FilterConfig | str | Path") -> "SNRFilterArgs":
        """An `SNRFilterArgs` from itself, a `FilterConfig` or a preset name (no stop rules)."""
        return value if isinstance(value, cls) else cls(filter=value)


def group_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """TRL's per-completion reward as `snr`'s matrix [num_groups, num_generations].

    The reward is TRL's own: the weighted sum over reward functions, NaN (a function that returned
    None) left out. A completion no function scored has no reward; it takes its group's mean, so it
    adds no spread (TRL gives it advantage 0), and a group with no scored completion has spread 0.
    """
    rewards = rewards_per_func.detach().float().cpu()
    weights = reward_weights.detach().float().cpu()
    if rewards.dim() != 2 or rewards.shape[1] != weights.numel():
        raise ValueError(f"rewards_per_func must be [batch, {weights.numel()} reward functions]; "
                         f"got shape {tuple(rewards.shape)}")
    if num_generations < 1 or rewards.shape[0] % num_generations:
        raise ValueError(f"a batch of {rewards.shape[0]} completions is not whole groups of {num_generations}")
    unscored = torch.isnan(rewards).all(dim=1)
    total = (rewards * weights.unsqueeze(0)).nansum(dim=1)
    total[unscored] = torch.nan
    matrix = total.view(-1, num_generations)
    fill = torch.nan_to_num(torch.nanmean(matrix, dim=1, keepdim=True), nan=0.0).expand_as(matrix)
    return torch.where(torch.isnan(matrix), fill, matrix)


@dataclass(frozen=True)
class FilterStep:
    """One generation batch's filter outcome."""

    selection: "snr.Selection"
    sample_mask: torch.Tensor  # bool [num_groups * G], group-major like TRL's gathered batch
    scale: float  # the advantages' kept-fraction factor
    decision: StopDecision | None
    metrics: dict[str, float]

    @property
    def skip(self) -> bool:
        return self.selection.skip


class GroupFilter:
    """`snr.select_groups` + `snr.StopPolicy` over successive TRL generation batches."""

    def __init__(self, args: SNRFilterArgs):
        self.args = args
        self.stop_policy = StopPolicy(args.stop) if args.stop is not None else None

    def step(self, rewards: torch.Tensor) -> FilterStep:
        """Select the groups of one batch (`rewards`: [num_groups, G]) and update the stop policy."""
        selection = snr.select_groups(rewards, self.args.filter)
        scale = snr.kept_fraction_scale(selection.kept_fraction, self.args.loss_scaling)
        metrics = dict(selection.metrics)
        metrics["snr/loss_scale"] = scale
        decision = None
        if self.stop_policy is not None:
            decision = self.stop_policy.observe(selection)
            metrics.update(self.stop_policy.metrics())
        return FilterStep(selection, selection.sample_mask(rewards.shape[1]), scale, decision, metrics)


def drop_from_loss(output: dict, keep: torch.Tensor, scale: float) -> dict:
    """Take the dropped completions of TRL's batch `output` out of the loss, in place.

    `keep` is bool [local batch]. Their advantages become 0 and their loss-mask rows 0, through
    `tool_mask`, which `_compute_loss` multiplies into the completion mask: the attention mask
    (the completion mask itself) stays as generated. Kept advantages are multiplied by `scale`.
    """
    advantages = output["advantages"]
    keep_rows = keep.to(device=advantages.device)
    shape = (-1,) + (1,) * (advantages.dim() - 1)
    output["advantages"] = advantages * keep_rows.to(advantages.dtype).view(shape) * scale
    completion_mask = output["completion_mask"]
    base = output.get("tool_mask")
    if base is None:
        base = torch.ones_like(completion_mask)
    output["tool_mask"] = base * keep_rows.to(device=base.device, dtype=base.dtype).unsqueeze(1)
    return output
