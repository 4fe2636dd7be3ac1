"""Shared-prefix passes: each group's common prompt is encoded once per forward.

A GRPO/PPO group is G rollouts of one instance, so its G rows start with the same prompt.
A plain forward encodes that prompt G times. Here (the idea of Prefix Grouper, arXiv 2506.05433)
the rows of a micro-batch are clustered by their longest common token prefix; each cluster's
prefix runs once (one row per cluster), its keys/values are copied to the cluster's rows
(an index_select, so backward sums the rows' gradients into the one prefix), and only each
row's own suffix runs, attending to those keys/values with its real positions. The decoder's
last hidden states are then reassembled to the plain [B, T, H] layout, so callers apply their
heads (LM head on sampled positions, value head everywhere) exactly as before.

Causal attention makes this exact: a prefix position sees only the prefix, whichever row it
belongs to; a suffix position sees the same keys/values as in the whole row. The results
equal the plain forward up to float rounding (different matmul shapes sum in another order).

Batches are right-padded (ragen2.rollout.batch): row r's real tokens are input_ids[r, :L_r].
Multi-turn rows share at most the first prompt; later turns differ and are suffix. A micro-batch
in which no two rows share `MIN_SHARED_PREFIX` tokens, or where sharing would not pay (`plan`
weighs tokens and attended pairs), runs the plain forward, unchanged. So do models training
with gradient checkpointing (`supported`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from mi_probe.kv_cache import cache_argument
from ragen2 import attention as attention_lib

# Below this many shared tokens a cluster saves less than the extra prefix row's padding costs.
MIN_SHARED_PREFIX = 16
# Run shared only when its estimated work is at most this share of the plain forward's.
MAX_COST_RATIO = 0.9
# An attended (query, key) pair under an explicit mask costs about this many pairs of a causal,
# unpadded pass (torch's CPU attention skips masked blocks only for is_causal). Measured on the
# bundled model: two unpadded Sokoban rows of 1,048 tokens, the shared suffix pass (764 tokens
# after a 284-token prefix) took 1.13x the plain pass's time, which this factor reproduces.
MASKED_PAIR_COST = 1.8


@dataclass
class Plan:
    """How a micro-batch's rows share prefixes: row r's first prefix_len[cluster[r]] tokens are
    the prefix of its cluster, whose tokens are read from row leader[cluster[r]]."""

    cluster: torch.Tensor  # [B] cluster of each row
    leader: torch.Tensor  # [C] a row of each cluster
    prefix_len: torch.Tensor  # [C] shared tokens of each cluster (a single row: all but its last)
    lengths: torch.Tensor  # [B] real tokens of each row


def _lexicographic(input_ids: torch.Tensor, lengths: torch.Tensor) -> list[int]:
    rows = [row[:n] for row, n in zip(input_ids.tolist(), lengths.tolist())]
    return sorted(range(len(rows)), key=rows.__getitem__)


def packing_order(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A permutation of the rows that puts rows sharing a prefix next to each other (sorted by
    their real tokens), so micro-batches cut from it hold whole groups."""
    order = _lexicographic(input_ids, attention_mask.sum(dim=1))
    return torch.tensor(order, dtype=torch.long, device=input_ids.device)


def attention_cost(model: nn.Module) -> float:
    """FLOPs of one attended (query, key) pair over those of one token through a layer's linear
    maps (0 when the config does not say): long suffixes attend to many keys, and a shared pass
    that feeds fewer tokens can still do more work."""
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        hidden, inter, heads = config.hidden_size, config.intermediate_size, config.num_attention_heads
    except AttributeError:
        return 0.0
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    linear = 2 * (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter)
    return 4 * heads * head_dim / linear


def _pass_cost(rows: int, queries: int, keys: int, masked: bool, attention: float) -> float:
    """Work of a pass of `rows` x `queries` tokens over `keys` keys, in token units."""
    pairs = queries * keys * MASKED_PAIR_COST if masked else queries * keys / 2
    return rows * (queries + attention * pairs)


def plan(input_ids: torch.Tensor, attention_mask: torch.Tensor, min_shared: int = MIN_SHARED_PREFIX,
         attention: float = 0.0, weigh_cost: bool = True) -> Plan | None:
    """Cluster the rows so that the tokens saved, sum over clusters of (size - 1) x prefix, is
    largest; None when no two rows share `min_shared` tokens or (`weigh_cost`) sharing would not
    pay: its estimated work (tokens fed plus `attention` x attended pairs, see attention_cost) is
    more than MAX_COST_RATIO of the plain pass's. A padding-free pass always gains from sharing."""
    batch, width = input_ids.shape
    if batch < 2:
        return None
    lengths = attention_mask.sum(dim=1)
    order = _lexicographic(input_ids, lengths)
    ids, lens = input_ids[order], lengths[order]
    # After a lexicographic sort, the common prefix of rows i..j is the minimum of the
    # neighbours' common prefixes in between: one pass gives every segment's prefix.
    cols = torch.arange(width, device=ids.device)
    both = cols[None] < torch.minimum(lens[:-1], lens[1:])[:, None]
    neighbours = ((ids[:-1] == ids[1:]) & both).long().cumprod(dim=1).sum(dim=1).tolist()
    lens_list = lens.tolist()
    # best[j]: most tokens saved over the first j sorted rows; cut[j]: where its last segment starts.
    best, cut = [0] * (batch + 1), [0] * (batch + 1)
    for end in range(1, batch + 1):
        best[end], cut[end] = best[end - 1], end - 1  # row end-1 alone
        shared, shortest = None, lens_list[end - 1]
        for start in range(end - 2, -1, -1):  # segment start..end-1, grown to the left
            shared = neighbours[start] if shared is None else min(shared, neighbours[start])
            shortest = min(shortest, lens_list[start])
            prefix = min(shared, shortest - 1)  # every row keeps a token of its own
            if prefix < min_shared:
                break  # the prefix only shrinks as the segment grows
            gain = best[start] + (end - 1 - start) * prefix
            if gain > best[end]:
                best[end], cut[end] = gain, start
    if best[batch] == 0:
        return None
    segments, end = [], batch
    while end > 0:
        segments.append((cut[end], end))
        end = cut[end]
    segments.reverse()
    cluster = torch.empty(batch, dtype=torch.long)
    leaders, prefixes = [], []
    for index, (start, end) in enumerate(segments):
        members = order[start:end]
        cluster[members] = index
        leaders.append(members[0])
        if len(members) == 1:  # alone: all but its last token goes in the prefix batch (no padding)
            prefixes.append(lens_list[start] - 1)
        else:
            prefixes.append(min(min(neighbours[start:end - 1]), min(lens_list[start:end]) - 1))
    device = input_ids.device
    result = Plan(cluster.to(device), torch.tensor(leaders, device=device), torch.tensor(prefixes, device=device),
                  lengths)
    if not weigh_cost:
        return result
    # Prefixes (C x longest prefix, causal unless padded), suffixes (B x longest suffix, masked).
    suffix, prefix, longest = int((lengths - result.prefix_len[result.cluster]).max()), max(prefixes), max(lens_list)
    shared_cost = (_pass_cost(len(segments), prefix, prefix, min(prefixes) < prefix, attention)
                   + _pass_cost(batch, suffix, prefix + suffix, True, attention))
    plain_cost = _pass_cost(batch, longest, longest, min(lens_list) < longest, attention)
    return result if shared_cost <= MAX_COST_RATIO * plain_cost else None


def fed_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, attention: float = 0.0,
               padding_free: bool = False) -> int:
    """Tokens (padding included) a forward of these rows feeds the decoder, shared where `plan`
    shares, else plain; with `padding_free`, those of the packed sequence (no padding)."""
    if padding_free:
        return len(packed_layout(input_ids, attention_mask).token_index)
    lengths = attention_mask.sum(dim=1)
    layout = plan(input_ids, attention_mask, attention=attention)
    if layout is None:
        return int(lengths.max()) * input_ids.shape[0]
    suffix = int((lengths - layout.prefix_len[layout.cluster]).max())
    return int(layout.prefix_len.max()) * layout.leader.shape[0] + suffix * input_ids.shape[0]


class TokenRows(NamedTuple):
    """A right-padded batch's token tensors, as `micro_batches` reads them (a rollout batch or the
    update's inputs serve as well: anything with these three fields)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor | None = None  # None: no LM head (the critic)


@dataclass(frozen=True)
class PaddingFree:
    """Run a pass's rows as one unpadded sequence (padding_free_hidden_states), after the first
    `skip` tokens of every row, which `prefix` holds encoded for the whole step (EncodedPrefix;
    None with skip=0, or to count tokens before encoding)."""

    skip: int = 0
    prefix: EncodedPrefix | None = None

    def __post_init__(self):
        if self.prefix is not None and self.prefix.length != self.skip:
            raise ValueError(f"skip={self.skip} but the encoded prefix has {self.prefix.length} tokens")

    @classmethod
    def after(cls, prefix: EncodedPrefix | None) -> PaddingFree:
        return cls(prefix.length if prefix is not None else 0, prefix)


def micro_batches(tokens: TokenRows, rows: torch.Tensor, micro_batch_size: int, no_grad: bool = False,
                  attention: float = 0.0, padding_free: PaddingFree | None = None) -> list[torch.Tensor]:
    """`rows` packed by prefix and cut into micro-batches that need no more memory than a plain
    micro-batch of `micro_batch_size` of them, so a shared prompt buys room for more rows: fewer
    passes, and each pass's fixed costs (weight casts and their gradients) paid less often.

    With gradient, what a pass keeps for backward grows with the decoder tokens fed and the
    positions the LM head projects (the sampled tokens): their sum stays within
    micro_batch_size x (longest row + most sampled tokens of a row). Without (`no_grad`), the
    decoder tokens alone stay within micro_batch_size x longest row (the caller projects the
    head in chunks: ragen2.scoring.policy_log_probs). `response_mask` None: no head (the critic).
    `attention`: the model's attention_cost, so the estimate follows the pass `plan` will pick;
    `padding_free`: the rows will run as one packed sequence (padding_free_hidden_states), after
    their first padding_free.skip tokens, encoded once for the step: those are not fed again."""
    input_ids, attention_mask, response_mask = tokens.input_ids, tokens.attention_mask, tokens.response_mask
    rows = rows[packing_order(input_ids[rows], attention_mask[rows])]
    lengths = attention_mask.sum(dim=1)
    sampled = response_mask.sum(dim=1) if response_mask is not None else torch.zeros_like(lengths)
    longest, most_sampled = int(lengths[rows].max()), int(sampled[rows].max())
    skip = padding_free.skip if padding_free is not None else 0
    batches, current = [], rows[:0]
    for row in rows.split(1):
        trial = torch.cat([current, row])
        width = int(lengths[trial].max())
        fed = fed_tokens(input_ids[trial, skip:width], attention_mask[trial, skip:width], attention,
                         padding_free is not None)
        heads = int(sampled[trial].sum())
        if no_grad:
            over = fed > micro_batch_size * longest
        else:
            over = fed + heads > micro_batch_size * (longest + most_sampled)
        if current.numel() and over:
            batches.append(current)
            trial = row
        current = trial
    batches.append(current)
    return batches


def _output_cache(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def supported(body: nn.Module) -> bool:
    """False where the cache cannot carry gradients: gradient checkpointing drops the cache in
    training (transformers sets use_cache=False there), so those forwards stay plain."""
    if torch.is_grad_enabled() and body.training:
        return not any(getattr(m, "gradient_checkpointing", False) for m in body.modules())
    return True


def shared_hidden_states(body: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         layout: Plan) -> torch.Tensor | None:
    """The decoder's last hidden states [B, T, H] computed with each cluster's prefix run once;
    None when the model returns no cache whose rows can be selected."""
    batch, width = input_ids.shape
    device = input_ids.device
    clusters = layout.leader.shape[0]
    prefix_width = int(layout.prefix_len.max())
    cols = torch.arange(prefix_width, device=device)
    prefix_mask = (cols[None] < layout.prefix_len[:, None]).long()
    prefix_ids = input_ids[layout.leader, :prefix_width]  # past a cluster's prefix: masked, never read
    starts = layout.prefix_len[layout.cluster]  # [B]
    suffix_width = int((layout.lengths - starts).max())
    steps = torch.arange(suffix_width, device=device)
    positions = starts[:, None] + steps[None]
    suffix_ids = input_ids.gather(1, positions.clamp(max=width - 1))
    # One embedding call for both passes: its backward writes a dense vocabulary-sized gradient,
    # which two calls would write twice.
    embed = body.get_input_embeddings()
    embeds = embed(torch.cat([prefix_ids.flatten(), suffix_ids.flatten()]))
    prefix_embeds, suffix_embeds = embeds.split([prefix_ids.numel(), suffix_ids.numel()])
    cache_arg = cache_argument(body)
    out = body(inputs_embeds=prefix_embeds.view(clusters, prefix_width, -1), attention_mask=prefix_mask,
               position_ids=cols[None].expand(clusters, -1), use_cache=True)
    cache = _output_cache(out)
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return None
    prefix_hidden = out.last_hidden_state
    cache.batch_select_indices(layout.cluster)  # one indexing op per layer: backward sums the rows
    suffix_mask = (positions < layout.lengths[:, None]).long()
    # The pads of a short prefix sit between it and the row's suffix: masked out, and the
    # suffix's position ids count real tokens, so each row sees what it sees whole.
    mask = torch.cat([prefix_mask[layout.cluster], suffix_mask], dim=1)
    suffix_hidden = body(inputs_embeds=suffix_embeds.view(batch, suffix_width, -1), attention_mask=mask,
                         position_ids=positions, use_cache=True, **{cache_arg: cache}).last_hidden_state
    # Back to the plain layout: position t of row r comes from its cluster's prefix when t is
    # inside it, else from its suffix (pad positions read a clamped suffix position: unused).
    hidden = prefix_hidden.shape[-1]
    source = torch.cat([prefix_hidden.reshape(-1, hidden), suffix_hidden.reshape(-1, hidden)], dim=0)
    t = torch.arange(width, device=device)[None]
    from_prefix = layout.cluster[:, None] * prefix_width + t.clamp(max=prefix_width - 1)
    rows = torch.arange(batch, device=device)[:, None]
    from_suffix = clusters * prefix_width + rows * suffix_width + (t - starts[:, None]).clamp(0, suffix_width - 1)
    index = torch.where(t < starts[:, None], from_prefix, from_suffix)
    return source[index]


@dataclass
class PackedLayout:
    """A micro-batch as one unpadded sequence: each cluster's shared prefix once (clusters of two
    or more rows), then each row's own tokens; see padding_free_hidden_states."""

    token_index: torch.Tensor  # [S] flat index into input_ids of each packed token
    positions: torch.Tensor  # [S] its position in its row
    segments: list[tuple[int, int, int, int]]  # (start, end, prefix_start, prefix_end): attention.packed_attention
    row_index: torch.Tensor  # [B, T] packed position that row r's position t is at (pads: a real one, unused)


def packed_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedLayout:
    """The packed sequence of these right-padded rows: `plan`'s clusters (every shared prefix
    pays when nothing is padded); a row that shares with none goes in whole."""
    batch, width = input_ids.shape
    lengths = attention_mask.sum(dim=1).tolist()
    layout = plan(input_ids, attention_mask, weigh_cost=False)
    cluster = layout.cluster.tolist() if layout is not None else list(range(batch))
    leader = layout.leader.tolist() if layout is not None else list(range(batch))
    prefix = layout.prefix_len.tolist() if layout is not None else [0] * batch
    prefix = [p if cluster.count(c) > 1 else 0 for c, p in enumerate(prefix)]
    pieces, positions, segments, prefix_at, cursor = [], [], [], {}, 0
    for c, p in enumerate(prefix):
        if p:
            pieces.append(leader[c] * width + torch.arange(p))
            positions.append(torch.arange(p))
            segments.append((cursor, cursor + p, cursor, cursor))
            prefix_at[c], cursor = (cursor, cursor + p), cursor + p
    row_prefix_start, row_own_start = [], []
    for r in range(batch):
        p = prefix[cluster[r]]
        start, end = prefix_at.get(cluster[r], (0, 0))
        pieces.append(r * width + torch.arange(p, lengths[r]))
        positions.append(torch.arange(p, lengths[r]))
        segments.append((cursor, cursor + lengths[r] - p, start, end))
        row_prefix_start.append(start)
        row_own_start.append(cursor - p)  # row position t >= p sits at packed position this + t
        cursor += lengths[r] - p
    t = torch.arange(width)[None]
    own_prefix = torch.tensor([prefix[c] for c in cluster])[:, None]
    last = torch.tensor(lengths)[:, None] - 1
    row_index = torch.where(t < own_prefix, torch.tensor(row_prefix_start)[:, None] + t,
                            torch.tensor(row_own_start)[:, None] + t.minimum(last))
    device = input_ids.device
    return PackedLayout(torch.cat(pieces).to(device), torch.cat(positions).to(device), segments, row_index.to(device))


def padding_free_supported(body: nn.Module) -> bool:
    """The packed pass needs ragen2's attention function (ragen2.attention.use_grouped_sdpa), which
    reads the segments; models loaded by ragen2.models run it."""
    return getattr(getattr(body, "config", None), "_attn_implementation", None) == attention_lib.NAME


@dataclass
class EncodedPrefix:
    """Tokens every row of an optimiser step starts with (the system prompt of every demo),
    encoded once for the step instead of once per micro-batch. The micro-batches read its keys
    and values as leaves and their backward passes add up the gradient there; `backward()` then
    sends that sum through the prefix's own pass once: the gradient the rows give it, exactly."""

    length: int
    leaves: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), what micro-batches read
    encoded: list[tuple[torch.Tensor, torch.Tensor]]  # the same from the prefix's pass, with its graph

    def cache(self, body: nn.Module):
        """A fresh cache holding the prefix, for one micro-batch's pass to extend."""
        from transformers import DynamicCache

        cache = DynamicCache(config=body.config)
        for layer, (keys, values) in enumerate(self.leaves):
            cache.update(keys, values, layer)
        return cache

    def backward(self) -> None:
        pairs = [(out, leaf.grad) for outs, leaves in zip(self.encoded, self.leaves)
                 for out, leaf in zip(outs, leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])


def step_prefix_length(tokens: TokenRows, rows: torch.Tensor, min_shared: int = MIN_SHARED_PREFIX) -> int:
    """Tokens all `rows` start with, ending before any row's first trained token's predictor
    (position t's hidden state predicts token t+1, so those stay in the rows' own passes); 0 when
    fewer than `min_shared` or a single row."""
    if rows.numel() < 2:
        return 0
    ids, lengths = tokens.input_ids[rows], tokens.attention_mask[rows].sum(dim=1)
    same = (ids == ids[:1]).all(dim=0).long().cumprod(dim=0).sum()
    trained = tokens.response_mask[rows].bool()
    first_trained = torch.where(trained.any(dim=1), trained.long().argmax(dim=1), lengths)
    length = int(min(same, lengths.min() - 1, first_trained.min() - 1))
    return length if length >= min_shared else 0


def encode_prefix(body: nn.Module, prefix_ids: torch.Tensor) -> EncodedPrefix | None:
    """One pass over `prefix_ids` [P]; None when the model returns no cache layers to read."""
    cache = _output_cache(body(input_ids=prefix_ids[None], use_cache=True))
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    encoded = [(layer.keys, layer.values) for layer in layers]
    grad = torch.is_grad_enabled()
    leaves = [(k.detach().requires_grad_(grad), v.detach().requires_grad_(grad)) for k, v in encoded]
    return EncodedPrefix(int(prefix_ids.shape[0]), leaves, encoded)


def padding_free_hidden_states(body: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                               prefix: EncodedPrefix | None = None) -> torch.Tensor:
    """The decoder's last hidden states [B, T, H] from one packed pass: no padding is computed,
    and each cluster's prefix runs once. Linear maps, norms and MLPs act per token, so packing
    changes nothing there; attention runs per segment (attention.packed_attention) and each
    token keeps its row's position id: every token sees what it sees in its whole row.

    `prefix`: the rows' first prefix.length tokens, encoded already (step_prefix_length); their
    positions' hidden states are not computed here (left as row 0's first: not to be read)."""
    skip = prefix.length if prefix is not None else 0
    packed = packed_layout(input_ids[:, skip:], attention_mask[:, skip:])
    ids = input_ids[:, skip:].reshape(-1)[packed.token_index][None]
    cache = prefix.cache(body) if prefix is not None else None
    cached = {cache_argument(body): cache, "use_cache": True} if cache is not None else {"use_cache": False}
    # A mask of ones: transformers then builds no block mask of its own from the restarting
    # position ids (the segments carry the layout).
    mask = torch.ones(1, skip + ids.shape[1], dtype=attention_mask.dtype, device=ids.device)
    out = body(input_ids=ids, attention_mask=mask, position_ids=skip + packed.positions[None],
               **cached, **{attention_lib.PACKED: packed.segments})
    if cache is not None and cache.get_seq_length() != skip + ids.shape[1]:
        # a layer dropped the cache (gradient checkpointing does): the rows did not see their prefix
        raise RuntimeError("the packed pass did not read the encoded prefix (is gradient checkpointing on?)")
    index = torch.cat([packed.row_index.new_zeros(input_ids.shape[0], skip), packed.row_index], dim=1)
    return out.last_hidden_state[0][index]


def hidden_states(body: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  shared: bool = True, padding_free: PaddingFree | None = None) -> torch.Tensor:
    """The decoder body's last hidden states [B, T, H]: one packed sequence with `padding_free`
    (where the model's attention supports it), shared-prefix where some rows share a prefix (and
    `shared`), else the plain forward."""
    if padding_free is not None and padding_free_supported(body):
        return padding_free_hidden_states(body, input_ids, attention_mask, padding_free.prefix)
    layout = plan(input_ids, attention_mask, attention=attention_cost(body)) if shared and supported(body) else None
    if layout is not None:
        result = shared_hidden_states(body, input_ids, attention_mask, layout)
        if result is not None:
            return result
    return body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
