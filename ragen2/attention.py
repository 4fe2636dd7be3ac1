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
    passes grouped key/value heads to torch (``enable_gqa``) instead of repeated copies."""
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
