"""The log-prob (and entropy) a model gives each sampled token of packed rows: the scoring pass the
update, the gradient decomposition, SFT and the audit all read, one implementation. It sits below
the local engine (with `ragen2.shared_prefix`, which encodes a shared prompt once) so that reports
use it without importing the engine."""

from __future__ import annotations

import torch
from torch import nn

from ragen2 import precision
from ragen2 import shared_prefix as prefix_lib
from ragen2.shared_prefix import TokenRows

__all__ = ["HEAD_CHUNK", "TokenRows", "padded_width", "policy_log_probs"]


def padded_width(attention_mask: torch.Tensor) -> int:
    """Length of the longest row (batches are right-padded)."""
    lengths = attention_mask.sum(dim=1)
    return int(lengths.max().item()) if lengths.numel() else 0


def policy_log_probs(model: nn.Module, tokens: TokenRows, temperature: float = 1.0, with_entropy: bool = False,
                     shared_prefix: bool = False,
                     padding_free: prefix_lib.PaddingFree | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (and entropy) of every sampled token, 0 elsewhere; [B, T]. `tokens`: the rows'
    input_ids, attention_mask and response_mask (a TokenRows, a rollout batch, the update's inputs).

    The LM head runs only on the hidden states that predict sampled tokens: on a multi-turn
    row most positions are prompt or env text, and the vocabulary projection dominates.
    `shared_prefix`: rows sharing a prompt encode it once (ragen2/shared_prefix); `padding_free`:
    the rows run as one unpadded sequence, shared prompts once (shared_prefix.padding_free_hidden_states),
    after their first tokens when those are encoded once for a whole step (shared_prefix.PaddingFree).
    """
    input_ids, attention_mask, response_mask = tokens.input_ids, tokens.attention_mask, tokens.response_mask
    batch, seq_len = input_ids.shape
    width = padded_width(attention_mask)
    log_probs = torch.zeros(batch, seq_len, dtype=torch.float32, device=input_ids.device)
    entropy = torch.zeros_like(log_probs) if with_entropy else None
    if width < 2:
        return log_probs, entropy
    ids, attn = input_ids[:, :width], attention_mask[:, :width]
    predicts = response_mask[:, 1:width].bool()  # hidden state t-1 predicts token t
    targets = ids[:, 1:][predicts]
    with precision.autocast(model):  # matmuls in the model's compute dtype; the head's softmax in fp32
        hidden = prefix_lib.hidden_states(model.get_decoder(), ids, attn, shared_prefix, padding_free)
        hidden = hidden[:, :-1][predicts]
        # Without gradient a packed shared-prefix pass holds more rows than a plain one: project
        # them in chunks, so the [positions, vocabulary] logits stay as small as a plain pass's.
        chunk = HEAD_CHUNK if shared_prefix and not torch.is_grad_enabled() else max(1, hidden.shape[0])
        parts = [_head_log_probs(model.get_output_embeddings(), h, t, temperature, with_entropy)
                 for h, t in zip(hidden.split(chunk), targets.split(chunk))]
    log_probs = log_probs.clone()
    log_probs[:, 1:width][predicts] = torch.cat([chosen for chosen, _ in parts])
    if with_entropy:
        entropy = entropy.clone()
        entropy[:, 1:width][predicts] = torch.cat([ent for _, ent in parts])
    return log_probs, entropy


# Positions projected at once by a no-grad shared-prefix pass: its logits (64 x vocabulary) stay
# below a plain micro-batch's, leaving room for the KV cache the shared pass holds.
HEAD_CHUNK = 64


def _head_log_probs(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of `targets` (and the entropy) from the hidden states that predict them, in fp32."""
    logits = head(hidden).float()
    with precision.full_precision(head):
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        chosen = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return chosen, entropy
