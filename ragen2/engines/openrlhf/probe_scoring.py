"""The MI probe on OpenRLHF samples, scored through the actor's log-prob forward (pure torch).

The local engine's probe (`ragen2.instruments.probe.Probe`) picks (prompt, reasoning) pairs from a
RolloutBatch and cross-scores them with the policy in-process. Here the policy lives in
OpenRLHF's DeepSpeed workers, whose `forward(sequences, action_mask, attention_mask)` returns
the log-prob of every action token. So:

1. `probe_batch` lays a step's samples out as the RolloutBatch fields the probe reads
   (right-padded ids, the sampled-token mask and turn of each sampled token, group ids, reasoning
   spans per turn);
2. `Probe.pairs` picks the pairs, exactly as in the local engine (both modes, same RNG);
3. `cross_score_with_forward` builds every [prompt_j | reasoning_i] sequence, marks the
   reasoning tokens as actions, and calls the forward in micro-batches of pairs of similar
   length; L_sum[i, j] is the sum of the returned log-probs and L[i, j] their mean;
4. `mi_probe.mi_metrics_both` and the probe's EMA give the same `probe/...` metrics.

The forward is the actor's own, under DeepSpeed's bf16 (the engine trains only in bf16: flags.DTYPES):
the policy's compute dtype, which is `probe.dtype`'s default and RAGEN-2's scoring; each row records
it (`probe/dtype`). `probe.dtype=float32` is refused at launch (flags.unsupported): fp32 scoring
would need an fp32 copy of the actor that OpenRLHF does not keep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import mi_probe
from ragen2 import metric_names as names
from ragen2.algos.advantages import turn_index
from ragen2.rollout.chat import ChatFormat, reasoning_span

# what the actor's forward computes in: --ds.param_dtype bf16, the only dtype the engine launches with
SCORING_DTYPE = "bfloat16"
# forward(sequences, action_masks, attention_masks) -> one [B, T-1] log-prob tensor per micro-batch
Forward = Callable[[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]], list[torch.Tensor]]


@dataclass
class ProbeBatch:
    """The RolloutBatch fields `ragen2.instruments.probe.Probe.pairs` reads."""

    input_ids: torch.Tensor  # [B, T] right-padded
    response_mask: torch.Tensor  # [B, T] bool: sampled tokens
    group_ids: torch.Tensor  # [B]
    traj_index: torch.Tensor  # [B]
    reasoning_spans: list[tuple[int, int, int, int]]  # (row, turn, start, end)
    turn_index: torch.Tensor  # [B, T] long: the turn of a sampled token, -1 elsewhere (reply segments)


def _spans(mask: list[bool]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, on in enumerate(mask + [False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            spans.append((start, i))
            start = None
    return spans


def probe_batch(samples: list, group_size: int, tokenizer, prefill: str, pad_id: int) -> ProbeBatch:
    """One row per sample. OpenRLHF's action_mask[t] marks token t+1 as sampled; left padding
    (attention_mask 0) is dropped so that every row starts with its prompt."""
    chat = ChatFormat(tokenizer)
    rows, masks, spans = [], [], []
    for row, sample in enumerate(samples):
        ids = sample.sequences.reshape(-1).tolist()
        attention = sample.attention_mask.reshape(-1).bool().tolist()
        sampled = [False] + [bool(v) for v in sample.action_mask.reshape(-1).tolist()]
        keep = [i for i, on in enumerate(attention) if on]
        ids, sampled = [ids[i] for i in keep], [sampled[i] for i in keep]
        for turn, (start, end) in enumerate(_spans(sampled)):
            found = reasoning_span(chat, ids[start:end], prefill)
            if found is not None:
                spans.append((row, turn, start + found[0], start + found[1]))
        rows.append(ids)
        masks.append(sampled)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (ids, sampled) in enumerate(zip(rows, masks)):
        input_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        response_mask[i, :len(ids)] = torch.tensor(sampled, dtype=torch.bool)
    n = len(rows)
    # a turn is one contiguous sampled span, numbered as _spans numbers them above
    return ProbeBatch(input_ids, response_mask, torch.arange(n) // group_size, torch.arange(n), spans,
                      turn_index(response_mask))


def pair_tensors(prompt: list[int], reasoning: list[int], width: int, pad_id: int):
    """Left-padded (sequence, attention_mask, action_mask[width-1]) for one [prompt | reasoning] pair."""
    ids = list(prompt) + list(reasoning)
    pad = width - len(ids)
    sequence = torch.tensor([pad_id] * pad + ids, dtype=torch.long)
    attention = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long)
    action = torch.zeros(width - 1, dtype=torch.bool)
    first = pad + len(prompt)  # position of the first reasoning token; predicted at index first - 1
    action[first - 1:width - 1] = True
    return sequence, attention, action


def cross_score_with_forward(forward: Forward, prompts: list[list[int]], reasonings: list[list[int]],
                             pad_id: int, micro_batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, L_sum), each [rows, columns] float32: reasoning i's mean / summed log-prob after prompt j."""
    if not prompts or not reasonings:
        raise ValueError("cross-scoring needs at least one prompt and one reasoning")
    if any(len(p) == 0 for p in prompts) or any(len(z) == 0 for z in reasonings):
        raise ValueError("prompts and reasonings must be non-empty token lists")
    # Longest first, so a micro-batch's pairs have similar lengths and pad little (each micro-batch
    # is padded to its longest pair).
    pairs = sorted(((i, j) for i in range(len(reasonings)) for j in range(len(prompts))),
                   key=lambda pair: -(len(prompts[pair[1]]) + len(reasonings[pair[0]])))
    L_sum = torch.zeros(len(reasonings), len(prompts), dtype=torch.float32)
    seq_list, att_list, act_list, index_list = [], [], [], []
    for start in range(0, len(pairs), micro_batch_size):
        chunk = pairs[start:start + micro_batch_size]
        width = max(len(prompts[j]) + len(reasonings[i]) for i, j in chunk)
        built = [pair_tensors(prompts[j], reasonings[i], width, pad_id) for i, j in chunk]
        seq_list.append(torch.stack([b[0] for b in built]))
        att_list.append(torch.stack([b[1] for b in built]))
        act_list.append(torch.stack([b[2] for b in built]))
        index_list.append(chunk)
    results = forward(seq_list, act_list, att_list)
    if len(results) < len(index_list):
        raise RuntimeError(f"the forward returned {len(results)} results for {len(index_list)} micro-batches")
    for chunk, action, log_probs in zip(index_list, act_list, results):
        sums = (log_probs.float() * action.float()).sum(dim=-1)
        for (i, j), value in zip(chunk, sums.tolist()):
            L_sum[i, j] = value
    lengths = torch.tensor([len(z) for z in reasonings], dtype=torch.float32).unsqueeze(1)
    return L_sum / lengths, L_sum


def probe_metrics(probe, samples: list, group_size: int, step: int, forward: Forward, prefill: str,
                  micro_batch_size: int = 8) -> dict[str, float]:
    """The `probe/...` metrics of one step (`probe` is a ragen2.instruments.probe.Probe: pairs, EMA, config)."""
    batch = probe_batch(samples, group_size, probe.tokenizer, prefill, probe.pad_id)
    prompts, reasonings, owners = probe.pairs(batch, step)
    if len(set(owners)) < 2:
        return {names.PROBE_SKIPPED_TOO_FEW_GROUPS: 1.0, "probe/num_pairs": float(len(owners)),
                names.PROBE_DTYPE: SCORING_DTYPE}
    L, L_sum = cross_score_with_forward(forward, prompts, reasonings, probe.pad_id, micro_batch_size)
    metrics = mi_probe.mi_metrics_both(L, L_sum, torch.tensor(owners), column_ids=mi_probe.prompt_identities(prompts))
    metrics.update(probe.ema.update(metrics))
    # (no num_pairs here: the local probe logs it only when it skips; num_rows counts the pairs)
    return {**{names.PROBE + key: float(value) for key, value in metrics.items()}, names.PROBE_DTYPE: SCORING_DTYPE}
