"""Padding-free passes (shared_prefix.padding_free_hidden_states) equal the plain padded ones:
log-probs, entropies, losses and every parameter's gradient, in fp32 to 1e-4 of each tensor's
largest magnitude; so does a step whose common prefix is encoded once (EncodedPrefix) and whose
micro-batches add their gradients through it. Each test also checks the packed pass really ran
(the decoder fed exactly the unpadded tokens, shared prompts once), so a silent fallback fails it.
"""

from __future__ import annotations

import pytest
import torch

from ragen2 import shared_prefix as prefix_lib
from ragen2.attention import use_grouped_sdpa
from ragen2.engines.local import learner
from tests.ragen2.engines.local.test_shared_prefix import (FedTokens, _grads, _lora, close, group_batch,
                                                          no_shared_batch, template, tok)  # noqa: F401 (fixtures)
from tests.tiny import tiny_llama


def _pass(model, fed, ids, attn, mask, padding_free: bool, prefix=None):
    """(log-probs, entropy, loss, tokens fed) of an actor-like loss; the loss is backpropagated."""
    before = fed.count
    packed = prefix_lib.PaddingFree.after(prefix) if padding_free else None
    log_probs, entropy = learner.policy_log_probs(model, learner.TokenRows(ids, attn, mask), temperature=0.7,
                                                  with_entropy=True, padding_free=packed)
    advantages = torch.linspace(-1, 1, ids.shape[1]).expand_as(mask) * mask
    loss = -(log_probs * advantages).sum() / 50 - 0.01 * (entropy * mask).sum() / 50
    loss.backward()
    return log_probs.detach(), entropy.detach(), loss.detach(), fed.count - before


def _unpadded_tokens(ids, attn) -> int:
    """What one packed pass feeds: each cluster's shared prefix once, then each row's own tokens."""
    packed = prefix_lib.packed_layout(ids, attn)
    return len(packed.token_index)


@pytest.mark.parametrize("turns", [1, 3])
@pytest.mark.parametrize("lora", [False, True])
def test_padding_free_log_probs_loss_and_gradients_equal_the_padded_pass(tok, template, turns, lora):
    model = use_grouped_sdpa(tiny_llama(tok, seed=1))
    model = _lora(model) if lora else model
    model.train()
    ids, attn, mask = group_batch(tok, template, turns=turns)
    fed = FedTokens(model.get_decoder())
    model.zero_grad(set_to_none=True)
    plain = _pass(model, fed, ids, attn, mask, padding_free=False)
    plain_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    packed = _pass(model, fed, ids, attn, mask, padding_free=True)
    # two groups of three: each group's prompt once, no padding
    assert packed[3] == _unpadded_tokens(ids, attn) < int(attn.sum()) < plain[3]
    close(packed[0], plain[0], "log-probs")
    close(packed[1], plain[1], "entropy")
    close(packed[2], plain[2], "loss")
    for name, grad in _grads(model).items():
        close(grad, plain_grads[name], f"grad {name}")
    assert (packed[0][mask == 0] == 0).all()


def test_rows_sharing_nothing_pack_whole_and_unpadded(tok):
    model = use_grouped_sdpa(tiny_llama(tok, seed=2)).train()
    ids, attn, mask = no_shared_batch(tok)
    fed = FedTokens(model.get_decoder())
    plain = _pass(model, fed, ids, attn, mask, padding_free=False)
    packed = _pass(model, fed, ids, attn, mask, padding_free=True)
    assert packed[3] == int(attn.sum()) < plain[3]
    close(packed[0], plain[0], "log-probs")
    close(packed[1], plain[1], "entropy")


def test_a_step_prefix_encoded_once_gives_the_whole_batch_gradient(tok, template):
    """Micro-batches of one row each read the step's common prefix from one encoding; their
    gradients, summed through it by EncodedPrefix.backward, are the padded whole batch's."""
    model = use_grouped_sdpa(tiny_llama(tok, seed=3)).train()
    ids, attn, mask = group_batch(tok, template, turns=2)
    rows = torch.arange(ids.shape[0])
    fed = FedTokens(model.get_decoder())
    model.zero_grad(set_to_none=True)
    plain = _pass(model, fed, ids, attn, mask, padding_free=False)
    plain_grads = _grads(model)

    tokens = learner.TokenRows(ids, attn, mask)
    skip = prefix_lib.step_prefix_length(tokens, rows)
    assert skip >= prefix_lib.MIN_SHARED_PREFIX  # the system prompt and the first state's opening
    model.zero_grad(set_to_none=True)
    start = fed.count
    prefix = prefix_lib.encode_prefix(model.get_decoder(), ids[0, :skip])
    parts = prefix_lib.micro_batches(tokens, rows, 1, padding_free=prefix_lib.PaddingFree.after(prefix))
    assert len(parts) > 1
    log_probs = torch.zeros_like(plain[0])
    for part in parts:
        out = _pass(model, fed, ids[part], attn[part], mask[part], padding_free=True, prefix=prefix)
        log_probs[part] = out[0]
    prefix.backward()
    fed_once = skip + sum(_unpadded_tokens(ids[part, skip:], attn[part, skip:]) for part in parts)
    assert fed.count - start == fed_once <= int(attn.sum()) - (len(rows) - 1) * skip
    close(log_probs, plain[0], "log-probs")
    for name, grad in _grads(model).items():
        close(grad, plain_grads[name], f"grad {name}")


def test_the_step_prefix_stops_before_the_first_trained_tokens_predictor():
    ids = torch.tensor([[5] * 30 + [6] * 10, [5] * 30 + [7] * 10, [5] * 40])
    attn = torch.ones_like(ids)
    mask = torch.zeros(ids.shape)
    mask[0, 25:] = 1  # row 0 trains from position 25: hidden state 24 predicts it
    tokens = learner.TokenRows(ids, attn, mask)
    assert prefix_lib.step_prefix_length(tokens, torch.arange(3)) == 24
    mask[0, 25:] = 0  # no trained token at all: the common prefix (30), below each row's last token
    assert prefix_lib.step_prefix_length(tokens, torch.arange(3)) == 30
    assert prefix_lib.step_prefix_length(tokens, torch.arange(1)) == 0  # one row: nothing to share
    mask[1, 10:] = 1  # too short to pay
    assert prefix_lib.step_prefix_length(tokens, torch.arange(3)) == 0


def test_models_without_ragens_attention_run_padded(tok, template):
    """The packed pass needs ragen2's attention function to read its segments: without it the
    padded pass runs (the same numbers, the padded tokens fed)."""
    model = tiny_llama(tok, seed=2).train()  # transformers' own sdpa
    assert not prefix_lib.padding_free_supported(model.get_decoder())
    ids, attn, mask = group_batch(tok, template)
    fed = FedTokens(model.get_decoder())
    plain = _pass(model, fed, ids, attn, mask, padding_free=False)
    packed = _pass(model, fed, ids, attn, mask, padding_free=True)
    assert packed[3] == plain[3] and torch.equal(packed[0], plain[0])


def test_gradient_checkpointing_packs_without_a_step_prefix(tok, template):
    """Checkpointed layers drop the cache an encoded prefix travels in: sft encodes none there
    (sft.step_prefix), and the packed pass alone, which needs no cache, still equals the padded one."""
    from ragen2.engines.local.sft import step_prefix

    model = use_grouped_sdpa(tiny_llama(tok, seed=2))
    model.gradient_checkpointing_enable()
    model.train()
    ids, attn, mask = group_batch(tok, template)
    tokens = learner.TokenRows(ids, attn, mask)
    assert prefix_lib.step_prefix_length(tokens, torch.arange(ids.shape[0])) > 0
    assert step_prefix(model, tokens, torch.arange(ids.shape[0])) is None
    fed = FedTokens(model.get_decoder())
    plain = _pass(model, fed, ids, attn, mask, padding_free=False)
    packed = _pass(model, fed, ids, attn, mask, padding_free=True)
    assert packed[3] == _unpadded_tokens(ids, attn) < plain[3]
    close(packed[0], plain[0], "log-probs")


def test_an_encoded_prefix_and_a_skip_that_disagree_are_refused():
    prefix = prefix_lib.EncodedPrefix(12, [], [])
    assert prefix_lib.PaddingFree.after(prefix).skip == 12 and prefix_lib.PaddingFree.after(None).skip == 0
    with pytest.raises(ValueError, match="skip=10 but the encoded prefix has 12 tokens"):
        prefix_lib.PaddingFree(10, prefix)


def test_a_packed_pass_whose_layers_drop_the_prefix_cache_fails_loudly(tok, template):
    """Checkpointed layers drop the cache: rows that silently missed their prefix would train on
    wrong hidden states, so the pass raises (sft never gets here: step_prefix encodes none)."""
    model = use_grouped_sdpa(tiny_llama(tok, seed=2))
    ids, attn, mask = group_batch(tok, template)
    skip = prefix_lib.step_prefix_length(learner.TokenRows(ids, attn, mask), torch.arange(ids.shape[0]))
    model.train()
    prefix = prefix_lib.encode_prefix(model.get_decoder(), ids[0, :skip])
    model.gradient_checkpointing_enable()
    with pytest.raises(RuntimeError, match="did not read the encoded prefix"):
        prefix_lib.padding_free_hidden_states(model.get_decoder(), ids, attn, prefix)


def test_sft_says_when_padding_free_cannot_run(tok):
    from ragen2.config import load_config
    from ragen2.engines.local.sft import padding_free_note

    cfg = load_config(overrides=["sft.padding_free=true"])
    assert padding_free_note(cfg, use_grouped_sdpa(tiny_llama(tok))) is None
    eager = tiny_llama(tok)
    eager.set_attn_implementation("eager")
    assert "runs 'eager'" in padding_free_note(cfg, eager)
    checkpointing = load_config(overrides=["sft.padding_free=true", "model.gradient_checkpointing=true"])
    assert "gradient checkpointing" in padding_free_note(checkpointing, use_grouped_sdpa(tiny_llama(tok)))
    assert padding_free_note(load_config(overrides=["sft.padding_free=false"]), eager) is None


def test_the_rl_update_says_when_padding_free_cannot_run(tok):
    """optim.padding_free (on by default) on a model whose attention is not ragen2's: the trainer
    logs this line (trainer.setup) instead of running the padded passes unsaid."""
    from ragen2.engines.local import learner

    what = "the update and the log-prob and value passes"
    assert learner.padding_free_refusal("optim.padding_free", True, use_grouped_sdpa(tiny_llama(tok)), what) is None
    eager = tiny_llama(tok)
    eager.set_attn_implementation("eager")
    line = learner.padding_free_refusal("optim.padding_free", True, eager, what)
    assert "optim.padding_free" in line and "runs 'eager'" in line and what in line
    assert learner.padding_free_refusal("optim.padding_free", False, eager, what) is None
