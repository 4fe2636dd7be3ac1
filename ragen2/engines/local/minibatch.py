"""How the PPO update walks its batch: the plan of mini-batches and their micro-batches, the
metrics the micro-batches log, and the rule that a mini-batch steps every model or none.

Pure bookkeeping around `learner.ppo_update`'s loop; the losses are built in `learner`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from ragen2 import metric_names as names
from ragen2 import shared_prefix as prefix_lib

# Loss terms whose micro-batch values are shares of the mini-batch's loss under loss_scope=mini_batch.
ADDITIVE_METRICS = (names.ACTOR_PG_LOSS, names.ACTOR_ENTROPY, names.ACTOR_KL_LOSS, names.CRITIC_VALUE_LOSS)


@dataclass
class MiniBatch:
    """One optimiser step's rows, cut into micro-batches (index tensors into the update's rows)."""

    micro_batches: list[torch.Tensor]
    totals: dict  # total_tokens / total_sequences of the mini-batch (loss_scope=mini_batch), else {}
    weight: float  # each micro-batch loss's factor: 1, or 1 / micro-batches (loss_scope=micro_batch)


def plan_mini_batches(data, optim, generator: torch.Generator, pack: bool, attention: float,
                      padding_free: bool = False) -> list[MiniBatch]:
    """Every epoch's shuffled mini-batches, in the order the update takes them.

    `pack`: micro-batches cut by shared prefix (a group's rows together: its prompt is encoded
    once; learner.packs_by_prefix says when), `attention` the model's shared_prefix.attention_cost,
    `padding_free` whether the passes run unpadded (a packed micro-batch then holds the rows whose
    packed tokens fit).
    Drawing every epoch's order up front takes the same numbers from `generator` as drawing each
    at its epoch: nothing else in the update draws from it."""
    rows = data.input_ids.shape[0]
    lengths = data.attention_mask.sum(dim=1)
    planned = []
    for _ in range(optim.ppo_epochs):
        order = torch.randperm(rows, generator=generator)
        for start in range(0, rows, optim.mini_batch_size):
            mini = order[start:start + optim.mini_batch_size]
            if pack:
                micro = prefix_lib.micro_batches(data, mini, optim.micro_batch_size, attention=attention,
                                                 padding_free=prefix_lib.PaddingFree() if padding_free else None)
            else:
                # Longest rows first, so each micro-batch holds rows of similar length: a micro-batch
                # is trimmed to its longest row, and the gradient sum does not depend on the grouping.
                mini = mini[torch.argsort(lengths[mini], descending=True, stable=True)]
                micro = list(mini.split(optim.micro_batch_size))
            planned.append(_mini_batch(micro, data.response_mask[mini], optim.loss_scope))
    return planned


def _mini_batch(micro: list[torch.Tensor], mask: torch.Tensor, loss_scope: str) -> MiniBatch:
    if loss_scope == "micro_batch":  # veRL: each micro-batch's own mean, then their mean
        return MiniBatch(micro, {}, 1.0 / len(micro))
    totals = dict(total_tokens=max(1, int(mask.sum().item())),
                  total_sequences=max(1, int((mask.sum(dim=1) > 0).sum().item())))
    return MiniBatch(micro, totals, 1.0)


@dataclass
class UpdateMetrics:
    """Means over the update of what its micro-batches and mini-batches logged.

    With loss_scope=mini_batch a micro-batch's loss term is its share of the mini-batch's loss
    (sums over fixed totals), so the logged loss is the mini-batch's: the shares summed, then
    averaged over mini-batches. Averaging the shares would divide the loss by the number of
    micro-batches, and the logged value would change with micro_batch_size (or with packing)."""

    sums_shares: bool  # loss_scope == "mini_batch"
    totals: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + float(value)
        self.counts[name] = self.counts.get(name, 0) + 1

    def add_micro(self, logged: dict[str, float]) -> None:
        for name, value in logged.items():
            if self.sums_shares and name in ADDITIVE_METRICS:
                self.shares[name] = self.shares.get(name, 0.0) + float(value)
            else:
                self.add(name, value)

    def end_mini_batch(self) -> None:
        for name in list(self.shares):
            self.add(name, self.shares.pop(name))

    def means(self) -> dict[str, float]:
        return {name: self.totals[name] / self.counts[name] for name in self.totals}


def clip_grad(module: nn.Module, max_norm: float) -> float:
    """Clip the module's gradient to `max_norm`; returns its pre-clip norm (non-finite: do not step)."""
    return float(torch.nn.utils.clip_grad_norm_([p for p in module.parameters() if p.requires_grad], max_norm))


@dataclass
class Stepped:
    """A model the update steps: its optimiser, and the metric its pre-clip gradient norm goes to."""

    optimizer: torch.optim.Optimizer
    module: nn.Module
    norm_metric: str


def step_or_skip(stepping: list[Stepped], losses_finite: bool, grad_clip: float, metrics: UpdateMetrics) -> bool:
    """One loss, one step: every model steps, or (a loss or a gradient not finite) none does,
    since stepping the other would update half of the loss. Gradients are cleared either way;
    True when they stepped. A non-finite norm is logged as NaN."""
    finite = losses_finite
    if losses_finite:
        norms = [clip_grad(model.module, grad_clip) for model in stepping]
        for model, norm in zip(stepping, norms):
            metrics.add(model.norm_metric, norm if math.isfinite(norm) else float("nan"))
        finite = all(math.isfinite(norm) for norm in norms)
    for model in stepping:
        if finite:
            model.optimizer.step()
        model.optimizer.zero_grad(set_to_none=True)
    return finite
