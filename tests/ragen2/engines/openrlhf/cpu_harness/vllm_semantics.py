"""Test harness only: what vLLM 0.29.0 does with one request's SamplingParams, for the HF stand-in engine.

Read from vllm 0.29.0 (its wheel), none of its code copied:

- stop ids (`SamplingParams.update_from_generation_config`, called by the input processor with the
  tokenizer's EOS): the primary EOS is the tokenizer's; the generation config's other
  `eos_token_id`s join `stop_token_ids`; all of them (plus any `stop_token_ids` asked for) are
  masked while fewer than `min_tokens` tokens are out (the min-tokens logits processor).
- stopping, per sampled token (`v1/core/sched/utils.check_stop`, then the output processor's
  detokenizer): the primary EOS -> finish "stop", stop_reason None; a stop id -> "stop", stop_reason
  = that id (both tokens are kept in `token_ids`); once more than `min_tokens` tokens are out, a
  stop string completed in the new text -> "stop", stop_reason = the string (the tokens up to the
  one that completed it are kept), even on the max_tokens-th token; else `max_tokens` -> "length".
- sampling (`v1/sample`): only the request's own temperature / top_k / top_p (the model's
  generation_config.json defaults are not applied to requests that pass SamplingParams); temperature
  0 = greedy; the log-probs returned are the model's raw ones (logprobs_mode raw_logprobs).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    eos: int | None  # the tokenizer's EOS
    stop_ids: frozenset[int]  # the generation config's other EOS ids + the request's stop_token_ids
    stops: tuple[str, ...]  # stop strings
    min_tokens: int
    max_tokens: int

    @classmethod
    def of(cls, params, tokenizer_eos: int | None, generation_config_eos, max_tokens: int | None = None) -> "StopRule":
        """max_tokens: the cap when params.max_tokens is None (vLLM: max_model_len - prompt length)."""
        configured = generation_config_eos
        configured = set() if configured is None else {configured} if isinstance(configured, int) else set(configured)
        if getattr(params, "ignore_eos", False):
            raise NotImplementedError("ignore_eos: not used by OpenRLHF or ragen2")
        stop_ids = (configured - {tokenizer_eos}) | set(getattr(params, "stop_token_ids", None) or ())
        return cls(eos=tokenizer_eos, stop_ids=frozenset(stop_ids), stops=tuple(getattr(params, "stop", None) or ()),
                   min_tokens=int(getattr(params, "min_tokens", 0) or 0),
                   max_tokens=int(params.max_tokens if params.max_tokens is not None else max_tokens))

    @property
    def masked_early(self) -> set[int]:
        """Ids that cannot be sampled while fewer than min_tokens tokens are out."""
        return ({self.eos} if self.eos is not None else set()) | set(self.stop_ids)

    def check(self, ids: list[int], text: str, new_chars: int):
        """After appending ids[-1] (text: the output decoded so far, new_chars of it new): None to go
        on, else (finish_reason, stop_reason)."""
        last = ids[-1]
        if last == self.eos:
            return "stop", None
        if last in self.stop_ids:
            return "stop", last
        if self.stops and len(ids) > self.min_tokens and new_chars:
            ends = [(text.find(s, max(0, len(text) - new_chars - len(s) + 1)), s) for s in self.stops]
            hits = [(at + len(s), k, s) for k, (at, s) in enumerate(ends) if at != -1]
            if hits:  # the one completed first; ties: the stop list's order. It wins over "length"
                return "stop", min(hits)[2]  # (the output processor runs after the scheduler's check)
        if len(ids) >= self.max_tokens:
            return "length", None
        return None


def sample(logits, temperature: float, top_k: int, top_p: float, generator):
    """One token id from a [vocab] float tensor, as vLLM's sampler: greedy at temperature 0, else
    temperature, then top-k (<= 0: off), then top-p, then a draw."""
    import torch

    if temperature < 1e-5:  # vLLM's _SAMPLING_EPS
        return int(torch.argmax(logits))
    logits = logits / temperature
    if 0 < top_k < logits.numel():
        logits = logits.masked_fill(logits < torch.topk(logits, top_k).values[-1], float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = torch.cumsum(probs, dim=-1) - probs > top_p  # keep the smallest prefix reaching top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))
