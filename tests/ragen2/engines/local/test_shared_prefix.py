"""Shared-prefix passes equal the plain ones: log-probs, entropies, values, losses and every
parameter's gradient, in fp32 to 1e-4 of each tensor's largest magnitude.

Rows are built as a rollout writes them (right-padded; a group's members share the chat-template
prompt, then their own replies, and in multi-turn rows env text between replies), on ChatML and
Llama-3 layouts, with and without LoRA. Each test also checks that the shared path really ran
(fewer tokens fed to the decoder), so a silent fallback to the plain forward fails it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaModel

from ragen2 import models as model_lib
from ragen2.cli import main
from ragen2.config import load_config
from ragen2.engines.local import learner
from ragen2 import scoring
from ragen2 import shared_prefix as prefix_lib
from ragen2.run_dir import read_metrics
from tests.tiny import tiny_llama, tiny_tokenizer

REPLIES = ["<think> the risky arm pays more on average </think><answer>Trader</answer>",
           "<think> the risky arm </think><answer>Nurse</answer>",  # shares sampled tokens with the first
           "<answer>Up || Left</answer>", "Down Right", "<think>push the box</think> <answer>Up</answer>"]
SEPARATOR = {"chatml": "\n<|im_start|>user\nReward:\n{r}<|im_end|>\n<|im_start|>assistant\n",
             "llama3": "<|start_header_id|>user<|end_header_id|>\n\nReward:\n{r}<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n"}


def _encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _row(tok, template: str, group: int, member: int, turns: int) -> tuple[list[int], list[bool]]:
    """One rollout row: the group's prompt, then `turns` replies (sampled) with env text between."""
    messages = [{"role": "system", "content": "You're a helpful assistant. You are playing a bandit game."},
                {"role": "user", "content": f"Turn 1:\nState:\n{'#_O.X@P'[group:] * 3}\nYou have 1 actions left."}]
    ids = _encode(tok, tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    sampled = [False] * len(ids)
    for turn in range(turns):
        if turn:
            env_text = _encode(tok, SEPARATOR[template].format(r=0.1 * (member + turn)))
            ids, sampled = ids + env_text, sampled + [False] * len(env_text)
        reply = _encode(tok, REPLIES[(member + 2 * turn + group) % len(REPLIES)]) + [tok.eos_token_id]
        ids, sampled = ids + reply, sampled + [True] * len(reply)
    return ids, sampled


def _pad(tok, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r, _ in rows])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in rows])
    mask = torch.tensor([[float(s) for s in m] + [0.0] * (width - len(m)) for _, m in rows])
    return ids, attn, mask


def group_batch(tok, template: str, groups: int = 2, size: int = 3, turns: int = 1):
    """groups x size rows; a group's members share the prompt (and sometimes first reply tokens)."""
    return _pad(tok, [_row(tok, template, g, m, turns) for g in range(groups) for m in range(size)])


def no_shared_batch(tok, rows: int = 4):
    """Rows that differ from the first token: nothing to share."""
    g = torch.Generator().manual_seed(7)
    built = []
    for r in range(rows):
        ids = [3 + r] + torch.randint(3, len(tok), (20 + 3 * r,), generator=g).tolist()
        built.append((ids, [False] * 10 + [True] * (len(ids) - 10)))
    return _pad(tok, built)


def close(ours: torch.Tensor, plain: torch.Tensor, what: str, rel: float = 1e-4) -> None:
    scale = plain.abs().max().item()
    diff = (ours - plain).abs().max().item()
    assert diff <= rel * scale + 1e-12, f"{what}: max diff {diff:.3g} > {rel} x {scale:.3g}"


class FedTokens:
    """Tokens the decoder body is fed (padding included), to tell a shared pass from a plain one."""

    def __init__(self, body):
        self.count = 0
        body.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        ids, embeds = kwargs.get("input_ids"), kwargs.get("inputs_embeds")
        self.count += ids.numel() if ids is not None else embeds.shape[0] * embeds.shape[1]


def _lora(model, task_type="CAUSAL_LM"):
    model = model_lib.apply_lora(model, model_lib.LoraSettings(rank=4, alpha=8), task_type=task_type)
    with torch.no_grad():  # B starts at 0 (A's gradient would be 0 on both sides): give it weight
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2, generator=torch.Generator().manual_seed(len(name)))
    return model


@pytest.fixture(scope="module", params=["chatml", "llama3"])
def template(request):
    return request.param


@pytest.fixture(scope="module")
def tok(template):
    return tiny_tokenizer(template)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _policy_pass(model, fed: FedTokens, ids, attn, mask, shared: bool):
    """(log-probs, entropy, loss, gradients, tokens fed) of an actor-like loss."""
    model.zero_grad(set_to_none=True)
    before = fed.count
    log_probs, entropy = learner.policy_log_probs(model, learner.TokenRows(ids, attn, mask), temperature=0.7,
                                                  with_entropy=True, shared_prefix=shared)
    advantages = torch.linspace(-1, 1, ids.shape[1]).expand_as(mask) * mask
    loss = -(log_probs * advantages).sum() / mask.sum() - 0.01 * (entropy * mask).sum() / mask.sum()
    loss.backward()
    return log_probs.detach(), entropy.detach(), loss.detach(), _grads(model), fed.count - before


@pytest.mark.parametrize("turns", [1, 3])
@pytest.mark.parametrize("lora", [False, True])
def test_policy_log_probs_loss_and_gradients_equal_the_plain_pass(tok, template, turns, lora):
    model = tiny_llama(tok, seed=1)
    model = _lora(model) if lora else model
    model.train()
    ids, attn, mask = group_batch(tok, template, turns=turns)
    fed = FedTokens(model.get_decoder())
    plain = _policy_pass(model, fed, ids, attn, mask, shared=False)
    shared = _policy_pass(model, fed, ids, attn, mask, shared=True)
    assert shared[4] < 0.9 * plain[4], "the shared pass fed the decoder as many tokens as the plain one"
    close(shared[0], plain[0], "log-probs")
    close(shared[1], plain[1], "entropy")
    close(shared[2], plain[2], "loss")
    assert plain[3].keys() == shared[3].keys() and plain[3]
    for name in plain[3]:
        close(shared[3][name], plain[3][name], f"grad {name}")
    assert (shared[0][mask == 0] == 0).all()


def _critic(tok, lora: bool):
    backbone = LlamaModel(tiny_llama(tok, seed=4).config)
    backbone = _lora(backbone, task_type="FEATURE_EXTRACTION") if lora else backbone
    return model_lib.ValueModel(backbone).train()


@pytest.mark.parametrize("lora", [False, True])
def test_critic_values_and_gradients_equal_the_plain_pass(tok, template, lora):
    critic = _critic(tok, lora)
    ids, attn, mask = group_batch(tok, template, turns=2)
    fed = FedTokens(critic.body)
    results = []
    for shared in (False, True):
        critic.zero_grad(set_to_none=True)
        start = fed.count
        values = learner.critic_values(critic, ids, attn, shared_prefix=shared)
        loss = ((values - 0.5) ** 2 * mask).sum() / mask.sum()
        loss.backward()
        results.append((values.detach(), loss.detach(), _grads(critic), fed.count - start))
    plain, ours = results
    assert ours[3] < 0.9 * plain[3]
    real = torch.zeros_like(attn, dtype=torch.bool)
    real[:, 1:] = attn[:, :-1].bool()  # V at t reads the state that ends with token t-1
    close(ours[0][real], plain[0][real], "values")
    close(ours[1], plain[1], "value loss")
    for name in plain[2]:
        close(ours[2][name], plain[2][name], f"grad {name}")


def test_no_shared_prefix_falls_back_to_the_plain_pass_exactly(tok):
    model = tiny_llama(tok, seed=2).train()
    ids, attn, mask = no_shared_batch(tok)
    assert prefix_lib.plan(ids, attn) is None
    fed = FedTokens(model.get_decoder())
    plain = _policy_pass(model, fed, ids, attn, mask, shared=False)
    shared = _policy_pass(model, fed, ids, attn, mask, shared=True)
    assert shared[4] == plain[4]
    assert torch.equal(shared[0], plain[0]) and torch.equal(shared[1], plain[1]) and torch.equal(shared[2], plain[2])
    assert all(torch.equal(shared[3][n], plain[3][n]) for n in plain[3])


def test_gradient_checkpointing_runs_the_plain_pass(tok, template):
    """transformers drops the KV cache of a checkpointed layer in training: no cache, no sharing."""
    model = tiny_llama(tok, seed=2)
    model.gradient_checkpointing_enable()
    model.train()
    ids, attn, mask = group_batch(tok, template)
    fed = FedTokens(model.get_decoder())
    plain = _policy_pass(model, fed, ids, attn, mask, shared=False)
    shared = _policy_pass(model, fed, ids, attn, mask, shared=True)
    assert shared[4] == plain[4] and torch.equal(shared[0], plain[0])
    with torch.no_grad():  # without gradient the cache is kept: the no-grad passes still share
        start = fed.count
        learner.policy_log_probs(model, learner.TokenRows(ids, attn, mask), shared_prefix=True)
        assert fed.count - start < plain[4]


def test_a_group_beside_rows_sharing_nothing(tok, template):
    """Rows with no partner run as one-row clusters in the same pass; copies of a row (RAGEN-2's
    batch adjustment duplicates rows) share their whole length but one token."""
    model = tiny_llama(tok, seed=3).train()
    group = group_batch(tok, template, groups=1, size=3, turns=2)
    lonely = no_shared_batch(tok, rows=2)
    rows = []
    for ids, attn, mask in (group, lonely):
        rows += [(ids[r, :int(attn[r].sum())].tolist(), mask[r, :int(attn[r].sum())].bool().tolist())
                 for r in range(ids.shape[0])]
    rows.append(rows[1])  # a copy
    ids, attn, mask = _pad(tok, rows)
    layout = prefix_lib.plan(ids, attn)
    assert layout is not None and len(layout.leader) == 3  # the group (with the copy) and two single rows
    fed = FedTokens(model.get_decoder())
    plain = _policy_pass(model, fed, ids, attn, mask, shared=False)
    shared = _policy_pass(model, fed, ids, attn, mask, shared=True)
    close(shared[0], plain[0], "log-probs")
    for name in plain[3]:
        close(shared[3][name], plain[3][name], f"grad {name}")


def test_plan_keeps_groups_apart_when_they_share_less_than_their_own_prompt(tok, template):
    ids, attn, _ = group_batch(tok, template, groups=2, size=3)
    layout = prefix_lib.plan(ids, attn)
    assert layout.cluster.tolist() in ([0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0])
    for c, leader in enumerate(layout.leader.tolist()):
        members = (layout.cluster == c).nonzero().flatten().tolist()
        n = int(layout.prefix_len[c])
        assert all(torch.equal(ids[m, :n], ids[leader, :n]) for m in members)
        assert n < int(attn[members].sum(1).min())  # every row keeps a token of its own


def test_plan_counts_attention_long_suffixes_after_a_short_prefix_stay_plain():
    """Two unpadded rows of 1,000 tokens sharing 280: fewer tokens shared, but the suffixes'
    masked attention over 1,000 keys costs more than the plain causal pass saves (SmolLM2's
    shape); with a long shared prompt and short replies, sharing wins even so."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 300, (280,), generator=g)
    rows = torch.stack([torch.cat([prompt, torch.randint(5, 300, (720,), generator=g)]) for _ in range(2)])
    attn = torch.ones_like(rows)
    smollm2 = 4 * 576 / (2 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536))
    assert prefix_lib.plan(rows, attn) is not None  # tokens alone: 1,720 fed instead of 2,000
    assert prefix_lib.plan(rows, attn, attention=smollm2) is None
    short = rows[:, :320]
    assert prefix_lib.plan(short, torch.ones_like(short), attention=smollm2) is not None


def test_batched_packing_returns_rows_in_their_order(tok, template, monkeypatch):
    monkeypatch.setattr(scoring, "HEAD_CHUNK", 5)  # the no-grad head runs in chunks of positions
    model = tiny_llama(tok, seed=5)
    ids, attn, mask = group_batch(tok, template, groups=3, size=2)
    order = torch.tensor([0, 2, 4, 1, 3, 5])  # members of a group apart, as after a shuffle
    ids, attn, mask = ids[order], attn[order], mask[order]
    plain = learner.batched(lambda i, a, m: learner.policy_log_probs(model, learner.TokenRows(i, a, m))[0],
                            2, ids, attn, mask)
    packed = learner.batched(lambda i, a, m: learner.policy_log_probs(model, learner.TokenRows(i, a, m),
                                                                      shared_prefix=True)[0],
                             2, ids, attn, mask, pack=True)
    close(packed, plain, "packed log-probs")


def test_bf16_autocast_stays_within_bf16_rounding(tok, template):
    """Under bf16 autocast both passes round differently; stated tolerance: 2% of the largest log-prob."""
    model = tiny_llama(tok, seed=6)
    from ragen2 import precision

    precision.set_compute_dtype(model, "bfloat16")
    ids, attn, mask = group_batch(tok, template, turns=2)
    plain = learner.policy_log_probs(model, learner.TokenRows(ids, attn, mask))[0]
    shared = learner.policy_log_probs(model, learner.TokenRows(ids, attn, mask), shared_prefix=True)[0]
    close(shared, plain, "bf16 log-probs", rel=2e-2)


@pytest.mark.parametrize("extra", [[], ["optim.mini_batch_size=4", "optim.ppo_epochs=2"]],
                         ids=["one-step", "two-minibatches-two-epochs"])
def test_ppo_update_equals_the_plain_update(tok, template, extra):
    """Policy and critic, with SGD (lr 1) so each parameter's change is its clipped gradient."""
    ids, attn, mask = group_batch(tok, template, groups=2, size=4, turns=2)
    results = []
    for shared in (False, True):
        cfg = load_config(algo="ppo", overrides=["optim.micro_batch_size=4", "optim.mini_batch_size=8",
                                                 f"optim.shared_prefix={str(shared).lower()}", *extra])
        policy, critic = tiny_llama(tok, seed=8).train(), _critic(tok, lora=False)
        models = learner.Models(policy, tok, critic, None, torch.device("cpu"))
        on_policy = learner.reuses_current_log_probs(cfg.optim, ids.shape[0])
        old = None if on_policy else learner.policy_log_probs(policy, learner.TokenRows(ids, attn, mask))[0].detach()
        old_values = learner.critic_values(critic, ids, attn).detach()
        advantages = torch.linspace(-1, 1, ids.shape[1]).expand_as(mask) * mask
        data = learner.UpdateInputs(ids, attn, mask, old, advantages, None, old_values, old_values + advantages)
        before = {n: p.detach().clone() for n, p in [*policy.named_parameters(), *critic.named_parameters()]}
        optimizers = learner.Optimizers(torch.optim.SGD(policy.parameters(), lr=1.0),
                                        torch.optim.SGD(critic.parameters(), lr=1.0))
        metrics = learner.ppo_update(models, optimizers, data, cfg, torch.Generator().manual_seed(0))
        steps = {n: p.detach() - before[n] for n, p in [*policy.named_parameters(), *critic.named_parameters()]}
        results.append((metrics, steps))
    (plain_metrics, plain_steps), (metrics, steps) = results
    assert metrics.keys() == plain_metrics.keys()
    for key, value in plain_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for name, step in plain_steps.items():
        close(steps[name], step, f"step {name}")


def test_packed_micro_batches_hold_whole_groups_within_the_plain_budget(tok, template):
    ids, attn, mask = group_batch(tok, template, groups=3, size=4, turns=1)
    shuffled = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    lengths, sampled = attn.sum(1), mask.sum(1)
    for no_grad in (False, True):
        batches = prefix_lib.micro_batches(prefix_lib.TokenRows(ids, attn, mask), shuffled, 2, no_grad=no_grad)
        assert sorted(torch.cat(batches).tolist()) == list(range(12))
        assert len(batches) < 6  # fewer passes than plain micro-batches of 2
        for rows in batches:
            width = int(lengths[rows].max())
            fed = prefix_lib.fed_tokens(ids[rows, :width], attn[rows, :width])
            if no_grad:
                assert fed <= 2 * int(lengths.max())
            else:
                assert fed + int(sampled[rows].sum()) <= 2 * (int(lengths.max()) + int(sampled.max()))
    packed = prefix_lib.micro_batches(prefix_lib.TokenRows(ids, attn, mask), shuffled, 4)
    groups = [set((r // 4 for r in rows.tolist())) for rows in packed]
    assert all(len(g) <= 2 for g in groups)  # rows of a group are neighbours, not scattered


def test_logged_losses_do_not_depend_on_the_micro_batch_size(tok):
    """loss_scope=mini_batch: a micro-batch's term is its share of the mini-batch's loss; the log
    sums the shares (it used to average them, dividing the loss by the number of micro-batches)."""
    ids, attn, mask = group_batch(tok, "chatml", groups=2, size=4)
    logged = []
    for micro in (1, 4):
        cfg = load_config(algo="grpo", overrides=[f"optim.micro_batch_size={micro}", "optim.mini_batch_size=8",
                                                  "optim.shared_prefix=false"])
        policy = tiny_llama(tok, seed=9)
        models = learner.Models(policy, tok, None, None, torch.device("cpu"))
        advantages = torch.linspace(-1, 1, ids.shape[1]).expand_as(mask) * mask
        data = learner.UpdateInputs(ids, attn, mask, None, advantages)
        optimizers = learner.Optimizers(torch.optim.SGD(policy.parameters(), lr=0.0), None)
        logged.append(learner.ppo_update(models, optimizers, data, cfg, torch.Generator().manual_seed(0)))
    for key in ("actor/pg_loss", "actor/entropy"):
        assert logged[0][key] == pytest.approx(logged[1][key], rel=1e-5), key
    with torch.no_grad():
        _, entropy = learner.policy_log_probs(policy, learner.TokenRows(ids, attn, mask), with_entropy=True)
    per_row = (entropy * mask).sum(1) / mask.sum(1)  # the grpo preset's seq-mean-token-mean
    assert logged[1]["actor/entropy"] == pytest.approx(float(per_row.mean()), rel=1e-5)


# --- a whole run ------------------------------------------------------------------------------

TINY = ["rollout.num_groups=3", "rollout.group_size=2", "rollout.max_new_tokens=10", "trainer.val_groups=2",
        "optim.micro_batch_size=2", "probe.every=0", "model.dtype=float32", "--filter", "none",
        "--steps", "3"]


# each switch alone: the shared-prefix passes with padded micro-batches, and the padding-free ones
SWITCHES = {"shared_prefix": ("shared_hidden_states", ["optim.padding_free=false"]),
            "padding_free": ("padding_free_hidden_states", [])}


@pytest.mark.parametrize("switch", sorted(SWITCHES))
@pytest.mark.parametrize("setting", [["--algo", "grpo", "optim.mini_batch_size=6"],
                                     ["--algo", "ppo", "--env", "sokoban", "rollout.max_turns=2",
                                      "optim.mini_batch_size=4"]],
                         ids=["grpo-bandit-one-step", "ppo-sokoban-two-minibatches"])
def test_a_run_gives_the_same_metrics_with_the_switch_on_and_off(tiny_model_dir, tmp_path, setting, switch,
                                                                  monkeypatch):
    calls = []
    function, others = SWITCHES[switch]
    real = getattr(prefix_lib, function)
    monkeypatch.setattr(prefix_lib, function, lambda *a, **k: calls.append(1) or real(*a, **k))
    rows = {}
    for on in ("true", "false"):
        argv = ["train", "--quiet", "--model", str(tiny_model_dir), "--out", str(tmp_path),
                f"trainer.run_name={switch}-{on}", f"optim.{switch}={on}", *others, *TINY, *setting]
        assert main(argv) == 0
        rows[on] = read_metrics(tmp_path / f"{switch}-{on}")
        if on == "true":
            assert calls, f"the run never took a {function} pass"
            calls.clear()
    assert not calls  # the switch turns it off
    assert len(rows["true"]) == len(rows["false"]) == 3
    for on, off in zip(rows["true"], rows["false"]):
        keys = {k for k in off if not k.startswith(("time/", "throughput/"))}
        assert keys == {k for k in on if not k.startswith(("time/", "throughput/"))}
        for key in keys:
            if isinstance(off[key], float):
                assert on[key] == pytest.approx(off[key], rel=1e-4, abs=1e-6), (on["step"], key)
            else:
                assert on[key] == off[key], (on["step"], key)
