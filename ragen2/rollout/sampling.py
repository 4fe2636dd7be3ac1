"""What sampling returns and how one token is drawn; shared by the session and `generate`.

Every random draw comes from the `torch.Generator` passed in (one uniform per row per step), so
a rollout is reproduced exactly from a saved generator state (resume) and in another process.

Log-probs: `log_softmax(logits / temperature)` at the sampled token, in fp32 — the full
temperature-scaled distribution, before top-p truncation, so they match what a trainer
recomputes for the same tokens. With temperature 0 (greedy) they are `log_softmax(logits)`.

A sequence stops right after its text contains a stop string (checked on the decoded tail of
its last few tokens, so a stop string split across tokens is found), after an EOS token (kept
in the result), or at `max_new_tokens`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

FINISH_REASONS = ("stop", "eos", "length")


@dataclass
class GenerationResult:
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)  # one per token, fp32 values
    finish_reason: str = "length"  # "stop" | "eos" | "length"


def check_args(prompts, max_new_tokens, temperature, top_p, stop_strings, tokenizer) -> None:
    if not prompts:
        raise ValueError("generate needs at least one prompt")
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {index} is empty: a prompt needs at least one token")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if isinstance(stop_strings, str):
        raise ValueError("stop_strings must be a sequence of strings, not one string")
    if any(not s for s in stop_strings):
        raise ValueError("stop_strings may not contain an empty string")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer to decode the generated tail")


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of `logits` [b, V]; return (tokens [b], log-probs [b] fp32)."""
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    logprobs = torch.log_softmax(logits / temperature if temperature != 1 else logits, dim=-1)
    probs = logprobs.exp()
    if top_p < 1:
        # Keep the smallest set of most likely tokens whose mass reaches top_p (always >= 1 token).
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = torch.where(mass_before < top_p, sorted_probs, torch.zeros_like(sorted_probs))
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    sample_device = generator.device if generator is not None else probs.device
    # A generator lives on one device: sample where it is (pass one on the model's device to
    # avoid copying the probabilities every step).
    tokens = _inverse_cdf_draw(probs.to(sample_device), generator).to(logits.device)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def _inverse_cdf_draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row with P(token) = probs / row sum, from one uniform per row.

    `torch.multinomial` draws an exponential for every vocabulary entry (49k per row per
    step); this draws one number per row. The cumulative sum is in float64 so that a uniform
    below 1 always lands strictly inside the mass, and `right=True` never picks a token whose
    probability is 0 (its cumulative value equals its predecessor's).
    """
    cdf = probs.double().cumsum(dim=-1)
    totals = cdf[:, -1]
    if not bool((torch.isfinite(totals) & (totals > 0)).all()):
        raise ValueError("cannot sample: a row's probabilities are not finite or sum to 0 (non-finite logits?)")
    uniform = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=torch.float64)
    tokens = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(-1)
    return tokens.clamp(max=probs.shape[-1] - 1)


class StopChecker:
    """Says whether a row's text now contains a stop string, from its last few tokens."""

    def __init__(self, tokenizer, stop_strings: Sequence[str]):
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        # A stop string of n characters spans at most n tokens, plus a few that decode to
        # nothing alone (partial UTF-8 bytes): every earlier window was checked, so a hit
        # in this window must involve the newest token.
        self.window = max((len(s) for s in self.stop_strings), default=0) + 4

    def hit(self, ids: list[int]) -> bool:
        if not self.stop_strings:
            return False
        tail = self.tokenizer.decode(ids[-self.window:], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
        return any(s in tail for s in self.stop_strings)
