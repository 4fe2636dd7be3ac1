"""grouped_sdpa: masked CPU passes keep key/value heads grouped, with transformers' sdpa results."""

import torch
import transformers.integrations.sdpa_attention as sdpa_module

from ragen2 import models as model_lib
from ragen2.attention import NAME, transformers_sdpa, use_grouped_sdpa
from tests.tiny import build_tiny_policy, build_tiny_value_model


def _padded_batch():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0  # right padding
    mask[1, :2] = 0  # left padding
    return ids, mask


def _count_repeats(monkeypatch) -> list:
    calls = []
    original = sdpa_module.repeat_kv
    monkeypatch.setattr(sdpa_module, "repeat_kv", lambda *args: (calls.append(1), original(*args))[1])
    return calls


def test_a_masked_pass_gives_sdpas_logits_bit_for_bit_and_its_gradients_to_float_rounding():
    plain, grouped = build_tiny_policy(seed=0), use_grouped_sdpa(build_tiny_policy(seed=0))
    assert plain.config.num_key_value_heads < plain.config.num_attention_heads  # grouped-query heads
    assert grouped.config._attn_implementation == NAME
    ids, mask = _padded_batch()
    plain_logits = plain(input_ids=ids, attention_mask=mask).logits
    grouped_logits = grouped(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(plain_logits, grouped_logits)
    plain_logits.square().mean().backward()
    grouped_logits.square().mean().backward()
    for (name, p), q in zip(plain.named_parameters(), grouped.parameters()):
        scale = p.grad.abs().max().item()
        assert (p.grad - q.grad).abs().max().item() <= 1e-5 * max(scale, 1e-12), name


def test_masked_passes_stop_copying_key_value_heads_and_other_passes_are_transformers_own(monkeypatch):
    plain, grouped = build_tiny_policy(seed=0), use_grouped_sdpa(build_tiny_policy(seed=0))
    ids, mask = _padded_batch()
    calls = _count_repeats(monkeypatch)
    with torch.no_grad():
        plain(input_ids=ids, attention_mask=mask)
        assert len(calls) == 2 * plain.config.num_hidden_layers  # transformers copies K and V in every layer
        calls.clear()
        grouped(input_ids=ids, attention_mask=mask)
        assert calls == []
        # Decoding one token on a cache: transformers' own path, the same tokens as before.
        out = grouped(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
        step = grouped(input_ids=ids[:, -1:], attention_mask=mask, past_key_values=out.past_key_values)
        reference = plain(input_ids=ids, attention_mask=mask).logits[:, -1]
    assert torch.allclose(step.logits[:, -1], reference, atol=1e-5)


def test_only_models_on_transformers_sdpa_are_switched():
    eager = build_tiny_policy(seed=0)
    eager.set_attn_implementation("eager")
    assert use_grouped_sdpa(eager).config._attn_implementation == "eager"
    critic = build_tiny_value_model(seed=0)
    assert use_grouped_sdpa(critic) is critic  # not a transformers model: left alone


def test_the_loaders_switch_the_policy_reference_and_critic(tmp_path):
    build_tiny_policy(seed=0).save_pretrained(tmp_path)
    for model in (model_lib.load_policy(str(tmp_path)), model_lib.load_reference(str(tmp_path)),
                  model_lib.load_value_model(str(tmp_path)).body):
        assert model.config._attn_implementation == NAME
    with_lora = model_lib.load_policy(str(tmp_path), lora=model_lib.LoraSettings(rank=2, alpha=4, dropout=0.0))
    assert with_lora.config._attn_implementation == NAME


def test_transformers_sdpa_runs_transformers_own_attention_for_the_block_only(monkeypatch):
    grouped = use_grouped_sdpa(build_tiny_policy(seed=0))
    ids, mask = _padded_batch()
    calls = _count_repeats(monkeypatch)
    with torch.no_grad():
        with transformers_sdpa(grouped, None):
            assert grouped.config._attn_implementation == "sdpa"
            grouped(input_ids=ids, attention_mask=mask)
        assert len(calls) == 2 * grouped.config.num_hidden_layers
        assert grouped.config._attn_implementation == NAME
        calls.clear()
        grouped(input_ids=ids, attention_mask=mask)
    assert calls == []
