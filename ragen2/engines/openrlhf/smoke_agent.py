"""The agent file of the GPU smoke test (scripts/gpu_smoke.sh, smoke.py): ragen2's AgentExecutor, recording.

It plays exactly as `agent.AgentExecutor`, and appends one JSON line per generate and per numbered
sample to $RAGEN2_SMOKE_LOG: the seed and rollout index of each sample, and each completion's
finish_reason / stop_reason checked against vLLM 0.29.0's semantics ("length": max_tokens ids;
"stop" with stop_reason None: the tokenizer's EOS is the last id; an int: that id is the last id;
a string: the text holds it). Loaded by path by OpenRLHF like agent_entry.py: no dataclasses here.
"""
import json
import os

from ragen2.engines.openrlhf import SMOKE_LOG_ENV as LOG_ENV
from ragen2.engines.openrlhf.agent import AgentExecutor as _Agent


def _write(row: dict) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps(row) + "\n")


def vllm_semantics_ok(output, ids, params, tokenizer) -> bool:
    reason, stop_reason = output.finish_reason, getattr(output, "stop_reason", None)
    if reason == "length":
        return len(ids) == params.max_tokens
    if reason != "stop" or not ids:
        return False
    if stop_reason is None:
        return ids[-1] == tokenizer.eos_token_id
    if isinstance(stop_reason, int):
        return ids[-1] == stop_reason
    return stop_reason in tokenizer.decode(ids, skip_special_tokens=False)


class _Recorder:
    def __init__(self, engine, tokenizer, seed):
        self.engine, self.tokenizer, self.seed = engine, tokenizer, seed

    async def generate(self, prompt_token_ids, sampling_params, *args, **kwargs):
        request = await self.engine.generate(prompt_token_ids, sampling_params, *args, **kwargs)
        output = request.outputs[0]
        ids = list(output.token_ids)
        stop_reason = getattr(output, "stop_reason", None)
        _write({"kind": "generate", "seed": self.seed, "finish": output.finish_reason,
                "stop_reason": stop_reason if isinstance(stop_reason, (int, str)) or stop_reason is None
                else repr(stop_reason), "tokens": len(ids), "max_tokens": sampling_params.max_tokens,
                "ok": vllm_semantics_ok(output, ids, sampling_params, self.tokenizer)})
        return request


class AgentExecutor(_Agent):
    def _next_member(self, label, group_size=None):
        member = super()._next_member(label, group_size)
        _write({"kind": "member", "seed": json.loads(label)["seed"], "member": member})
        return member

    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        seed = json.loads(label)["seed"]
        return await super().execute(prompt, label, sampling_params, max_length, hf_tokenizer,
                                     _Recorder(llm_engine, hf_tokenizer, seed), images)
