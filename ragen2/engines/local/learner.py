"""The local engine: policy, critic and reference in one process, on CPU or one GPU.

It only moves tensors: the advantage and loss maths live in `ragen2/algos`, selection in
`snr/`, probing in `mi_probe/`. Everything here is token-aligned: position t of a
[B, T] tensor describes token t, predicted from the hidden state at t − 1.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ragen2 import metric_names as names
from ragen2 import models as model_lib
from ragen2 import precision
from ragen2.algos import losses
from ragen2.algos.estimators import compute_advantages
from ragen2.config import Config
from ragen2.engines.local import minibatch
from ragen2 import shared_prefix as prefix_lib
from ragen2.scoring import TokenRows, padded_width, policy_log_probs  # the engine's scoring pass, below it for reports too


@dataclass
class Models:
    policy: nn.Module
    tokenizer: object
    critic: nn.Module | None
    reference: nn.Module | None
    device: torch.device


def build_models(cfg: Config, report=None) -> Models:
    """Load what the config asks for: a critic only with GAE, a reference only with a KL term.

    `model.dtype=auto` is resolved here for the device (ragen2.precision) and written back into
    the config, so config.yaml records what ran; `report(choice)` is told the choice and why."""
    device = model_lib.pick_device(cfg.model.device)
    choice = precision.resolve(cfg.model.dtype, device)
    cfg.model.dtype = choice.dtype
    if report is not None:
        report(choice)
    policy, tokenizer = model_lib.build_policy(cfg.model, device)
    source = model_lib.resolve_model_source(cfg.model.name)
    critic = (model_lib.load_value_model(source, dtype=cfg.model.dtype, device=device,
                                         lora=model_lib.lora_of(cfg.model))
              if cfg.algo.uses_critic else None)
    reference = (model_lib.load_reference(source, dtype=cfg.model.dtype, device=device)
                 if cfg.algo.kl_coef > 0 else None)
    if cfg.model.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    return Models(policy, tokenizer, critic, reference, device)


def critic_values(critic: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  shared_prefix: bool = False, padding_free: bool = False) -> torch.Tensor:
    """V(state before token t) at position t; [B, T]. `shared_prefix` and `padding_free` as in
    policy_log_probs (for a models.ValueModel; other critics run plain)."""
    batch, seq_len = input_ids.shape
    width = padded_width(attention_mask)
    values = torch.zeros(batch, seq_len, dtype=torch.float32, device=input_ids.device)
    if width < 2:
        return values
    ids, attn = input_ids[:, :width], attention_mask[:, :width]
    with precision.autocast(critic):  # the value head itself runs in fp32 (models.ValueModel)
        if (shared_prefix or padding_free) and hasattr(critic, "values_from_hidden"):
            packed = prefix_lib.PaddingFree() if padding_free else None
            per_position = critic.values_from_hidden(prefix_lib.hidden_states(critic.body, ids, attn, shared_prefix,
                                                                              packed))
        else:
            per_position = critic(ids, attn)
    per_position = per_position.float()
    values = values.clone()
    values[:, 1:width] = per_position[:, :-1]
    return values


@torch.no_grad()
def batched(fn, micro_batch_size: int, *tensors: torch.Tensor, pack: bool = False,
            attention: float = 0.0, padding_free: bool = False) -> torch.Tensor:
    """Apply `fn` to row slices and concatenate; padding is trimmed per slice.

    `pack` (tensors: input ids, attention mask[, response mask]): slices are packed by shared
    prefix (shared_prefix.micro_batches: a group's rows together, as many as cost no more than
    `micro_batch_size` plain rows; `attention`: the model's shared_prefix.attention_cost;
    `padding_free`: `fn` runs each slice unpadded, so a slice holds the rows whose packed tokens
    fit); the output is in the input's row order."""
    rows = tensors[0].shape[0]
    if not pack:
        slices = [torch.arange(i, min(i + micro_batch_size, rows)) for i in range(0, rows, micro_batch_size)]
    else:
        slices = prefix_lib.micro_batches(prefix_lib.TokenRows(*tensors[:3]), torch.arange(rows, device=tensors[0].device),
                                          micro_batch_size, no_grad=True, attention=attention,
                                          padding_free=prefix_lib.PaddingFree() if padding_free else None)
    outputs = [fn(*(t[index] for t in tensors)) for index in slices]
    order = torch.cat(slices).to(tensors[0].device)
    result = torch.cat(outputs, dim=0)
    return result if not pack else result[torch.argsort(order)]


@dataclass
class Optimizers:
    actor: torch.optim.Optimizer
    critic: torch.optim.Optimizer | None


def _can_fuse(params: list[torch.Tensor]) -> bool | None:
    """Fused AdamW (one kernel over all tensors) where torch has it: CPU and CUDA floating point.

    The default on CPU loops over the parameters with several small ops each; fused makes one
    pass over memory, which matters when the optimiser step touches all 135M parameters.
    """
    fusable = bool(params) and all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)
    return True if fusable else None


def build_optimizers(models: Models, cfg: Config) -> Optimizers:
    def adam(module: nn.Module, lr: float) -> torch.optim.Optimizer:
        params = [p for p in module.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay,
                                 fused=_can_fuse(params))

    actor = adam(models.policy, cfg.optim.actor_lr)
    critic = adam(models.critic, cfg.optim.critic_lr) if models.critic is not None else None
    return Optimizers(actor, critic)


@dataclass
class UpdateInputs:
    """Everything the PPO epochs read, row-aligned; computed once before the update."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    old_log_probs: torch.Tensor | None  # None: on-policy, see reuses_current_log_probs
    advantages: torch.Tensor
    ref_log_probs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None


def update_inputs(models: Models, batch, cfg: Config, old_log_probs: bool = True, timer=None) -> UpdateInputs:
    """The one place a step's update inputs are built from a rollout batch (on the models'
    device): old log-probs (unless `old_log_probs=False`: on-policy), reference log-probs (with
    a reference model), values (with a critic), then advantages and returns.

    `timer(phase)` is a context that times each phase (old_log_probs, ref_log_probs, values,
    advantages). The no-grad passes encode each group's prompt once when optim.shared_prefix."""
    phase = timer or (lambda name: contextlib.nullcontext())
    micro, shared = cfg.optim.micro_batch_size, cfg.optim.shared_prefix
    batch = batch.to(models.device)
    unpadded = runs_padding_free(cfg.optim, models.critic) if models.critic is not None else False
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.response_mask
    attention = prefix_lib.attention_cost(models.policy)  # the critic and reference share its shape

    old = ref = values = None
    if old_log_probs:
        with phase(names.PHASE_OLD_LOG_PROBS):
            old = log_probs_pass(models.policy, batch, cfg, attention)
    if models.reference is not None:
        with phase(names.PHASE_REF_LOG_PROBS):
            ref = log_probs_pass(models.reference, batch, cfg, attention)
    if models.critic is not None:
        with phase(names.PHASE_VALUES), precision.autocast(models.critic):  # one context: see log_probs_pass
            values = batched(lambda i, a: critic_values(models.critic, i, a, shared_prefix=shared, padding_free=unpadded),
                             micro, ids, attn, pack=shared, attention=attention, padding_free=unpadded)
    with phase(names.PHASE_ADVANTAGES):
        advantages, returns = compute_advantages(cfg.algo, batch, values, old, ref)
    return UpdateInputs(ids, attn, mask, old, advantages, ref, values, returns)


def log_probs_pass(model: nn.Module, tokens: TokenRows, cfg: Config, attention: float = 0.0) -> torch.Tensor:
    """Log-probs of a batch's sampled tokens in micro-batches (the old and reference passes), at
    rollout.temperature, optim.micro_batch_size rows (packed by prefix with optim.shared_prefix).

    One autocast context spans the micro-batches: autocast keeps each weight's low-precision copy
    until its outermost context exits, so the weights are cast once per pass, not once per
    micro-batch (a cast of every weight is a pass over all of them in memory). The copies are the
    same, so are the log-probs."""
    temperature, shared = cfg.rollout.temperature, cfg.optim.shared_prefix
    unpadded = runs_padding_free(cfg.optim, model)
    packed = prefix_lib.PaddingFree() if unpadded else None
    with precision.autocast(model):
        return batched(lambda i, a, m: policy_log_probs(model, TokenRows(i, a, m), temperature, shared_prefix=shared,
                                                        padding_free=packed)[0],
                       cfg.optim.micro_batch_size, tokens.input_ids, tokens.attention_mask, tokens.response_mask,
                       pack=shared, attention=attention, padding_free=unpadded)


def _decoder_body(model: nn.Module) -> nn.Module:
    return model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "body", model)


def runs_padding_free(optim, model: nn.Module) -> bool:
    """optim.padding_free, where the model's attention can run it (else its passes pad)."""
    return optim.padding_free and prefix_lib.padding_free_supported(_decoder_body(model))


def padding_free_refusal(setting: str, asked: bool, model: nn.Module, passes: str) -> str | None:
    """One line when `setting` (optim.padding_free, sft.padding_free) is asked for but the model's
    attention cannot run it, so the setting is not dropped unsaid; `passes` names what pads then."""
    body = _decoder_body(model)
    if not asked or prefix_lib.padding_free_supported(body):
        return None
    implementation = getattr(getattr(body, "config", None), "_attn_implementation", None)
    return (f"note: {setting} needs ragen2's attention (transformers' sdpa); this model runs "
            f"{implementation!r}, so {passes} run the padded passes (the same numbers, slower)")


def reuses_current_log_probs(optim, rows: int) -> bool:
    """True when the update makes one optimiser step over the whole batch (one epoch, one mini-batch).

    Then every log-prob is taken before any step, by the weights that sampled the rollout: the
    old log-probs equal the current ones, the ratio is exactly 1, and the forward that would
    compute them beforehand can be skipped (pass old_log_probs=None), as TRL does.
    """
    return optim.ppo_epochs == 1 and optim.mini_batch_size >= rows


def packs_by_prefix(optim, rows: int) -> bool:
    """Whether the update cuts micro-batches by shared prefix instead of by length.

    Only when one optimiser step covers the batch with one loss (one epoch, one mini-batch,
    loss_scope=mini_batch): then every micro-batch sees the weights that sampled the batch, so
    no number depends on which rows share a micro-batch (ratios are exactly 1). With several
    mini-batches the per-micro-batch means (clip fractions, ratio_max) would change with the
    packing, so rows keep today's micro-batches and share prefixes only within them."""
    return optim.shared_prefix and optim.loss_scope == "mini_batch" and reuses_current_log_probs(optim, rows)


@dataclass(frozen=True)
class ActorLossSettings:
    """How `actor_loss` builds the loss: the forward's settings and losses.actor_loss_terms's."""

    temperature: float  # the sampling temperature the log-probs are taken at
    shared_prefix: bool  # optim.shared_prefix: rows sharing a prompt encode it once
    padding_free: bool  # the rows run as one unpadded sequence (optim.padding_free; sft.padding_free)
    with_entropy: bool  # an "entropy" term (and its forward cost)
    kl_as_loss: bool  # a "kl" term, when the batch has reference log-probs
    terms: dict  # clip_low, clip_high, dual_clip, agg_mode, kl_estimator

    @classmethod
    def update(cls, cfg: Config) -> ActorLossSettings:
        """The PPO update's (and the gradient decomposition's): the algo section as configured."""
        algo = cfg.algo
        return cls(cfg.rollout.temperature, cfg.optim.shared_prefix, cfg.optim.padding_free, True, algo.kl_mode == "loss",
                   dict(clip_low=algo.clip_low, clip_high=algo.clip_high, dual_clip=algo.dual_clip,
                        agg_mode=algo.loss_agg, kl_estimator=algo.kl_estimator))

    @classmethod
    def supervised(cls, cfg: Config) -> ActorLossSettings:
        """The supervised warm start's: the model's own distribution (temperature 1), token-mean,
        no entropy or KL term. With advantage 1 and ratio 1 (`ActorBatch.demonstrations`) the task
        term's gradient is the token-mean NLL's (losses.sft_loss), bit for bit: SFT is the policy
        loss on demonstrations with a constant advantage."""
        algo = cfg.algo
        return cls(1.0, cfg.optim.shared_prefix, cfg.sft.padding_free, False, False,
                   dict(clip_low=algo.clip_low, clip_high=algo.clip_high, dual_clip=None, agg_mode="token-mean",
                        kl_estimator=algo.kl_estimator))


@dataclass
class ActorBatch:
    """The rows of one micro-batch of the actor loss, row-aligned."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    old_log_probs: torch.Tensor | None = None  # None: the current ones, detached (ratio exactly 1)
    ref_log_probs: torch.Tensor | None = None
    prefix: prefix_lib.EncodedPrefix | None = None  # the rows' first tokens, encoded once for the step (SFT)

    @classmethod
    def of(cls, data: UpdateInputs, rows: torch.Tensor) -> ActorBatch:
        """Rows `rows` of the update's inputs."""
        def pick(tensor):
            return tensor[rows] if tensor is not None else None
        return cls(data.input_ids[rows], data.attention_mask[rows], data.response_mask[rows], data.advantages[rows],
                   pick(data.old_log_probs), pick(data.ref_log_probs))

    @classmethod
    def demonstrations(cls, batch, rows: torch.Tensor, prefix: prefix_lib.EncodedPrefix | None = None) -> ActorBatch:
        """Rows `rows` of a batch of demonstrations: advantage 1 on every token, on-policy."""
        mask = batch.response_mask[rows]
        return cls(batch.input_ids[rows], batch.attention_mask[rows], mask, torch.ones(mask.shape, device=mask.device),
                   prefix=prefix)


@dataclass
class ActorLoss:
    terms: dict[str, torch.Tensor]  # unscaled {"task"[, "entropy"][, "kl"]}: losses.actor_loss_terms
    metrics: dict[str, torch.Tensor]  # the policy loss's clip fractions, approx KL, ratios
    log_probs: torch.Tensor  # of the sampled tokens, with gradient


def actor_loss(policy: nn.Module, batch: ActorBatch, settings: ActorLossSettings, totals: dict) -> ActorLoss:
    """The one builder of the actor's loss terms: the PPO update, the gradient decomposition and
    the supervised warm start all take their loss from here. `totals`: the mini-batch's
    total_tokens / total_sequences (losses.aggregate_token_loss), or {} for the micro-batch's own."""
    packed = prefix_lib.PaddingFree.after(batch.prefix) if settings.padding_free else None
    log_probs, entropy = policy_log_probs(policy, batch, settings.temperature, with_entropy=settings.with_entropy,
                                          shared_prefix=settings.shared_prefix, padding_free=packed)
    old = batch.old_log_probs if batch.old_log_probs is not None else log_probs.detach()
    ref = batch.ref_log_probs if settings.kl_as_loss else None
    terms, metrics = losses.actor_loss_terms(log_probs, entropy, old, batch.advantages, batch.response_mask, ref,
                                             **settings.terms, **totals)
    return ActorLoss(terms, metrics, log_probs)


POLICY_METRICS = ("clipfrac_high", "clipfrac_low", "approx_kl", "ratio_max")  # logged as actor/<key>


def _actor_micro_loss(models: Models, data: UpdateInputs, rows: torch.Tensor, mini: minibatch.MiniBatch,
                      cfg: Config, options: UpdateOptions):
    """(weighted loss, logged) of the actor on micro-batch `rows`; None when the loss is not finite."""
    built = actor_loss(models.policy, ActorBatch.of(data, rows), ActorLossSettings.update(cfg), mini.totals)
    coefficients = losses.actor_loss_coefficients(cfg.algo.entropy_coef, cfg.algo.kl_coef,
                                                  task_scale=options.loss_scale)
    loss = losses.combine_actor_loss(built.terms, coefficients)
    if not torch.isfinite(loss):
        return None
    terms = built.terms
    logged = {names.ACTOR_KL_LOSS: terms["kl"]} if "kl" in terms else {}
    logged |= {names.ACTOR_PG_LOSS: terms["task"], names.ACTOR_ENTROPY: terms["entropy"]}
    logged |= {f"actor/{key}": built.metrics[key] for key in POLICY_METRICS}
    return mini.weight * loss, logged


def _critic_micro_loss(models: Models, data: UpdateInputs, rows: torch.Tensor, mini: minibatch.MiniBatch,
                       cfg: Config, options: UpdateOptions):
    """(weighted loss, logged) of the critic on micro-batch `rows`; None when the loss is not finite."""
    values = critic_values(models.critic, data.input_ids[rows], data.attention_mask[rows],
                           shared_prefix=cfg.optim.shared_prefix, padding_free=cfg.optim.padding_free)
    loss, value_metrics = losses.clipped_value_loss(values, data.old_values[rows], data.returns[rows],
                                                    data.response_mask[rows], clip_range=cfg.algo.value_clip,
                                                    agg_mode="token-mean",
                                                    total_tokens=mini.totals.get("total_tokens"))
    if not torch.isfinite(loss):
        return None
    logged = {names.CRITIC_VALUE_LOSS: loss, names.CRITIC_CLIPFRAC: value_metrics["vf_clipfrac"]}
    return mini.weight * cfg.algo.value_coef * loss, logged


@dataclass
class UpdateOptions:
    loss_scale: float = 1.0  # filter_loss_scaling: multiplies the policy term (snr.kept_fraction_scale)
    train_actor: bool = True  # False: the critic warm-up trains the critic alone
    on_micro_batch: Callable[[int, int], None] | None = None  # (done, total) after each micro-batch


def ppo_update(models: Models, optimizers: Optimizers, data: UpdateInputs, cfg: Config,
               generator: torch.Generator, options: UpdateOptions | None = None) -> dict[str, float]:
    """PPO epochs over shuffled mini-batches with gradient accumulation; returns mean metrics.

    A mini-batch whose loss or gradient (actor's or critic's) is not finite is skipped (no
    optimiser step for either model) and counted once, and the run goes on."""
    options = options or UpdateOptions()
    _check_update(models, data, cfg, options)
    plan = minibatch.plan_mini_batches(data, cfg.optim, generator, packs_by_prefix(cfg.optim, data.input_ids.shape[0]),
                                       prefix_lib.attention_cost(models.policy),
                                       runs_padding_free(cfg.optim, models.policy))
    with_critic = models.critic is not None
    stepping = ([minibatch.Stepped(optimizers.actor, models.policy, names.ACTOR_GRAD_NORM)]
                if options.train_actor else [])
    stepping += [minibatch.Stepped(optimizers.critic, models.critic, names.CRITIC_GRAD_NORM)] if with_critic else []
    for model in [models.policy, models.critic]:
        if model is not None:
            model.train()
    metrics = minibatch.UpdateMetrics(sums_shares=cfg.optim.loss_scope == "mini_batch")
    skipped, done, total = 0, 0, sum(len(mini.micro_batches) for mini in plan)
    for mini in plan:
        finite = True
        for rows in mini.micro_batches:
            # actor then critic: each backward frees its graph before the next forward
            finite = ((not options.train_actor or _backward(_actor_micro_loss(models, data, rows, mini, cfg, options),
                                                            metrics))
                      and (not with_critic or _backward(_critic_micro_loss(models, data, rows, mini, cfg, options),
                                                        metrics)))
            if not finite:
                break
            done += 1
            if options.on_micro_batch is not None:
                options.on_micro_batch(done, total)
        metrics.end_mini_batch()
        skipped += not minibatch.step_or_skip(stepping, finite, cfg.optim.grad_clip, metrics)
    return metrics.means() | {names.ACTOR_NONFINITE_SKIPPED_MINIBATCHES: float(skipped)}


def _backward(built, metrics: minibatch.UpdateMetrics) -> bool:
    """Backpropagate one micro-batch loss and log what it logs; False (nothing done) when it was not finite."""
    if built is None:
        return False
    loss, logged = built
    loss.backward()
    metrics.add_micro({name: value.item() for name, value in logged.items()})
    return True


def _check_update(models: Models, data: UpdateInputs, cfg: Config, options: UpdateOptions) -> None:
    rows = data.input_ids.shape[0]
    if not options.train_actor and models.critic is None:
        raise ValueError("train_actor=False (critic warm-up) needs a critic")
    if options.train_actor and data.old_log_probs is None and not reuses_current_log_probs(cfg.optim, rows):
        raise ValueError("old_log_probs=None needs one optimiser step over the whole batch (ppo_epochs=1, "
                         f"mini_batch_size >= {rows} rows); got ppo_epochs={cfg.optim.ppo_epochs}, "
                         f"mini_batch_size={cfg.optim.mini_batch_size}")
