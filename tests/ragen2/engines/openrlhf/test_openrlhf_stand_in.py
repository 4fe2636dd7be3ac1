"""The CPU harness's vLLM stand-in (cpu_harness/vllm_semantics.py) against vLLM 0.29.0's behaviour.

The cases below restate what vllm 0.29.0 does (read from its wheel: SamplingParams.
update_from_generation_config, v1/core/sched/utils.check_stop, v1/engine/detokenizer and
output_processor, the min-tokens logits processor). Where vLLM's own modules import (not in CI:
the wheel is 316 MB and needs msgspec, pyzmq, openai, ... even for SamplingParams), the same cases
also run through them. Pure Python: no OpenRLHF needed.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "cpu_harness_vllm_semantics", Path(__file__).resolve().parent / "cpu_harness" / "vllm_semantics.py")
vs = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = vs  # its dataclass looks its module up there
_spec.loader.exec_module(vs)

EOS, EOT = 2, 7  # the tokenizer's EOS; another EOS id of the generation config (Llama-3's <|eot_id|>)


def params(**kw):
    base = dict(max_tokens=8, min_tokens=1, stop=["</answer>"], stop_token_ids=None, ignore_eos=False)
    return SimpleNamespace(**(base | kw))


def real_vllm():
    try:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.engine.detokenizer import check_stop_strings
    except Exception:  # noqa: BLE001 - not installed, or its dependencies are not
        return None
    return SamplingParams, check_stop_strings


@pytest.mark.parametrize("configured,extra,stop_ids", [
    ([EOS, EOT], None, {EOT}),  # the primary EOS is checked on its own, not a stop id
    (EOT, None, {EOT}), (None, None, set()), ([EOS], [11], {11}), ([EOS, EOT], [11], {EOT, 11}),
])
def test_the_generation_configs_eos_ids_become_stop_ids(configured, extra, stop_ids):
    rule = vs.StopRule.of(params(stop_token_ids=extra), EOS, configured)
    assert rule.eos == EOS and rule.stop_ids == stop_ids and rule.masked_early == {EOS} | stop_ids
    if (vllm := real_vllm()) is not None:
        real = vllm[0](max_tokens=8, min_tokens=1, stop=["</answer>"], stop_token_ids=extra)
        real.update_from_generation_config({} if configured is None else {"eos_token_id": configured}, EOS)
        assert set(real.stop_token_ids) == stop_ids and real.all_stop_token_ids == rule.masked_early


def test_finish_and_stop_reason_per_token():
    rule = vs.StopRule.of(params(max_tokens=4, min_tokens=1), EOS, [EOS, EOT])
    assert rule.check([5, EOS], "ab", 1) == ("stop", None)  # the tokenizer's EOS: no stop_reason
    assert rule.check([5, EOT], "ab", 1) == ("stop", EOT)  # a stop id is the stop_reason
    assert rule.check([5, 6], "x</answer>", 9) == ("stop", "</answer>")  # a stop string
    assert rule.check([5, 6], "</answer> more", 5) is None  # already searched: not found again
    assert rule.check([5, 6, 8, 9], "abcd", 1) == ("length", None)
    assert rule.check([5, 6, 8, 9], "abc</answer>", 9) == ("stop", "</answer>")  # wins on the last token
    # no stop string in the text of the first min_tokens tokens (the detokenizer's check), not later either
    early = vs.StopRule.of(params(max_tokens=8, min_tokens=2), EOS, None)
    assert early.check([5, 6], "</answer>", 9) is None and early.check([5, 6, 9], "</answer>x", 1) is None
    assert early.check([5, 6, 9], "ab</answer>", 9) == ("stop", "</answer>")
    both = vs.StopRule.of(params(stop=["b", "ab"]), EOS, None)
    assert both.check([5, 6], "xab", 2) == ("stop", "b")  # the same end: the list's order
    if (vllm := real_vllm()) is not None:
        check_stop_strings = vllm[1]
        assert check_stop_strings("x</answer>", 9, ["</answer>"], True) == ("</answer>", -1)
        assert check_stop_strings("</answer> more", 5, ["</answer>"], True) is None
        assert check_stop_strings("xab", 2, ["b", "ab"], True)[0] == "b"


def test_sampling_uses_only_the_requests_parameters():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])
    assert vs.sample(logits.clone(), 0.0, -1, 1.0, None) == 1  # temperature 0: greedy
    draws = {vs.sample(logits.clone(), 1.0, 1, 1.0, torch.Generator().manual_seed(s)) for s in range(20)}
    assert draws == {1}  # top_k=1
    # probabilities 0.03, 0.64, 0.09, 0.24: top-p keeps the smallest most-likely set reaching p (vLLM
    # masks the ascending cumulative sum <= 1 - p)
    for top_p, kept in ((0.6, {1}), (0.8, {1, 3}), (0.95, {1, 2, 3})):
        draws = {vs.sample(logits.clone(), 1.0, -1, top_p, torch.Generator().manual_seed(s)) for s in range(80)}
        assert draws == kept, top_p
