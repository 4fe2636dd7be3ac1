"""A generation session: conversations that keep their KV cache from one turn to the next.

    session = GenerationSession(model, tokenizer=tok, generator=g, eos_token_ids=[2], pad_token_id=0)
    results = session.generate(keys, prompts, max_new_tokens=96)   # turn 1
    results = session.generate(keys, longer_prompts, max_new_tokens=96)   # turn 2: appends only

Each key (an episode) owns a row of a `KVRows` cache, which the model's own forward fills. A
call compares each prompt with the tokens its row already holds and feeds only the rest: in a
multi-turn rollout turn k no longer re-reads the k-1 turns before it. A prompt that diverges
(window mode, a re-templated history) truncates the row to the common prefix, so the result
is always the prompt's own forward.

Within a call: new keys with identical prompts (a group's G copies) are prefilled once and
their rows copied; the prefix that all new prompts share (system message, instructions) is
prefilled once too. While decoding, the live rows are rows 0..n-1 of the cache: a row that
finishes swaps places with the last live row, so the next forward runs on a contiguous view
and a finished row costs nothing more.

Sampling is `sampling.sample_tokens` (one uniform per row from the generator, drawn in request
order) with `sampling.StopChecker`'s stop rules, so a seed gives the same tokens whatever the
rows' order in the cache.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import torch

from envs.parsing import STOP_STRINGS
from ragen2 import precision
from ragen2.rollout.kv_rows import KVRows
from ragen2.rollout.sampling import GenerationResult, StopChecker, check_args, sample_tokens

# Below this many shared tokens the extra forward for the prefix costs about what it saves.
MIN_SHARED_PREFIX = 16

# Rows x new tokens per prefill forward: bounds the attention scores' memory and keeps the
# working set in cache.
PREFILL_TOKENS = 2048


def shared_prefix_length(prompts) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own (whose logits we need)."""
    shortest = min(len(p) for p in prompts)
    first = prompts[0]
    for i in range(shortest - 1):
        if any(p[i] != first[i] for p in prompts[1:]):
            return i
    return max(shortest - 1, 0)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    limit = min(len(a), len(b))
    for i in range(limit):
        if a[i] != b[i]:
            return i
    return limit


class GenerationSession:
    """Batched sampling over conversations whose caches persist between calls; see the module doc."""

    def __init__(self, model, *, temperature: float = 1.0, top_p: float = 1.0,
                 stop_strings: Sequence[str] = STOP_STRINGS, eos_token_ids: Sequence[int] = (),
                 pad_token_id: int = 0, tokenizer=None, generator: torch.Generator | None = None):
        self.model = model
        self.temperature, self.top_p = temperature, top_p
        self.stop_strings, self.eos_ids = tuple(stop_strings), {int(t) for t in eos_token_ids}
        self.pad_token_id, self.tokenizer, self.generator = pad_token_id, tokenizer, generator
        self.cache: KVRows | None = None  # built on the first call (its size is known then)
        self.slot_keys: list[Hashable | None] = []  # the key each cache row belongs to

    # --- rows ---------------------------------------------------------------------------------

    def _swap(self, a: int, b: int) -> None:
        if a != b:
            self.cache.swap_rows(a, b)
            self.slot_keys[a], self.slot_keys[b] = self.slot_keys[b], self.slot_keys[a]

    def _grow(self, rows: int, capacity: int) -> None:
        if self.cache is None:
            self.cache = KVRows(self.model, rows, capacity)
        else:
            self.cache.reserve(rows, capacity)
        self.slot_keys += [None] * (self.cache.rows - len(self.slot_keys))

    def release(self, keys) -> None:
        """Forget these conversations (their rows become free)."""
        drop = set(keys)
        for slot, key in enumerate(self.slot_keys):
            if key in drop:
                self.slot_keys[slot] = None
                self.cache.truncate(slot, 0)

    def _free_slot(self, beyond: int) -> int:
        for slot in range(beyond, len(self.slot_keys)):
            if self.slot_keys[slot] is None:
                return slot
        self._grow(len(self.slot_keys) + 1, self.cache.capacity)
        return len(self.slot_keys) - 1

    def _place(self, order: list[Hashable]) -> None:
        """Put order[i] in row i: known keys by swapping, new keys into emptied rows."""
        slot_of = {key: slot for slot, key in enumerate(self.slot_keys) if key is not None}
        for i, key in enumerate(order):
            if key in slot_of:
                j = slot_of[key]
                if j != i:
                    moved = self.slot_keys[i]
                    self._swap(i, j)
                    if moved is not None:
                        slot_of[moved] = j
                    slot_of[key] = i
                continue
            held = self.slot_keys[i]
            if held is not None:  # idle, or wanted later (then swapped back in): move it aside
                free = self._free_slot(len(order))
                self._swap(i, free)
                slot_of[held] = free
            self.slot_keys[i] = key
            self.cache.truncate(i, 0)
            slot_of[key] = i

    # --- one call -----------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, keys: Sequence[Hashable], prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 on_step: Callable[[int, int], None] | None = None) -> list[GenerationResult]:
        """Sample one reply per (key, prompt); results in request order.

        `on_step(live_rows, tokens_sampled_so_far)` is called after every decode step (progress).
        """
        check_args(prompts, max_new_tokens, self.temperature, self.top_p, self.stop_strings, self.tokenizer)
        keys, prompts = list(keys), [[int(t) for t in p] for p in prompts]
        if len(set(keys)) != len(keys):
            raise ValueError("generate: each key may appear once per call")
        was_training = self.model.training
        self.model.eval()
        try:
            # One autocast context for the whole call: in bf16 autocast then casts each weight once
            # per call, not once per token (its cast cache lives until the outermost context exits).
            with precision.autocast(self.model):
                return self._generate(keys, prompts, max_new_tokens, on_step)
        finally:
            self.model.train(was_training)

    def _generate(self, keys, prompts, max_new_tokens, on_step) -> list[GenerationResult]:
        known = set(k for k in self.slot_keys if k is not None)
        old = [i for i, k in enumerate(keys) if k in known]
        new = [i for i, k in enumerate(keys) if k not in known]
        # New prompts: one representative per distinct prompt, its copies after all of them.
        rep_of: dict[tuple, int] = {}
        reps, copies = [], []
        for i in new:
            first = rep_of.setdefault(tuple(prompts[i]), i)
            (reps if first == i else copies).append(i)
        order = old + reps + copies  # request index of each row
        alive = len(known | set(keys))
        capacity = max(len(p) for p in prompts) + max_new_tokens + 1
        self._grow(max(alive, len(order)), capacity)
        self._place([keys[i] for i in order])
        cache, n = self.cache, len(order)

        # What each row must be fed: old rows keep the longest prefix their cache shares with
        # the prompt (at least one token is always fed: its logits start the reply).
        feed: list[list[int]] = []
        for row, i in enumerate(order[:len(old) + len(reps)]):
            held = cache.tokens[row]
            keep = min(_common_prefix(held, prompts[i]), len(prompts[i]) - 1)
            if keep < len(held):
                cache.truncate(row, keep)
            feed.append(prompts[i][keep:])
        first_rep = len(old)
        if len(reps) > 1 and cache.cached:  # the prefix every new prompt shares: prefilled once, copied
            shared = shared_prefix_length([prompts[i] for i in reps])
            if shared >= MIN_SHARED_PREFIX:
                self._forward_rows(first_rep, [prompts[reps[0]][:shared]])
                cache.copy_rows([first_rep] * (len(reps) - 1), list(range(first_rep + 1, first_rep + len(reps))),
                                length=shared)
                for r in range(first_rep, first_rep + len(reps)):
                    feed[r] = feed[r][shared:]
        logits = self._forward_rows(0, feed)
        if copies:
            sources = [first_rep + reps.index(rep_of[tuple(prompts[i])]) for i in copies]
            targets = list(range(len(old) + len(reps), n))
            cache.copy_rows(sources, targets)
            logits = torch.cat([logits, logits[torch.tensor(sources)]])
        return self._decode(order, logits, max_new_tokens, on_step)

    def _forward_rows(self, first: int, feed: list[list[int]]) -> torch.Tensor:
        """Feed rows first.. their token lists (right-padded, in chunks); last logits per row."""
        out, row = [], 0
        while row < len(feed):
            width = max(len(f) for f in feed[row:row + 1])
            count = 1
            while row + count < len(feed):
                wider = max(width, len(feed[row + count]))
                if wider * (count + 1) > PREFILL_TOKENS:
                    break
                width, count = wider, count + 1
            chunk = feed[row:row + count]
            ids = torch.full((count, width), self.pad_token_id, dtype=torch.long)
            for r, tokens in enumerate(chunk):
                ids[r, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            out.append(self.cache.forward(ids, [len(t) for t in chunk], first=first + row))
            row += count
        return torch.cat(out)

    def _decode(self, order, logits, max_new_tokens, on_step) -> list[GenerationResult]:
        results = [GenerationResult(token_ids=[], logprobs=[]) for _ in order]  # by request index
        rows = list(order)  # row -> request index; rows[:live] are still sampling
        live, sampled = len(rows), 0
        stop = StopChecker(self.tokenizer, self.stop_strings)
        for step in range(max_new_tokens):
            # Draw in request order, not in row order, which swaps shuffle: the same seed then
            # gives the same tokens however the rows were placed.
            by_request = sorted(range(live), key=rows.__getitem__)
            identity = by_request == list(range(live))
            picked = logits if identity else logits[torch.tensor(by_request)]
            drawn, drawn_logprobs = sample_tokens(picked, self.temperature, self.top_p, self.generator)
            token_list, logprob_list = [0] * live, [0.0] * live
            for row, token, logprob in zip(by_request, drawn.tolist(), drawn_logprobs.tolist()):
                token_list[row], logprob_list[row] = token, logprob
            finished = []
            for row in range(live):
                result = results[rows[row]]
                result.token_ids.append(token_list[row])
                result.logprobs.append(logprob_list[row])
                if token_list[row] in self.eos_ids:
                    result.finish_reason = "eos"
                elif stop.hit(result.token_ids):
                    result.finish_reason = "stop"
                elif step == max_new_tokens - 1:
                    result.finish_reason = "length"
                else:
                    continue
                finished.append(row)
            sampled += live
            for row in reversed(finished):  # descending: the swap partner is always still live
                last = live - 1
                self._swap(row, last)
                rows[row], rows[last] = rows[last], rows[row]
                token_list[row], token_list[last] = token_list[last], token_list[row]
                live -= 1
            if on_step is not None:
                on_step(live, sampled)
            if live == 0:
                break
            logits = self.cache.forward(torch.tensor(token_list[:live], dtype=torch.long)[:, None])
        return results
