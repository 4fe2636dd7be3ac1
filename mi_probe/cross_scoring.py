"""Cross-scoring: log-probability of every reasoning under every prompt.

For N prompts x_j (token ids up to and including the opening ``<think>``) and
reasoning segments z_i (with the index of the prompt that produced each), the
policy is teacher-forced on every pair [x_j | z_i]:

* ``L_sum[i, j]`` = sum over z_i's tokens of log p(token | x_j, earlier z_i tokens)
* ``L[i, j]``     = ``L_sum[i, j]`` / len(z_i)  (the token mean; length-fair)

``cross_score`` encodes the prefix all prompts share (the system text) once, runs
each distinct prompt's own tokens on a copy of that cache, keeps the prompt's KV cache, and scores
the reasoning rows under it in micro-batches on a copy of that cache expanded
along the batch. Rows are packed: several rows share one row of the batch, one after another,
each attending to the prompt and to its own earlier tokens only (a mask), with its real
positions, so a short row costs its own tokens and not a long row's padding. Where the model's
attention takes no such mask (eager attention, a sliding window, a model that cannot be split),
rows are right-padded instead, sorted by length first so a micro-batch pads little. Columns
with identical prompt tokens are computed once.
``cross_score_naive`` does one full forward per pair and is the reference.

The model is any HF-style causal LM: ``model(input_ids=..., attention_mask=...,
past_key_values=..., use_cache=...)`` returning an object with ``.logits`` (the
cache argument is passed as ``cache`` when the forward names it so, as
transformers 5 does). One with ``get_decoder()`` and ``get_output_embeddings()``
(transformers' causal LMs) is run as decoder, then head on only the positions
that predict a scored token, in chunks. It
is put in eval mode under ``torch.no_grad`` while scoring and every module's
mode is restored afterwards.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .estimators import prompt_identities
from .kv_cache import cache_argument

__all__ = ["CrossScores", "cross_score", "cross_score_naive", "sample_trajectory_turns"]


@dataclass(frozen=True)
class CrossScores:
    """Result of cross-scoring. Rows are the non-empty reasonings, in input order."""

    L: torch.Tensor  # [rows, N] float32 mean token log-prob
    L_sum: torch.Tensor  # [rows, N] float32 summed log-prob
    owner: torch.Tensor  # [rows] long: column of each row's own prompt
    row_index: torch.Tensor  # [rows] long: position of each row in the input reasoning list
    token_counts: torch.Tensor  # [rows] long: reasoning length in tokens
    column_ids: list[int]  # [N] prompt identity: equal ids = identical prompt tokens
    num_empty_dropped: int  # reasonings with no tokens (cannot be scored)


def _token_list(value: Any, what: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().reshape(-1).tolist()
    elif isinstance(value, np.ndarray):
        value = value.reshape(-1).tolist()
    elif isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{what} must be a sequence of token ids, got {type(value).__name__}")
    ids = list(value)
    for tok in ids:
        if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)) or tok < 0:
            raise ValueError(f"{what} holds {tok!r}; token ids must be ints >= 0")
    return [int(t) for t in ids]


@dataclass(frozen=True)
class _Pairs:
    prompts: list[list[int]]
    reasonings: list[list[int]]  # non-empty only
    owners: list[int]
    row_index: list[int]
    num_empty_dropped: int


def _prepare(prompts: Sequence[Any], reasonings: Sequence[Any], owners: Sequence[Any], model: Any) -> _Pairs:
    prompt_lists = [_token_list(p, f"prompts[{j}]") for j, p in enumerate(prompts)]
    if not prompt_lists:
        raise ValueError("need at least one prompt")
    for j, p in enumerate(prompt_lists):
        if not p:
            raise ValueError(f"prompts[{j}] is empty; a prompt needs at least one token to condition on")
    if len(reasonings) != len(owners):
        raise ValueError(f"got {len(reasonings)} reasonings but {len(owners)} owners")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    kept, kept_owner, kept_index = [], [], []
    for i, (z, o) in enumerate(zip(reasonings, owners)):
        if isinstance(o, bool) or not isinstance(o, (int, np.integer)) or not 0 <= o < len(prompt_lists):
            raise ValueError(f"owners[{i}] = {o!r} is not a column index in [0, {len(prompt_lists)})")
        ids = _token_list(z, f"reasonings[{i}]")
        if ids:  # empty reasoning has no token to score: dropped and counted
            kept.append(ids)
            kept_owner.append(int(o))
            kept_index.append(i)
    if isinstance(vocab, int):
        for what, lists in (("prompt", prompt_lists), ("reasoning", kept)):
            for pos, ids in enumerate(lists):
                if max(ids, default=0) >= vocab:
                    raise ValueError(f"{what} {pos} has token id {max(ids)} >= vocab_size {vocab}")
    return _Pairs(prompt_lists, kept, kept_owner, kept_index, len(reasonings) - len(kept))


def _model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


@contextmanager
def _scoring_mode(model: Any) -> Iterator[None]:
    """Eval mode + no_grad; restores each module's own train/eval flag afterwards."""
    modes = [(m, m.training) for m in model.modules()] if hasattr(model, "modules") else []
    if hasattr(model, "eval"):
        model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, was_training in modes:
            module.training = was_training


def _returned_cache(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = getattr(out, "past_key_values", None)
    if cache is None:
        raise ValueError("the model returned no KV cache with use_cache=True; use cross_score_naive for it")
    return cache


def _expand_cache(cache: Any, batch: int) -> Any:
    """A fresh batch-``batch`` copy of a batch-1 prompt cache (the forward appends to it)."""
    if hasattr(cache, "batch_repeat_interleave"):
        fresh = copy.deepcopy(cache)
        fresh.batch_repeat_interleave(batch)
        return fresh
    if isinstance(cache, (tuple, list)):  # legacy ((key, value), ...) per layer
        return tuple(tuple(t.expand(batch, *t.shape[1:]) for t in layer) for layer in cache)
    raise TypeError(f"cannot expand a past_key_values of type {type(cache).__name__} along the batch")


def _check_vocab(ids: torch.Tensor, vocab: int) -> None:
    if ids.numel() and int(ids.max()) >= vocab:
        raise ValueError(f"token id {int(ids.max())} is outside the model's {vocab} logits")


def _result(pairs: _Pairs, L_sum: torch.Tensor, lengths: torch.Tensor) -> CrossScores:
    return CrossScores(
        L=L_sum / lengths.to(L_sum.dtype).unsqueeze(1),
        L_sum=L_sum,
        owner=torch.tensor(pairs.owners, dtype=torch.long),
        row_index=torch.tensor(pairs.row_index, dtype=torch.long),
        token_counts=lengths,
        column_ids=prompt_identities(pairs.prompts),
        num_empty_dropped=pairs.num_empty_dropped,
    )


def cross_score(
    model: Any,
    prompts: Sequence[Any],
    reasonings: Sequence[Any],
    owners: Sequence[int],
    *,
    micro_batch_size: int = 16,
    pad_token_id: int = 0,
    share_system_prefix: bool = True,
    split_head: bool = True,
    pack: bool = True,
) -> CrossScores:
    """Score every reasoning under every prompt, reusing each prompt's KV cache.

    `share_system_prefix=False` encodes each prompt whole, `split_head=False` runs the model whole
    (its head on every position), `pack=False` pads each row to its micro-batch's longest: the
    same scores, for measuring.
    """
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be an int >= 1, got {micro_batch_size!r}")
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or pad_token_id < 0 or (
            isinstance(vocab_size, int) and pad_token_id >= vocab_size):
        raise ValueError(f"pad_token_id must be a token id in [0, vocab_size), got {pad_token_id!r}")
    pairs = _prepare(prompts, reasonings, owners, model)
    rows, cols = len(pairs.reasonings), len(pairs.prompts)
    lengths = torch.tensor([len(z) for z in pairs.reasonings], dtype=torch.long)
    L_sum = torch.zeros(rows, cols, dtype=torch.float32)
    if rows == 0:
        return _result(pairs, L_sum, lengths)
    device = _model_device(model)
    # Longest first, so each micro-batch holds similar lengths and pads little.
    order = sorted(range(rows), key=lambda i: -len(pairs.reasonings[i]))
    identity = prompt_identities(pairs.prompts)
    columns_of: dict[int, list[int]] = {}
    for col, ident in enumerate(identity):
        columns_of.setdefault(ident, []).append(col)

    scorer = _Scorer(model, split_head)
    packed = pack and scorer.split and _takes_boolean_masks(model)
    if packed:
        batches = _packed_micro_batches(order, [len(z) - 1 for z in pairs.reasonings], micro_batch_size)
    else:  # one row per pack: the padded layout
        batches = [[[i] for i in order[s:s + micro_batch_size]] for s in range(0, rows, micro_batch_size)]
    distinct = [pairs.prompts[cols_same[0]] for cols_same in columns_of.values()]
    shared = _shared_prefix_length(distinct) if share_system_prefix else 0
    with _scoring_mode(model):
        shared_cache = None
        if shared:  # the system text every prompt begins with: encoded once, its cache copied per prompt
            prefix = torch.tensor(distinct[0][:shared], dtype=torch.long, device=device).unsqueeze(0)
            shared_cache = scorer.encode(prefix, torch.ones_like(prefix))[1]
        for cols_same in columns_of.values():
            prompt = torch.tensor(pairs.prompts[cols_same[0]], dtype=torch.long, device=device).unsqueeze(0)
            if shared_cache is None:
                last, prompt_cache = scorer.encode(prompt, torch.ones_like(prompt))
            else:
                last, prompt_cache = scorer.encode(prompt[:, shared:], torch.ones_like(prompt),
                                                   copy.deepcopy(shared_cache))
            # The prompt's last logits predict the first reasoning token of every row.
            first_logp = torch.log_softmax(scorer.logits(last[0, -1:]).float(), dim=-1)[0]
            for packs in batches:
                batch_rows = [i for pack in packs for i in pack]
                if packed:
                    sums = _score_packs(scorer, prompt_cache, first_logp, prompt.shape[1],
                                        [[pairs.reasonings[i] for i in pack] for pack in packs], pad_token_id, device)
                else:
                    sums = _score_micro_batch(scorer, prompt_cache, first_logp, prompt.shape[1],
                                              [pairs.reasonings[i] for i in batch_rows], pad_token_id, device)
                index = torch.tensor(batch_rows, dtype=torch.long)
                for col in cols_same:
                    L_sum[index, col] = sums.cpu()
    return _result(pairs, L_sum, lengths)


def _shared_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens all distinct prompts begin with, leaving each at least one of its own (its last
    logits start the reasoning); 0 for a single prompt, where there is nothing to share."""
    if len(prompts) < 2:
        return 0
    return min(len(os.path.commonprefix(prompts)), min(len(p) for p in prompts) - 1)


# Positions whose logits are computed at once: a [64 x vocabulary] block stays small and warm in
# cache for the softmax, where a micro-batch's whole [rows x length x vocabulary] would not.
HEAD_CHUNK = 64


class _Scorer:
    """The model as the probe uses it. A transformers causal LM is split into its decoder and its
    output head, so the head (a vocabulary-wide projection and softmax) runs only on positions
    that predict a scored token: not on prompt positions, and not on padding. Other models run
    whole, their logits read where needed."""

    def __init__(self, model: Any, split: bool = True):
        get_decoder, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
        body = get_decoder() if split and callable(get_decoder) else None
        head = get_head() if split and callable(get_head) else None
        self.split = body is not None and head is not None and body is not model
        self.model, self.body, self.head = model, body, head
        self.cache_kwarg = cache_argument(body if self.split else model)

    def encode(self, ids: torch.Tensor, attention: torch.Tensor, cache: Any = None,
               positions: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        """(what `logits` takes for each position: hidden states, or logits if not split; the cache)."""
        kwargs = {} if cache is None else {self.cache_kwarg: cache}
        if positions is not None:
            kwargs["position_ids"] = positions
        if self.split:
            out = self.body(input_ids=ids, attention_mask=attention, use_cache=True, **kwargs)
            return out.last_hidden_state, _returned_cache(out)
        out = self.model(input_ids=ids, attention_mask=attention, use_cache=True, **kwargs)
        return out.logits, _returned_cache(out)

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        return self.head(states) if self.split else states

    def log_probs(self, states: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Log-prob of each target from the states ([n, hidden] or [n, vocab]) predicting it: [n]."""
        parts = []
        for chunk, chunk_targets in zip(states.split(HEAD_CHUNK), targets.split(HEAD_CHUNK)):
            logits = self.logits(chunk).float()  # targets were checked against the vocabulary by the caller
            parts.append(torch.log_softmax(logits, dim=-1).gather(-1, chunk_targets.unsqueeze(-1)).squeeze(-1))
        return torch.cat(parts) if parts else states.new_zeros(0, dtype=torch.float32)


def _score_micro_batch(
    scorer: _Scorer,
    prompt_cache: Any,
    first_logp: torch.Tensor,
    prompt_len: int,
    rows: list[list[int]],
    pad_token_id: int,
    device: torch.device,
) -> torch.Tensor:
    """Summed log-prob of each row after the cached prompt: [len(rows)] float32."""
    batch, longest = len(rows), max(len(z) for z in rows)
    targets = torch.full((batch, longest), pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros(batch, longest, dtype=torch.bool, device=device)
    for b, z in enumerate(rows):
        targets[b, : len(z)] = torch.tensor(z, dtype=torch.long, device=device)
        mask[b, : len(z)] = True
    _check_vocab(targets[mask], first_logp.shape[-1])
    token_logp = torch.zeros(batch, longest, dtype=torch.float32, device=device)
    token_logp[:, 0] = first_logp[targets[:, 0]]
    if longest > 1:
        # Feed all but the last token: position t's states predict token t + 1.
        attention = torch.cat([torch.ones(batch, prompt_len, dtype=torch.long, device=device),
                               mask[:, :-1].long()], dim=1)
        states, _ = scorer.encode(targets[:, :-1], attention, _expand_cache(prompt_cache, batch))
        predicts = mask[:, 1:]  # only real tokens are scored; a pad's state is never projected
        token_logp[:, 1:][predicts] = scorer.log_probs(states[predicts], targets[:, 1:][predicts])
    return token_logp.sum(dim=1)  # a pad's entry stays 0


def _takes_boolean_masks(model: Any) -> bool:
    """Whether the model's attention reads an explicit [batch, 1, queries, keys] boolean mask as
    transformers' sdpa does (eager attention adds its masks: a boolean one would be read wrong),
    over full attention (a sliding window would be bypassed by an explicit mask)."""
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    except ImportError:
        return False
    config = getattr(model, "config", None)
    windowed = (getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
                ) or "sliding_attention" in (getattr(config, "layer_types", None) or ())
    implementation = getattr(config, "_attn_implementation", None)
    return not windowed and implementation is not None and ALL_MASK_ATTENTION_FUNCTIONS.get(implementation) is sdpa_mask


def _packed_micro_batches(order: list[int], fed: list[int], micro_batch_size: int) -> list[list[list[int]]]:
    """Rows (`order`, longest first; `fed[i]`: tokens row i feeds) packed first-fit into packs no
    wider than the longest row, `micro_batch_size` packs per micro-batch. A pack is as wide as a
    padded row would be, so each token attends to as many keys as padded (torch's CPU attention
    computes masked pairs too: wider packs cost more attention than the padding they save) and a
    micro-batch holds no more positions than a padded one."""
    width = max(max(fed[i] for i in order), 1)
    packs: list[list[int]] = []
    room: list[int] = []
    for i in order:
        target = next((p for p, left in enumerate(room) if left >= fed[i]), None)
        if target is None:
            packs.append([])
            room.append(width)
            target = len(packs) - 1
        packs[target].append(i)
        room[target] -= fed[i]
    return [packs[s:s + micro_batch_size] for s in range(0, len(packs), micro_batch_size)]


def _score_packs(
    scorer: _Scorer,
    prompt_cache: Any,
    first_logp: torch.Tensor,
    prompt_len: int,
    packs: list[list[list[int]]],
    pad_token_id: int,
    device: torch.device,
) -> torch.Tensor:
    """Summed log-prob of each row after the cached prompt, the rows of a pack sharing one row of
    the batch: [rows, in pack order] float32."""
    rows = [z for pack in packs for z in pack]
    _check_vocab(torch.tensor([t for z in rows for t in z], dtype=torch.long), first_logp.shape[-1])
    sums = first_logp[torch.tensor([z[0] for z in rows], dtype=torch.long, device=device)].clone()
    width = max(sum(len(z) - 1 for z in pack) for pack in packs)
    if width == 0:  # every row is one token: scored from the prompt's last logits alone
        return sums
    ids = torch.full((len(packs), width), pad_token_id, dtype=torch.long)
    targets = torch.full((len(packs), width), pad_token_id, dtype=torch.long)
    offset = torch.zeros(len(packs), width, dtype=torch.long)  # a fed token's place in its own row
    segment = torch.full((len(packs), width), -1, dtype=torch.long)  # its row (in `rows`); -1: pad
    row = 0
    for p, pack in enumerate(packs):
        start = 0
        for z in pack:
            end = start + len(z) - 1  # feed all but the last token: position t predicts token t + 1
            ids[p, start:end] = torch.tensor(z[:-1], dtype=torch.long)
            targets[p, start:end] = torch.tensor(z[1:], dtype=torch.long)
            offset[p, start:end] = torch.arange(end - start)
            segment[p, start:end] = row
            start, row = end, row + 1
    real = segment >= 0
    # A row's token sees the whole prompt and its own row's earlier tokens; a pad sees the prompt
    # alone (a finite state, never projected).
    own = (segment[:, :, None] == segment[:, None, :]) & (offset[:, :, None] >= offset[:, None, :]) & real[:, None, :]
    mask = torch.cat([torch.ones(len(packs), width, prompt_len, dtype=torch.bool), own], dim=2).unsqueeze(1)
    states, _ = scorer.encode(ids.to(device), mask.to(device), _expand_cache(prompt_cache, len(packs)),
                              positions=(prompt_len + offset).to(device))
    real = real.to(device)
    token_logp = scorer.log_probs(states[real], targets.to(device)[real])
    return sums.index_add(0, segment.to(device)[real], token_logp)


def cross_score_naive(model: Any, prompts: Sequence[Any], reasonings: Sequence[Any],
                      owners: Sequence[int]) -> CrossScores:
    """Reference: one full forward per (reasoning, prompt) pair, no cache, no batching."""
    pairs = _prepare(prompts, reasonings, owners, model)
    rows, cols = len(pairs.reasonings), len(pairs.prompts)
    lengths = torch.tensor([len(z) for z in pairs.reasonings], dtype=torch.long)
    L_sum = torch.zeros(rows, cols, dtype=torch.float32)
    device = _model_device(model)
    with _scoring_mode(model):
        for i, z in enumerate(pairs.reasonings):
            for j, x in enumerate(pairs.prompts):
                ids = torch.tensor(x + z, dtype=torch.long, device=device).unsqueeze(0)
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0]
                target = ids[0, len(x):]
                _check_vocab(target, logits.shape[-1])
                # logits at position p predict token p + 1, so z's tokens are predicted from len(x) - 1 on.
                logp = torch.log_softmax(logits[len(x) - 1 : len(x) + len(z) - 1].float(), dim=-1)
                L_sum[i, j] = logp.gather(-1, target.unsqueeze(-1)).sum().cpu()
    return _result(pairs, L_sum, lengths)


def sample_trajectory_turns(
    turn_counts: Sequence[int],
    num_samples: int | None = 64,
    *,
    rng: np.random.Generator | torch.Generator,
    replace: bool = True,
) -> list[tuple[int, int]]:
    """Draw (trajectory m, turn t) pairs, each with probability 1/M * 1/T_m.

    Every trajectory weighs the same whatever its length. M counts trajectories
    with at least one scoreable turn (T_m >= 1); the others cannot be drawn.
    ``min(num_samples, sum T_m)`` pairs are drawn (all of them if num_samples is
    None). With ``replace`` (the default, as RAGEN) the draws are i.i.d. from
    exactly that distribution, so a pair may repeat; without it, successive
    draws without replacement (each with the remaining pairs' renormalised
    weights), which avoids repeats but only approximates the distribution.
    """
    counts = []
    for m, t in enumerate(turn_counts):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"turn_counts[{m}] = {t!r}; turn counts must be ints >= 0")
        counts.append(int(t))
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                    or num_samples < 1):
        raise ValueError(f"num_samples must be an int >= 1 or None, got {num_samples!r}")
    pairs = [(m, t) for m, count in enumerate(counts) for t in range(count)]
    if not pairs:
        return []
    live = sum(1 for c in counts if c > 0)
    weights = np.array([1.0 / (live * counts[m]) for m, _ in pairs], dtype=np.float64)
    draws = len(pairs) if num_samples is None else min(num_samples, len(pairs))
    if isinstance(rng, np.random.Generator):
        picked = rng.choice(len(pairs), size=draws, replace=replace, p=weights / weights.sum()).tolist()
    elif isinstance(rng, torch.Generator):
        picked = torch.multinomial(torch.from_numpy(weights), draws, replacement=replace, generator=rng).tolist()
    else:
        raise TypeError(f"rng must be a numpy Generator or a torch Generator, got {type(rng).__name__}")
    return [pairs[k] for k in picked]
