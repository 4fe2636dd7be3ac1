"""model.dtype=auto and the precision policy (ragen2.precision).

The choice is tested from its inputs (CPU flags, benchmark figures), so these tests say the
same on a CPU with bf16 units and on one without; the bf16 forwards run on any CPU (torch
emulates bf16 where the units are missing, slowly but with the same rounding).
"""

import pytest
import torch

from ragen2 import precision
from ragen2.config import Config, load_config
from tests import tiny
from ragen2.engines.local import learner
from ragen2.rollout import generate
from tests.tiny import tiny_llama, tiny_tokenizer

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
ZEN4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_bf16_units_are_read_from_the_cpu_flags():
    assert precision.cpu_bf16_flags(AVX2_ONLY) == []
    assert precision.cpu_bf16_flags(ZEN4) == ["avx512_bf16"]
    assert precision.cpu_bf16_flags(SAPPHIRE_RAPIDS) == ["amx_bf16", "avx512_bf16"]
    assert precision.cpu_bf16_flags(GRAVITON3) == ["bf16"]
    assert precision.cpu_bf16_flags("") == []


def test_cpu_choice_is_bf16_exactly_where_x86_has_bf16_units():
    assert precision.choose_cpu_dtype([]).dtype == "float32"  # emulated: never bf16
    zen4 = precision.choose_cpu_dtype(["avx512_bf16"])
    assert zen4.dtype == "bfloat16" and "avx512_bf16" in zen4.reason
    assert precision.choose_cpu_dtype(["amx_bf16", "avx512_bf16"]).dtype == "bfloat16"
    arm = precision.choose_cpu_dtype(["bf16"])  # Arm's flag: not acted on, and it says how to try
    assert arm.dtype == "float32" and "model.dtype=bfloat16" in arm.reason


@pytest.mark.parametrize("cpuinfo, dtype", [(AVX2_ONLY, "float32"), (ZEN4, "bfloat16"),
                                            (SAPPHIRE_RAPIDS, "bfloat16"), (GRAVITON3, "float32")])
def test_the_cpu_flags_alone_decide_never_a_timing(monkeypatch, cpuinfo, dtype):
    # A timing read under load, or under another BLAS path, flipped between processes, so two
    # runs of one config could compute in different precisions (issue 32 item 8).
    monkeypatch.setattr(precision, "_read_cpuinfo", lambda: cpuinfo)

    def no_benchmark(*_):
        raise AssertionError("the auto choice must not time anything")

    monkeypatch.setattr(precision, "matmul_gflops", no_benchmark)
    choice = precision._cpu_choice.__wrapped__()  # uncached: the process-wide cache is not touched
    assert choice.dtype == dtype


def test_an_explicit_dtype_always_wins(monkeypatch):
    monkeypatch.setattr(precision, "_cpu_choice", lambda: pytest.fail("auto was not asked for"))
    assert precision.resolve("float32", "cpu").dtype == "float32"
    assert precision.resolve("bfloat16", "cpu").reason == "set in the config"
    with pytest.raises(ValueError, match="model.dtype must be auto or one of"):
        precision.resolve("float8", "cpu")


def test_the_benchmark_measures_something_and_leaves_the_global_rng_alone():
    before = torch.random.get_rng_state()
    assert precision.matmul_gflops(torch.float32, size=128, seconds=0.01) > 0.1
    assert torch.equal(torch.random.get_rng_state(), before)  # a run's seeding is not shifted by it


def test_build_models_writes_the_resolved_dtype_into_the_config(monkeypatch, tmp_path):
    tok = tiny.build_tiny_tokenizer()
    folder = tmp_path / "tiny"
    tiny.build_tiny_policy(tokenizer=tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    monkeypatch.setattr(precision, "resolve",
                        lambda requested, device: precision.PrecisionChoice("bfloat16", "test: pretend fast bf16"))
    cfg = load_config(overrides=[f"model.name={folder}", "algo.advantage=gae", "algo.kl_coef=0.01"])
    assert cfg.model.dtype == "auto"
    told = []
    built = learner.build_models(cfg, report=told.append)
    assert cfg.model.dtype == "bfloat16" and told[0].reason == "test: pretend fast bf16"
    for module in (built.policy, built.critic, built.reference):
        assert precision.compute_dtype(module) == torch.bfloat16
        assert {p.dtype for p in module.parameters()} == {torch.float32}  # fp32 master weights


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer("chatml")


def bf16_copy(model):
    import copy

    return precision.set_compute_dtype(copy.deepcopy(model), torch.bfloat16)


def test_bf16_policy_keeps_fp32_weights_logprobs_values_and_optimizer_state(tok):
    policy = tiny_llama(tok, seed=0)
    policy_bf16 = bf16_copy(policy)
    ids = torch.tensor([tok.encode("<think> push </think><answer>Up</answer>", add_special_tokens=False)])
    mask = torch.ones_like(ids)
    response = torch.zeros_like(ids)
    response[:, 5:] = 1
    lp32, _ = learner.policy_log_probs(policy, learner.TokenRows(ids, mask, response))
    lp16, entropy = learner.policy_log_probs(policy_bf16, learner.TokenRows(ids, mask, response), with_entropy=True)
    assert lp16.dtype == torch.float32 and entropy.dtype == torch.float32
    sampled = response[:, 1:].bool()
    gap = (lp16 - lp32)[:, 1:][sampled].detach().abs()
    # bf16 matmuls change log-probs by rounding, not more: > 0 (it really ran bf16), small
    assert 0 < float(gap.max()) < 0.05
    # the same bf16 forward twice is bit-identical: the first PPO ratio is exactly 1
    again, _ = learner.policy_log_probs(policy_bf16, learner.TokenRows(ids, mask, response))
    assert torch.equal(again, lp16)

    critic = precision.set_compute_dtype(tiny.build_tiny_value_model(config=policy.config), torch.bfloat16)
    values = learner.critic_values(critic, ids, mask)
    assert values.dtype == torch.float32

    optimizer = torch.optim.AdamW(policy_bf16.parameters(), lr=1e-3)
    with precision.autocast(policy_bf16):
        loss = policy_bf16(ids).logits.float().logsumexp(-1).mean()
    loss.backward()
    optimizer.step()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in policy_bf16.parameters())
    state = optimizer.state[next(policy_bf16.parameters())]
    assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32


def test_bf16_sampling_logprobs_match_the_bf16_teacher_forced_ones(tok):
    """Sampling and the update compute in the same precision, so they agree to bf16 rounding
    (an fp32 sampler against a bf16 update would differ by the whole bf16 error, every step)."""
    policy_bf16 = bf16_copy(tiny_llama(tok, seed=1))
    prompts = [tok.encode(text, add_special_tokens=False) for text in ("Turn 1:\nState:\n#_P", "a b c d")]
    results = generate(policy_bf16, prompts, max_new_tokens=12, temperature=1.0, eos_token_ids=[tok.eos_token_id],
                       pad_token_id=tok.pad_token_id, tokenizer=tok, generator=torch.Generator().manual_seed(0))
    for prompt, result in zip(prompts, results):
        ids = torch.tensor([prompt + result.token_ids])
        response = torch.zeros_like(ids)
        response[:, len(prompt):] = 1
        forced, _ = learner.policy_log_probs(policy_bf16, learner.TokenRows(ids, torch.ones_like(ids), response))
        gap = (forced[0, len(prompt):] - torch.tensor(result.logprobs)).abs()
        assert float(gap.max()) < 0.05


def test_fp32_models_run_without_autocast(tok):
    policy = tiny_llama(tok, seed=0)
    assert precision.compute_dtype(policy) == torch.float32
    with precision.autocast(policy):
        assert not torch.is_autocast_enabled("cpu")
    with precision.autocast(bf16_copy(policy)):
        assert torch.is_autocast_enabled("cpu")


def test_a_no_grad_pass_casts_each_weight_once_not_once_per_micro_batch(tok):
    """The old/reference log-prob pass holds one autocast context over its micro-batches, so each
    weight is cast to bf16 once per pass; the log-probs are bit-identical to per-micro-batch casts."""
    from torch.utils._python_dispatch import TorchDispatchMode

    policy = bf16_copy(tiny_llama(tok, seed=0))
    weights = {p.data_ptr() for p in policy.parameters()}

    class CountWeightCasts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.casts = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if (func is torch.ops.aten._to_copy.default and args[0].data_ptr() in weights
                    and kwargs.get("dtype") == torch.bfloat16):
                self.casts += 1
            return func(*args, **kwargs)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (8, 20), generator=g)
    attn, mask = torch.ones_like(ids), torch.zeros_like(ids)
    mask[:, 12:] = 1
    with torch.no_grad(), CountWeightCasts() as one_pass:
        cfg = Config(rollout={"temperature": 1.0}, optim={"micro_batch_size": 2, "shared_prefix": False})
        pass_log_probs = learner.log_probs_pass(policy, learner.TokenRows(ids, attn, mask), cfg)
    with torch.no_grad(), CountWeightCasts() as per_micro_batch:  # 4 micro-batches, a context each
        separate = learner.batched(lambda i, a, m: learner.policy_log_probs(policy, learner.TokenRows(i, a, m))[0],
                                   2, ids, attn, mask)
    assert one_pass.casts > 0 and per_micro_batch.casts == 4 * one_pass.casts
    assert torch.equal(pass_log_probs, separate)
