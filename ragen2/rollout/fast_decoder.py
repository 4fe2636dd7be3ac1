"""A Llama-family forward over a ragged, preallocated KV cache, for sampling only.

Why not the model's own forward: on a 2-core CPU, Hugging Face's eager decode step at batch
16 costs about 4x the time the weights take to stream from memory. The extra time is Python
and bookkeeping around small matmuls (mask building, cache concatenation, per-projection
calls). Here a layer is: RMSNorm, one fused QKV matmul, RoPE, an in-place write into the
cache, one attention call, the output matmul, RMSNorm, one fused gate/up matmul, SiLU, down.

The cache keeps every row's tokens contiguous from slot 0: row b holds `lengths[b]` tokens,
and a forward appends each row's new tokens at its own offset (rows may append different
counts; shorter rows are right-padded and their pad outputs ignored). Queries at position p
attend to slots <= p of their own row. So a row keeps its cache across turns of a
conversation: the next turn only appends what the previous turn did not feed.

Same math as `LlamaForCausalLM.forward` in fp32 (the same RMSNorm, rotary module and
attention formula); only summation order differs, by ~1e-6 on log-probs. The fused weights
are copies, refreshed on `refresh_weights()` (call it after an optimiser step; the
GenerationSession builds one per rollout, so training never samples from stale weights).

In bf16 (a model whose compute dtype is bf16, ragen2.precision) it follows what autocast does
to the model's own forward: the weight copies, the matmuls and the KV cache are bf16, while the
residual stream, RMSNorm, rotary, softmax and the logits' use stay fp32. Half the bytes a
decode step streams, and the bf16 units do the matmuls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ragen2 import precision

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")


def supports(model) -> bool:
    """True when `model` is a plain (non-LoRA) Llama / Qwen2 causal LM this module can run."""
    if type(model).__name__ not in SUPPORTED:
        return False
    config = model.config
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "use_sliding_window", False):
        return False
    inner = getattr(model, "model", None)
    return all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb"))


class FastDecoder:
    """Rows x capacity KV cache plus a forward that appends tokens to chosen rows."""

    def __init__(self, model, rows: int, capacity: int):
        if not supports(model):
            raise ValueError(f"FastDecoder runs {SUPPORTED} models, not {type(model).__name__}")
        self.model, self.config = model, model.config
        config = self.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        self.scale = self.head_dim ** -0.5
        param = next(model.parameters())
        # dtype: the matmuls' and the cache's; the residual stream stays in the weights' dtype
        self.device, self.dtype, self.stream_dtype = param.device, precision.compute_dtype(model), param.dtype
        self.refresh_weights()
        self.rows, self.capacity = 0, 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths = torch.zeros(0, dtype=torch.long)
        self.reserve(rows, capacity)

    # --- weights ------------------------------------------------------------------------------

    def refresh_weights(self) -> None:
        """Fuse q/k/v and gate/up into one matrix each (one matmul instead of three / two)."""
        inner = self.model.model
        def matmul_weight(*parts):  # a copy in the compute dtype (one cat for fused parts)
            return torch.cat(parts).to(self.dtype) if len(parts) > 1 else parts[0].to(self.dtype)

        def maybe(bias):
            return None if bias is None else bias.to(self.dtype)

        self.embed = inner.embed_tokens.weight
        self.final_norm = (inner.norm.weight, inner.norm.variance_epsilon)
        with torch.no_grad():
            self.head = matmul_weight(self.model.lm_head.weight)
            self.layers = []
            for layer in inner.layers:
                attn, mlp = layer.self_attn, layer.mlp
                qkv = matmul_weight(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
                bias = (matmul_weight(attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias)
                        if attn.q_proj.bias is not None else None)
                self.layers.append((
                    layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, qkv, bias,
                    matmul_weight(attn.o_proj.weight), maybe(attn.o_proj.bias),
                    layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                    matmul_weight(mlp.gate_proj.weight, mlp.up_proj.weight), matmul_weight(mlp.down_proj.weight),
                ))
        self.rotary = inner.rotary_emb

    # --- cache --------------------------------------------------------------------------------

    def reserve(self, rows: int, capacity: int) -> None:
        """Make room for at least `rows` rows of `capacity` tokens (existing contents kept)."""
        if rows <= self.rows and capacity <= self.capacity:
            return
        rows, capacity = max(rows, self.rows), max(capacity, self.capacity)
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        new_keys, new_values = [], []
        for layer in range(len(self.layers)):
            # Zeros, not empty: masked slots still enter the matmuls, and 0 * NaN is NaN.
            k = torch.zeros(shape, device=self.device, dtype=self.dtype)
            v = torch.zeros(shape, device=self.device, dtype=self.dtype)
            if self.rows and self.capacity:
                k[:self.rows, :, :self.capacity] = self.keys[layer]
                v[:self.rows, :, :self.capacity] = self.values[layer]
            new_keys.append(k)
            new_values.append(v)
        self.keys, self.values = new_keys, new_values
        lengths = torch.zeros(rows, dtype=torch.long)
        lengths[:self.rows] = self.lengths
        self.lengths, self.rows, self.capacity = lengths, rows, capacity

    def copy_rows(self, source: list[int], target: list[int], length: int | None = None) -> None:
        """Row target[i] := row source[i] (its first `length` slots, default all it holds)."""
        if not source:
            return
        src = torch.tensor(source, device=self.device)
        dst = torch.tensor(target, device=self.device)
        end = int(self.lengths[source].max()) if length is None else length
        for k, v in zip(self.keys, self.values):
            k[dst, :, :end] = k[src, :, :end]  # the right side is gathered first: overlaps are safe
            v[dst, :, :end] = v[src, :, :end]
        self.lengths[target] = self.lengths[source] if length is None else length

    def swap_rows(self, a: int, b: int) -> None:
        if a == b:
            return
        end = int(max(self.lengths[a], self.lengths[b]))
        index, swapped = torch.tensor([a, b], device=self.device), torch.tensor([b, a], device=self.device)
        for k, v in zip(self.keys, self.values):
            k[index, :, :end] = k[swapped, :, :end]
            v[index, :, :end] = v[swapped, :, :end]
        self.lengths[[a, b]] = self.lengths[[b, a]]

    # --- forward ------------------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, counts: list[int] | None = None, first: int = 0) -> torch.Tensor:
        """Append input_ids [n, T] (row i: its first counts[i] real) to cache rows first..first+n-1.

        Returns the logits [n, V] in fp32 at each row's last real token.
        """
        n, width = input_ids.shape
        if counts is None:
            counts = [width] * n
        if first + n > self.rows:
            raise ValueError(f"rows {first}..{first + n - 1} are outside the cache's {self.rows} rows")
        if min(counts) < 1 or max(counts) > width:
            raise ValueError(f"each row must append between 1 and {width} tokens, got {counts}")
        rows = slice(first, first + n)
        start = self.lengths[rows].clone()
        if int(start.max()) + width > self.capacity:
            self.reserve(self.rows, int(start.max()) + width + 256)
        offsets = torch.arange(width)
        positions = (start[:, None] + offsets).to(self.device)  # [n, T]
        end = int(start.max()) + width
        # Query t of row i (position start_i + t) sees slots <= that position.
        visible = (torch.arange(end, device=self.device)[None, None, :] <= positions[:, :, None])  # [n, T, L]
        # GQA without repeating keys: the `group` query heads that share a KV head become
        # group*T query rows of that head, so attention runs on the cache as it is stored.
        mask = visible[:, None, None].expand(n, 1, self.group, width, end).reshape(n, 1, self.group * width, end)
        # An additive mask, built once for all layers; matmul attention (CPU SDPA's flash
        # kernel costs ~0.5 ms a call at these sizes, most of a small decode step).
        bias = torch.zeros(mask.shape, device=self.device, dtype=torch.float32).masked_fill_(~mask, float("-inf"))
        low = self.dtype != self.stream_dtype
        cos, sin = self.rotary(self.embed, positions)  # [n, T, D]
        cos, sin = cos[:, None], sin[:, None]
        half = self.head_dim // 2
        hidden = F.embedding(input_ids.to(self.device), self.embed)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        if width == 1:
            row_index = torch.arange(first, first + n, device=self.device)
            write_at = start.to(self.device)
        for layer, (norm1, eps1, qkv_w, qkv_b, o_w, o_b, norm2, eps2, gate_up, down) in enumerate(self.layers):
            x = _rms_norm(hidden, norm1, eps1)
            qkv = F.linear(x.to(self.dtype), qkv_w, qkv_b)
            q = qkv[..., :q_size].view(n, width, self.heads, self.head_dim).transpose(1, 2)
            k = qkv[..., q_size:q_size + kv_size].view(n, width, self.kv_heads, self.head_dim).transpose(1, 2)
            v = qkv[..., q_size + kv_size:].view(n, width, self.kv_heads, self.head_dim).transpose(1, 2)
            if low:  # rotary in fp32, as the model's forward under autocast does it
                q, k = q.float(), k.float()
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
            q, k = q.to(self.dtype), k.to(self.dtype)
            cache_k, cache_v = self.keys[layer], self.values[layer]
            if width == 1:
                cache_k[row_index, :, write_at] = k[:, :, 0]
                cache_v[row_index, :, write_at] = v[:, :, 0]
            else:
                for i in range(n):
                    s = int(start[i])
                    cache_k[first + i, :, s:s + width] = k[i]
                    cache_v[first + i, :, s:s + width] = v[i]
            q = q.reshape(n, self.kv_heads, self.group * width, self.head_dim)
            scores = torch.matmul(q, cache_k[rows, :, :end].transpose(-1, -2))
            scores = (scores.float() if low else scores).mul_(self.scale).add_(bias)
            out = torch.matmul(torch.softmax(scores, dim=-1).to(self.dtype), cache_v[rows, :, :end])
            out = out.view(n, self.heads, width, self.head_dim).transpose(1, 2).reshape(n, width, q_size)
            hidden = hidden + F.linear(out, o_w, o_b)
            x = F.linear(_rms_norm(hidden, norm2, eps2).to(self.dtype), gate_up)
            gate, up = x.chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, down)
        self.lengths[rows] += torch.tensor(counts, dtype=torch.long)
        last = hidden[torch.arange(n, device=self.device), torch.tensor(counts, device=self.device) - 1]
        return F.linear(_rms_norm(last, *self.final_norm).to(self.dtype), self.head).float()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)
