"""Frozen weights under bf16 autocast: cast once per outermost context, not at every use.

autocast caches its cast of a weight only when the weight requires grad, so a frozen model (the
reference of a KL term, a LoRA model's base layers) was cast again at every use: every decode
step of a rollout, twice per micro-batch of a shared-prefix pass. `precision.autocast` now lends
each frozen linear layer one copy for the whole context (`precision._autocast_lending_frozen_copies`).
"""

import copy

import pytest
import torch

from ragen2 import precision
from ragen2.engines.local import learner
from ragen2.rollout import generate
from tests.tiny import tiny_llama, tiny_tokenizer
from tests.weight_casts import CountWeightCasts


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer("chatml")


def frozen_bf16(model):
    return precision.set_compute_dtype(copy.deepcopy(model).eval().requires_grad_(False), torch.bfloat16)


def frozen_linear_tensors(model) -> int:
    """Distinct fp32 tensors (weights and biases) of frozen linear layers: what each context casts once."""
    return len({id(t) for m in model.modules() if isinstance(m, torch.nn.Linear)
                for t in (m.weight, m.bias) if t is not None and not t.requires_grad})


def as_before(monkeypatch):
    """autocast alone, as before: no copies lent."""
    monkeypatch.setattr(precision, "_frozen_copies", lambda layers, dtype: {})


def shared_prefix_batch():
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 200, (1, 14), generator=g).expand(8, -1)  # one group: a shared prefix
    ids = torch.cat([prompt, torch.randint(5, 200, (8, 6), generator=g)], dim=1)
    mask = torch.zeros_like(ids)
    mask[:, 14:] = 1
    return ids, torch.ones_like(ids), mask


def test_a_frozen_models_log_prob_pass_casts_each_weight_once_with_the_same_log_probs(tok, monkeypatch):
    reference = frozen_bf16(tiny_llama(tok, seed=0))
    ids, attn, mask = shared_prefix_batch()
    with torch.no_grad(), CountWeightCasts(reference) as now:
        lent = learner.log_probs_pass(reference, ids, attn, mask, 1.0, 2, shared_prefix=True)
    as_before(monkeypatch)
    with torch.no_grad(), CountWeightCasts(reference) as before:
        plain = learner.log_probs_pass(reference, ids, attn, mask, 1.0, 2, shared_prefix=True)
    assert now.casts == frozen_linear_tensors(reference) > 0
    assert before.casts >= 2 * now.casts  # every use cast it: the prefix forward and the suffix forward
    assert torch.equal(lent, plain)
    assert not precision._LENT  # every copy returned on exit


def test_a_lora_model_samples_with_its_base_cast_once_per_call_and_the_same_tokens(tok, monkeypatch):
    pytest.importorskip("peft")
    from ragen2.models import LoraSettings, apply_lora

    lora = apply_lora(tiny_llama(tok, seed=3), LoraSettings(rank=4))
    with torch.no_grad():  # non-zero adapters, so the LoRA path changes the logits
        for name, parameter in lora.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    precision.set_compute_dtype(lora, torch.bfloat16)
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("Turn 1:\nState:\n#_P", "a b c")]
    args = dict(max_new_tokens=6, temperature=1.0, pad_token_id=tok.pad_token_id, tokenizer=tok, stop_strings=())

    def sample():
        return generate(lora, prompts, generator=torch.Generator().manual_seed(5), **args)

    with CountWeightCasts(lora) as now:
        lent = sample()
    as_before(monkeypatch)
    with CountWeightCasts(lora) as before:
        plain = sample()
    frozen = frozen_linear_tensors(lora)
    trainable = sum(1 for p in lora.parameters() if p.requires_grad)  # autocast's own cache: once each
    assert now.casts == frozen + trainable
    assert before.casts >= frozen * 6  # the base was cast at every forward (a prefill and 5 decode steps)
    assert [r.token_ids for r in lent] == [r.token_ids for r in plain]
    assert [r.logprobs for r in lent] == [r.logprobs for r in plain]


def test_full_precision_inside_gets_the_fp32_weights_back_and_the_copies_return_after(tok):
    reference = frozen_bf16(tiny_llama(tok, seed=1))
    ids = torch.randint(5, 200, (2, 9), generator=torch.Generator().manual_seed(1))
    originals = {name: p for name, p in reference.named_parameters()}
    down = reference.model.layers[0].mlp.down_proj
    with torch.no_grad():
        fp32_alone = reference(ids).logits
        with precision.autocast(reference):
            assert down.weight.dtype == torch.bfloat16  # lent
            with precision.autocast(reference):  # nested: the outer context's copies stay
                assert down.weight.dtype == torch.bfloat16
            assert down.weight.dtype == torch.bfloat16
            with precision.full_precision(reference):
                assert down.weight is originals["model.layers.0.mlp.down_proj.weight"]
                fp32_inside = reference(ids).logits
            assert down.weight.dtype == torch.bfloat16  # lent again after the fp32 part
    assert torch.equal(fp32_inside, fp32_alone)
    assert all(p is originals[name] for name, p in reference.named_parameters())
    assert not precision._LENT


def test_weights_changed_between_contexts_are_cast_afresh(tok):
    """A copy lives for one outermost context: weights loaded later (a checkpoint) are never stale."""
    reference = frozen_bf16(tiny_llama(tok, seed=2))
    ids = torch.randint(5, 200, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), precision.autocast(reference):
        first = reference(ids).logits
    with torch.no_grad():
        for p in reference.parameters():
            p.mul_(1.5)
    fresh = frozen_bf16(reference)  # a new model with the changed weights: nothing cached anywhere
    with torch.no_grad(), precision.autocast(reference):
        second = reference(ids).logits
    with torch.no_grad(), precision.autocast(fresh):
        want = fresh(ids).logits
    assert not torch.equal(first, second) and torch.equal(second, want)
