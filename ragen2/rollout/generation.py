"""Batched sampling with a KV cache, our own loop (not `model.generate`).

Why our own: every random draw comes from the `torch.Generator` passed in, so a rollout is
reproduced exactly from a saved generator state (resume), and we control what is returned:
the sampled ids, their log-probs, and why each sequence stopped.

The loop: left-pad the prompts, one prefill forward, then one forward per new token with the
cache (`past_key_values`). Left padding needs explicit `position_ids` (each row counts from its
first real token) and an attention mask that hides the pads, extended by one column per step.
A sequence stops right after its text contains a stop string (checked on the decoded tail of
its last few tokens, so a stop string split across tokens is found), after an EOS token (kept
in the result), or at `max_new_tokens`. Finished rows leave the batch: the cache rows are
dropped with `batch_select_indices` (benchmarks/generation.py measures the gain), so a long
straggler does not make the batch pay for the rows already done. Identical prompts (a group's
first turn) are prefilled once and their cache rows copied, and so is the prefix all prompts
share (the env's system message and instructions): see `_prefill`.

Log-probs: `log_softmax(logits / temperature)` at the sampled token, in fp32 — the full
temperature-scaled distribution, before top-p truncation, so they match what a trainer
recomputes for the same tokens. With temperature 0 (greedy) they are `log_softmax(logits)`.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from envs.parsing import STOP_STRINGS
from ragen2 import precision
from ragen2.rollout import fast_decoder
from ragen2.rollout.config import BACKENDS

try:  # transformers' cache API (4.56+ / 5.x); without it the model's own cache is used
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
except ImportError:  # pragma: no cover - another transformers layout
    DynamicLayer = None

FINISH_REASONS = ("stop", "eos", "length")


def use_fast_backend(model, backend: str) -> bool:
    """Whether `backend` means our own forward for this model ("fast" on an unsupported model is an error)."""
    if backend == "hf":
        return False
    if backend == "fast" and not fast_decoder.supports(model):
        raise ValueError(f"backend 'fast' runs {fast_decoder.SUPPORTED} models, not {type(model).__name__}; "
                         "use backend='hf' or 'auto'")
    return fast_decoder.supports(model)


@dataclass
class GenerationResult:
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)  # one per token, fp32 values
    finish_reason: str = "length"  # "stop" | "eos" | "length"


def _model_device(model) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def _forward_parameters(model) -> dict:
    try:
        return dict(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return {}


def _cache_argument(model) -> str:
    """transformers >= 5.2x names the cache `cache`; older versions `past_key_values`."""
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


def _output_cache(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _check_args(prompts, max_new_tokens, temperature, top_p, stop_strings, tokenizer) -> None:
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


class _StopChecker:
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


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float = 1.0,
             top_p: float = 1.0, stop_strings: Sequence[str] = STOP_STRINGS,
             eos_token_ids: Sequence[int] = (), pad_token_id: int = 0, tokenizer=None,
             generator: torch.Generator | None = None, shrink_batch: bool = True,
             backend: str = "auto") -> list[GenerationResult]:
    """Sample a continuation of every prompt in one batch; results in prompt order.

    backend: "fast" runs Llama-family models through session.GenerationSession (our own
    forward over a preallocated cache, see fast_decoder.py); "hf" runs the model's own forward
    with the loop below (any causal LM, test stand-ins); "auto" picks "fast" where it applies.
    `shrink_batch=False` (hf only) keeps finished rows in the batch (fed pad tokens, results
    ignored): slower, kept to measure the gain and as a fallback for caches without batch selection.
    """
    _check_args(prompts, max_new_tokens, temperature, top_p, stop_strings, tokenizer)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if use_fast_backend(model, backend) and shrink_batch:
        from ragen2.rollout.session import GenerationSession  # it imports this module

        session = GenerationSession(model, temperature=temperature, top_p=top_p, stop_strings=stop_strings,
                                    eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, tokenizer=tokenizer,
                                    generator=generator)
        return session.generate(range(len(prompts)), prompts, max_new_tokens=max_new_tokens)
    was_training = model.training
    model.eval()  # no dropout while sampling
    try:
        with precision.autocast(model):  # the update's precision (ragen2.precision); sampling in fp32
            return _generate(model, prompts, max_new_tokens, temperature, top_p, stop_strings,
                             set(int(t) for t in eos_token_ids), pad_token_id, tokenizer, generator, shrink_batch)
    finally:
        model.train(was_training)


if DynamicLayer is not None:
    class _PreallocatedLayer(DynamicLayer):
        """One layer's keys and values in buffers with room for the whole generation.

        transformers' DynamicLayer concatenates on every token, copying the layer's whole cache
        each step (a quarter of a batched decode step on CPU); here a token is written in
        place and the attention reads views of the filled part.
        """

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity, self.length = capacity, 0

        def lazy_initialization(self, key_states, value_states) -> None:
            self.device = key_states.device
            self._keys = key_states.new_empty(*key_states.shape[:2], self.capacity, key_states.shape[3])
            self._values = value_states.new_empty(*value_states.shape[:2], self.capacity, value_states.shape[3])
            self.is_initialized = True

        def _expose(self) -> None:
            self.keys, self.values = self._keys[:, :, :self.length], self._values[:, :, :self.length]

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self._keys.shape[-2]:  # more than planned: grow (rare, e.g. a reused cache)
                extra = end + self.capacity - self._keys.shape[-2]
                pad = lambda t: torch.cat([t, t.new_empty(*t.shape[:2], extra, t.shape[3])], dim=-2)  # noqa: E731
                self._keys, self._values = pad(self._keys), pad(self._values)
            self._keys[:, :, self.length:end] = key_states
            self._values[:, :, self.length:end] = value_states
            self.length = end
            self._expose()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.length:
                self._keys, self._values = self._keys[indices], self._values[indices]
                self._expose()

        def batch_repeat_interleave(self, repeats: int) -> None:
            self.batch_select_indices(torch.arange(self._keys.shape[0], device=self.device).repeat_interleave(repeats))

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            self.batch_select_indices(beam_idx)

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("the generation cache does not crop")

        def reset(self) -> None:
            self.length = 0
            super().reset()


def _new_cache(model, capacity: int):
    """A cache with room for `capacity` positions, or None (the model then makes its own)."""
    if DynamicLayer is None:
        return None
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model  # LoRA
    if not isinstance(base, PreTrainedModel):
        return None
    cache = DynamicCache()
    Cache.__init__(cache, layer_class_to_replicate=lambda: _PreallocatedLayer(capacity))
    return cache


def shared_prefix_length(prompts) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own (whose logits we need)."""
    shortest = min(len(p) for p in prompts)
    first = prompts[0]
    for i in range(shortest - 1):
        if any(p[i] != first[i] for p in prompts[1:]):
            return i
    return max(shortest - 1, 0)


# Below this many shared tokens the extra forward for the prefix costs about what it saves.
MIN_SHARED_PREFIX = 16


def _prefill(model, prompts, pad_token_id, device, cache=None):
    """Forward the prompts: (cache, last logits, attention mask, next positions).

    Prompts of one env share their system message and instructions: that common prefix is
    run once (batch 1), its cache rows copied to every prompt, and only the rest of each prompt
    is run, left-padded. The pads then sit between the prefix and the suffix; the attention
    mask hides them and positions count real tokens only, so every row sees what it would see
    alone. `cache`: an empty cache to fill (None: the model makes one).
    """
    shared = shared_prefix_length(prompts) if len(prompts) > 1 else 0
    past, prefix_mask = cache, torch.zeros((len(prompts), 0), dtype=torch.long, device=device)
    # The prefix's logits are never read: run the decoder body alone (models without one, like
    # test stand-ins, run whole prompts).
    body = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None
    if shared >= MIN_SHARED_PREFIX and body is not None:
        prefix = torch.as_tensor([list(prompts[0][:shared])], dtype=torch.long, device=device)
        ones = torch.ones_like(prefix)
        given = {_cache_argument(body): cache} if cache is not None else {}
        past = _output_cache(body(input_ids=prefix, attention_mask=ones, position_ids=ones.cumsum(-1) - 1,
                                  use_cache=True, **given))
        if hasattr(past, "batch_select_indices"):
            past.batch_select_indices(torch.zeros(len(prompts), dtype=torch.long, device=device))
            prompts = [p[shared:] for p in prompts]
            prefix_mask = torch.ones((len(prompts), shared), dtype=torch.long, device=device)
        else:  # a cache we cannot copy rows of: run whole prompts
            past = None
    batch, longest = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((batch, longest), pad_token_id, dtype=torch.long)
    suffix_mask = torch.zeros((batch, longest), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, longest - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
        suffix_mask[row, longest - len(prompt):] = 1
    attention_mask = torch.cat([prefix_mask, suffix_mask.to(device)], dim=-1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, prefix_mask.shape[1]:]  # real tokens only
    cache = {_cache_argument(model): past} if past is not None else {}
    out = model(input_ids=input_ids.to(device), attention_mask=attention_mask, position_ids=position_ids,
                use_cache=True, **cache, **_keep_last_logits(model))
    return _output_cache(out), out.logits[:, -1, :], attention_mask, attention_mask.sum(-1)


def _keep_last_logits(model) -> dict:
    """Only the last position's logits are needed: skip the [batch, length, vocab] head output."""
    return {"logits_to_keep": 1} if "logits_to_keep" in _forward_parameters(model) else {}


def _generate(model, prompts, max_new_tokens, temperature, top_p, stop_strings, eos_ids, pad_token_id,
              tokenizer, generator, shrink_batch) -> list[GenerationResult]:
    device = _model_device(model)
    batch = len(prompts)
    cache_arg = _cache_argument(model)
    # The G members of a group start from the same prompt: prefill each distinct prompt once,
    # then copy its cache rows (a G-fold saving on the first turn's prefill).
    distinct: dict[tuple[int, ...], int] = {}
    expand = [distinct.setdefault(tuple(int(t) for t in p), len(distinct)) for p in prompts]
    capacity = max(len(p) for p in prompts) + max_new_tokens
    past, logits, attention_mask, next_position = _prefill(model, list(distinct), pad_token_id, device,
                                                           _new_cache(model, capacity))
    if len(distinct) < batch:
        if hasattr(past, "batch_select_indices"):
            index = torch.tensor(expand, device=device)
            past.batch_select_indices(index)
            logits, attention_mask, next_position = logits[index], attention_mask[index], next_position[index]
        else:  # a cache we cannot copy rows of: prefill every prompt
            past, logits, attention_mask, next_position = _prefill(model, prompts, pad_token_id, device)
    can_shrink = shrink_batch and hasattr(past, "batch_select_indices")

    results = [GenerationResult(token_ids=[], logprobs=[]) for _ in range(batch)]
    rows = list(range(batch))  # batch row -> prompt index
    live = torch.ones(batch, dtype=torch.bool)  # only used when the batch does not shrink
    stop = _StopChecker(tokenizer, stop_strings)
    for step in range(max_new_tokens):
        tokens, logprobs = sample_tokens(logits, temperature, top_p, generator)
        token_list, logprob_list = tokens.tolist(), logprobs.tolist()
        finished = []
        for b, index in enumerate(rows):
            if not live[b]:
                finished.append(True)
                continue
            result = results[index]
            result.token_ids.append(token_list[b])
            result.logprobs.append(logprob_list[b])
            if token_list[b] in eos_ids:
                result.finish_reason = "eos"
            elif stop.hit(result.token_ids):
                result.finish_reason = "stop"
            elif step == max_new_tokens - 1:
                result.finish_reason = "length"
            else:
                finished.append(False)
                continue
            finished.append(True)
        if all(finished):
            break
        if can_shrink and any(finished):
            keep = [b for b, done in enumerate(finished) if not done]
            keep_index = torch.tensor(keep, device=device)
            past.batch_select_indices(keep_index)
            rows = [rows[b] for b in keep]
            tokens, attention_mask, next_position = tokens[keep_index], attention_mask[keep_index], next_position[keep_index]
            live = torch.ones(len(rows), dtype=torch.bool)
        elif not can_shrink:
            live = ~torch.tensor(finished)
            tokens = torch.where(live.to(device), tokens, torch.full_like(tokens, pad_token_id))
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(rows), 1))], dim=-1)
        out = model(input_ids=tokens[:, None], attention_mask=attention_mask,
                    position_ids=next_position[:, None], use_cache=True, **{cache_arg: past})
        past, logits = _output_cache(out), out.logits[:, -1, :]
        next_position = next_position + 1
    return results


def generate_one_at_a_time(model, prompts: Sequence[Sequence[int]], **kwargs) -> list[GenerationResult]:
    """The unbatched baseline: `generate` on each prompt alone (same arguments)."""
    _check_args(prompts, kwargs.get("max_new_tokens"), kwargs.get("temperature", 1.0),
                kwargs.get("top_p", 1.0), kwargs.get("stop_strings", STOP_STRINGS), kwargs.get("tokenizer"))
    return [generate(model, [prompt], **kwargs)[0] for prompt in prompts]
