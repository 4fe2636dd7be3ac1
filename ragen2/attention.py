"""Masked attention on CPU without copying the key/value heads.

transformers' ``sdpa`` attention repeats each key/value head to the number of query heads (a
copy of the layer's whole keys and values) whenever a mask is passed, because CUDA's fused
kernels cannot take grouped-query attention together with a mask. torch's CPU kernels can
(``enable_gqa=True``), with the same output bit for bit. Every masked forward of a ragen2 model
on CPU is such a case: padded batches, the shared-prefix suffix passes (a group's prompt keys
copied to each row, then repeated again per head), the MI probe's cross-scoring. In the probe
that copy was 8% of its time. ``grouped_sdpa`` keeps the heads grouped there and hands every
other case (CUDA, decoding, unmasked causal passes, position biases) to transformers' own
function unchanged.

``use_grouped_sdpa(model)`` switches a loaded model that runs transformers' ``sdpa`` (registering
the name with transformers' attention and mask registries); ``transformers_sdpa(*models)`` switches
them back for a block, to measure against transformers' own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "ragen2_grouped_sdpa"


def grouped_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, except that a masked CPU pass over several query positions
    passes grouped key/value heads to torch (``enable_gqa``) instead of repeated copies, and a
    padding-free pass (the PACKED keyword) runs `packed_attention`."""
    segments = kwargs.get(PACKED)
    if segments is not None:
        return packed_attention(query, key, value, segments, scaling), None
    grouped = query.shape[1] != key.shape[1]
    if (not grouped or attention_mask is None or query.shape[2] == 1 or query.device.type != "cpu"
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    # With a mask transformers passes is_causal=False (the mask carries causality): so do we.
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=False,
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


# The keyword a padding-free pass (ragen2.shared_prefix.padding_free_hidden_states) passes the
# model: transformers' decoder layers hand unknown keywords down to the attention function.
PACKED = "ragen2_packed_segments"


def packed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     segments: list[tuple[int, int, int, int]], scaling: float | None) -> torch.Tensor:
    """Attention over one packed sequence (batch 1) of segments `(start, end, prefix_start,
    prefix_end)` that cover the queries in order. Keys hold the cache first (a prefix every row
    starts with, encoded earlier: shared_prefix.EncodedPrefix), then the packed positions. Query
    positions start..end-1 attend to all of the cache, then to packed positions prefix_start..
    prefix_end-1 (their cluster's shared prompt; empty for none), then causally to themselves.
    [1, S, heads, head_dim], as transformers' attention functions return.

    Each segment runs as one causal pass over its keys with zero queries standing in for the
    positions before its own, whose outputs are dropped (so they get no gradient): a causal
    square lets torch skip the masked half, where an explicit "all of the prefix, then causal"
    mask would cost every pair (shared_prefix.MASKED_PAIR_COST)."""
    cached = key.shape[2] - query.shape[2]
    outputs = []
    for start, end, prefix_start, prefix_end in segments:
        parts = [slice(0, cached), slice(cached + prefix_start, cached + prefix_end), slice(cached + start, cached + end)]
        k, v = (torch.cat([t[:, :, part] for part in parts], dim=2) for t in (key, value))
        lead = k.shape[2] - (end - start)
        q = query[:, :, start:end]
        if lead:
            q = torch.cat([q.new_zeros(q.shape[0], q.shape[1], lead, q.shape[3]), q], dim=2)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling,
                                                               enable_gqa=query.shape[1] != key.shape[1])
        outputs.append(out[:, :, lead:])
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()


def use_grouped_sdpa(model: nn.Module) -> nn.Module:
    """Run `model`'s attention through grouped_sdpa if it runs transformers' sdpa; else unchanged."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return model
    AttentionInterface.register(NAME, grouped_sdpa)  # a dict entry: registering again changes nothing
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the masks sdpa gets, skips included
    model.set_attn_implementation(NAME)
    return model


@contextmanager
def transformers_sdpa(*models: nn.Module | None) -> Iterator[None]:
    """For the block, the given models that run grouped_sdpa run transformers' own sdpa."""
    switched = [m for m in models if getattr(getattr(m, "config", None), "_attn_implementation", None) == NAME]
    for model in switched:
        model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        for model in switched:
            use_grouped_sdpa(model)
