"""The local engine's tensor plumbing on a tiny model: alignment, accumulation, non-finite skips."""

import copy

import pytest
import torch

from ragen2.config import load_config
from ragen2.engines.local import learner
from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer("chatml")


def _batch(vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (4, 12), generator=g)
    attn = torch.ones(4, 12, dtype=torch.long)
    attn[1, 9:] = 0  # right padding
    attn[3, 7:] = 0
    mask = torch.zeros(4, 12)
    mask[:, 4:7] = 1  # one assistant span, then env text
    mask[0, 9:11] = 1  # a second turn on row 0
    mask[2, 8:12] = 1
    return ids, attn, mask * attn


def test_log_probs_match_the_full_vocabulary_computation(tok):
    model = tiny_llama(tok, seed=1)
    ids, attn, mask = _batch(len(tok))
    ours, entropy = learner.policy_log_probs(model, learner.TokenRows(ids, attn, mask), with_entropy=True)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits.float(), -1)
    expected = torch.zeros_like(ours)
    expected[:, 1:] = logp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    expected_entropy = torch.zeros_like(ours)
    expected_entropy[:, 1:] = -(logp.exp() * logp).sum(-1)[:, :-1]
    assert torch.allclose(ours, expected * mask, atol=1e-5)
    assert torch.allclose(entropy, expected_entropy * mask, atol=1e-5)
    assert (ours[mask == 0] == 0).all()


def _inputs(tok, micro, advantages=None):
    cfg = load_config(algo="grpo", overrides=[f"optim.micro_batch_size={micro}", "optim.mini_batch_size=4",
                                              "optim.actor_lr=1e-3", "algo.entropy_coef=0.01"])
    model = tiny_llama(tok, seed=2)
    models = learner.Models(model, tok, None, None, torch.device("cpu"))
    ids, attn, mask = _batch(len(tok), seed=3)
    old, _ = learner.policy_log_probs(model, learner.TokenRows(ids, attn, mask))
    if advantages is None:
        advantages = torch.linspace(-1, 1, 12).expand(4, 12) * mask
    data = learner.UpdateInputs(ids, attn, mask, old.detach(), advantages)
    return cfg, models, data


def test_gradient_accumulation_equals_one_big_micro_batch(tok):
    results = []
    for micro in (1, 4):
        cfg, models, data = _inputs(tok, micro)
        optimizers = learner.build_optimizers(models, cfg)
        metrics = learner.ppo_update(models, optimizers, data, cfg, torch.Generator().manual_seed(0))
        results.append((torch.cat([p.detach().flatten() for p in models.policy.parameters()]), metrics))
    (params_1, m1), (params_4, m4) = results
    assert torch.allclose(params_1, params_4, atol=1e-6)
    assert m1["actor/grad_norm"] == pytest.approx(m4["actor/grad_norm"], rel=1e-4)


def test_non_finite_loss_skips_the_step_and_counts_it(tok):
    cfg, models, data = _inputs(tok, 2)
    data.advantages[0, 5] = float("nan")  # on an assistant token: the loss becomes NaN
    before = copy.deepcopy(models.policy.state_dict())
    optimizers = learner.build_optimizers(models, cfg)
    metrics = learner.ppo_update(models, optimizers, data, cfg, torch.Generator().manual_seed(0))
    assert metrics["actor/nonfinite_skipped_minibatches"] == 1.0
    after = models.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def _policy_and_critic(tok) -> learner.Models:
    from ragen2.models import ValueModel
    from transformers import LlamaModel

    critic = ValueModel(LlamaModel(tiny_llama(tok, seed=5).config))
    return learner.Models(tiny_llama(tok, seed=2), tok, critic, None, torch.device("cpu"))


def _actor_and_critic(tok):
    cfg = load_config(algo="ppo", overrides=["optim.micro_batch_size=2", "optim.mini_batch_size=4",
                                             "optim.actor_lr=1e-3", "optim.critic_lr=1e-3"])
    models = _policy_and_critic(tok)
    policy, critic = models.policy, models.critic
    ids, attn, mask = _batch(len(tok), seed=3)
    old, _ = learner.policy_log_probs(policy, learner.TokenRows(ids, attn, mask))
    old_values = learner.critic_values(critic, ids, attn).detach()
    advantages = torch.linspace(-1, 1, 12).expand(4, 12) * mask
    data = learner.UpdateInputs(ids, attn, mask, old.detach(), advantages, None, old_values, old_values + advantages)
    return cfg, models, data


@pytest.mark.parametrize("broken", ["critic", "actor"])
def test_a_non_finite_gradient_of_either_model_steps_neither_and_counts_once(tok, broken):
    """The loss is finite, one model's gradient is not: the mini-batch is one update of both
    models, so neither steps (stepping the other would apply half of the loss), counted once."""
    cfg, models, data = _actor_and_critic(tok)
    module = models.critic.value_head if broken == "critic" else models.policy.get_output_embeddings()
    module.weight.register_hook(lambda grad: grad * float("inf"))
    before = {name: copy.deepcopy(model.state_dict()) for name, model in (("policy", models.policy),
                                                                         ("critic", models.critic))}
    optimizers = learner.build_optimizers(models, cfg)
    metrics = learner.ppo_update(models, optimizers, data, cfg, torch.Generator().manual_seed(0))
    assert metrics["actor/nonfinite_skipped_minibatches"] == 1.0
    for name, model in (("policy", models.policy), ("critic", models.critic)):
        assert all(torch.equal(before[name][k], v) for k, v in model.state_dict().items()), f"the {name} stepped"
    assert not optimizers.actor.state and not optimizers.critic.state  # no moments: no step was taken


def test_values_are_aligned_with_the_token_they_precede(tok):
    from ragen2.models import ValueModel
    from transformers import LlamaModel

    backbone = LlamaModel(tiny_llama(tok, seed=4).config)
    critic = ValueModel(backbone).eval()
    ids, attn, _ = _batch(len(tok))
    values = learner.critic_values(critic, ids, attn)
    with torch.no_grad():
        raw = critic(ids, attn)
    assert torch.allclose(values[:, 1:], raw[:, :-1]) and (values[:, 0] == 0).all()


def test_critic_warmup_updates_the_critic_and_leaves_the_policy_untouched(tok):
    cfg = load_config(algo="ppo", overrides=["optim.micro_batch_size=2", "optim.mini_batch_size=4",
                                             "optim.critic_warmup_steps=1", "optim.actor_lr=1e-3"])
    models = _policy_and_critic(tok)
    policy, critic = models.policy, models.critic
    ids, attn, mask = _batch(len(tok), seed=3)
    old_values = learner.critic_values(critic, ids, attn).detach()
    returns = torch.ones_like(old_values) * mask
    data = learner.UpdateInputs(ids, attn, mask, None, torch.ones_like(old_values) * mask, None, old_values, returns)
    policy_before = copy.deepcopy(policy.state_dict())
    critic_before = copy.deepcopy(critic.state_dict())
    optimizers = learner.build_optimizers(models, cfg)
    metrics = learner.ppo_update(models, optimizers, data, cfg, torch.Generator().manual_seed(0),
                                 learner.UpdateOptions(train_actor=False))
    assert all(torch.equal(policy_before[k], v) for k, v in policy.state_dict().items())
    assert any(not torch.equal(critic_before[k], v) for k, v in critic.state_dict().items())
    assert "critic/value_loss" in metrics and not any(k.startswith("actor/pg") for k in metrics)
    assert metrics["actor/nonfinite_skipped_minibatches"] == 0.0
    # Without a critic there is nothing to warm up: a clear error, not a silent no-op update.
    with pytest.raises(ValueError, match="needs a critic"):
        learner.ppo_update(learner.Models(policy, tok, None, None, torch.device("cpu")), optimizers, data, cfg,
                           torch.Generator().manual_seed(0), learner.UpdateOptions(train_actor=False))
