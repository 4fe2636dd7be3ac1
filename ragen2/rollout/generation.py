"""Batched sampling of one reply per prompt: a one-call `GenerationSession`.

Why our own loop and not `model.generate`: every random draw comes from the `torch.Generator`
passed in, so a rollout is reproduced exactly from a saved generator state (resume) and in
another process, and we return what training needs: the sampled ids, their fp32 log-probs
(see `sampling`) and why each sequence stopped. The forward is the model's own, over a KV
cache whose rows grow independently (`kv_rows`); identical prompts (a group's first turn) and
the prefix all prompts share are prefilled once, and a finished row leaves the decode batch.
"""

from __future__ import annotations

from typing import Sequence

import torch

from envs.parsing import STOP_STRINGS
from ragen2.rollout.sampling import FINISH_REASONS, GenerationResult, check_args, sample_tokens
from ragen2.rollout.session import MIN_SHARED_PREFIX, GenerationSession, shared_prefix_length

__all__ = ["FINISH_REASONS", "GenerationResult", "MIN_SHARED_PREFIX", "generate", "generate_one_at_a_time",
           "sample_tokens", "shared_prefix_length"]


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float = 1.0,
             top_p: float = 1.0, stop_strings: Sequence[str] = STOP_STRINGS,
             eos_token_ids: Sequence[int] = (), pad_token_id: int = 0, tokenizer=None,
             generator: torch.Generator | None = None) -> list[GenerationResult]:
    """Sample a continuation of every prompt in one batch; results in prompt order."""
    check_args(prompts, max_new_tokens, temperature, top_p, stop_strings, tokenizer)
    session = GenerationSession(model, temperature=temperature, top_p=top_p, stop_strings=stop_strings,
                                eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, tokenizer=tokenizer,
                                generator=generator)
    return session.generate(range(len(prompts)), prompts, max_new_tokens=max_new_tokens)


def generate_one_at_a_time(model, prompts: Sequence[Sequence[int]], **kwargs) -> list[GenerationResult]:
    """The unbatched baseline: `generate` on each prompt alone (same arguments)."""
    check_args(prompts, kwargs.get("max_new_tokens"), kwargs.get("temperature", 1.0),
               kwargs.get("top_p", 1.0), kwargs.get("stop_strings", STOP_STRINGS), kwargs.get("tokenizer"))
    return [generate(model, [prompt], **kwargs)[0] for prompt in prompts]
