"""The row cache under bf16 autocast: keys and values kept in bf16, decode steps reading whole rows.

Both are for speed on a CPU (see `kv_rows._stored_dtype` and `KVRows._decode_reads_whole_rows`);
what is tested here is that neither changes the logits, and that each is in effect where it should be.
"""

import pytest
import torch

from ragen2 import precision
from ragen2.rollout import kv_rows
from ragen2.rollout.kv_rows import KVRows
from tests.tiny import tiny_llama

# (tokens appended per row) for 3 rows: a ragged prefill, then decode steps of one token a row
# (rows at different lengths), one more ragged append (a later turn), and decode again.
APPENDS = ([5, 9, 2], [1, 1, 1], [1, 1, 1], [4, 1, 3], [1, 1, 1], [1, 1, 1])


def run_appends(model) -> tuple[list[torch.Tensor], KVRows]:
    torch.manual_seed(0)
    rows = KVRows(model, rows=3, capacity=12)  # too small on purpose: it grows once
    logits = []
    for counts in APPENDS:
        ids = torch.randint(0, 300, (3, max(counts)))
        logits.append(rows.forward(ids, counts))
    return logits, rows


@pytest.fixture()
def bf16_llama(tok):
    return precision.set_compute_dtype(tiny_llama(tok, seed=0), "bfloat16")


def as_before(monkeypatch):
    """The cache as it was: keys stored as they leave the rotary embedding, decode reading [:end]."""
    monkeypatch.setattr(kv_rows, "_stored_dtype", lambda states: states.dtype)
    monkeypatch.setattr(KVRows, "_decode_reads_whole_rows", lambda self: False)


def test_under_bf16_the_cache_is_bf16_and_a_decode_step_reads_whole_contiguous_rows(bf16_llama):
    logits, rows = run_appends(bf16_llama)
    layers = rows.cache.layers
    assert all(buffer.dtype == torch.bfloat16 for layer in layers for buffer in layer.buffers)
    # The last append was a decode step: attention read every slot of the rows, contiguously.
    assert all(layer.keys.is_contiguous() and layer.keys.shape[-2] == rows.capacity for layer in layers)
    assert rows.lengths.tolist() == [sum(c[i] for c in APPENDS) for i in range(3)]
    assert all(torch.isfinite(step).all() for step in logits)


def test_the_bf16_cache_gives_the_logits_of_the_cache_as_it_was(bf16_llama, monkeypatch):
    now, _ = run_appends(bf16_llama)
    as_before(monkeypatch)
    before, rows = run_appends(bf16_llama)
    assert rows.cache.layers[0].buffers[0].dtype == torch.float32  # the patch did restore the old cache
    for a, b in zip(now, before):
        assert torch.allclose(a, b, rtol=0, atol=1e-5 * float(b.abs().max())), float((a - b).abs().max())


def test_in_fp32_a_decode_step_reads_up_to_the_last_slot_and_whole_rows_would_give_the_same_logits(llama, monkeypatch):
    sliced, rows = run_appends(llama)
    assert all(layer.buffers[0].dtype == torch.float32 for layer in rows.cache.layers)
    assert rows.cache.layers[0].keys.shape[-2] == rows.plan.end < rows.capacity
    monkeypatch.setattr(KVRows, "_decode_reads_whole_rows", lambda self: True)
    whole, rows = run_appends(llama)
    assert rows.cache.layers[0].keys.shape[-2] == rows.capacity
    for a, b in zip(whole, sliced):
        assert torch.allclose(a, b, atol=1e-5)
