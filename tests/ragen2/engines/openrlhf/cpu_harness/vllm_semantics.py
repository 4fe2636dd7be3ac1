"""Test harness only: what vLLM 0.29.0 does with one request, for the HF stand-in engine (orl_hf_engine.py).

Mirrored, not imported: importing vLLM costs each process 10-20 s and ~200 MB on the 2-core CI machine
(its package init pulls vllm.config and the platform probe), and the wheel is 316 MB. Every rule below is
checked against vLLM's own code by test_openrlhf_stand_in.py, through the cases that
record_vllm_semantics.py recorded from it (fixtures/vllm-0.29.0-semantics.json).

- `resolve`: the SamplingParams the engine works with (v1/engine/input_processor.py): a clone; when
  max_tokens is unset, max_model_len - prompt length; then `update_from_generation_config`: the
  tokenizer's EOS is the primary EOS (unless ignore_eos), the generation config's other `eos_token_id`s
  join `stop_token_ids`, and all of them are in `all_stop_token_ids`. The generation config's sampling
  defaults (temperature, top_p, top_k, repetition_penalty, ...) are NOT applied: only vLLM's
  entrypoints (LLM, the OpenAI server) merge `get_diff_sampling_param`; AsyncLLM.generate, which
  OpenRLHF calls with its own SamplingParams, does not. Greedy (temperature < 1e-5) sets top_p 1, top_k 0.
- `Completion.step`: per sampled token, the scheduler's `check_stop` (v1/core/sched/utils.py) then the
  output processor's detokenizer (v1/engine/detokenizer.py): the primary EOS -> "stop", stop_reason
  None; a stop token id -> "stop", stop_reason = the id (both kept in token_ids; their text is left
  out unless include_stop_str_in_output); prompt + output reaching max_model_len or output reaching
  max_tokens -> "length"; then, once more than min_tokens tokens are out, a stop string completed by
  the new text -> "stop", stop_reason = the string (overriding "length"; the text is cut after it
  with include_stop_str_in_output, before it without).
- `sample`: the sampler (v1/sample/sampler.py, ops/topk_topp_sampler.py): raw log-probs from the
  model's logits; the min-tokens processor masks `all_stop_token_ids` while fewer than min_tokens
  tokens are out; greedy = argmax; else temperature, top-k, top-p (vLLM's masks: ascending sort,
  cumulative probability <= 1 - top_p dropped, the top one kept), then the exponential race
  argmax(probs / q), q ~ Exp(1) drawn from the request's own generator when SamplingParams.seed is set.
"""
from __future__ import annotations

from dataclasses import dataclass

SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS


class UnsupportedRequest(ValueError):
    """A SamplingParams field the stand-in does not implement (OpenRLHF and ragen2 never set it)."""


NEUTRAL = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_p": 0.0,
           "logit_bias": None, "allowed_token_ids": None, "bad_words": None, "n": 1}


@dataclass(frozen=True)
class Resolved:
    eos_token_id: int | None  # the primary EOS (None with ignore_eos)
    stop_token_ids: frozenset[int]
    all_stop_token_ids: frozenset[int]  # what min_tokens masks
    max_tokens: int
    min_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    ignore_eos: bool
    logprobs: int | None

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


def resolve(params, generation_config: dict, tokenizer_eos: int | None, max_model_len: int,
            prompt_len: int) -> Resolved:
    """params: a SamplingParams (vLLM's or the harness's stand-in class); generation_config: the
    model's generation config as a dict (vLLM: its non-default fields)."""
    field = lambda name, default: getattr(params, name, default)  # noqa: E731
    for name, neutral in NEUTRAL.items():
        if field(name, neutral) not in (neutral, [], {}):
            raise UnsupportedRequest(f"SamplingParams.{name}={field(name, neutral)!r}: the HF stand-in does not "
                                     f"implement it")
    temperature, top_p, top_k = float(field("temperature", 1.0)), float(field("top_p", 1.0)), int(field("top_k", 0))
    if temperature < SAMPLING_EPS:  # SamplingParams.__post_init__
        top_p, top_k = 1.0, 0
    stop = field("stop", None) or []
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    ignore_eos = bool(field("ignore_eos", False))
    stop_ids = set(field("stop_token_ids", None) or ())
    all_stop = set(stop_ids)
    eos = None if ignore_eos else tokenizer_eos
    if tokenizer_eos is not None:
        all_stop.add(tokenizer_eos)
    configured = generation_config.get("eos_token_id")
    if configured is not None:
        configured = {configured} if isinstance(configured, int) else set(configured)
        configured.discard(tokenizer_eos)
        all_stop |= configured
        if configured and not ignore_eos:
            stop_ids |= configured
    max_tokens = field("max_tokens", None)
    seed = field("seed", None)
    return Resolved(eos_token_id=eos, stop_token_ids=frozenset(stop_ids), all_stop_token_ids=frozenset(all_stop),
                    max_tokens=int(max_model_len - prompt_len if max_tokens is None else max_tokens),
                    min_tokens=int(field("min_tokens", 0) or 0), temperature=temperature, top_p=top_p, top_k=top_k,
                    seed=None if seed in (None, -1) else int(seed), stop=stop,
                    include_stop_str_in_output=bool(field("include_stop_str_in_output", False)),
                    skip_special_tokens=bool(field("skip_special_tokens", True)), ignore_eos=ignore_eos,
                    logprobs=field("logprobs", None))


def find_stop_string(text: str, new_chars: int, stops: tuple[str, ...], include: bool):
    """(stop string, length to cut the text to, or -1 for no cut) or None: the stop string completed
    earliest within the last new_chars characters (ties: the list's order)."""
    if not new_chars or not stops:
        return None
    best = None
    for stop in stops:
        at = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))  # only text not searched before
        if at != -1 and (best is None or at + len(stop) < best[1] + len(best[0])):
            best = (stop, at)
    if best is None:
        return None
    stop, at = best
    if not include:
        return stop, at
    end = at + len(stop)
    return stop, (end if end < len(text) else -1)


class Completion:
    """One request's output as vLLM builds it, one sampled token at a time."""

    def __init__(self, request: Resolved, tokenizer, prompt_len: int, max_model_len: int):
        self.request, self.tokenizer = request, tokenizer
        self.prompt_len, self.max_model_len = prompt_len, max_model_len
        self.token_ids: list[int] = []
        self._text_ids: list[int] = []  # the ids the detokenizer has turned into text
        self.text = ""
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None

    def step(self, token: int) -> bool:
        """Append a sampled token; True when the request is finished."""
        r = self.request
        self.token_ids.append(token)
        out = len(self.token_ids)
        finish, reason = None, None
        if token == r.eos_token_id:  # scheduler: check_stop
            finish = "stop"
        elif token in r.stop_token_ids:
            finish, reason = "stop", token
        elif self.prompt_len + out >= self.max_model_len or out >= r.max_tokens:
            finish = "length"
        before = len(self.text)  # detokenizer: a stop token's text only with include_stop_str_in_output
        if not (finish == "stop" and not r.include_stop_str_in_output):
            self._text_ids.append(token)
            self.text = self.tokenizer.decode(self._text_ids, skip_special_tokens=r.skip_special_tokens)
        checked_from = len(self.text) if (r.min_tokens and out <= r.min_tokens) else before
        if r.stop and out > r.min_tokens:
            found = find_stop_string(self.text, len(self.text) - checked_from, r.stop, r.include_stop_str_in_output)
            if found is not None:
                finish, reason = "stop", found[0]
                if found[1] != -1:
                    self.text = self.text[:found[1]]
        self.finish_reason, self.stop_reason = finish, reason
        return finish is not None


def top_k_top_p(logits, top_k: int, top_p: float):
    """vLLM's top-k then top-p masks (PyTorch path) on [rows, vocab] float logits, in place."""
    vocab = logits.shape[-1]
    if not (0 < top_k < vocab) and top_p >= 1.0:
        return logits
    ordered, order = logits.sort(dim=-1, descending=False)
    if 0 < top_k < vocab:
        kth = ordered[:, vocab - top_k].unsqueeze(1)
        ordered.masked_fill_(ordered < kth, float("-inf"))
    if top_p < 1.0:
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - top_p
        drop[:, -1] = False  # the most likely token always stays
        ordered.masked_fill_(drop, float("-inf"))
    return logits.scatter_(-1, order, ordered)


def sample(logits, request: Resolved, generated: int, generator, processed_logprobs: bool = False):
    """One token from a [vocab] logits row: (token, the log-probs vLLM reports for it: raw or processed)."""
    import torch

    logits = logits.float().unsqueeze(0)
    raw = None if processed_logprobs else torch.log_softmax(logits, dim=-1)[0]
    logits = logits.clone()
    if generated < request.min_tokens and request.all_stop_token_ids:
        logits[0, sorted(request.all_stop_token_ids)] = float("-inf")
    if request.greedy:
        token = int(logits[0].argmax())
        return token, raw if raw is not None else torch.log_softmax(logits, dim=-1)[0]
    logits = top_k_top_p(logits / request.temperature, request.top_k, request.top_p)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    q[0].exponential_(generator=generator)
    token = int(probs.div_(q).argmax(dim=-1)[0])
    return token, raw if raw is not None else torch.log_softmax(logits, dim=-1)[0]
