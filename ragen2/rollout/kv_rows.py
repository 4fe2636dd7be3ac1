"""Rows of a KV cache that grow independently, filled by the model's own forward (sampling only).

Row b holds one conversation's tokens contiguously from slot 0, `lengths[b]` of them. A forward
appends each row's new tokens at its own offset; rows may append different counts (shorter rows
are right-padded: their pad slots lie beyond the row's length, no real query sees them, and the
next append overwrites them). So a row keeps its cache across turns of a conversation, and a
finished row can swap out of the live block without the batch being rebuilt.

The forward is the model's own (transformers' layers and attention), given what it needs to
read ragged rows: `position_ids` counting from each row's length, a 4D additive mask (query t
of row b sees slots <= lengths[b] + t), and a transformers cache whose layers write into
preallocated buffers at those offsets instead of concatenating. Same math as a plain forward
over each row alone; only the masked slots (exact zeros after softmax) differ.

Models that take no transformers cache (test stand-ins, or a transformers too old for the layer
API) run on each row's whole token list every step: slower, same results.
"""

from __future__ import annotations

import inspect

import torch

from mi_probe.kv_cache import cache_argument
from ragen2 import precision

try:  # transformers' cache-layer and attention-registry API (5.x)
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
except ImportError:  # pragma: no cover - an older transformers: whole rows each step
    DynamicLayer = None

ROW_ATTENTION = "ragen2_kv_rows"

# Slots added beyond the need when a row outgrows the buffers (fewer reallocations).
GROWTH = 256


def _forward_parameters(model) -> dict:
    try:
        return dict(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return {}


def _output_logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out[0]


def _row_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
    """Matmul attention over the rows' cache, the mask already folded for GQA (see `_mask`).

    Why not the model's SDPA: at one query per row, CPU SDPA's flash kernel costs ~0.5 ms a
    call in fp32 and ~30 ms in bf16 (most of a decode step), and `repeat_kv` would copy the
    cache. Here the `group` query heads sharing a KV head become group*T query rows of that
    head, so the cache is read as stored; scores and softmax in fp32, as eager attention does.
    """
    n, heads, width, dim = query.shape
    kv_heads = key.shape[1]
    q = query.reshape(n, kv_heads, heads // kv_heads * width, dim)
    scale = dim ** -0.5 if scaling is None else scaling
    scores = torch.matmul(q, key.transpose(-1, -2)).float().mul_(scale).add_(attention_mask)
    out = torch.matmul(torch.softmax(scores, dim=-1).to(value.dtype), value)
    return out.view(n, heads, width, dim).transpose(1, 2), None


def _stored_dtype(states: torch.Tensor) -> torch.dtype:
    """The dtype the cache keeps keys and values in: the one the attention's matmuls read them in.

    Under autocast that is the autocast dtype. Keys leave the rotary embedding in fp32 (its
    cos/sin follow the fp32 residual stream); stored so, every decode step's matmuls would cast
    every layer's whole cache to bf16 again. Casting once on write gives the same values.
    """
    kind = states.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else states.dtype


def _base_model(model):
    """The transformers model under a LoRA (peft) wrapper, which passes its keyword arguments on."""
    return model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model


def takes_row_cache(model) -> bool:
    """Whether `model` runs its attention through a transformers cache we can hand it."""
    return DynamicLayer is not None and isinstance(_base_model(model), PreTrainedModel)


if DynamicLayer is not None:
    class _RowLayer(DynamicLayer):
        """One layer's keys and values, [rows, kv heads, capacity, head dim], written where `owner` says."""

        def __init__(self, owner: "KVRows"):
            super().__init__()
            self.owner = owner
            self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None

        def lazy_initialization(self, key_states, value_states) -> None:
            self.device, self.is_initialized = key_states.device, True
            shape = (self.owner.rows, key_states.shape[1], self.owner.capacity, key_states.shape[3])
            # Zeros, not empty: masked slots still enter the matmuls, and 0 * NaN is NaN.
            self.buffers = tuple(states.new_zeros(shape, dtype=_stored_dtype(states))
                                 for states in (key_states, value_states))

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            stored = (_stored_dtype(key_states), _stored_dtype(value_states))
            if stored != tuple(buffer.dtype for buffer in self.buffers):  # the precision changed between calls
                self.buffers = tuple(buffer.to(dtype) for buffer, dtype in zip(self.buffers, stored))
            key_states, value_states = key_states.to(stored[0]), value_states.to(stored[1])
            plan = self.owner.plan
            keys, values = self.buffers
            if plan.width == 1:
                keys[plan.rows_index, :, plan.starts] = key_states[:, :, 0]
                values[plan.rows_index, :, plan.starts] = value_states[:, :, 0]
            else:
                for i, start in enumerate(plan.start_list):
                    keys[plan.first + i, :, start:start + plan.width] = key_states[i]
                    values[plan.first + i, :, start:start + plan.width] = value_states[i]
            rows = slice(plan.first, plan.first + len(plan.start_list))
            self.keys, self.values = keys[rows, :, :plan.span], values[rows, :, :plan.span]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return 0 if self.keys is None else self.keys.shape[-2]

        def resize(self, rows: int, capacity: int) -> None:
            if self.buffers is None:
                return
            old_rows, _, old_capacity, _ = self.buffers[0].shape
            grown = []
            for buffer in self.buffers:
                new = buffer.new_zeros(rows, buffer.shape[1], capacity, buffer.shape[3])
                new[:old_rows, :, :old_capacity] = buffer
                grown.append(new)
            self.buffers = tuple(grown)

        def move_rows(self, source: torch.Tensor, target: torch.Tensor, end: int) -> None:
            for buffer in self.buffers or ():
                buffer[target, :, :end] = buffer[source, :, :end]  # gathered first: overlaps are safe


class _Plan:
    """Where the current forward writes (rows first.., each from its own start slot) and how many
    slots of each row its attention reads (`span`: up to the last written slot, or all of them)."""

    def __init__(self, first: int, starts: torch.Tensor, width: int, device, whole_rows: int | None = None):
        self.first, self.width = first, width
        self.start_list = starts.tolist()
        self.end = max(self.start_list) + width
        self.span = whole_rows or self.end
        self.starts = starts.to(device)
        self.rows_index = torch.arange(first, first + len(self.start_list), device=device)


class KVRows:
    """rows x capacity KV cache plus `forward`, which appends tokens to chosen rows; see the module doc."""

    def __init__(self, model, rows: int, capacity: int):
        self.model = model
        self.device = next(iter(model.parameters()), torch.zeros(0)).device
        self.cached = takes_row_cache(model)
        forward_parameters = _forward_parameters(_base_model(model))
        self.cache_argument = cache_argument(_base_model(model))
        self.keep_logits = "logits_to_keep" in forward_parameters
        self.rows, self.capacity = 0, 0
        self.lengths = torch.zeros(0, dtype=torch.long)
        self.tokens: list[list[int]] = []  # what each row holds (read only for models without a cache)
        self.cache = None
        config = getattr(model, "config", None)
        self.group = 1
        if self.cached:
            AttentionInterface.register(ROW_ATTENTION, _row_attention)
            heads = config.num_attention_heads
            self.group = heads // (getattr(config, "num_key_value_heads", None) or heads)
            self.cache = DynamicCache()
            Cache.__init__(self.cache, layer_class_to_replicate=lambda: _RowLayer(self))
        self.plan: _Plan | None = None
        self.reserve(rows, capacity)

    def _layers(self) -> list:
        return list(self.cache.layers) if self.cache is not None else []

    def _decode_reads_whole_rows(self) -> bool:
        """Whether a decode step's attention should read each row's whole buffer, masked, not a slice.

        A slice [:end] of a [rows, heads, capacity, dim] buffer is strided, and CPU matmuls in
        bf16 copy strided operands first: over whole contiguous rows the two attention matmuls
        ran faster even at twice the slots (docs/generation_speed.md; fp16 is taken to behave as
        bf16, unmeasured). fp32 matmuls read the slice in place, so fp32 keeps it.
        """
        layers = self._layers()
        buffers = getattr(layers[0], "buffers", None) if layers else None
        return buffers is not None and buffers[0].device.type == "cpu" and buffers[0].dtype != torch.float32

    def reserve(self, rows: int, capacity: int) -> None:
        """Make room for at least `rows` rows of `capacity` tokens (existing contents kept)."""
        if rows <= self.rows and capacity <= self.capacity:
            return
        rows, capacity = max(rows, self.rows), max(capacity, self.capacity)
        for layer in self._layers():
            layer.resize(rows, capacity)
        lengths = torch.zeros(rows, dtype=torch.long)
        lengths[:self.rows] = self.lengths
        self.tokens += [[] for _ in range(rows - self.rows)]
        self.lengths, self.rows, self.capacity = lengths, rows, capacity

    def truncate(self, row: int, length: int) -> None:
        """Keep the first `length` tokens of `row` (0: empty it)."""
        self.lengths[row] = length
        del self.tokens[row][length:]

    def copy_rows(self, source: list[int], target: list[int], length: int | None = None) -> None:
        """Row target[i] := row source[i] (its first `length` slots, default all it holds)."""
        if not source:
            return
        end = int(self.lengths[source].max()) if length is None else length
        index = torch.tensor(source, device=self.device), torch.tensor(target, device=self.device)
        for layer in self._layers():
            layer.move_rows(*index, end)
        self.lengths[target] = self.lengths[source] if length is None else length
        held = [self.tokens[s][:int(self.lengths[t])] for s, t in zip(source, target)]
        for t, tokens in zip(target, held):
            self.tokens[t] = list(tokens)

    def swap_rows(self, a: int, b: int) -> None:
        if a == b:
            return
        end = int(max(self.lengths[a], self.lengths[b]))
        for layer in self._layers():
            layer.move_rows(torch.tensor([a, b], device=self.device), torch.tensor([b, a], device=self.device), end)
        self.lengths[[a, b]] = self.lengths[[b, a]]
        self.tokens[a], self.tokens[b] = self.tokens[b], self.tokens[a]

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, counts: list[int] | None = None, first: int = 0) -> torch.Tensor:
        """Append input_ids [n, T] (row i: its first counts[i] real) to rows first..first+n-1.

        Returns the logits [n, V] in fp32 at each row's last real token.
        """
        n, width = input_ids.shape
        counts = [width] * n if counts is None else list(counts)
        if first + n > self.rows:
            raise ValueError(f"rows {first}..{first + n - 1} are outside the cache's {self.rows} rows")
        if len(counts) != n or min(counts) < 1 or max(counts) > width:
            raise ValueError(f"each of the {n} rows must append between 1 and {width} tokens, got {counts}")
        for i, count in enumerate(counts):
            tokens = self.tokens[first + i]
            del tokens[int(self.lengths[first + i]):]
            tokens.extend(input_ids[i, :count].tolist())
        with precision.autocast(self.model):  # the update's precision (ragen2.precision)
            logits = self._cached(input_ids, counts, first) if self.cached else self._uncached(first, n)
        self.lengths[first:first + n] += torch.tensor(counts, dtype=torch.long)
        return logits.float()

    def _cached(self, input_ids, counts, first) -> torch.Tensor:
        n, width = input_ids.shape
        starts = self.lengths[first:first + n].clone()
        if int(starts.max()) + width > self.capacity:
            self.reserve(self.rows, int(starts.max()) + width + GROWTH)
        whole_rows = self.capacity if width == 1 and self._decode_reads_whole_rows() else None
        self.plan = plan = _Plan(first, starts, width, self.device, whole_rows)
        positions = (starts[:, None] + torch.arange(width)).to(self.device)  # [n, T]
        visible = torch.arange(plan.span, device=self.device)[None, None, :] <= positions[:, :, None]  # [n, T, L]
        # Folded for `_row_attention`: query row g*T + t of a KV head is query head g's token t.
        visible = visible[:, None, None].expand(n, 1, self.group, width, plan.span)
        mask = torch.zeros(visible.shape, dtype=torch.float32, device=self.device)
        mask = mask.masked_fill_(~visible, float("-inf")).reshape(n, 1, self.group * width, plan.span)
        last = torch.tensor(counts, device=self.device) - 1
        kept = {}
        if self.keep_logits:  # only the positions some row ends at go through the head
            columns = torch.unique(last)
            if len(columns) == 1 and int(columns[0]) == width - 1:
                kept, last = {"logits_to_keep": 1}, torch.zeros_like(last)
            else:
                kept, last = {"logits_to_keep": columns}, torch.searchsorted(columns, last)
        config = self.model.config
        attention = config._attn_implementation
        config._attn_implementation = ROW_ATTENTION  # for this forward only: training keeps its own
        try:
            out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask, position_ids=positions,
                             use_cache=True, **{self.cache_argument: self.cache}, **kept)
        finally:
            config._attn_implementation = attention
        logits = _output_logits(out)
        return logits[torch.arange(n, device=self.device), last]

    def _uncached(self, first: int, n: int) -> torch.Tensor:
        rows = self.tokens[first:first + n]
        longest = max(len(r) for r in rows)
        ids = torch.zeros((n, longest), dtype=torch.long)
        mask = torch.zeros((n, longest), dtype=torch.long)
        for i, tokens in enumerate(rows):  # left-padded: every row's last token is the last column
            ids[i, longest - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
            mask[i, longest - len(tokens):] = 1
        mask = mask.to(self.device)
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask,
                         position_ids=(mask.cumsum(-1) - 1).clamp(min=0))  # real tokens count from 0
        return _output_logits(out)[:, -1]
