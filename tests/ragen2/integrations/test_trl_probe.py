"""The TRL probe's pure part: TRL's padded batch -> mi_probe's pairs, estimates, EMA and alerts."""

import pytest
import torch

import mi_probe
from mi_probe import CollapseDetectorConfig
from ragen2.integrations.trl.probe import CollapseProbe, MIProbeArgs, dtype_key, probe_pairs
from tests.tiny import tiny_llama, tiny_tokenizer

PAD = 0


def _left_pad(rows):
    width = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def _right_pad(rows):
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


# Two groups of two, TRL's layout: prompts left-padded, completions right-padded.
PROMPTS = [[5, 6, 7], [5, 6, 7], [8, 9], [8, 9]]
COMPLETIONS = [[10, 11], [12], [13, 14, 15], []]  # the last one is empty (a fully masked completion)


def test_pairs_unpad_and_give_one_column_per_distinct_prompt():
    prompts, completions, owners = probe_pairs(*_left_pad(PROMPTS), *_right_pad(COMPLETIONS), num_samples=64, step=0)
    assert prompts == [[5, 6, 7], [8, 9]]
    assert completions == [[10, 11], [12], [13, 14, 15]]
    assert owners == [0, 0, 1]


def test_pairs_subsample_the_same_rows_at_the_same_step():
    prompts = [[p] for p in range(1, 13) for _ in range(2)]  # 12 groups of 2
    completions = [[20 + i] for i in range(24)]
    tensors = (*_left_pad(prompts), *_right_pad(completions))
    first = probe_pairs(*tensors, num_samples=5, step=3)
    assert len(first[1]) == 5 and first == probe_pairs(*tensors, num_samples=5, step=3)
    assert len(first[0]) == len(set(first[2]))  # only the sampled rows' prompts are columns


@pytest.fixture(scope="module")
def policy():
    tokenizer = tiny_tokenizer("chatml")
    return tiny_llama(tokenizer, seed=1)


def test_measure_is_mi_probe_on_the_same_tensors(policy):
    probe = CollapseProbe(MIProbeArgs(ks=(1, 2)), pad_token_id=PAD)
    tensors = (*_left_pad(PROMPTS), *_right_pad(COMPLETIONS))
    metrics = probe.measure(policy, *tensors, step=0)
    scores = mi_probe.cross_score_naive(policy, [[5, 6, 7], [8, 9]], [[10, 11], [12], [13, 14, 15]], [0, 0, 1])
    expected = mi_probe.mi_metrics_both(scores.L, scores.L_sum, scores.owner, column_ids=scores.column_ids, ks=(1, 2))
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, abs=1e-5), key
    assert metrics["num_empty_dropped"] == 0.0  # the empty completion is no candidate at all
    assert list(metrics) == probe.keys


def test_measure_needs_two_prompts(policy):
    probe = CollapseProbe(MIProbeArgs(), pad_token_id=PAD)
    one_prompt = (*_left_pad(PROMPTS[:2]), *_right_pad(COMPLETIONS[:2]))
    assert probe.measure(policy, *one_prompt, step=0) is None


def _metrics(mi: float) -> dict:
    # A 2-prompt matrix whose MI is `mi`-ish: the own prompt scores `mi` above the other.
    L = torch.tensor([[0.0, -mi], [-mi, 0.0], [0.0, -mi], [-mi, 0.0]])
    return mi_probe.mi_metrics_both(L, L * 3, [0, 1, 0, 1], ks=(1,))


def test_observe_is_the_ema_and_detector_of_mi_probe_and_stops_when_told():
    collapse = CollapseDetectorConfig(mi_baseline=2, mi_patience=2, mi_ratio=0.5)
    probe = CollapseProbe(MIProbeArgs(collapse=collapse, stop_on_collapse=True))
    ema, detector = mi_probe.ZScoreEMA(0.9), mi_probe.CollapseDetector(collapse)
    stopped_at = None
    for step, mi in enumerate([2.0, 2.0, 0.01, 0.01, 0.01]):
        logged, alerts, stop_on = probe.observe(step, _metrics(mi), entropy=1.0, reward_std=0.5)
        expected = ema.update(_metrics(mi))
        assert logged["probe/mi_zscore_ema"] == expected["mi_zscore_ema"]
        assert logged["probe/mi_estimate"] == _metrics(mi)["mi_estimate"]
        assert alerts == detector.update(step, mi_zscore_ema=expected["mi_zscore_ema"], entropy=1.0, reward_std=0.5)
        if stop_on is not None and stopped_at is None:
            stopped_at = step
            assert stop_on.kind == "template_collapse" and logged["alert/template_collapse"] == 1.0
    assert stopped_at == 3


def test_an_alert_is_logged_but_does_not_stop_unless_asked():
    collapse = CollapseDetectorConfig(mi_baseline=1, mi_patience=1)
    probe = CollapseProbe(MIProbeArgs(collapse=collapse))
    probe.observe(0, _metrics(2.0))
    logged, alerts, stop_on = probe.observe(1, _metrics(0.01))
    assert [a.kind for a in alerts] == ["template_collapse"] and stop_on is None
    assert logged["alert/template_collapse"] == 1.0


def test_args_are_checked():
    with pytest.raises(ValueError, match="every"):
        MIProbeArgs(every=0)
    with pytest.raises(ValueError, match="ema_decay"):
        MIProbeArgs(ema_decay=1.0)
    with pytest.raises(ValueError, match="dtype"):
        MIProbeArgs(dtype="bfloat16")


def test_the_probe_scores_in_trls_mixed_precision_by_default_and_in_fp32_when_asked(policy):
    """The default follows the policy: under TRL's bf16 mixed precision it scores in bf16 (MI close to
    fp32's, not equal), without mixed precision in the weights' fp32; dtype="float32" scores in fp32
    even under bf16 mixed precision and inside a caller's autocast, and needs fp32 weights."""
    tensors = (*_left_pad(PROMPTS), *_right_pad(COMPLETIONS))
    default = CollapseProbe(MIProbeArgs(ks=(1,)), pad_token_id=PAD)
    assert default.args.dtype == "policy"
    fp32 = default.measure(policy, *tensors, step=0, mixed_precision="no")
    assert default.last_dtype == torch.float32
    bf16 = default.measure(policy, *tensors, step=0, mixed_precision="bf16")
    assert default.last_dtype == torch.bfloat16
    assert bf16["mi_estimate"] != fp32["mi_estimate"]
    assert bf16["mi_estimate"] == pytest.approx(fp32["mi_estimate"], abs=0.05)
    asked = CollapseProbe(MIProbeArgs(ks=(1,), dtype="float32"), pad_token_id=PAD)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert asked.measure(policy, *tensors, step=0, mixed_precision="bf16") == fp32
    assert asked.last_dtype == torch.float32
    low = tiny_llama(tiny_tokenizer("chatml"), seed=1).to(torch.bfloat16)
    with pytest.raises(ValueError, match="fp32 weights"):
        asked.measure(low, *tensors, step=0)


def test_a_row_names_its_dtype_as_a_number_trl_can_average():
    assert dtype_key(torch.bfloat16) == "probe/dtype/bfloat16"
