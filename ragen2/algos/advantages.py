"""Advantage estimators for multi-turn token sequences (pure torch: no model, no trainer).

Conventions, shared with ``ragen2.algos.losses``:

- Token tensors are ``[batch, seq_len]``. ``response_mask`` is True (or 1) on the assistant tokens
  that are trained and False (or 0) on prompt, environment and padding tokens. A multi-turn row has
  several assistant spans (maximal runs of True); each span is one turn.
- Rewards are token-level ``[batch, seq_len]``; a turn's reward sits on the last token of its span
  (``rewards_at_turn_ends`` builds such a tensor from per-turn or trajectory rewards).
- Masked positions are never read: they may hold anything, NaN included, and it cannot reach the
  result (every read goes through ``torch.where``, never ``0 * x``). Non-finite values at assistant
  positions are not hidden: they propagate, so the trainer sees them.
- Estimators run under ``no_grad`` and return detached tensors: advantages and returns are targets.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

__all__ = [
    "as_bool_mask",
    "check_token_tensor",
    "masked_mean",
    "masked_whiten",
    "turn_index",
    "turn_end_mask",
    "rewards_at_turn_ends",
    "gae_advantages",
    "bi_level_gae_advantages",
    "group_normalized_scores",
    "grpo_advantages",
    "dr_grpo_advantages",
]


# ----------------------------------------------------------------------------- checks and masked stats


def as_bool_mask(mask: torch.Tensor, shape: Optional[Sequence[int]] = None, name: str = "response_mask") -> torch.Tensor:
    """Return ``mask`` as a bool tensor, after checking it is 2-D (and of ``shape`` if given).

    Accepts bool, or an integer / floating dtype holding only 0 and 1 (attention masks are often
    long, veRL masks are float). Anything else raises, since a mask of 0.5s would silently weight.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() != 2:
        raise ValueError(f"{name} must be 2-D [batch, seq_len], got shape {tuple(mask.shape)}")
    if shape is not None and tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.dtype.is_complex:
        raise TypeError(f"{name} must be bool or hold 0/1 values, got dtype {mask.dtype}")
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        raise ValueError(f"{name} must hold only 0 and 1 (or be bool); found value {mask[bad][0].item()!r}")
    return mask != 0


def check_token_tensor(x: torch.Tensor, name: str, shape: Sequence[int]) -> None:
    """Raise unless ``x`` is a floating tensor of ``shape``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)} (the response_mask shape)")


def _check_unit_interval(name: str, value: float) -> None:
    if not (0.0 <= float(value) <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def _float_dtype(x: torch.Tensor) -> torch.dtype:
    # bf16/fp16 recursions lose too much precision over thousands of tokens: compute in >= fp32.
    return torch.promote_types(x.dtype, torch.float32)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` (bool) is True; 0 where nothing is selected."""
    total = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    count = mask.sum() if dim is None else mask.sum(dim)
    total = total.sum() if dim is None else total.sum(dim)
    return total / count.clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``x`` to zero mean and unit variance over the masked positions (0 elsewhere).

    Variance is the unbiased (n-1) estimate as in veRL's ``masked_whiten``; with one token the
    n-1 is clamped to 1 so the result is 0 instead of NaN. ``shift_mean=False`` only rescales.
    """
    mean = masked_mean(x, mask)
    centered = torch.where(mask, x - mean, torch.zeros((), dtype=x.dtype, device=x.device))
    n = mask.sum()
    var = centered.pow(2).sum() / (n - 1).clamp(min=1)
    out = centered * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, torch.zeros((), dtype=x.dtype, device=x.device))


# ----------------------------------------------------------------------------- turn structure


def turn_index(response_mask: torch.Tensor) -> torch.Tensor:
    """[batch, seq_len] long: k on the tokens of the k-th assistant span (0-based), -1 elsewhere."""
    mask = as_bool_mask(response_mask)
    starts = mask.clone()
    starts[:, 1:] &= ~mask[:, :-1]
    idx = starts.long().cumsum(dim=-1) - 1
    return torch.where(mask, idx, torch.full_like(idx, -1))


def turn_end_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """[batch, seq_len] bool: True on the last token of each assistant span."""
    mask = as_bool_mask(response_mask)
    ends = mask.clone()
    ends[:, :-1] &= ~mask[:, 1:]
    return ends


def rewards_at_turn_ends(response_mask: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """Token-level rewards [batch, seq_len] from trajectory or per-turn rewards.

    ``rewards`` of shape [batch] puts each trajectory reward on the row's last assistant token.
    ``rewards`` of shape [batch, K] puts reward k on the last token of the k-th assistant span;
    K must cover every row's number of spans, and entries past a row's spans must be 0. A reward
    with no token to sit on (nonzero reward, no span) raises rather than being dropped silently.
    """
    mask = as_bool_mask(response_mask)
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dtype == torch.bool or rewards.dtype.is_complex:
        raise TypeError(f"rewards must be real numbers, got dtype {rewards.dtype}")
    if not rewards.dtype.is_floating_point:
        rewards = rewards.to(torch.get_default_dtype())
    batch = mask.shape[0]
    if rewards.dim() not in (1, 2) or rewards.shape[0] != batch:
        raise ValueError(f"rewards must have shape [{batch}] or [{batch}, num_turns], got {tuple(rewards.shape)}")
    ends = turn_end_mask(mask)
    idx = turn_index(mask)
    n_turns = ends.sum(dim=-1)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    if rewards.dim() == 1:
        lost = (n_turns == 0) & (rewards != 0)
        if bool(lost.any()):
            row = int(lost.nonzero()[0, 0])
            raise ValueError(f"row {row} has reward {rewards[row].item()} but no assistant token to carry it")
        last_end = ends & (idx == (n_turns - 1).unsqueeze(-1))
        return torch.where(last_end, rewards.unsqueeze(-1), zero)
    k = rewards.shape[1]
    too_many = n_turns > k
    if bool(too_many.any()):
        row = int(too_many.nonzero()[0, 0])
        raise ValueError(f"row {row} has {int(n_turns[row])} assistant spans but rewards has only {k} columns")
    beyond = torch.arange(k, device=mask.device).unsqueeze(0) >= n_turns.unsqueeze(-1)
    lost = beyond & (rewards != 0)
    if bool(lost.any()):
        row, col = (int(v) for v in lost.nonzero()[0])
        raise ValueError(
            f"row {row} has {int(n_turns[row])} assistant spans but a nonzero reward for turn {col} "
            f"({rewards[row, col].item()}); pad missing turns with 0"
        )
    if k == 0:
        return torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    per_token = rewards.gather(1, idx.clamp(min=0))
    return torch.where(ends, per_token, zero)


# ----------------------------------------------------------------------------- GAE


def _prepare(token_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor):
    mask = as_bool_mask(response_mask)
    check_token_tensor(token_rewards, "token_rewards", mask.shape)
    check_token_tensor(values, "values", mask.shape)
    dtype = torch.promote_types(_float_dtype(token_rewards), _float_dtype(values))
    zero = torch.zeros((), dtype=dtype, device=values.device)
    rewards = torch.where(mask, token_rewards.detach().to(dtype), zero)
    vals = torch.where(mask, values.detach().to(dtype), zero)
    return mask, rewards, vals


@torch.no_grad()
def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda) over the assistant tokens only; returns ``(advantages, returns)``.

    Non-assistant tokens are skipped, not treated as episode ends: the TD error of the last token
    of turn k bootstraps from the value of the first token of turn k+1, and discounting counts
    assistant tokens only (the multi-turn semantics of veRL's ``compute_gae_advantage_return``,
    which RAGEN uses). Rewards and values on masked tokens are ignored.

    ``returns = raw advantages + values`` (the critic target, never whitened). ``whiten=True``
    (the veRL/RAGEN behaviour) normalises advantages over all assistant tokens of the batch.
    Both outputs are 0 on masked positions.
    """
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lam", lam)
    mask, rewards, vals = _prepare(token_rewards, values, response_mask)
    batch, seq_len = mask.shape
    advantages = torch.zeros_like(vals)
    next_value = torch.zeros(batch, dtype=vals.dtype, device=vals.device)
    last_gae = torch.zeros_like(next_value)
    for t in reversed(range(seq_len)):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        gae_t = delta + gamma * lam * last_gae
        # A masked token leaves the recursion state untouched: the chain jumps over env tokens.
        last_gae = torch.where(m, gae_t, last_gae)
        next_value = torch.where(m, vals[:, t], next_value)
        advantages[:, t] = torch.where(m, gae_t, torch.zeros_like(gae_t))
    returns = torch.where(mask, advantages + vals, torch.zeros_like(vals))
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


@torch.no_grad()
def bi_level_gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    turn_gamma: float = 1.0,
    turn_lam: float = 1.0,
    token_gamma: float = 1.0,
    token_lam: float = 1.0,
    whiten: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Two-level GAE: across turns first, then across tokens inside each turn.

    Semantics follow RAGEN's ``compute_bi_level_gae_advantage_return``:

    1. Turn level. Turn k's value is the critic value at its last token, V_k; its reward r_k is
       the sum of the rewards on its tokens (normally just the last one). Backwards over turns:
       ``delta_k = r_k + turn_gamma * V_{k+1} - V_k`` (V after the last turn is 0) and
       ``A_k = delta_k + turn_gamma * turn_lam * A_{k+1}``; the turn return is ``G_k = A_k + V_k``.
    2. Token level, inside each turn with no bootstrapping across turns: the last token gets
       ``G_k - V_end`` (= A_k); earlier tokens ``delta_t = token_gamma * V_{t+1} - V_t`` and
       ``A_t = delta_t + token_gamma * token_lam * A_{t+1}``.

    Differences from RAGEN, on purpose: turns are the assistant spans of ``response_mask`` (RAGEN
    takes the positions of nonzero rewards, so a turn with reward 0 vanished from the turn-level
    recursion), a reward is counted once (RAGEN also added non-end rewards at token level),
    ``turn_lam`` and ``token_lam`` are separate (RAGEN shares one ``lam``), and whitening is
    optional. Returns ``(advantages, returns)`` with ``returns = raw advantages + values``.
    """
    for name, value in (("turn_gamma", turn_gamma), ("turn_lam", turn_lam),
                        ("token_gamma", token_gamma), ("token_lam", token_lam)):
        _check_unit_interval(name, value)
    mask, rewards, vals = _prepare(token_rewards, values, response_mask)
    batch, seq_len = mask.shape
    zero = torch.zeros((), dtype=vals.dtype, device=vals.device)
    ends = turn_end_mask(mask)
    idx = turn_index(mask).clamp(min=0)
    n_turns = ends.sum(dim=-1)
    num_k = int(n_turns.max()) if batch > 0 else 0
    if num_k == 0:
        empty = torch.zeros_like(vals)
        return empty, empty.clone()

    # Per-turn reward and value, [batch, num_k]; masked tokens add exact zeros to turn 0.
    turn_reward = torch.zeros(batch, num_k, dtype=vals.dtype, device=vals.device).scatter_add_(1, idx, rewards)
    end_value = torch.zeros_like(turn_reward).scatter_add_(1, idx, torch.where(ends, vals, zero))
    turn_valid = torch.arange(num_k, device=mask.device).unsqueeze(0) < n_turns.unsqueeze(-1)
    turn_adv = torch.zeros_like(turn_reward)
    next_value = torch.zeros(batch, dtype=vals.dtype, device=vals.device)
    last = torch.zeros_like(next_value)
    for k in reversed(range(num_k)):
        valid = turn_valid[:, k]
        a = turn_reward[:, k] + turn_gamma * next_value - end_value[:, k] + turn_gamma * turn_lam * last
        last = torch.where(valid, a, last)
        next_value = torch.where(valid, end_value[:, k], next_value)
        turn_adv[:, k] = torch.where(valid, a, zero)
    turn_return = turn_adv + end_value

    target = turn_return.gather(1, idx)  # G_k on every token of turn k
    advantages = torch.zeros_like(vals)
    next_value = torch.zeros(batch, dtype=vals.dtype, device=vals.device)
    last = torch.zeros_like(next_value)
    for t in reversed(range(seq_len)):
        m = mask[:, t]
        inner = token_gamma * next_value - vals[:, t] + token_gamma * token_lam * last
        a = torch.where(ends[:, t], target[:, t] - vals[:, t], inner)
        last = torch.where(m, a, last)
        next_value = torch.where(m, vals[:, t], next_value)
        advantages[:, t] = torch.where(m, a, zero)
    returns = torch.where(mask, advantages + vals, zero)
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


# ----------------------------------------------------------------------------- GRPO / Dr.GRPO


def _as_group_ids(group_ids: Union[torch.Tensor, Sequence[int]], batch: int, device: torch.device) -> torch.Tensor:
    ids = torch.as_tensor(group_ids, device=device)
    if ids.dtype == torch.bool or ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise TypeError(f"group_ids must be integers, got dtype {ids.dtype}")
    if tuple(ids.shape) != (batch,):
        raise ValueError(f"group_ids must have shape [{batch}], got {tuple(ids.shape)}")
    return ids


@torch.no_grad()
def group_normalized_scores(
    scores: torch.Tensor,
    group_ids: Union[torch.Tensor, Sequence[int]],
    eps: float = 1e-6,
    scale_by_std: bool = True,
    unbiased_std: bool = True,
) -> torch.Tensor:
    """Per-sample ``(R - mean_group) / (std_group + eps)`` for scores [batch]; [batch] out.

    ``unbiased_std=True`` (n-1, torch.std's default) is the default because RAGEN and veRL use
    it, so GRPO numbers reproduce theirs; the population std (n) makes every advantage larger by
    sqrt(G / (G-1)). ``scale_by_std=False`` is Dr.GRPO (mean-centering only). A group of size 1
    gets 0 (veRL gives such a sample its raw score instead, which is no baseline at all); a group
    whose scores are all equal gets 0. A non-finite score makes its whole group NaN (not hidden).
    """
    if not isinstance(scores, torch.Tensor) or scores.dim() != 1:
        raise ValueError(f"scores must be a 1-D tensor [batch], got {getattr(scores, 'shape', type(scores))}")
    if not scores.dtype.is_floating_point:
        raise TypeError(f"scores must have a floating dtype, got {scores.dtype}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    ids = _as_group_ids(group_ids, scores.shape[0], scores.device)
    if scores.numel() == 0:
        return scores.clone()
    _, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    s = scores.double()  # group sums in fp64: exact for the small integer-ish rewards of our envs
    num_groups = counts.numel()
    mean = torch.zeros(num_groups, dtype=s.dtype, device=s.device).index_add_(0, inverse, s) / counts
    dev = s - mean[inverse]  # exactly 0 for a singleton with a finite score
    if scale_by_std:
        # Its own std, not snr.group_spread's: per sample over group ids of any size, in fp64, with no zero-spread
        # tolerance, as RAGEN/veRL compute it, so GRPO advantages reproduce theirs bit for bit.
        sq = torch.zeros_like(mean).index_add_(0, inverse, dev * dev)
        denom = (counts - 1 if unbiased_std else counts).clamp(min=1)
        std = (sq / denom).sqrt()
        dev = dev / (std[inverse] + eps)
    return dev.to(scores.dtype)


@torch.no_grad()
def grpo_advantages(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: Union[torch.Tensor, Sequence[int]],
    eps: float = 1e-6,
    scale_by_std: bool = True,
    unbiased_std: bool = True,
) -> torch.Tensor:
    """GRPO outcome advantage, broadcast to every assistant token (0 elsewhere); [batch, seq_len].

    R is the sum of a row's rewards on its assistant tokens (rewards on masked tokens are
    ignored, like everything there). See ``group_normalized_scores`` for the normalisation.
    GRPO has no critic, so there is no separate "returns" output.
    """
    mask = as_bool_mask(response_mask)
    check_token_tensor(token_rewards, "token_rewards", mask.shape)
    dtype = _float_dtype(token_rewards)
    zero = torch.zeros((), dtype=dtype, device=token_rewards.device)
    scores = torch.where(mask, token_rewards.detach().to(dtype), zero).sum(dim=-1)
    adv = group_normalized_scores(scores, group_ids, eps=eps, scale_by_std=scale_by_std, unbiased_std=unbiased_std)
    return torch.where(mask, adv.unsqueeze(-1), zero)


def dr_grpo_advantages(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: Union[torch.Tensor, Sequence[int]],
) -> torch.Tensor:
    """Dr.GRPO advantage: ``R - mean_group`` without the std division (arXiv 2503.20783).

    Pair it with the ``seq-mean-token-sum`` (or ``-norm``) loss aggregation, which removes the
    length bias the paper also points at.
    """
    return grpo_advantages(token_rewards, response_mask, group_ids, scale_by_std=False)
