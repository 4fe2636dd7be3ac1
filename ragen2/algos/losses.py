"""Policy, entropy, KL and value losses over masked token tensors (pure torch: no model, no trainer).

Same conventions as ``ragen2.algos.advantages``: tensors are [batch, seq_len], ``response_mask`` is
True on trained assistant tokens. Every input is passed through ``torch.where(mask, x, 0)`` before
any arithmetic, so whatever sits at masked positions (NaN, inf) reaches neither the loss nor the
gradient (``0 * NaN`` would, and so would the backward of a ``where`` taken after the NaN was
used). Non-finite values at assistant positions propagate: they are a bug upstream, not noise.

Metrics are returned as detached 0-dim tensors so micro-batch loops need no device sync; call
``.item()`` when logging.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ragen2.algos.advantages import as_bool_mask, check_token_tensor, masked_mean

__all__ = [
    "AGG_MODES",
    "KL_ESTIMATORS",
    "aggregate_token_loss",
    "ppo_clip_policy_loss",
    "kl_estimate",
    "kl_loss",
    "kl_reward_penalty",
    "clipped_value_loss",
    "actor_loss_terms",
    "actor_loss_coefficients",
    "combine_actor_loss",
]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

# canonical name -> accepted aliases (veRL's names included)
KL_ESTIMATORS = {"k1": ("k1", "kl"), "k2": ("k2", "mse"), "k3": ("k3", "low_var_kl")}


def _masked_inputs(mask: torch.Tensor, **tensors: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Check each tensor against the mask and return it upcast to >= fp32 with masked positions 0."""
    out = {}
    for name, x in tensors.items():
        check_token_tensor(x, name, mask.shape)
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        out[name] = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return out


# ----------------------------------------------------------------------------- aggregation


def aggregate_token_loss(
    loss_mat: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str = "token-mean",
    norm_length: Optional[int] = None,
    total_tokens: Optional[int] = None,
    total_sequences: Optional[int] = None,
) -> torch.Tensor:
    """Reduce a [batch, seq_len] per-token loss to a scalar over the masked tokens.

    - ``token-mean``: sum over all tokens / number of tokens (long answers weigh more).
    - ``seq-mean-token-mean``: mean within each sequence, then mean over sequences.
    - ``seq-mean-token-sum``: sum within each sequence, mean over sequences (Dr.GRPO: no length
      normalisation, so no bias towards long wrong answers).
    - ``seq-mean-token-sum-norm``: ``seq-mean-token-sum / norm_length`` (default seq_len), a
      constant rescaling that keeps the loss scale near token-mean. veRL's mode of that name
      divides the plain sum by the constant without the mean over sequences.

    Sequences without tokens are left out of the sequence means; an empty mask gives 0.
    ``total_tokens`` / ``total_sequences`` replace the counts of this call by those of the whole
    mini-batch, so that micro-batch losses summed under gradient accumulation equal the loss of
    the mini-batch in one call.
    """
    mask = as_bool_mask(response_mask)
    check_token_tensor(loss_mat, "loss_mat", mask.shape)
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")
    for name, value in (("norm_length", norm_length), ("total_tokens", total_tokens),
                        ("total_sequences", total_sequences)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    losses = torch.where(mask, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    if mode == "token-mean":
        count = mask.sum().clamp(min=1) if total_tokens is None else total_tokens
        return losses.sum() / count
    tokens_per_seq = mask.sum(dim=-1)
    n_seq = (tokens_per_seq > 0).sum().clamp(min=1) if total_sequences is None else total_sequences
    seq_losses = losses.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        seq_losses = seq_losses / tokens_per_seq.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        seq_losses = seq_losses / (mask.shape[-1] if norm_length is None else norm_length)
    return seq_losses.sum() / n_seq


# ----------------------------------------------------------------------------- PPO policy loss


def ppo_clip_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: Optional[float] = None,
    agg_mode: str = "token-mean",
    norm_length: Optional[int] = None,
    total_tokens: Optional[int] = None,
    total_sequences: Optional[int] = None,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric clipping and optional dual clip; ``(loss, metrics)``.

    Per token, with r = exp(log_prob - old_log_prob) (log-ratio clamped to [-20, 20] so exp
    cannot overflow): ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``. Clip-higher (DAPO,
    StarPO-S: 0.2 / 0.28) widens only the upper bound so low-probability tokens with A > 0 can
    still grow. ``dual_clip = c > 1`` (arXiv 1912.09729) caps the loss of A < 0 tokens at
    ``-A c``, so a huge ratio on a bad token cannot blow the loss up.

    Metrics (fractions of assistant tokens): ``clipfrac_high`` (A > 0, r > 1 + clip_high: no
    gradient), ``clipfrac_low`` (A < 0, r < 1 - clip_low), ``clipfrac_dual`` (A < 0, r > c);
    ``approx_kl`` = mean(old - new log-prob) (veRL's ppo_kl, k1) and ``approx_kl_k3`` (k3, >= 0)
    for KL(old || new); ``ratio_mean`` / ``ratio_min`` / ``ratio_max``.
    """
    if not 0.0 < clip_low < 1.0:
        raise ValueError(f"clip_low must be in (0, 1), got {clip_low}")
    if not clip_high > 0.0:
        raise ValueError(f"clip_high must be > 0, got {clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (a lower bound on the ratio cap), got {dual_clip}")
    mask = as_bool_mask(response_mask)
    x = _masked_inputs(mask, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages)
    adv = x["advantages"].detach()
    log_ratio = (x["log_prob"] - x["old_log_prob"].detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)
    loss = aggregate_token_loss(per_token, mask, agg_mode, norm_length, total_tokens, total_sequences)

    with torch.no_grad():
        n = mask.sum()
        inf = torch.tensor(float("inf"), dtype=ratio.dtype, device=ratio.device)

        def frac(hit: torch.Tensor) -> torch.Tensor:
            return (hit & mask).sum().to(ratio.dtype) / n.clamp(min=1)

        metrics = {
            "clipfrac_high": frac((adv > 0) & (ratio > 1.0 + clip_high)),
            "clipfrac_low": frac((adv < 0) & (ratio < 1.0 - clip_low)),
            "clipfrac_dual": frac((adv < 0) & (ratio > dual_clip)) if dual_clip is not None
            else torch.zeros((), dtype=ratio.dtype, device=ratio.device),
            "approx_kl": masked_mean(-log_ratio, mask),
            "approx_kl_k3": masked_mean(ratio - 1.0 - log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
            # min/max of an empty selection would be +-inf: report 1 (no change) instead
            "ratio_min": torch.where(n > 0, torch.where(mask, ratio, inf).min(), torch.ones_like(inf)),
            "ratio_max": torch.where(n > 0, torch.where(mask, ratio, -inf).max(), torch.ones_like(inf)),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


# ----------------------------------------------------------------------------- KL to the reference


def _canonical_kl(estimator: str) -> str:
    for name, aliases in KL_ESTIMATORS.items():
        if estimator in aliases:
            return name
    known = sorted(a for aliases in KL_ESTIMATORS.values() for a in aliases)
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {known}")


def kl_estimate(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman, "Approximating
    KL divergence", 2020). With log r = log pi - log pi_ref:

    - ``k1`` / ``kl``: log r (unbiased, high variance, can be negative).
    - ``k2`` / ``mse``: (log r)^2 / 2 (biased, low variance; its gradient is the KL's gradient).
    - ``k3`` / ``low_var_kl``: exp(-log r) - 1 + log r (unbiased, >= 0, low variance); as in
      veRL, -log r is clamped to [-20, 20] and the result to [-10, 10] against overflow.

    Elementwise and unmasked: ``kl_loss`` and ``kl_reward_penalty`` apply the mask.
    """
    kind = _canonical_kl(estimator)
    log_r = log_prob - ref_log_prob
    if kind == "k1":
        return log_r
    if kind == "k2":
        return 0.5 * log_r.square()
    neg = (-log_r).clamp(-20.0, 20.0)
    return (neg.exp() - 1.0 - neg).clamp(-10.0, 10.0)


def kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    estimator: str = "k3",
    agg_mode: str = "token-mean",
    norm_length: Optional[int] = None,
    total_tokens: Optional[int] = None,
    total_sequences: Optional[int] = None,
) -> torch.Tensor:
    """Aggregated KL(pi || pi_ref) as a loss term (gradient flows through ``log_prob`` only)."""
    mask = as_bool_mask(response_mask)
    x = _masked_inputs(mask, log_prob=log_prob, ref_log_prob=ref_log_prob)
    per_token = kl_estimate(x["log_prob"], x["ref_log_prob"].detach(), estimator)
    return aggregate_token_loss(per_token, mask, agg_mode, norm_length, total_tokens, total_sequences)


@torch.no_grad()
def kl_reward_penalty(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    estimator: str = "k1",
) -> torch.Tensor:
    """Token-level ``beta * KL`` [batch, seq_len] (0 off the mask, detached) to subtract from the
    token rewards: ``token_rewards - kl_reward_penalty(...)``. k1 is the classic RLHF choice."""
    if not beta >= 0.0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    mask = as_bool_mask(response_mask)
    x = _masked_inputs(mask, log_prob=log_prob, ref_log_prob=ref_log_prob)
    kl = kl_estimate(x["log_prob"], x["ref_log_prob"], estimator)
    return torch.where(mask, beta * kl, torch.zeros((), dtype=kl.dtype, device=kl.device))


# ----------------------------------------------------------------------------- value loss


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range: Optional[float] = 0.5,
    agg_mode: str = "token-mean",
    norm_length: Optional[int] = None,
    total_tokens: Optional[int] = None,
    total_sequences: Optional[int] = None,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """PPO2 value loss ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with
    ``V_clip = V_old + clip(V - V_old, -clip_range, clip_range)``; ``(loss, metrics)``.

    The max makes the clip pessimistic: a prediction may move past ``V_old +- clip_range`` only
    where that does not lower the loss. ``clip_range=None`` gives the plain 0.5 * squared error.
    The default 0.5 is veRL's ``cliprange_value`` (RAGEN-2's critic). ``V_clip`` is taken as
    ``clamp(V, V_old - c, V_old + c)`` as veRL does, so inside the range it *is* V (``V_old + (V -
    V_old)`` can be 1 ulp off V). Metrics: ``vf_clipfrac``, the tokens where the clip binds
    (``|V - V_old| > c``, compared directly) and its term is the larger, i.e. veRL's "clipped loss
    used" without counting rounding; ``vf_mean`` (mean prediction).
    """
    if clip_range is not None and not clip_range > 0.0:
        raise ValueError(f"clip_range must be > 0 or None, got {clip_range}")
    mask = as_bool_mask(response_mask)
    x = _masked_inputs(mask, values=values, old_values=old_values, returns=returns)
    v, v_old, target = x["values"], x["old_values"].detach(), x["returns"].detach()
    unclipped = (v - target).square()
    if clip_range is None:
        per_token, clipped = 0.5 * unclipped, unclipped
    else:
        clipped = (torch.clamp(v, v_old - clip_range, v_old + clip_range) - target).square()
        per_token = 0.5 * torch.maximum(unclipped, clipped)
    loss = aggregate_token_loss(per_token, mask, agg_mode, norm_length, total_tokens, total_sequences)
    with torch.no_grad():
        binds = torch.zeros_like(mask) if clip_range is None else (v - v_old).abs() > clip_range
        metrics = {
            "vf_clipfrac": masked_mean((binds & (clipped > unclipped)).to(v.dtype), mask),
            "vf_mean": masked_mean(v, mask),
        }
    return loss, {k: t.detach() for k, t in metrics.items()}


# ----------------------------------------------------------------------------- the actor loss


def sft_loss(log_probs: torch.Tensor, response_mask: torch.Tensor, total_tokens: Optional[int] = None) -> torch.Tensor:
    """The supervised warm start's loss: the negative log-likelihood of the masked tokens, token-mean
    (divided by `total_tokens` when the batch is cut into micro-batches). Its gradient equals the
    clipped policy loss's at ratio 1 with advantage 1 on every token: SFT is the policy loss on
    demonstrations with a constant advantage, so both train exactly the rollout's response tokens."""
    return aggregate_token_loss(-log_probs, response_mask, "token-mean", total_tokens=total_tokens)


def actor_loss_terms(
    log_probs: torch.Tensor,
    entropy: Optional[torch.Tensor],
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_log_probs: Optional[torch.Tensor] = None,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: Optional[float],
    agg_mode: str,
    kl_estimator: str = "k3",
    total_tokens: Optional[int] = None,
    total_sequences: Optional[int] = None,
) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """The actor loss term by term, unscaled: ({"task"[, "entropy"][, "kl"]}, policy-loss metrics).

    One definition for the update (which combines the terms, `combine_actor_loss`) and for the
    gradient decomposition (which takes each term's gradient apart). "entropy" is present only when
    `entropy` is given (the supervised warm start has none), "kl" only when `ref_log_probs` is (the
    KL-as-loss mode).
    """
    totals = dict(total_tokens=total_tokens, total_sequences=total_sequences)
    task, metrics = ppo_clip_policy_loss(log_probs, old_log_probs, advantages, response_mask, clip_low=clip_low,
                                         clip_high=clip_high, dual_clip=dual_clip, agg_mode=agg_mode, **totals)
    terms = {"task": task}
    if entropy is not None:
        terms["entropy"] = aggregate_token_loss(entropy, response_mask, agg_mode, **totals)
    if ref_log_probs is not None:
        terms["kl"] = kl_loss(log_probs, ref_log_probs, response_mask, kl_estimator, agg_mode, **totals)
    return terms, metrics


def actor_loss_coefficients(entropy_coef: float, kl_coef: float, task_scale: float = 1.0) -> Dict[str, float]:
    """How the terms enter the loss: task_scale * task - entropy_coef * entropy + kl_coef * kl.

    `task_scale` is RAGEN-2's filter loss scaling: it multiplies the advantages, so only the
    policy term (the clipped surrogate is linear in A); entropy and KL keep their weight."""
    return {"task": task_scale, "entropy": -entropy_coef, "kl": kl_coef}


def combine_actor_loss(terms: Dict[str, torch.Tensor], coefficients: Dict[str, float]) -> torch.Tensor:
    """The scalar the update backpropagates: sum of coefficient x term, in the terms' order."""
    loss = None
    for name, term in terms.items():
        weighted = coefficients[name] * term
        loss = weighted if loss is None else loss + weighted
    return loss
