"""Cross-scoring with a reused prompt KV cache equals one-pair-at-a-time full forwards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from mi_probe import cross_score, cross_score_naive, mi_metrics_both, sample_trajectory_turns  # noqa: E402

VOCAB = 64


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    return transformers.LlamaForCausalLM(config).eval().float()


def _tokens(generator, lengths):
    return [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(7)
    prompts = _tokens(g, (1, 3, 6, 9))
    prompts.append(list(prompts[2]))  # column 4 repeats column 2's prompt
    reasonings = _tokens(g, (4, 1, 13, 0, 2, 8, 5, 1, 0))
    owners = [0, 1, 2, 3, 4, 0, 2, 4, 1]
    return prompts, reasonings, owners


@pytest.fixture(scope="module")
def naive(model, batch):
    return cross_score_naive(model, *batch)


@pytest.mark.parametrize("micro_batch_size", [1, 4, 16])  # 4: an uneven last micro-batch
def test_cached_cross_score_equals_naive_loop(model, batch, naive, micro_batch_size):
    fast = cross_score(model, *batch, micro_batch_size=micro_batch_size)
    assert fast.L.shape == naive.L.shape == (7, 5)
    torch.testing.assert_close(fast.L, naive.L, atol=1e-5, rtol=0)
    # L_sum = L x length; the same per-token tolerance, scaled by length.
    per_token = (fast.L_sum - naive.L_sum).abs() / fast.token_counts.unsqueeze(1)
    assert per_token.max().item() < 1e-5
    assert torch.equal(fast.owner, naive.owner) and torch.equal(fast.row_index, naive.row_index)


@pytest.mark.parametrize("tails", [(1, 3, 5, 2), (1, 1, 4, 2)])  # (1, 1, ...): two prompts end where the rest go on
def test_prompts_sharing_a_system_prefix_score_as_the_naive_loop(model, tails):
    g = torch.Generator().manual_seed(11)
    system = _tokens(g, (12,))[0]
    prompts = [system + tail for tail in _tokens(g, tails)]
    prompts.append(list(prompts[1]))  # a repeated prompt: one column computed for both
    reasonings = _tokens(g, (4, 7, 1, 9, 3, 6))
    owners = [0, 1, 2, 3, 4, 0]
    calls = []  # the decoder runs the prompts (the head, only the positions scored)
    hook = model.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: calls.append((*kwargs["input_ids"].shape, kwargs["attention_mask"].dim())),
        with_kwargs=True)
    try:
        fast = cross_score(model, prompts, reasonings, owners, micro_batch_size=8)
    finally:
        hook.remove()
    # The reasonings run packed, under a [rows, 1, queries, keys] mask; a prompt under a plain one.
    prompt_forwards = [width for rows, width, mask_dims in calls if rows == 1 and mask_dims == 2]
    assert prompt_forwards == [12, *tails]  # the shared system prefix once, then each prompt's own tokens
    slow = cross_score_naive(model, prompts, reasonings, owners)
    torch.testing.assert_close(fast.L, slow.L, atol=1e-5, rtol=0)


def test_the_head_projects_only_positions_that_predict_a_scored_token(model):
    g = torch.Generator().manual_seed(5)
    prompts = _tokens(g, (6, 9, 4))
    reasonings = _tokens(g, (4, 7, 1, 9, 3))
    owners = [0, 1, 2, 0, 1]
    projected = []
    hook = model.get_output_embeddings().register_forward_hook(lambda _, args, out: projected.append(out.shape[0]))
    try:
        fast = cross_score(model, prompts, reasonings, owners, micro_batch_size=2)
    finally:
        hook.remove()
    # Per prompt: its last position (the first token of every row), then each row's later tokens;
    # no prompt position, no pad (micro-batches of 2 rows of unequal length are padded).
    assert sum(projected) == len(prompts) * (1 + sum(len(z) - 1 for z in reasonings))
    torch.testing.assert_close(fast.L, cross_score_naive(model, prompts, reasonings, owners).L, atol=1e-5, rtol=0)


class _ForwardOnly(torch.nn.Module):
    """A causal LM that exposes only its forward (no decoder / head to split)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, **kwargs):
        return self.inner(**kwargs)


def test_a_model_that_cannot_be_split_runs_whole_and_scores_the_same(model, batch, naive):
    whole = cross_score(_ForwardOnly(model), *batch, micro_batch_size=3)
    torch.testing.assert_close(whole.L, naive.L, atol=1e-5, rtol=0)
    asked_whole = cross_score(model, *batch, micro_batch_size=3, split_head=False)
    torch.testing.assert_close(asked_whole.L, naive.L, atol=1e-5, rtol=0)


def test_bookkeeping_of_rows_and_columns(batch, naive):
    # The two empty reasonings (inputs 3 and 8) are dropped and counted; the rest keep input order.
    assert naive.num_empty_dropped == 2
    assert naive.row_index.tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert naive.owner.tolist() == [0, 1, 2, 4, 0, 2, 4]
    assert naive.token_counts.tolist() == [4, 1, 13, 2, 8, 5, 1]
    assert naive.column_ids == [0, 1, 2, 3, 2]
    torch.testing.assert_close(naive.L, naive.L_sum / naive.token_counts.unsqueeze(1).float())
    assert (naive.L < 0).all()  # log-probs of a random model
    # Identical prompt tokens give identical columns.
    assert torch.equal(naive.L[:, 2], naive.L[:, 4])


def test_single_token_reasoning_is_its_first_token_log_prob(model, batch, naive):
    prompts, reasonings, _ = batch
    # Row 1 is reasoning [t]: its score under prompt j is log softmax(last prompt logits)[t].
    token = reasonings[1][0]
    for j, prompt in enumerate(prompts):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
        expected = torch.log_softmax(logits, dim=-1)[token]
        assert naive.L[1, j].item() == pytest.approx(expected.item(), abs=1e-6)


def test_scores_feed_the_estimators(naive):
    scores = naive
    m = mi_metrics_both(scores.L, scores.L_sum, scores.owner, column_ids=scores.column_ids)
    assert m["num_rows"] == 7 and m["num_prompts"] == 5 and m["num_distinct_prompts"] == 4
    assert m["mi_estimate"] <= m["mi_upper_bound"]


def test_mode_is_restored_and_no_grad_is_kept(model, batch):
    prompts, reasonings, owners = batch
    model.train()
    model.model.layers[0].eval()  # a mixed state must come back as it was
    try:
        scores = cross_score(model, prompts[:2], reasonings[:2], [0, 1])
        assert model.training and not model.model.layers[0].training and model.model.layers[1].training
        assert not scores.L.requires_grad
    finally:
        model.eval()


class _PastKeyValuesWrapper(torch.nn.Module):
    """A forward that names its cache ``past_key_values`` (transformers 4.x / trainer wrappers)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, cache=past_key_values,
                          use_cache=use_cache)


def test_past_key_values_forward_signature_is_supported(model, batch, naive):
    prompts, reasonings, owners = batch
    wrapped = _PastKeyValuesWrapper(model).eval()
    scores = cross_score(wrapped, prompts, reasonings[:3], owners[:3], micro_batch_size=2)
    torch.testing.assert_close(scores.L, naive.L[:3], atol=1e-5, rtol=0)


def test_all_empty_reasoning_gives_no_rows(model):
    scores = cross_score(model, [[1, 2], [3]], [[], []], [0, 1])
    assert scores.L.shape == (0, 2) and scores.num_empty_dropped == 2


@pytest.mark.parametrize(
    ("prompts", "reasonings", "owners", "kwargs", "match"),
    [
        ([[1], []], [[2]], [0], {}, r"prompts\[1\] is empty"),
        ([[1], [2]], [[2]], [2], {}, r"owners\[0\] = 2 is not a column index"),
        ([[1], [2]], [[2], [3]], [0], {}, "2 reasonings but 1 owners"),
        ([[1], [2]], [[VOCAB]], [0], {}, "vocab_size 64"),
        ([[1], [-2]], [[3]], [0], {}, "token ids must be ints >= 0"),
        ([[1], [2]], [[1.5]], [0], {}, "token ids must be ints >= 0"),
        ([[1], [2]], [[3]], [0], {"micro_batch_size": 0}, "micro_batch_size"),
        ([[1], [2]], [[3]], [0], {"pad_token_id": VOCAB}, "pad_token_id"),
        ([], [[3]], [0], {}, "at least one prompt"),
    ],
)
def test_bad_input_is_a_specific_error(model, prompts, reasonings, owners, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cross_score(model, prompts, reasonings, owners, **kwargs)


def test_text_instead_of_token_ids_is_a_type_error(model):
    with pytest.raises(TypeError, match="sequence of token ids"):
        cross_score(model, ["hello <think>"], [[1]], [0])


# ---------------------------------------------------------------- trajectory sampler
TURNS = [1, 4, 0, 2]  # 3 trajectories with turns: P(0,0)=1/3, P(1,t)=1/12, P(3,t)=1/6


def test_sampler_draws_trajectory_uniform_pairs():
    expected = {(0, 0): 1 / 3, **{(1, t): 1 / 12 for t in range(4)}, (3, 0): 1 / 6, (3, 1): 1 / 6}
    for rng in (np.random.default_rng(0), torch.Generator().manual_seed(0)):
        draws = []
        for _ in range(2000):
            draws += sample_trajectory_turns(TURNS, num_samples=64, rng=rng)
        assert len(draws) == 2000 * 7  # min(64, 7 pairs) per call
        for pair, p in expected.items():
            assert draws.count(pair) / len(draws) == pytest.approx(p, abs=0.01)
        assert set(draws) == set(expected)  # trajectory 2 has no turn to draw


def test_sampler_is_deterministic_and_sizes_follow_num_samples():
    turns = [3] * 40  # 120 pairs
    a = sample_trajectory_turns(turns, rng=np.random.default_rng(5))
    b = sample_trajectory_turns(turns, rng=np.random.default_rng(5))
    assert a == b and len(a) == 64
    t1 = sample_trajectory_turns(turns, 10, rng=torch.Generator().manual_seed(3))
    t2 = sample_trajectory_turns(turns, 10, rng=torch.Generator().manual_seed(3))
    assert t1 == t2 and len(t1) == 10
    assert len(sample_trajectory_turns(turns, None, rng=np.random.default_rng(0))) == 120
    no_repeat = sample_trajectory_turns(TURNS, 7, rng=np.random.default_rng(1), replace=False)
    assert sorted(no_repeat) == [(0, 0), (1, 0), (1, 1), (1, 2), (1, 3), (3, 0), (3, 1)]
    assert sample_trajectory_turns([0, 0], rng=np.random.default_rng(0)) == []


def test_sampler_rejects_bad_input():
    with pytest.raises(ValueError, match="turn counts must be ints >= 0"):
        sample_trajectory_turns([2, -1], rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="num_samples"):
        sample_trajectory_turns([2], 0, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="numpy Generator or a torch Generator"):
        sample_trajectory_turns([2], rng=np.random.RandomState(0))


def test_pad_token_choice_does_not_change_scores(model, batch, naive):
    prompts, reasonings, owners = batch
    # Rows of lengths 4, 1, 13 (and an empty one) in one micro-batch: two rows are padded.
    scores = cross_score(model, prompts, reasonings[:4], owners[:4], micro_batch_size=4, pad_token_id=VOCAB - 1)
    torch.testing.assert_close(scores.L, naive.L[:3], atol=1e-5, rtol=0)


# --- the trainer's probe: which pairs, and scores it cannot use -------------------------------

THINK_ID = 60


class _Tok:
    """What `ragen2.instruments.probe.Probe` asks of a tokenizer: `<think>`'s ids, a pad id, decode."""

    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [THINK_ID]}

    def decode(self, ids, skip_special_tokens=False):
        return ""  # the prompt does not end in <think>: the probe appends it


def _first_turn_batch():
    """Groups 0, 0, 1, 2; the assistant turn starts at position 4. Group 2's only member wrote
    no reasoning (an empty span), as a format failure would."""
    from types import SimpleNamespace

    mask = torch.zeros(4, 10, dtype=torch.bool)
    mask[:, 4:] = True
    spans = [(0, 0, 4, 6), (1, 0, 4, 7), (2, 0, 4, 5), (3, 0, 4, 4)]
    return SimpleNamespace(group_ids=torch.tensor([0, 0, 1, 2]), response_mask=mask,
                           input_ids=torch.arange(40).reshape(4, 10) % VOCAB, reasoning_spans=spans)


def test_first_turn_probe_has_columns_only_for_groups_with_sampled_reasoning(model):
    from ragen2.config import ProbeSection
    from ragen2.instruments.probe import Probe

    probe = Probe(ProbeSection(num_samples=64), _Tok())
    batch = _first_turn_batch()
    prompts, reasonings, owners = probe.pairs(batch, step=0)
    # RAGEN-2: the columns are the groups present among the valid pairs (0 and 1, not 2)
    assert prompts == [[0, 1, 2, 3, THINK_ID], [20, 21, 22, 23, THINK_ID]]
    assert reasonings == [[4, 5], [14, 15, 16], [24]] and owners == [0, 0, 1]
    metrics = probe.measure(model, batch, step=0, update_ema=False)
    reference = mi_metrics_both(*[getattr(cross_score_naive(model, prompts, reasonings, owners), k)
                                  for k in ("L", "L_sum", "owner")])
    assert metrics["probe/num_prompts"] == 2 and metrics["probe/retrieval_chance_level@1"] == 0.5
    assert metrics["probe/mi_estimate"] == pytest.approx(reference["mi_estimate"], abs=1e-6)
    assert metrics["probe/mi_estimate"] <= np.log(2) + 1e-6  # the bound of 2 columns, not log 3


def _scores(L, owner):
    from mi_probe.cross_scoring import CrossScores

    L = torch.tensor(L, dtype=torch.float32)
    n = L.shape[0]
    return CrossScores(L=L, L_sum=2 * L, owner=torch.tensor(owner), row_index=torch.arange(n),
                       token_counts=torch.full((n,), 2), column_ids=list(range(L.shape[1])), num_empty_dropped=0)


def test_non_finite_scores_drop_their_rows_and_columns_not_the_run(model, monkeypatch):
    import mi_probe
    from ragen2.config import ProbeSection
    from ragen2.instruments.probe import Probe, usable_scores

    nan = float("nan")
    # column 2 is NaN for every row (a prompt the model cannot score): it goes, and so does
    # row 3, which it owns; row 1's NaN under column 0 drops row 1 only.
    scores = _scores([[-1.0, -2.0, nan], [nan, -1.0, nan], [-3.0, -1.5, nan], [-1.0, -1.0, nan],
                      [-2.5, -0.5, nan]], owner=[0, 1, 1, 2, 1])
    L, L_sum, owner, column_ids, dropped = usable_scores(scores)
    assert L.tolist() == [[-1.0, -2.0], [-3.0, -1.5], [-2.5, -0.5]] and torch.equal(L_sum, 2 * L)
    assert owner.tolist() == [0, 1, 1] and column_ids == [0, 1] and dropped == 2
    # Through the probe: metrics of the finite rows, by hand. matched = [-1, -1.5, -0.5];
    # marginal_i = logsumexp(row) - log 2; MI = mean(matched - marginal).
    monkeypatch.setattr(mi_probe, "cross_score", lambda *a, **k: scores)
    probe = Probe(ProbeSection(), _Tok())
    metrics = probe.measure(model, _first_turn_batch(), step=0)
    rows = torch.tensor([[-1.0, -2.0], [-3.0, -1.5], [-2.5, -0.5]], dtype=torch.float64)
    marginal = torch.logsumexp(rows, dim=1) - np.log(2)
    expected = float((torch.tensor([-1.0, -1.5, -0.5], dtype=torch.float64) - marginal).mean())
    assert metrics["probe/mi_estimate"] == pytest.approx(expected, abs=1e-6)
    assert metrics["probe/num_nonfinite_dropped"] == 2 and np.isfinite(metrics["probe/mi_zscore_ema"])
    # Nothing usable left (every row NaN somewhere): the probe skips, it does not raise.
    monkeypatch.setattr(mi_probe, "cross_score", lambda *a, **k: _scores([[nan, -1.0], [-1.0, nan]], [0, 1]))
    assert probe.measure(model, _first_turn_batch(), step=1) == {
        "probe/skipped_too_few_groups": 1.0, "probe/num_pairs": 3.0, "probe/num_nonfinite_dropped": 2.0,
        "probe/dtype": "float32"}  # what it would have scored in: the fp32 model's own dtype


def _reasoning_forwards(model, run):
    """(rows, width, mask dims) of each decoder forward that feeds reasoning tokens (position ids given)."""
    calls = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: calls.append((*kwargs["input_ids"].shape, kwargs["attention_mask"].dim(),
                                              kwargs.get("position_ids") is not None)), with_kwargs=True)
    try:
        result = run()
    finally:
        hook.remove()
    return result, calls


@pytest.mark.parametrize("micro_batch_size", [1, 2, 16])
def test_packed_rows_score_as_padded_rows_and_the_naive_loop(model, micro_batch_size):
    # Lengths from 1 (no token fed: scored from the prompt's last logits) up; the short rows fit
    # together in the room of the longest.
    g = torch.Generator().manual_seed(3)
    prompts = _tokens(g, (5, 8, 2))
    reasonings = _tokens(g, (1, 14, 2, 3, 1, 6, 2, 9, 4))
    owners = [0, 1, 2, 0, 1, 2, 0, 1, 2]
    packed, calls = _reasoning_forwards(model, lambda: cross_score(model, prompts, reasonings, owners,
                                                                  micro_batch_size=micro_batch_size))
    padded = cross_score(model, prompts, reasonings, owners, micro_batch_size=micro_batch_size, pack=False)
    slow = cross_score_naive(model, prompts, reasonings, owners)
    torch.testing.assert_close(packed.L, padded.L, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed.L, slow.L, atol=1e-5, rtol=0)
    fed_forwards = [(rows, width) for rows, width, _, positioned in calls if positioned]
    # Per prompt: packs no wider than the longest row (13 fed tokens), micro_batch_size of them a
    # forward; the 33 fed tokens fit 3 packs (13 | 8 5 | 3 2 1 1 and the two 1-token rows), where
    # padding would run 9 rows of 13.
    assert all(width <= 13 and rows <= micro_batch_size for rows, width in fed_forwards)
    assert sum(rows for rows, _ in fed_forwards) == 3 * len(prompts)
    if micro_batch_size >= 3:
        assert fed_forwards == [(3, 13)] * len(prompts)


def test_models_whose_attention_adds_its_mask_are_padded_not_packed():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    config._attn_implementation = "eager"  # adds a float mask: a boolean one would be read as 0/1
    eager = transformers.LlamaForCausalLM(config).eval().float()
    g = torch.Generator().manual_seed(4)
    prompts, reasonings, owners = _tokens(g, (5, 8)), _tokens(g, (3, 7, 2, 5)), [0, 1, 0, 1]
    scores, calls = _reasoning_forwards(eager, lambda: cross_score(eager, prompts, reasonings, owners))
    assert all(mask_dims == 2 for _, _, mask_dims, _ in calls)
    torch.testing.assert_close(scores.L, cross_score_naive(eager, prompts, reasonings, owners).L, atol=1e-5, rtol=0)


def test_packing_on_a_qwen2_model_and_windowed_attention_falls_back():
    import mi_probe.cross_scoring as cross_scoring

    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    qwen = transformers.Qwen2ForCausalLM(config).eval().float()
    g = torch.Generator().manual_seed(9)
    prompts, reasonings, owners = _tokens(g, (6, 4, 7)), _tokens(g, (5, 1, 8, 3, 2)), [0, 1, 2, 0, 1]
    assert cross_scoring._takes_boolean_masks(qwen)
    scores, calls = _reasoning_forwards(qwen, lambda: cross_score(qwen, prompts, reasonings, owners))
    assert any(mask_dims == 4 for _, _, mask_dims, _ in calls)
    torch.testing.assert_close(scores.L, cross_score_naive(qwen, prompts, reasonings, owners).L, atol=1e-5, rtol=0)
    windowed = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                        sliding_window=4, max_window_layers=0)
    assert not cross_scoring._takes_boolean_masks(transformers.Qwen2ForCausalLM(windowed))
