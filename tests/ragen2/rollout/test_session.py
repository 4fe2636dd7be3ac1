"""The generation session (kv_rows + GenerationSession) against forwards without a cache.

Exactness is the point: the same tokens as whole-row forwards, log-probs equal to a
teacher-forced forward (1e-5), and a cache kept across turns that feeds only the tokens a turn adds.
"""

import subprocess
import sys
import textwrap

import envs
import pytest
import torch

from ragen2.rollout import RolloutConfig, generate, rollout
from ragen2.rollout.kv_rows import KVRows, takes_row_cache
from ragen2.rollout.session import GenerationSession
from tests.tiny import tiny_llama

TEXTS = ["Turn 1:\nState:\n#_P", "a", "<think> push the box </think> and more words here",
         "Turn 1:\nState:\n#_P", "Turn 1:\nState:\n#_P"]


class WholeRows(torch.nn.Module):
    """The same model seen as one that takes no cache: the session then feeds whole rows each step."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None, position_ids=None, **_):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


@pytest.fixture(scope="module")
def uncached(llama):
    assert takes_row_cache(llama) and not takes_row_cache(WholeRows(llama))
    return WholeRows(llama)


def ids_of(tok, texts):
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def kwargs(tok, **overrides):
    base = dict(max_new_tokens=10, temperature=0, stop_strings=("</answer>",), eos_token_ids=[tok.eos_token_id],
                pad_token_id=tok.pad_token_id, tokenizer=tok)
    return {**base, **overrides}


def count_fed(session):
    """Wrap the session's cache so every forward records (rows, tokens fed)."""
    fed = []
    forward = session.cache.forward

    def recording(ids, counts=None, first=0):
        fed.append((ids.shape[0], sum(counts) if counts is not None else ids.numel()))
        return forward(ids, counts, first)

    session.cache.forward = recording
    return fed


def test_row_logits_equal_the_model_forward_with_ragged_appends(llama):
    torch.manual_seed(0)
    seqs = [torch.randint(0, 300, (n,)).tolist() for n in (9, 14, 4)]
    attention = llama.config._attn_implementation
    decoder = KVRows(llama, rows=3, capacity=4)  # too small on purpose: it must grow
    fed = [0, 0, 0]
    for chunk in ([3, 5, 2], [1, 1, 1], [5, 8, 1]):
        counts = [min(c, len(s) - f) for c, s, f in zip(chunk, seqs, fed)]
        ids = torch.zeros(3, max(counts), dtype=torch.long)
        for row, (c, s, f) in enumerate(zip(counts, seqs, fed)):
            ids[row, :c] = torch.tensor(s[f:f + c])
        logits = decoder.forward(ids, counts)
        fed = [f + c for f, c in zip(fed, counts)]
        with torch.no_grad():
            for row in range(3):
                want = llama(input_ids=torch.tensor([seqs[row][:fed[row]]])).logits[0, -1]
                assert torch.allclose(logits[row], want, atol=1e-5)
    assert decoder.lengths.tolist() == fed and decoder.tokens == seqs
    assert llama.config._attn_implementation == attention  # the row attention is for its own forwards only


def test_the_row_cache_and_whole_row_forwards_give_the_same_tokens(tok, llama, uncached):
    prompts = ids_of(tok, TEXTS)
    eos = generate(uncached, prompts, **kwargs(tok))[0].token_ids[3]  # rows stop at different steps
    for temperature, top_p in ((0, 1.0), (1.0, 1.0), (0.8, 0.9)):
        args = kwargs(tok, temperature=temperature, top_p=top_p, eos_token_ids=[eos])
        whole = generate(uncached, prompts, generator=torch.Generator().manual_seed(4), **args)
        cached = generate(llama, prompts, generator=torch.Generator().manual_seed(4), **args)
        assert [r.token_ids for r in cached] == [r.token_ids for r in whole]
        assert [r.finish_reason for r in cached] == [r.finish_reason for r in whole]
        for a, b in zip(cached, whole):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        if temperature == 0:  # greedy row 0 meets the "EOS" by its 4th token: rows finish apart
            assert cached[0].finish_reason == "eos" and len(cached[0].token_ids) <= 4
            assert len({len(r.token_ids) for r in cached}) > 1


def test_group_copies_and_shared_prefix_are_prefilled_once(tok, llama, uncached):
    prefix = "You're a helpful assistant. You are playing a bandit game. Goal: maximize your reward. "
    texts = [prefix + "Turn 1:\nState:\n#_P"] * 3 + [prefix + "Reward:\n1"] * 2
    prompts = ids_of(tok, texts)
    session = GenerationSession(llama, temperature=1.0, tokenizer=tok, pad_token_id=tok.pad_token_id,
                                generator=torch.Generator().manual_seed(0))
    session._grow(len(prompts), 8)
    fed = count_fed(session)
    results = session.generate(range(5), prompts, max_new_tokens=4)
    shared = len(prompts[0]) - 1 - next(i for i in range(len(prompts[0])) if prompts[0][i] != prompts[3][i]) + 1
    common = len(prompts[0]) - shared
    # the shared prefix once (1 row), then the 2 distinct suffixes, then decode steps of 1 token a row
    assert fed[0] == (1, common)
    assert fed[1] == (2, (len(prompts[0]) - common) + (len(prompts[3]) - common))
    assert all(tokens == rows for rows, tokens in fed[2:])
    whole = generate(uncached, prompts, max_new_tokens=4, temperature=1.0, pad_token_id=tok.pad_token_id,
                     tokenizer=tok, generator=torch.Generator().manual_seed(0), stop_strings=())
    assert [r.token_ids for r in results] == [r.token_ids for r in whole]
    assert len({tuple(results[i].token_ids) for i in range(3)}) > 1  # copies sample apart


def test_a_second_turn_feeds_only_what_it_adds_and_equals_a_fresh_prompt(tok, llama):
    prompts = ids_of(tok, TEXTS[:3])
    session = GenerationSession(llama, **{k: v for k, v in kwargs(tok).items() if k != "max_new_tokens"})
    first = session.generate(["a", "b", "c"], prompts, max_new_tokens=6)
    fed = count_fed(session)
    added = tok.encode("Reward:\n0.1\nTurn 2:", add_special_tokens=False)
    second_prompts = [p + r.token_ids + added for p, r in zip(prompts, first)]
    second = session.generate(["c", "a"], [second_prompts[2], second_prompts[0]], max_new_tokens=6)
    # the prefill feeds each row its last sampled token (never fed) + the added text, nothing more
    assert fed[0] == (2, 2 * (1 + len(added)))
    fresh = generate(llama, [second_prompts[2], second_prompts[0]], **kwargs(tok, max_new_tokens=6))  # a new session
    assert [r.token_ids for r in second] == [r.token_ids for r in fresh]
    for a, b in zip(second, fresh):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    # a prompt that diverges from the cache (window mode) is cut back to the common prefix
    window = [prompts[1][:1] + added]
    third = session.generate(["b"], window, max_new_tokens=6)
    assert third[0].token_ids == generate(llama, window, **kwargs(tok, max_new_tokens=6))[0].token_ids


@pytest.mark.parametrize("context", ["full", "window"])
def test_sampling_logprobs_equal_teacher_forced_ones(tok, llama, context):
    cfg = RolloutConfig(group_size=3, max_turns=3, max_new_tokens=12, context=context, stop_strings=("</answer>",))
    batch = rollout(llama, tok, lambda: envs.make("sokoban"), [3, 4], cfg, torch.Generator().manual_seed(1))
    assert max(t.reward is not None and len(t.turn_rewards) for t in batch.trajectories) > 1  # really multi-turn
    mask = batch.response_mask.bool()
    with torch.no_grad():  # the trainer's view: one right-padded forward, no cache
        logits = llama(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    teacher = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    assert (teacher[mask[:, 1:]] - batch.sampling_logprobs[mask]).abs().max() <= 1e-5


def test_rollouts_with_the_row_cache_and_with_whole_rows_are_the_same(tok, llama, uncached):
    def run(model):
        cfg = RolloutConfig(group_size=2, max_turns=3, max_new_tokens=10)
        return rollout(model, tok, lambda: envs.make("sokoban"), [5], cfg, torch.Generator().manual_seed(2))

    cached, whole = run(llama), run(uncached)
    assert torch.equal(cached.input_ids, whole.input_ids)
    assert torch.allclose(cached.sampling_logprobs, whole.sampling_logprobs, atol=1e-5)


SCRIPT = textwrap.dedent("""
    import torch, envs
    from ragen2.rollout import RolloutConfig, rollout
    from tests.tiny import tiny_llama, tiny_tokenizer
    tok = tiny_tokenizer("chatml")
    batch = rollout(tiny_llama(tok, seed=0), tok, lambda: envs.make("sokoban"), [7],
                    RolloutConfig(group_size=2, max_turns=2, max_new_tokens=8), torch.Generator().manual_seed(9))
    print(batch.input_ids.tolist())
""")


def test_a_fixed_generator_gives_the_same_tokens_in_another_process(tok, llama):
    here = rollout(llama, tok, lambda: envs.make("sokoban"), [7],
                   RolloutConfig(group_size=2, max_turns=2, max_new_tokens=8), torch.Generator().manual_seed(9))
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=True)
    theirs = out.stdout.strip().splitlines()[-1]
    assert theirs == str(here.input_ids.tolist()), (len(theirs), len(str(here.input_ids.tolist())), here.input_ids.shape)


def test_bad_row_requests_get_clear_errors(llama):
    rows = KVRows(llama, rows=2, capacity=8)
    with pytest.raises(ValueError, match="outside the cache's 2 rows"):
        rows.forward(torch.zeros(2, 3, dtype=torch.long), first=1)
    with pytest.raises(ValueError, match="between 1 and 3 tokens"):
        rows.forward(torch.zeros(2, 3, dtype=torch.long), counts=[3, 0])
    assert rows.lengths.tolist() == [0, 0]


def test_a_lora_model_samples_through_the_row_cache_exactly(tok):
    pytest.importorskip("peft")
    from ragen2.models import LoraSettings, apply_lora

    lora = apply_lora(tiny_llama(tok, seed=3), LoraSettings(rank=4))
    with torch.no_grad():  # non-zero adapters, so the LoRA path changes the logits
        for name, parameter in lora.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    assert takes_row_cache(lora)
    prompts = ids_of(tok, TEXTS[:3])
    args = kwargs(tok, temperature=1.0, max_new_tokens=8)
    cached = generate(lora, prompts, generator=torch.Generator().manual_seed(5), **args)
    whole = generate(WholeRows(lora), prompts, generator=torch.Generator().manual_seed(5), **args)
    assert [r.token_ids for r in cached] == [r.token_ids for r in whole]
    for a, b in zip(cached, whole):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
