"""The SNR filter on one step of OpenRLHF samples, and the skipped-step ledger (pure torch).

OpenRLHF hands the controller a step's rollouts as a flat list of one-sample `Experience`s in
which each prompt's `n_samples_per_prompt` samples are consecutive (one vLLM request per prompt
returns them together). A group is such a run; its reward is `sample.rewards`.

Batch-size policy. A kept count must be a multiple of the batch unit (`flags.batch_unit`:
DeepSpeed's accumulation and the equal data-parallel split). When the filter keeps k groups and
k x G is not a multiple, the lowest-scored kept groups are dropped (ties: the later group first)
until it is; the rest keep their original order. If no group is left, the step is skipped like
an empty selection. Dropping rather than padding keeps every trained sample a real, equally
weighted sample; what was dropped is logged (`snr/groups_dropped_for_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import snr
from ragen2 import metric_names as names


class SampleGroupError(ValueError):
    """The samples do not form whole, contiguous groups."""


def group_reward_matrix(samples: list, group_size: int) -> torch.Tensor:
    """[num_groups, G] float64 rewards of contiguous groups; checks the groups are whole and share a label."""
    if group_size < 1:
        raise SampleGroupError(f"group_size must be >= 1, got {group_size}")
    if not samples or len(samples) % group_size:
        raise SampleGroupError(f"{len(samples)} samples is not a whole number of groups of {group_size}")
    rewards = []
    for i, sample in enumerate(samples):
        if sample.rewards is None:
            raise SampleGroupError(f"sample {i} has no reward (the agent returns one for every episode)")
        values = torch.as_tensor(sample.rewards).reshape(-1)
        if values.numel() != 1:
            raise SampleGroupError(f"sample {i} holds {values.numel()} rewards; expected one-sample experiences")
        rewards.append(float(values[0]))
        first = samples[i - i % group_size]
        if list(sample.labels or []) != list(first.labels or []):
            raise SampleGroupError(f"sample {i} has another label than the first sample of its group "
                                   f"({i - i % group_size}): groups must be contiguous runs of {group_size}")
    return torch.tensor(rewards, dtype=torch.float64).view(-1, group_size)


def fit_to_unit(kept: list[int], scores: torch.Tensor, group_size: int, unit: int) -> list[int]:
    """The kept groups trimmed to the largest count whose samples are a multiple of `unit`.

    The lowest-scored groups go first (ties: the later group first); the result is ascending.
    """
    if unit < 1:
        raise ValueError(f"unit must be >= 1, got {unit}")
    count = len(kept)
    while count and (count * group_size) % unit:
        count -= 1
    ranked = sorted(kept, key=lambda g: (-float(scores[g]), g))  # best first, earlier first on ties
    return sorted(ranked[:count])


@dataclass
class StepSelection:
    samples: list  # the kept samples, whole groups, original order
    kept_groups: list[int]
    skip: bool
    reason: str | None  # "filter" (nothing kept) or "batch_unit" (too few to fill one batch unit)
    metrics: dict[str, float]
    selection: snr.Selection


def select_samples(samples: list, group_size: int, filter_config: snr.FilterConfig, unit: int) -> StepSelection:
    rewards = group_reward_matrix(samples, group_size)
    selection = snr.select_groups(rewards, filter_config)
    kept = fit_to_unit(selection.kept.tolist(), selection.scores, group_size, unit)
    metrics = dict(selection.metrics)
    metrics["snr/groups_dropped_for_batch"] = float(selection.kept.numel() - len(kept))
    metrics["snr/groups_trained"] = float(len(kept))
    reason = "filter" if selection.skip else ("batch_unit" if not kept else None)
    kept_samples = [samples[g * group_size + j] for g in kept for j in range(group_size)]
    return StepSelection(kept_samples, kept, reason is not None, reason, metrics, selection)


def _info(sample, key: str):
    value = (getattr(sample, "info", None) or {}).get(key)
    return None if value is None else float(torch.as_tensor(value).reshape(-1)[0])


def rollout_metrics(samples: list, group_size: int, ddof: int = 1) -> dict[str, float]:
    """`rollout/...` over all of a step's samples (before the filter), in the local engine's
    definitions (`RolloutBatch.metrics`) where a sample carries what they need: reward std over
    all samples with ddof=0, in-group std / variance snr.group_spread's (with `ddof`), success from `scores` (the
    agent's), turns and the per-turn format fraction from the agent's `env/...` extra logs.
    `response_length_mean` and `truncated_rate` are OpenRLHF's (`_compute_rollout_stats`)."""
    rewards = group_reward_matrix(samples, group_size)
    flat = rewards.reshape(-1)
    spread = snr.group_spread(rewards, ddof)[0]
    out = {
        names.ROLLOUT_REWARD_MEAN: float(flat.mean()),
        "rollout/reward_std": float(flat.std(unbiased=False)),
        names.ROLLOUT_IN_GROUP_REWARD_STD_MEAN: float(spread.sqrt().mean()),
        "rollout/in_group_reward_variance_mean": float(spread.mean()),
        names.ROLLOUT_NUM_TRAJECTORIES: float(len(samples)),
        "rollout/num_groups": float(rewards.shape[0]),
    }
    scores = [float(torch.as_tensor(s.scores).reshape(-1)[0]) for s in samples
              if getattr(s, "scores", None) is not None]
    if len(scores) == len(samples):
        out[names.ROLLOUT_SUCCESS_RATE] = sum(scores) / len(scores)
    turns = [_info(s, names.ENV_NUM_TURNS) for s in samples]
    if None not in turns:
        out["rollout/turns_mean"] = sum(turns) / len(turns)
        format_ok = [_info(s, names.ENV_FORMAT_OK_FRACTION) for s in samples]
        if None not in format_ok and sum(turns) > 0:  # the local engine's mean is over turns, not episodes
            out[names.ROLLOUT_FORMAT_OK_FRACTION] = sum(f * t for f, t in zip(format_ok, turns)) / sum(turns)
    truncated_context = [_info(s, names.ENV_CONTEXT_TRUNCATED) for s in samples]
    if None not in truncated_context:
        out["rollout/context_truncated"] = float(sum(truncated_context))
    lengths = [getattr(s, "response_length", None) for s in samples]
    if None not in lengths:
        out["rollout/response_length_mean"] = float(torch.cat([torch.as_tensor(v).reshape(-1) for v in lengths])
                                                    .float().mean())
    truncated = [getattr(s, "truncated", None) for s in samples]
    if None not in truncated:
        out["rollout/truncated_rate"] = float(torch.cat([torch.as_tensor(v).reshape(-1) for v in truncated])
                                              .float().mean())
    return out


@dataclass
class SkipLedger:
    """Counts skipped steps; their count (and metrics held back) go out with the next logged step."""

    total: int = 0
    since_last_log: int = 0
    held: dict = field(default_factory=dict)

    def skipped(self, metrics: dict | None = None) -> None:
        self.total += 1
        self.since_last_log += 1
        self.held.update(metrics or {})

    def flush(self) -> dict[str, float]:
        out = dict(self.held)
        out.update({"ragen2/skipped_steps": float(self.since_last_log), "ragen2/skipped_steps_total": float(self.total)})
        self.since_last_log, self.held = 0, {}
        return out
