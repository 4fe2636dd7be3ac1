"""Incremental chat-template tokenization: a trajectory as a growing list of exact token ids.

Re-tokenizing a rendered conversation would not give back the ids the policy sampled (BPE
merges across boundaries, a template trimming whitespace, a stop inside a token), and PPO
must score exactly the sampled ids. So a trajectory is built in pieces:

    ids = encode(render([system, user_1], add_generation_prompt=True))    template, mask 0
        + sampled ids of turn 1                                           policy,   mask 1
        + encode(delta_1)                                                 template, mask 0
        + sampled ids of turn 2 ...

where delta_k is the template text that closes assistant turn k and opens the next user turn
and the generation prompt: the string difference between two renders,

    render(msgs + [assistant_k, user_k+1], gen=True) = render(msgs, gen=True) + reply_k + delta_k.

That equation is the *prefix property*; ChatML (SmolLM2, Qwen2.5) and Llama-3 templates have it
(Llama-3 trims contents, so the stripped reply is accepted too). A template that rewrites
earlier turns (Qwen3 drops past <think> blocks) breaks it: we raise ChatTemplateError naming
the template, and window mode, which re-renders every prompt, still works with it.

If the policy ended its turn by sampling EOS and the delta starts with that token's text
(ChatML's `<|im_end|>`, Llama-3's `<|eot_id|>`), the sampled EOS stays (mask 1) and the delta
drops that text, so the closing token is not doubled. Template text is encoded with
add_special_tokens=False: the template writes its own BOS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envs.parsing import THINK_CLOSE, THINK_OPEN


class ChatTemplateError(ValueError):
    """A tokenizer's chat template cannot be used for incremental tokenization."""


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


class ChatFormat:
    """A tokenizer with its chat template: renders messages and encodes template text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(f"tokenizer {self.name!r} has no chat_template: set tokenizer.chat_template "
                                    "to a Jinja template (e.g. ChatML) before rolling out")

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)
        if not isinstance(text, str):
            raise ChatTemplateError(f"apply_chat_template of {self.name!r} returned {type(text).__name__}, not str")
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def prompt_ids(self, messages: list[dict], prefill: str = "") -> list[int]:
        """The generation prompt for `messages` (+ the prefill), rendered and encoded in one piece."""
        return self.encode(self.render(messages, add_generation_prompt=True) + prefill)

    def delta_after_reply(self, previous_prompt: str, reply: str, new_render: str) -> str:
        """The text `new_render` adds after `previous_prompt + reply` (see the module doc)."""
        for shown in (reply, reply.strip()):
            if new_render.startswith(previous_prompt + shown):
                return new_render[len(previous_prompt) + len(shown):]
        expected = previous_prompt + reply
        at = _first_difference(expected, new_render)
        raise ChatTemplateError(
            f"the chat template of {self.name!r} breaks the prefix property that incremental "
            f"tokenization needs: rendering the conversation with the assistant reply should start "
            f"with the previous generation prompt + the reply, but differs at character {at}: "
            f"expected {expected[max(0, at - 40):at + 40]!r}, rendered {new_render[max(0, at - 40):at + 40]!r}. "
            f"Templates that rewrite earlier turns need context='window'."
        )


@dataclass
class TokenTrajectory:
    """One conversation's token list in full-history mode, grown turn by turn.

    `input_ids[i]` was sampled by the policy iff `sampled[i]`; `logprobs[i]` is its sampling
    log-prob (0.0 for template tokens) and `turn_index[i]` its 0-based turn (-1 for template).
    `turn_spans[k]` = (first, end) indices of turn k's sampled tokens.
    """

    chat: ChatFormat
    messages: list[dict]
    input_ids: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_index: list[int] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    prompt_text: str = ""
    prefill: str = ""  # text that opens every assistant turn in the prompt (RAGEN's "<think>")
    _last_reply: str | None = None
    _sampled_eos_text: str = ""

    def __post_init__(self) -> None:
        self.messages = list(self.messages)
        self.prompt_text = self.chat.render(self.messages, add_generation_prompt=True)
        self._append_template(self.chat.encode(self.prompt_text + self.prefill))

    def _append_template(self, ids: list[int]) -> None:
        self.input_ids.extend(ids)
        self.sampled.extend([False] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.turn_index.extend([-1] * len(ids))

    @property
    def awaiting_reply(self) -> bool:
        return self._last_reply is None

    def add_reply(self, ids: list[int], logprobs: list[float], reply: str, *, ended_with_eos: bool) -> None:
        """Append the sampled ids of the next turn; `reply` is the prefill + their text, as the env saw it."""
        if not self.awaiting_reply:
            raise RuntimeError("add_reply twice in a row: add the next user message first")
        if len(ids) != len(logprobs) or not ids:
            raise ValueError(f"a reply needs >= 1 token and one log-prob per token, got {len(ids)} and {len(logprobs)}")
        turn = len(self.turn_spans)
        first = len(self.input_ids)
        self.input_ids.extend(ids)
        self.sampled.extend([True] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.turn_index.extend([turn] * len(ids))
        self.turn_spans.append((first, len(self.input_ids)))
        self.messages.append({"role": "assistant", "content": reply})
        self._last_reply = reply
        self._sampled_eos_text = self.chat.decode(ids[-1:], skip_special_tokens=False) if ended_with_eos else ""

    def add_user(self, content: str) -> None:
        """Close the assistant turn and open the next user turn + generation prompt (mask 0)."""
        if self.awaiting_reply:
            raise RuntimeError("add_user before any reply: the first user message is given at construction")
        self.messages.append({"role": "user", "content": content})
        new_render = self.chat.render(self.messages, add_generation_prompt=True)
        delta = self.chat.delta_after_reply(self.prompt_text, self._last_reply, new_render)
        if self._sampled_eos_text and delta.startswith(self._sampled_eos_text):
            delta = delta[len(self._sampled_eos_text):]  # the policy already wrote the closing token
        self._append_template(self.chat.encode(delta + self.prefill))
        self.prompt_text = new_render
        self._last_reply = None

    def last_sampled_end(self) -> int:
        """Length of the list up to and including the last sampled token (drops trailing template)."""
        return self.turn_spans[-1][1] if self.turn_spans else len(self.input_ids)


def reply_text(chat: ChatFormat, ids: list[int], ended_with_eos: bool) -> str:
    """What the env sees: the sampled text without a final EOS and without special tokens."""
    body = ids[:-1] if ended_with_eos else ids
    return chat.decode(body, skip_special_tokens=True)


def _first_prefix_reaching(chat: ChatFormat, ids: list[int], chars: int) -> int:
    """The smallest i with len(decode(ids[:i])) >= chars (len(ids) + 1 if none), by bisection.

    Decoding prefixes (not single tokens) keeps byte-level merges and multi-byte characters
    right, and bisection needs O(log n) decodes instead of one per token.
    """
    lo, hi = 0, len(ids) + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if mid <= len(ids) and len(chat.decode(ids[:mid], skip_special_tokens=False)) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


def reasoning_span(chat: ChatFormat, ids: list[int], prefill: str = "") -> tuple[int, int] | None:
    """(start, end) token indices, within `ids`, of the reasoning between <think> and </think>.

    Found on the decoded text (first <think>, then the first </think> after it) and mapped to
    tokens by the lengths of decoded prefixes: start is the first token that begins at or after
    the end of `<think>`; end is one past the last token that ends at or before the start of
    `</think>`. So ids[:start] holds all of `<think>` and ids[start:end] lies inside the
    reasoning (a token straddling a tag boundary is left out). None when there is no closed,
    non-empty span. `prefill` is text the prompt already wrote before `ids` (a prefilled
    `<think>`): the tags are searched in prefill + ids, the span is still in `ids`.
    """
    text = prefill + chat.decode(ids, skip_special_tokens=False)
    open_at = text.find(THINK_OPEN)
    if open_at < 0:
        return None
    body_start = open_at + len(THINK_OPEN)
    close_at = text.find(THINK_CLOSE, body_start)
    if close_at < 0:
        return None
    offset = len(prefill)
    start = _first_prefix_reaching(chat, ids, max(0, body_start - offset))
    end = _first_prefix_reaching(chat, ids, close_at + 1 - offset) - 1
    return (start, end) if end > start else None
