"""Records what vLLM's own code does with the requests the OpenRLHF engine sends, for the stand-in's tests.

    python tests/ragen2/engines/openrlhf/cpu_harness/record_vllm_semantics.py [--check]

needs `vllm` importable (CI does not install it: see vllm_semantics.py). On a CPU machine with the
OpenRLHF venv, `pip install --no-deps --target DIR` of vllm==0.29.0 and of msgspec==0.23.0 cbor2==6.3.0
pyzmq==27.3.0 openai==3.60.0 openai-harmony==0.0.8 sniffio==1.3.1 pybase64==1.5.1 cachetools==8.0.2
uvloop==0.23.0 prometheus-client==0.26.0 (what `from vllm import SamplingParams` needs) and
llguidance==1.7.3 xgrammar==0.2.9 apache-tvm-ffi==0.1.11 (what vllm.v1.request needs), then
PYTHONPATH=DIR, is enough. It writes
fixtures/vllm-0.29.0-semantics.json (--check: compares instead and exits 1 on a difference).
Nothing here runs a model: each case drives the vLLM functions a request passes through, in vLLM's order.

- params: OpenRLHF's SamplingParams (samples_generator.py), the agent's per-turn edits (deepcopy,
  max_tokens, stop, include_stop_str_in_output), then the input processor (v1/engine/input_processor.py:
  clone, max_tokens when unset = max_model_len - prompt length, update_from_generation_config with the
  model's generation config and the tokenizer's EOS). Recorded: the fields the engine then uses.
- stops: a scripted token sequence fed one token per step through the scheduler's check_stop
  (v1/core/sched/utils.py) and the output processor's incremental detokenizer (v1/engine/detokenizer.py,
  output_processor.py: a stop string overrides the scheduler's finish). Recorded: the kept token ids,
  finish_reason, stop_reason and text of the RequestOutput.
- sampling: the sampler's top-k/top-p (v1/sample/ops/topk_topp_sampler.py, PyTorch path) and its draw
  (exponential race, per-request generator when SamplingParams.seed is set): the kept ids and six seeded
  draws from fixed logits.
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "fixtures" / "vllm-0.29.0-semantics.json"
TOKENIZER = HERE.parent / "fixtures" / "tiny-llama3"  # Llama-3 layout: EOS <|end_of_text|>, turns end <|eot_id|>

# OpenRLHF 0.11.2's SamplingParams for a rollout (trainer/ppo_utils/samples_generator.py)
OPENRLHF = dict(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1, skip_special_tokens=False,
                logprobs=None)
AGENT = dict(max_tokens=48, stop=["</answer>"], include_stop_str_in_output=True)  # ragen2's agent, per turn
LLAMA3_GENERATION = {"eos_token_id": [1, 4]}  # <|end_of_text|>, <|eot_id|>
SAMPLING_DEFAULTS = {"eos_token_id": 4, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}

PARAMS_CASES = [
    {"name": "openrlhf_llama3", "request": OPENRLHF, "agent": AGENT, "generation_config": LLAMA3_GENERATION},
    {"name": "generation_config_sampling_defaults_not_applied", "request": OPENRLHF, "agent": AGENT,
     "generation_config": SAMPLING_DEFAULTS},
    {"name": "max_tokens_unset", "request": OPENRLHF, "agent": None, "generation_config": LLAMA3_GENERATION},
    {"name": "request_stop_ids_join", "request": OPENRLHF | {"stop_token_ids": [11]}, "agent": AGENT,
     "generation_config": LLAMA3_GENERATION},
    {"name": "no_generation_config", "request": OPENRLHF, "agent": AGENT, "generation_config": {}},
    {"name": "greedy", "request": OPENRLHF | {"temperature": 0.0, "top_p": 0.5, "top_k": 5}, "agent": AGENT,
     "generation_config": LLAMA3_GENERATION},
    {"name": "seeded", "request": OPENRLHF | {"seed": 7}, "agent": AGENT, "generation_config": LLAMA3_GENERATION},
    {"name": "ignore_eos", "request": OPENRLHF | {"ignore_eos": True}, "agent": AGENT,
     "generation_config": LLAMA3_GENERATION},
]
PARAMS_FIELDS = ("eos_token_id", "stop_token_ids", "all_stop_token_ids", "max_tokens", "min_tokens", "temperature",
                 "top_p", "top_k", "seed", "stop", "include_stop_str_in_output", "skip_special_tokens", "ignore_eos",
                 "repetition_penalty")
PROMPT_LEN, MAX_MODEL_LEN = 20, 64

REPLY = " go up</think> <answer>Up</answer> more"
STOP_CASES = [  # "tail": special tokens appended to REPLY's ids (or REPLY cut where "cut" says)
    {"name": "generation_config_eos", "text": " go up</think> <answer>Up", "tail": ["<|eot_id|>"], "params": {}},
    {"name": "tokenizer_eos", "text": " go up</think> <answer>Up", "tail": ["<|end_of_text|>"], "params": {}},
    {"name": "stop_string", "text": REPLY, "tail": [], "params": {}},
    {"name": "stop_string_excluded", "text": REPLY, "tail": [],
     "params": {"include_stop_str_in_output": False}},
    {"name": "eos_text_excluded", "text": " go up", "tail": ["<|eot_id|>"],
     "params": {"include_stop_str_in_output": False}},
    {"name": "skip_special_tokens", "text": " go up", "tail": ["<|eot_id|>"], "params": {"skip_special_tokens": True}},
    {"name": "length", "text": REPLY, "tail": [], "params": {"max_tokens": 3}},
    {"name": "stop_string_on_the_last_token_wins", "text": " <answer>Up</answer>", "tail": [],
     "params": {"max_tokens": "len"}},
    {"name": "min_tokens_hides_an_early_stop_string", "text": "</answer> go up</answer>", "tail": [],
     "params": {"min_tokens": 4}},
    {"name": "max_model_len", "text": REPLY, "tail": [], "params": {"max_tokens": 100}, "max_model_len": 26},
    {"name": "request_stop_token_id", "text": " go up", "tail": ["<|start_header_id|>"],
     "params": {"stop_token_ids": ["<|start_header_id|>"]}},
    {"name": "two_stop_strings_first_completed", "text": " <answer>Up</answer>", "tail": [],
     "params": {"stop": ["</answer>", "Up"]}},
]

LOGITS = [0.0, 3.0, 1.0, 2.0, -1.0, 2.5, 0.5, 1.5]
SAMPLING_CASES = [
    {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "seed": 3},
    {"temperature": 0.7, "top_k": 3, "top_p": 1.0, "seed": 5},
    {"temperature": 1.0, "top_k": -1, "top_p": 0.8, "seed": 11},
    {"temperature": 1.3, "top_k": 4, "top_p": 0.9, "seed": 2},
]
DRAWS = 6


def vllm_params(case):
    from vllm import SamplingParams

    params = SamplingParams(**case["request"])  # the controller's, pickled to the engine by Ray
    params = copy.deepcopy(params)  # the agent's per-turn copy
    for key, value in (case["agent"] or {}).items():
        setattr(params, key, value)
    params = copy.deepcopy(params).clone()  # OpenRLHF's generate, then the input processor
    if params.max_tokens is None:
        params.max_tokens = MAX_MODEL_LEN - PROMPT_LEN
    params.update_from_generation_config(case["generation_config"], 1)  # the tokenizer's EOS: <|end_of_text|>
    return params


def record_params(case) -> dict:
    params = vllm_params(case)
    out = {}
    for field in PARAMS_FIELDS:
        value = getattr(params, field)
        out[field] = sorted(value) if isinstance(value, (set, frozenset)) or field == "stop_token_ids" else value
    return out


def stop_case(case, tokenizer) -> tuple[list[int], dict]:
    """A stop case's sampled token ids and its request's sampling settings (the agent's, then the case's),
    as both the recorder and the stand-in's test feed them."""
    ids = tokenizer(case["text"], add_special_tokens=False)["input_ids"]
    ids += [tokenizer.convert_tokens_to_ids(t) for t in case["tail"]]
    settings = dict(case["params"])
    if settings.get("max_tokens") == "len":
        settings["max_tokens"] = len(ids)
    if "stop_token_ids" in settings:
        settings["stop_token_ids"] = [tokenizer.convert_tokens_to_ids(t) for t in settings["stop_token_ids"]]
    return ids, OPENRLHF | {"max_tokens": 48, "stop": ["</answer>"], "include_stop_str_in_output": True} | settings


def record_stop(case, tokenizer) -> dict:
    from vllm import SamplingParams
    from vllm.v1.core.sched.utils import check_stop
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer
    from vllm.v1.request import Request, RequestStatus

    ids, settings = stop_case(case, tokenizer)
    params = SamplingParams(**settings)
    params.update_from_generation_config(LLAMA3_GENERATION, tokenizer.eos_token_id)
    prompt = list(range(5, 5 + PROMPT_LEN))
    max_model_len = case.get("max_model_len", 4096)
    request = Request("r", prompt, params, None)
    core = EngineCoreRequest(request_id="r", prompt_token_ids=prompt, mm_features=None, sampling_params=params,
                             pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None,
                             data_parallel_rank=None)
    detokenizer = IncrementalDetokenizer.from_new_request(tokenizer, core)
    finish, stop_reason = None, None
    for token in ids:
        request.append_output_token_ids(token)
        if check_stop(request, max_model_len):
            finish = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH_CAPPED: "length"}[
                request.status]
            stop_reason = request.stop_reason
        stop_string = detokenizer.update([token], finish == "stop")
        if stop_string:  # output_processor: the detokenizer's stop string overrides, the engine aborts the request
            finish, stop_reason = "stop", stop_string
        if finish is not None:
            break
    return {"token_ids": list(request.output_token_ids), "finish_reason": finish, "stop_reason": stop_reason,
            "text": detokenizer.get_next_output_text(finished=True, delta=False)}


def record_sampling(case) -> dict:
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch, random_sample

    logits = torch.tensor([LOGITS], dtype=torch.float32) / case["temperature"]
    k = None if case["top_k"] <= 0 else torch.tensor([case["top_k"]])
    p = None if case["top_p"] >= 1.0 else torch.tensor([case["top_p"]])
    kept = apply_top_k_top_p_pytorch(logits.clone(), k, p)
    probs = kept.softmax(dim=-1, dtype=torch.float32)
    generator = torch.Generator().manual_seed(case["seed"])  # gpu_model_runner: one per seeded request
    draws = [int(random_sample(probs.clone(), {0: generator})[0]) for _ in range(DRAWS)]
    return {"kept": [i for i, v in enumerate(kept[0].tolist()) if v != float("-inf")], "draws": draws,
            "processed_logprobs": [round(v, 6) for v in kept.log_softmax(dim=-1)[0].tolist()]}


def record() -> dict:
    import vllm
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    return {
        "vllm": vllm.__version__,
        "command": "python tests/ragen2/engines/openrlhf/cpu_harness/record_vllm_semantics.py",
        "prompt_len": PROMPT_LEN, "max_model_len": MAX_MODEL_LEN, "logits": LOGITS,
        "params": [case | {"vllm": record_params(case)} for case in PARAMS_CASES],
        "stops": [case | {"vllm": record_stop(case, tokenizer)} for case in STOP_CASES],
        "sampling": [case | {"vllm": record_sampling(case)} for case in SAMPLING_CASES],
    }


def main(argv: list[str]) -> int:
    recorded = json.loads(json.dumps(record()))
    if "--check" in argv:
        kept = json.loads(FIXTURE.read_text())
        print("same as the fixture" if kept == recorded else "differs from the fixture")
        return 0 if kept == recorded else 1
    FIXTURE.write_text(json.dumps(recorded, indent=1) + "\n")
    print(f"wrote {FIXTURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
