"""Gradient decomposition: bucketing, norms and cosines by hand, and the components adding up
to the gradient the real update takes (engines.local.ppo_update) on a tiny model."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
import transformers

from mi_probe import gradients as grad_lib
from ragen2.engines.local import grad_decomp
from ragen2.config import Config
from ragen2.engines.local import learner

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: threads cost more than they save
VOCAB, ROWS, WIDTH = 64, 6, 12
REWARDS = {0: [1.0, 1.0], 1: [0.0, 1.0], 2: [0.0, 0.5]}  # in-group std (ddof 1): 0, 0.7071, 0.3536


# --- pure helpers ---------------------------------------------------------------------------


def test_quantile_buckets_sort_by_spread_and_spread_the_remainder():
    spreads = [0.5, 0.0, 0.2, 0.0, 1.0, 0.3, 0.1]
    # ascending, ties in input order: 1, 3 (0.0), 6 (0.1), 2 (0.2), 5 (0.3), 0 (0.5), 4 (1.0); sizes 3, 2, 2
    assert grad_lib.quantile_buckets(spreads, 3) == {"bucket_1": [1, 3, 6], "bucket_2": [2, 5], "bucket_3": [0, 4]}
    assert grad_lib.quantile_buckets([0.3, 0.1], 6) == {"bucket_1": [1], "bucket_2": [0]}  # no empty buckets
    assert grad_lib.quantile_buckets([], 6) == {}
    with pytest.raises(ValueError, match="must be >= 0"):
        grad_lib.quantile_buckets([0.1, -0.2], 2)
    with pytest.raises(ValueError, match="finite"):
        grad_lib.quantile_buckets([0.1, float("nan")], 2)
    with pytest.raises(ValueError, match="num_buckets"):
        grad_lib.quantile_buckets([0.1], 0)


def test_ragen2_quantile_puts_the_remainder_in_the_last_bucket():
    # RAGEN-2's split_into_buckets: 7 groups / 3 buckets -> floor 2 each, the last takes 2 + 1.
    spreads = [0.5, 0.0, 0.2, 0.0, 1.0, 0.3, 0.1]  # ascending: 1, 3, 6, 2, 5, 0, 4
    assert grad_lib.quantile_buckets(spreads, 3, remainder="last") == {
        "bucket_1": [1, 3], "bucket_2": [2, 6], "bucket_3": [0, 4, 5]}
    assert grad_lib.quantile_buckets([0.3, 0.1], 6, remainder="last") == {"bucket_1": [1], "bucket_2": [0]}
    with pytest.raises(ValueError, match="remainder must be"):
        grad_lib.quantile_buckets(spreads, 3, remainder="first")
    # the config's default is RAGEN-2's; quantile_even is ours (sizes within one)
    assert grad_decomp.split_buckets(Config(probe={"grad_buckets": 2}), [0.0, 0.7, 0.35]) == {
        "bucket_1": [0], "bucket_2": [1, 2]}
    assert grad_decomp.split_buckets(Config(probe={"grad_buckets": 2, "grad_bucket_mode": "quantile_even"}),
                                     [0.0, 0.7, 0.35]) == {"bucket_1": [0, 2], "bucket_2": [1]}


def test_fixed_rv_bins_are_ragen2s_std_edges_and_skip_empty_bins():
    # [0,1) [1,2) [2,3) [3,4) [4,5) [5,inf): 1.0 and 5.0 open their bins; 12 is in the last
    spreads = [0.5, 1.0, 5.0, 2.7, 0.99, 12.0]
    assert grad_lib.fixed_rv_buckets(spreads) == {"bucket_1": [0, 4], "bucket_2": [1], "bucket_3": [3],
                                                  "bucket_6": [2, 5]}
    assert grad_decomp.split_buckets(Config(probe={"grad_bucket_mode": "fixed_rv"}), spreads) == \
        grad_lib.fixed_rv_buckets(spreads)
    assert grad_lib.fixed_rv_buckets([]) == {}
    with pytest.raises(ValueError, match="increasing"):
        grad_lib.fixed_rv_buckets([0.1], edges=(0.0, 2.0, 1.0))


def test_scaled_norms_are_the_coefficient_times_the_norm():
    a = [torch.tensor([3.0, 0.0]), torch.tensor([4.0])]  # norm 5
    b = [torch.tensor([0.0, 2.0]), torch.tensor([0.0])]  # norm 2
    out = grad_lib.component_metrics({"task": a, "entropy": b}, num_tokens=10, num_samples=4,
                                     coefficients={"task": 1.0, "entropy": -0.001})
    # RAGEN-2 logs ||entropy_coef * g_entropy|| = 0.001 * 2 beside ||g_task|| = 5
    assert out["entropy_scaled_norm"] == pytest.approx(0.002) and out["entropy_norm"] == pytest.approx(2.0)
    assert out["task_scaled_norm"] == pytest.approx(5.0)
    assert out["entropy_scaled_norm_per_token"] == pytest.approx(0.0002)
    assert out["entropy_scaled_norm_per_sample"] == pytest.approx(0.0005)
    assert "entropy_scaled_norm" not in grad_lib.component_metrics({"entropy": b}, num_tokens=1, num_samples=1)


def test_component_metrics_norms_per_token_per_sample_and_cosines():
    a = [torch.tensor([3.0, 0.0]), torch.tensor([4.0])]  # norm 5
    b = [torch.tensor([0.0, 2.0]), torch.tensor([0.0])]  # norm 2, orthogonal to a
    c = [torch.tensor([-3.0, 0.0]), torch.tensor([-4.0])]  # -a
    zero = [torch.zeros(2), torch.zeros(1)]
    out = grad_lib.component_metrics({"task": a, "entropy": b, "kl": c, "none": zero}, num_tokens=10, num_samples=4)
    assert out["task_norm"] == pytest.approx(5.0) and out["entropy_norm"] == pytest.approx(2.0)
    assert out["task_norm_per_token"] == pytest.approx(0.5) and out["task_norm_per_sample"] == pytest.approx(1.25)
    assert out["cos_task_entropy"] == pytest.approx(0.0) and out["cos_task_kl"] == pytest.approx(-1.0)
    assert out["none_norm"] == 0.0 and not any("none" in k and k.startswith("cos") for k in out)
    total = grad_lib.combine({"task": a, "entropy": b}, {"task": 1.0, "entropy": -0.5})
    assert [t.tolist() for t in total] == [[3.0, -1.0], [4.0]]


def test_gradient_components_match_backward_and_leave_param_grad_alone():
    w = torch.tensor([1.0, -2.0], requires_grad=True)
    w.grad = torch.tensor([7.0, 7.0])  # an optimiser's accumulated gradient
    x = (w * torch.tensor([2.0, 3.0])).sum()
    grads = grad_lib.gradient_components({"lin": x, "sq": (w ** 2).sum(), "const": torch.tensor(1.0)}, [w])
    assert grads["lin"][0].tolist() == [2.0, 3.0] and grads["sq"][0].tolist() == [2.0, -4.0]
    assert grads["const"][0].tolist() == [0.0, 0.0]
    assert w.grad.tolist() == [7.0, 7.0]


# --- on a tiny model --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy():
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).float()


def _config(loss_agg: str, kl_coef: float) -> Config:
    return Config(algo={"loss_agg": loss_agg, "kl_coef": kl_coef, "entropy_coef": 0.05, "clip_low": 0.2,
                        "clip_high": 0.28},
                  optim={"micro_batch_size": 3, "mini_batch_size": 8, "ppo_epochs": 1, "grad_clip": 1e9},
                  probe={"grad_every": 1, "grad_buckets": 2, "grad_bucket_mode": "quantile_even"})


def _inputs(policy, with_ref: bool):
    """Six right-padded rows (3 groups x 2) with old/ref log-probs off the current policy."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (ROWS, WIDTH), generator=g)
    lengths = torch.tensor([12, 9, 11, 7, 12, 10])
    attn = (torch.arange(WIDTH)[None] < lengths[:, None]).long()
    response = ((torch.arange(WIDTH)[None] >= 4) & attn.bool()).float()
    response[3] = 0.0
    response[3, 5] = 1.0  # a one-token response
    current, _ = learner.policy_log_probs(policy, learner.TokenRows(ids, attn, response))
    current = current.detach()
    noise = lambda: 0.3 * torch.randn(ROWS, WIDTH, generator=g) * response  # noqa: E731
    old = current + noise()  # ratios away from 1: some tokens clip
    ref = current + noise() if with_ref else None
    advantages = torch.randn(ROWS, 1, generator=g).expand(ROWS, WIDTH) * response
    data = learner.UpdateInputs(ids, attn, response, old, advantages.contiguous(), ref)
    trajectories = [SimpleNamespace(group=grp, reward=r) for grp, rs in REWARDS.items() for r in rs]
    batch = SimpleNamespace(trajectories=trajectories, group_ids=torch.tensor([t.group for t in trajectories]))
    return batch, data


class CapturingOptimizer:
    """Stands in for AdamW: records the gradient the update would step with, changes nothing."""

    def __init__(self, params):
        self.params, self.grads = list(params), None

    def step(self):
        self.grads = [p.grad.detach().clone() for p in self.params]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


@pytest.mark.parametrize("loss_agg, kl_coef", [("token-mean", 0.1), ("seq-mean-token-mean", 0.1),
                                               ("seq-mean-token-sum", 0.0)])
def test_components_add_up_to_the_update_gradient(policy, loss_agg, kl_coef):
    cfg = _config(loss_agg, kl_coef)
    batch, data = _inputs(policy, with_ref=kl_coef > 0)
    before = [p.detach().clone() for p in policy.parameters()]
    buckets = list(grad_decomp.iter_bucket_gradients(policy, cfg, batch, data))
    assert [b.name for b in buckets] == ["bucket_1", "bucket_2", "all"]
    # groups by std: 0 (0.0), 2 (0.354) | 1 (0.707)
    assert buckets[0].reward_stds == pytest.approx([0.0, 0.5 / math.sqrt(2)])
    assert buckets[1].reward_stds == pytest.approx([1 / math.sqrt(2)])
    whole = buckets[-1]
    assert set(whole.components) == ({"task", "entropy", "kl"} if kl_coef else {"task", "entropy"})
    assert whole.coefficients == ({"task": 1.0, "entropy": -0.05, "kl": kl_coef} if kl_coef
                                  else {"task": 1.0, "entropy": -0.05})
    summed = grad_lib.combine(whole.components, whole.coefficients)

    optimizer = CapturingOptimizer(policy.parameters())
    models = learner.Models(policy, None, None, None, torch.device("cpu"))
    learner.ppo_update(models, learner.Optimizers(optimizer, None), data, cfg, torch.Generator().manual_seed(0))
    for mine, theirs in zip(summed, optimizer.grads):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)
    assert grad_lib.norm(whole.components["task"]) > 1e-3  # not trivially zero
    for p, q in zip(policy.parameters(), before):  # nothing stepped
        assert torch.equal(p, q) and p.grad is None


def test_the_decompositions_task_term_is_the_updates_loss_on_the_same_batch(policy):
    # One builder (learner.actor_loss) for both: with no entropy or KL weight the update's loss is
    # the task term alone, so its logged loss and its gradient are the decomposition's task term's.
    cfg = _config("seq-mean-token-mean", 0.0)
    cfg.algo.entropy_coef = 0.0
    batch, data = _inputs(policy, with_ref=False)
    whole = list(grad_decomp.iter_bucket_gradients(policy, cfg, batch, data))[-1]
    optimizer = CapturingOptimizer(policy.parameters())
    models = learner.Models(policy, None, None, None, torch.device("cpu"))
    metrics = learner.ppo_update(models, learner.Optimizers(optimizer, None), data, cfg,
                                 torch.Generator().manual_seed(0))
    assert abs(whole.loss_values["task"]) > 1e-3  # not trivially zero
    assert metrics["actor/pg_loss"] == pytest.approx(whole.loss_values["task"], rel=1e-5)
    for mine, theirs in zip(whole.components["task"], optimizer.grads):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)


def test_filter_loss_scaling_scales_the_advantages_not_the_regularisers(policy):
    # RAGEN-2 multiplies the advantages by the kept fraction (linear) or its root (sqrt): the
    # update's gradient is s * g_task - entropy_coef * g_entropy + kl_coef * g_kl.
    cfg = _config("token-mean", 0.1)
    batch, data = _inputs(policy, with_ref=True)
    whole = list(grad_decomp.iter_bucket_gradients(policy, cfg, batch, data))[-1]
    scale = 0.25
    expected = grad_lib.combine(whole.components, {"task": scale, "entropy": -0.05, "kl": 0.1})
    optimizer = CapturingOptimizer(policy.parameters())
    models = learner.Models(policy, None, None, None, torch.device("cpu"))
    learner.ppo_update(models, learner.Optimizers(optimizer, None), data, cfg, torch.Generator().manual_seed(0),
                       learner.UpdateOptions(loss_scale=scale))
    for mine, theirs in zip(expected, optimizer.grads):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)
    scaled_adv = learner.UpdateInputs(data.input_ids, data.attention_mask, data.response_mask, data.old_log_probs,
                                    scale * data.advantages, data.ref_log_probs)
    learner.ppo_update(models, learner.Optimizers(optimizer, None), scaled_adv, cfg, torch.Generator().manual_seed(0))
    for mine, theirs in zip(expected, optimizer.grads):  # the same as scaling the advantages
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)


def test_micro_batch_loss_scope_is_verls_mean_of_micro_batch_means(policy):
    # veRL (RAGEN-2) takes each micro-batch's own token-mean and averages the micro-batches: with
    # micro-batches of one row (RAGEN-2's default) that is seq-mean-token-mean over the mini-batch.
    batch, data = _inputs(policy, with_ref=False)
    models = learner.Models(policy, None, None, None, torch.device("cpu"))
    grads = {}
    for name, agg, scope in (("verl", "token-mean", "micro_batch"), ("seq", "seq-mean-token-mean", "mini_batch"),
                             ("ours", "token-mean", "mini_batch")):
        cfg = _config(agg, 0.0)
        cfg.optim.micro_batch_size, cfg.optim.loss_scope = 1, scope
        optimizer = CapturingOptimizer(policy.parameters())
        learner.ppo_update(models, learner.Optimizers(optimizer, None), data, cfg, torch.Generator().manual_seed(0))
        grads[name] = optimizer.grads
    for a, b in zip(grads["verl"], grads["seq"]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # rows of 8, 5, 7, 1, 8 and 6 tokens: token-mean over the mini-batch weighs them differently
    assert max(float((a - b).abs().max()) for a, b in zip(grads["verl"], grads["ours"])) > 1e-4


def test_decompose_metrics_per_bucket(policy):
    cfg = _config("token-mean", 0.1)
    batch, data = _inputs(policy, with_ref=True)
    metrics = grad_decomp.decompose(policy, cfg, batch, data)
    assert metrics["grad/num_buckets"] == 2.0
    assert metrics["grad/bucket_1/num_groups"] == 2.0 and metrics["grad/bucket_2/num_groups"] == 1.0
    # bucket_1 = groups 0 and 2 = rows 0, 1, 4, 5: 8 + 5 + 8 + 6 sampled tokens
    assert metrics["grad/bucket_1/num_tokens"] == 27.0 and metrics["grad/bucket_1/num_samples"] == 4.0
    assert metrics["grad/bucket_1/reward_std_mean"] == pytest.approx((0.0 + 0.5 / math.sqrt(2)) / 2)
    assert metrics["grad/all/reward_std_mean"] == pytest.approx((0 + 1 / math.sqrt(2) + 0.5 / math.sqrt(2)) / 3)
    for bucket in ("bucket_1", "bucket_2", "all"):
        for key in ("task_norm", "entropy_norm", "kl_norm", "total_norm", "task_norm_per_token",
                    "task_norm_per_sample", "cos_task_entropy", "cos_task_kl", "cos_entropy_kl", "loss_task"):
            assert math.isfinite(metrics[f"grad/{bucket}/{key}"]), (bucket, key)
        norm, count = metrics[f"grad/{bucket}/task_norm"], metrics[f"grad/{bucket}/num_tokens"]
        assert metrics[f"grad/{bucket}/task_norm_per_token"] == pytest.approx(norm / count)
    for bucket in ("bucket_1", "bucket_2", "all"):  # entropy_coef 0.05, kl_coef 0.1
        assert metrics[f"grad/{bucket}/entropy_scaled_norm"] == pytest.approx(
            0.05 * metrics[f"grad/{bucket}/entropy_norm"])
        assert metrics[f"grad/{bucket}/kl_scaled_norm"] == pytest.approx(0.1 * metrics[f"grad/{bucket}/kl_norm"])
    assert metrics["grad/bucket_2/task_norm_per_reward_std"] == pytest.approx(
        metrics["grad/bucket_2/task_norm"] * math.sqrt(2))
    # the `all` loss is the token-weighted mean of the buckets' losses
    tokens = {b: metrics[f"grad/{b}/num_tokens"] for b in ("bucket_1", "bucket_2")}
    weighted = sum(tokens[b] * metrics[f"grad/{b}/loss_task"] for b in tokens) / sum(tokens.values())
    assert metrics["grad/all/loss_task"] == pytest.approx(weighted, abs=1e-6)


def test_training_logs_the_decomposition_and_zero_spread_gives_zero_task_gradient(tmp_path):
    from ragen2.cli import main
    from tests.tiny import tiny_llama, tiny_tokenizer
    from ragen2.run_dir import read_metrics

    tokenizer = tiny_tokenizer("chatml")
    tiny_llama(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    code = main(["train", "--quiet", "--algo", "grpo", "--filter", "none", "--model", str(tmp_path / "model"),
                 "--out", str(tmp_path), "--steps", "1", "trainer.run_name=r", "rollout.num_groups=3",
                 "rollout.group_size=2", "rollout.max_new_tokens=8", "trainer.val_groups=1",
                 "optim.micro_batch_size=2", "probe.every=0", "probe.grad_every=1", "probe.grad_buckets=2",
                 "probe.grad_prefilter=true", "model.dtype=float32"])  # not auto: the same test on every CPU
    assert code == 0
    [row] = read_metrics(tmp_path / "r")
    # A random tiny model never writes the format: every reward is the same penalty, every group's
    # spread is 0, GRPO's advantages are 0, and so is the task gradient (the bound with Var = 0).
    assert row["grad/num_buckets"] == 2.0 and row["grad/all/num_groups"] == 3.0
    assert row["grad/all/reward_std_mean"] == 0.0 and row["grad/all/task_norm"] == 0.0
    assert row["grad/all/entropy_norm"] > 0
    # grpo's preset has a k3 KL term; at step 0 the policy is the reference, where k3's gradient
    # vanishes. To rounding, not exactly: the reference pass packs rows into micro-batches by shared
    # prefix over the whole batch and the decomposition by bucket, and fp32 matmuls of other shapes
    # round differently (1.1e-6 here, against an entropy norm near 1; a reference that differed
    # from the policy would give a norm of the entropy's order).
    assert row["grad/all/kl_norm"] <= 1e-4 * row["grad/all/entropy_norm"]
    assert row["grad/time_s"] > 0 and "actor/pg_loss" in row
    # the filter is none, so the pre-filter pass sees the same batch and finds the same gradients
    assert row["grad_prefilter/all/num_groups"] == 3.0
    assert row["grad_prefilter/all/entropy_norm"] == pytest.approx(row["grad/all/entropy_norm"], rel=1e-5)
    assert row["grad/all/entropy_scaled_norm"] == pytest.approx(0.001 * row["grad/all/entropy_norm"])


def test_fixed_rv_decomposition_puts_every_small_spread_in_bin_one(policy):
    # stds 0, 0.707, 0.354 all lie in [0, 1): one bucket, and `all` is that bucket
    cfg = _config("token-mean", 0.1)
    cfg.probe.grad_bucket_mode = "fixed_rv"
    batch, data = _inputs(policy, with_ref=True)
    metrics = grad_decomp.decompose(policy, cfg, batch, data, prefix="grad_prefilter")
    assert metrics["grad_prefilter/num_buckets"] == 1.0 and metrics["grad_prefilter/bucket_1/num_groups"] == 3.0
    assert metrics["grad_prefilter/bucket_1/task_norm"] == metrics["grad_prefilter/all/task_norm"]
    assert not any(k.startswith("grad/") for k in metrics)


def test_a_micro_batch_with_all_advantages_zero_gets_an_exact_zero_task_gradient_without_a_pass(policy, monkeypatch):
    """Identical rewards mean-centre to exactly 0.0: the task gradient is exactly zero, so the
    decomposition takes no backward pass for it (the entropy and KL terms still get theirs)."""
    cfg = _config("token-mean", 0.1)
    batch, data = _inputs(policy, with_ref=True)
    flat = dataclasses.replace(data, advantages=torch.zeros_like(data.advantages))
    passes = []
    grad = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda loss, *a, **k: passes.append(loss) or grad(loss, *a, **k))
    components, _, tokens, _ = grad_decomp.bucket_gradients(policy, cfg, flat, list(range(ROWS)))
    micro_batches = -(-ROWS // cfg.optim.micro_batch_size)
    assert len(passes) == 2 * micro_batches and tokens > 0  # entropy and KL only
    assert all(bool((g == 0).all()) for g in components["task"])
    assert grad_lib.norm(components["entropy"]) > 0
    # the same rows with their real advantages: three passes a micro-batch, and a task gradient
    passes.clear()
    components, *_ = grad_decomp.bucket_gradients(policy, cfg, data, list(range(ROWS)))
    assert len(passes) == 3 * micro_batches and grad_lib.norm(components["task"]) > 0


def test_a_figure_that_reads_only_the_buckets_can_skip_the_whole(policy):
    cfg = _config("token-mean", 0.1)
    batch, data = _inputs(policy, with_ref=True)
    plain = grad_decomp.decompose(policy, cfg, batch, data)
    parts = grad_decomp.decompose(policy, cfg, batch, data, analysis=grad_decomp.Analysis(whole=False))
    assert not any(key.startswith("grad/all/") for key in parts) and "grad/all/task_norm" in plain
    assert {k: v for k, v in plain.items() if "/all/" not in k and not k.endswith("time_s")} == pytest.approx(
        {k: v for k, v in parts.items() if not k.endswith("time_s")})
