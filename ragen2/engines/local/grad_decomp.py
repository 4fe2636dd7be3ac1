"""The local engine's gradient decomposition (`probe.grad_every`, off by default).

On the filtered batch, after advantages and before the update (on the update's own
`learner.UpdateInputs`: the same old log-probs, values and advantages), the prompt groups are
bucketed by in-group reward std (`probe.grad_bucket_mode`: RAGEN-2's `quantile`, with
`probe.grad_buckets` buckets and the remainder in the last; `quantile_even`; or RAGEN-2's
`fixed_rv` std bins [0,1) ... [5,inf)), and for each bucket the gradients of the actor
loss's terms are taken separately, with no optimiser step: the clipped policy loss (task),
the entropy term and the KL term. The terms come from the update's own builder,
`learner.actor_loss` (same log-probs, clip ranges, aggregation and token/sequence totals), so

    g_task - entropy_coef * g_entropy + kl_coef * g_kl  =  gradient of the update's loss

(`filter_loss_scaling` would multiply g_task alone: it scales the advantages). Each norm is logged unscaled
(`entropy_norm`) and times its coefficient (`entropy_scaled_norm`, RAGEN-2's
`grad_norm/<bucket>/entropy`): the scaled one is what sits beside `task_norm` in the update.
The `all` bucket is the weighted sum of the buckets: with the loss aggregated over fixed
totals it is linear in the rows, so the whole batch needs no second pass. With
`probe.grad_prefilter` the unfiltered batch gets the same pass (`grad_prefilter/...`, RAGEN-2's
`grad_norm_prefilter/...`), with its own `learner.update_inputs`.

How RAGEN-2 (veRL's actor) differs: it takes one gradient per PPO mini-batch
(`ppo_mini_batch_size` rows), each the mean over micro-batches of the micro-batch's own
token-mean loss, and logs the mean over mini-batches of those gradients' norms. Here a
bucket's gradient is that of the bucket's whole loss (token-mean over all its tokens), and
its norm is one norm. Mean of norms >= norm of the mean, so RAGEN-2's figures run higher
when a bucket spans several mini-batches; with micro-batches of 1 (its default) its
"token-mean" weighs sequences equally, like our seq-mean-token-mean.
The maths is in `mi_probe.gradients`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

import snr
from mi_probe import gradients as grad_lib
from ragen2.algos import losses
from ragen2.config import Config
from ragen2.engines.local import learner
from ragen2 import shared_prefix
from ragen2.metric_names import GRAD

TOKEN_WEIGHTED = ("token-mean",)  # other aggregations average over sequences


def due(cfg: Config, step: int) -> bool:
    return cfg.probe.grad_every > 0 and step % cfg.probe.grad_every == 0


def loss_coefficients(cfg: Config, names) -> dict[str, float]:
    """How the terms present enter the total loss (losses.actor_loss_coefficients)."""
    coefs = losses.actor_loss_coefficients(cfg.algo.entropy_coef, cfg.algo.kl_coef)
    return {name: coefs[name] for name in names}


def group_reward_std(batch, ddof: int = 1) -> dict[int, float]:
    """In-group std of the trajectory rewards (snr.group_spread's), per group id (a one-member group: 0)."""
    rewards: dict[int, list[float]] = {}
    for t in batch.trajectories:
        rewards.setdefault(t.group, []).append(t.reward)
    return dict(zip(rewards, snr.group_spread(list(rewards.values()), ddof)[1].tolist()))


def bucket_gradients(policy, cfg: Config, data: learner.UpdateInputs, rows: list[int]):
    """Per-term gradients of one bucket's loss, accumulated over micro-batches.

    Each term's gradient is added into the bucket's sum as soon as it is taken, so one fresh
    gradient is alive at a time. A micro-batch whose advantages are all exactly 0.0 (a group
    of identical rewards, mean-centred) has an exactly zero task gradient: no backward for it.

    Returns (components, loss values, sampled tokens, sequences with tokens).
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    index = torch.tensor(rows, dtype=torch.long, device=data.input_ids.device)
    if cfg.optim.shared_prefix:  # a group's rows in one micro-batch, its prompt encoded once (sums are unchanged)
        index = index[shared_prefix.packing_order(data.input_ids[index], data.attention_mask[index])]
    mask = data.response_mask[index]
    tokens, sequences = int(mask.sum().item()), int((mask.sum(dim=1) > 0).sum().item())
    components: dict[str, list[torch.Tensor]] = {}
    values: dict[str, float] = {}
    micro, settings = cfg.optim.micro_batch_size, learner.ActorLossSettings.update(cfg)
    totals = dict(total_tokens=max(1, tokens), total_sequences=max(1, sequences))
    for start in range(0, len(rows), micro):
        idx = index[start:start + micro]
        terms = learner.actor_loss(policy, learner.ActorBatch.of(data, idx), settings, totals).terms
        for name, value in terms.items():  # fixed totals: micro-batch losses sum to the bucket's
            values[name] = values.get(name, 0.0) + float(value.detach())
        if not bool(data.advantages[idx].any()):
            terms["task"] = terms["task"].detach()  # taken as zeros, without a pass
        grad_lib.accumulate_gradient_components(components, terms, params)
    return components, values, tokens, sequences


@dataclass
class BucketGradients:
    name: str
    components: dict[str, list[torch.Tensor]]  # term -> one gradient tensor per trainable parameter
    loss_values: dict[str, float]
    coefficients: dict[str, float]
    num_tokens: int
    num_sequences: int
    reward_stds: list[float]  # of the bucket's groups


def _bucket_metrics(bucket: BucketGradients) -> dict[str, float]:
    out = grad_lib.component_metrics(bucket.components, num_tokens=bucket.num_tokens,
                                     num_samples=bucket.num_sequences, coefficients=bucket.coefficients)
    total = grad_lib.combine(bucket.components, bucket.coefficients)
    out["total_norm"] = grad_lib.norm(total)
    for name, value in bucket.loss_values.items():
        out[f"loss_{name}"] = value
    out["loss_total"] = sum(bucket.coefficients[name] * value for name, value in bucket.loss_values.items())
    stds = bucket.reward_stds
    mean_std = sum(stds) / len(stds) if stds else 0.0
    out.update(reward_std_mean=mean_std, reward_std_min=min(stds, default=0.0), reward_std_max=max(stds, default=0.0),
               num_groups=float(len(stds)), num_samples=float(bucket.num_sequences),
               num_tokens=float(bucket.num_tokens))
    if mean_std > 0:  # C in ||g_task|| <= C * sqrt(Var(R|x)), as this bucket shows it
        out["task_norm_per_reward_std"] = out["task_norm"] / mean_std
    return out


def split_buckets(cfg: Config, spreads: list[float]) -> dict[str, list[int]]:
    """Bucket names -> positions in `spreads`, by `probe.grad_bucket_mode`."""
    mode = cfg.probe.grad_bucket_mode
    if mode == "fixed_rv":
        return grad_lib.fixed_rv_buckets(spreads)
    return grad_lib.quantile_buckets(spreads, cfg.probe.grad_buckets,
                                     remainder="last" if mode == "quantile" else "spread")


@dataclass(frozen=True)
class Analysis:
    """What a decomposition computes beyond the buckets' own terms."""

    # the `all` bucket (the buckets' weighted sum: one more set of gradients held throughout);
    # a per-bucket figure that never reads it saves that memory
    whole: bool = True


def iter_bucket_gradients(policy, cfg: Config, batch, data: learner.UpdateInputs, analysis: Analysis = Analysis()):
    """Yield each reward-std bucket's `BucketGradients`, lowest spread first, then `all`.

    One bucket's gradients are alive at a time, besides the running `all` sum.
    """
    stds = group_reward_std(batch, cfg.filter.ddof)
    groups = sorted(stds)
    buckets = split_buckets(cfg, [stds[g] for g in groups])
    group_of_row = batch.group_ids.tolist()
    total_tokens = int(data.response_mask.sum().item())
    total_sequences = int((data.response_mask.sum(dim=1) > 0).sum().item())
    token_weighted = cfg.algo.loss_agg in TOKEN_WEIGHTED
    whole: dict[str, list[torch.Tensor]] = {}
    whole_values: dict[str, float] = {}
    coefs: dict[str, float] = {}
    for name, members in buckets.items():
        member_groups = {groups[i] for i in members}
        rows = [r for r, g in enumerate(group_of_row) if g in member_groups]
        components, values, tokens, sequences = bucket_gradients(policy, cfg, data, rows)
        coefs = loss_coefficients(cfg, components)
        yield BucketGradients(name, components, values, coefs, tokens, sequences, [stds[g] for g in member_groups])
        if not analysis.whole:
            continue
        if len(buckets) == 1:
            whole, whole_values = components, values
            break
        weight = tokens / max(1, total_tokens) if token_weighted else sequences / max(1, total_sequences)
        grad_lib.accumulate(whole, components, weight)
        for key, value in values.items():
            whole_values[key] = whole_values.get(key, 0.0) + weight * value
        del components
    if not analysis.whole:
        return
    yield BucketGradients(grad_lib.ALL_BUCKET, whole, whole_values, coefs, total_tokens, total_sequences,
                          [stds[g] for g in groups])


def decompose(policy, cfg: Config, batch, data: learner.UpdateInputs, prefix: str = GRAD,
              analysis: Analysis = Analysis()) -> dict[str, float]:
    """`<prefix>/<bucket>/<key>` metrics for every bucket and `all`; no parameter changes.
    `analysis`: whether `all` is wanted."""
    started = time.perf_counter()
    if int(data.response_mask.sum().item()) == 0:
        return {f"{prefix}/skipped_no_tokens": 1.0, f"{prefix}/time_s": time.perf_counter() - started}
    policy.train()  # the mode the update's gradient is taken in
    metrics: dict[str, float] = {}
    buckets = 0
    for bucket in iter_bucket_gradients(policy, cfg, batch, data, analysis):
        values = _bucket_metrics(bucket)
        metrics.update({f"{prefix}/{bucket.name}/{key}": value for key, value in values.items()})
        buckets += bucket.name != grad_lib.ALL_BUCKET
    metrics[f"{prefix}/num_buckets"] = float(buckets)
    metrics[f"{prefix}/time_s"] = time.perf_counter() - started
    return metrics


def maybe_decompose(models: learner.Models, cfg: Config, step: int, batch, data: learner.UpdateInputs,
                    prefix: str = GRAD) -> dict[str, float]:
    """The trainer's hook: `decompose` on the steps `probe.grad_every` names, else nothing.

    `data` is the step's `learner.update_inputs` of `batch`: the update's own (filtered batch),
    or, for `probe.grad_prefilter` (prefix `grad_prefilter`), those of the unfiltered batch."""
    if not due(cfg, step):
        return {}
    return decompose(models.policy, cfg, batch, data, prefix=prefix)
