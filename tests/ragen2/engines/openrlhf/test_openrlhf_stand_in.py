"""The CPU harness's vLLM stand-in (cpu_harness/vllm_semantics.py) against vLLM 0.29.0's own code.

fixtures/vllm-0.29.0-semantics.json holds what vLLM's functions returned for each case
(cpu_harness/record_vllm_semantics.py wrote it, with vllm 0.29.0 importable); here the stand-in's
mirror must return the same. The cases, in words:

- params: OpenRLHF's SamplingParams + the agent's per-turn edits + the input processor. A Llama-3
  generation config's <|eot_id|> becomes a stop token id beside the primary EOS <|end_of_text|>;
  both are in all_stop_token_ids (what min_tokens masks); a request's own stop ids join them; a
  generation config's sampling defaults (temperature 0.6, top_p 0.9, top_k 20, repetition_penalty 1.1)
  are NOT applied; max_tokens unset = max_model_len - prompt length; greedy sets top_p 1, top_k 0;
  a seed is kept; ignore_eos drops the primary EOS and the stop ids but still masks them.
- stops: a generation-config EOS -> ("stop", its id), the tokenizer's EOS -> ("stop", None), both
  tokens kept; a stop string -> ("stop", the string), the tokens through the one completing it
  kept, the text cut after (or, without include_stop_str_in_output, before) it; max_tokens and
  max_model_len -> "length", but a stop string completed on the last token wins; no stop string is
  looked for in the first min_tokens tokens' text; of two stop strings the one completed first.
- sampling: vLLM's top-k/top-p masks and, for a seeded request, the same six draws (the exponential
  race from the request's own generator).

Where vLLM imports (not in CI: see vllm_semantics.py for why), the recording is also redone live.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

HARNESS = Path(__file__).resolve().parent / "cpu_harness"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"cpu_harness_{name}", HARNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


vs = _load("vllm_semantics")
recorder = _load("record_vllm_semantics")
RECORDED = json.loads((FIXTURES / "vllm-0.29.0-semantics.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(FIXTURES / "tiny-llama3")


def as_recorded(resolved: vs.Resolved) -> dict:
    out = {}
    for name in recorder.PARAMS_FIELDS:
        value = getattr(resolved, name, 1.0 if name == "repetition_penalty" else None)
        out[name] = sorted(value) if isinstance(value, frozenset) else list(value) if isinstance(value, tuple) else value
    return out


def test_the_recording_is_vllm_0_29_0s():
    assert RECORDED["vllm"] == "0.29.0" and RECORDED["params"] and RECORDED["stops"] and RECORDED["sampling"]


@pytest.mark.parametrize("case", RECORDED["params"], ids=lambda c: c["name"])
def test_sampling_params_resolve_as_vllms_input_processor(case):
    params = SimpleNamespace(**case["request"])
    for key, value in (case["agent"] or {}).items():  # the agent's per-turn edits
        setattr(params, key, value)
    resolved = vs.resolve(params, case["generation_config"], 1, RECORDED["max_model_len"], RECORDED["prompt_len"])
    assert as_recorded(resolved) == case["vllm"]


@pytest.mark.parametrize("case", RECORDED["stops"], ids=lambda c: c["name"])
def test_each_token_stops_as_vllms_scheduler_and_detokenizer(case, tokenizer):
    ids, settings = recorder.stop_case(case, tokenizer)
    params = SimpleNamespace(**settings)
    max_model_len = case.get("max_model_len", 4096)
    resolved = vs.resolve(params, recorder.LLAMA3_GENERATION, tokenizer.eos_token_id, max_model_len,
                          recorder.PROMPT_LEN)
    completion = vs.Completion(resolved, tokenizer, recorder.PROMPT_LEN, max_model_len)
    for token in ids:
        if completion.step(token):
            break
    got = {"token_ids": completion.token_ids, "finish_reason": completion.finish_reason,
           "stop_reason": completion.stop_reason, "text": completion.text}
    assert got == case["vllm"]


@pytest.mark.parametrize("case", RECORDED["sampling"], ids=lambda c: f"T{c['temperature']}-k{c['top_k']}-p{c['top_p']}")
def test_seeded_draws_and_masks_are_vllms(case):
    request = vs.resolve(SimpleNamespace(**{k: case[k] for k in ("temperature", "top_k", "top_p", "seed")},
                                         max_tokens=8, min_tokens=0), {}, None, 64, 4)
    logits = torch.tensor(RECORDED["logits"])
    kept = vs.top_k_top_p(logits.unsqueeze(0) / request.temperature, request.top_k, request.top_p)[0]
    assert [i for i, v in enumerate(kept.tolist()) if v != float("-inf")] == case["vllm"]["kept"]
    generator = torch.Generator().manual_seed(request.seed)  # the engine's per-request generator
    draws = [vs.sample(logits, request, 1, generator, processed_logprobs=True) for _ in range(recorder.DRAWS)]
    assert [token for token, _ in draws] == case["vllm"]["draws"]
    assert draws[0][1].tolist() == pytest.approx(case["vllm"]["processed_logprobs"], abs=1e-5)


def test_min_tokens_masks_every_stop_id_and_raw_logprobs_are_the_models():
    logits = torch.tensor([0.0, 5.0, 1.0, 1.0, 6.0])  # 1: the tokenizer's EOS, 4: a generation-config EOS
    params = SimpleNamespace(temperature=0.0, max_tokens=8, min_tokens=2)
    request = vs.resolve(params, {"eos_token_id": [1, 4]}, 1, 64, 4)
    assert vs.sample(logits, request, 0, None)[0] == 2  # both EOS ids masked while < min_tokens are out
    token, logprobs = vs.sample(logits, request, 2, None)
    assert token == 4 and logprobs.tolist() == pytest.approx(torch.log_softmax(logits, -1).tolist())


def test_a_sampling_field_the_stand_in_lacks_is_refused():
    with pytest.raises(vs.UnsupportedRequest, match="repetition_penalty"):
        vs.resolve(SimpleNamespace(repetition_penalty=1.1, max_tokens=4), {}, 1, 64, 4)


def test_the_recording_matches_vllm_where_it_imports():
    try:
        import vllm  # noqa: F401
        from vllm.v1.core.sched.utils import check_stop  # noqa: F401
    except Exception as error:  # noqa: BLE001 - not installed, or a dependency is missing
        pytest.skip(f"vllm 0.29.0 not importable here ({type(error).__name__}); the fixture stands in for it")
    assert json.loads(json.dumps(recorder.record())) == RECORDED
