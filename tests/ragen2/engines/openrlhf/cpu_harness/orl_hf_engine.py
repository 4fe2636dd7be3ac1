"""Test harness only: OpenRLHF's rollout actor with vLLM's engine replaced by a Hugging Face model.

`HFRolloutActorImpl` subclasses the class under OpenRLHF's `ray.remote` RolloutRayActor
(trainer/ray/vllm_engine.py), so OpenRLHF's own request handling (`generate_responses`: one
`executor.execute(...)` per sample, with `llm_engine=self`) and agent loading
(`_load_agent_executor` on --train.agent_func_path) run unchanged. Replaced is what touched vLLM:
`__init__` (an HF model in the dtype create_vllm_engines passes), `generate` (token ids in, a
vLLM-shaped RequestOutput out, decoded token by token with vLLM 0.29.0's stop and sampling rules:
vllm_semantics.py), sleep / wake_up / prefix cache / pause, and the colocated weight sync
`update_weight_cuda_ipc` (trainer/ray/ppo_actor.py: with CPU tensors, torch's reduce_tensor handle
carries the storage, so rebuilding it gives the trained weights). The NCCL broadcast path
(init_process_group / update_weight) is refused: it needs vLLM and CUDA.

Not vLLM: one request at a time, each from its own seed (see _generate), and no prefix cache.

For the test, after every full weight sync and every sleep, the engine writes its counters
(engine-<pid>.json: calls, tokens, finish reasons, syncs) and after a sync its weights
(engine-<pid>.safetensors) to $RAGEN2_HARNESS_DIR.
"""
from __future__ import annotations

import asyncio
import importlib
import json
import os
import threading
import zlib
from types import SimpleNamespace

import ray
import torch
from vllm_semantics import StopRule, sample

_vllm_engine = importlib.import_module("openrlhf.trainer.ray.vllm_engine")
_Base = _vllm_engine.RolloutRayActor.__ray_actor_class__
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class HFRolloutActorImpl(_Base):
    async def __init__(self, *args, bundle_indices=None, agent_func_path=None, remote_rm_url=None,
                       mm_pad_token_ids=None, **kwargs):
        from openrlhf.utils.agent import SingleTurnAgentExecutor
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.kwargs = kwargs
        self.executor = (_vllm_engine._load_agent_executor(agent_func_path) if agent_func_path
                         else SingleTurnAgentExecutor(remote_rm_url))
        self._mm_pad_token_ids = mm_pad_token_ids
        self.dtype = DTYPES[kwargs.get("dtype", "bfloat16")]
        self.tokenizer = AutoTokenizer.from_pretrained(kwargs["model"])
        self.model = AutoModelForCausalLM.from_pretrained(kwargs["model"], dtype=self.dtype,
                                                          attn_implementation="sdpa").eval()
        # vLLM stops at these too (vllm_semantics); its other defaults are not applied to requests
        self.generation_eos = getattr(self.model.generation_config, "eos_token_id", None)
        self._seed = int(kwargs.get("seed", 0))
        self._prompts_seen: dict[int, int] = {}
        self._lock = threading.Lock()  # one generate at a time
        self._unfinished = 0
        self.awake = {"weights": True, "kv_cache": True}
        self.stats = {"executor": f"{type(self.executor).__module__}.{type(self.executor).__name__}",
                      "generate_calls": 0, "generated_tokens": 0, "sleeps": 0, "wake_ups": 0,
                      "tensors_updated": 0, "weight_syncs": 0, "finishes": {}}
        self._write()

    def _write(self, weights: bool = False) -> None:
        folder = os.environ["RAGEN2_HARNESS_DIR"]
        name = os.path.join(folder, f"engine-{os.getpid()}")
        if weights:
            from safetensors.torch import save_file

            save_file({k: v.detach().contiguous() for k, v in self.model.state_dict().items()}, name + ".safetensors")
        with open(name + ".json", "w") as handle:
            json.dump(self.stats, handle)

    # --- what the controller and the actor call ----------------------------------------------

    def get_num_unfinished_requests(self) -> int:
        return self._unfinished

    async def sleep(self, level=1):
        self.stats["sleeps"] += 1
        self.awake = {"weights": False, "kv_cache": False}
        self._write()

    async def wake_up(self, tags=None):
        self.stats["wake_ups"] += 1
        for tag in (["weights", "kv_cache"] if tags is None else tags):
            self.awake[tag] = True

    async def reset_prefix_cache(self):
        pass

    async def pause_generation(self):
        pass

    async def resume_generation(self):
        pass

    async def init_process_group(self, *args, **kwargs):
        raise RuntimeError("HF engine: the NCCL broadcast weight sync needs vLLM and CUDA; the colocated "
                           "runs ragen2 launches use update_weight_cuda_ipc")

    async def update_weight(self, *args, **kwargs):
        raise RuntimeError("HF engine: update_weight (NCCL broadcast) is not supported")

    async def update_weight_cuda_ipc(self, name, dtype, shape, ipc_handles, empty_cache=False):
        if not self.awake["weights"]:
            raise RuntimeError(f"weight update of {name} while the weights sleep (OpenRLHF wakes them first)")
        rebuild, args = ipc_handles[sorted(ipc_handles)[0]]
        weight = rebuild(*args)
        param = self.model.get_parameter(name)
        if dtype != self.dtype or tuple(shape) != tuple(param.shape):
            raise RuntimeError(f"weight update of {name}: got {dtype} {tuple(shape)}, engine holds {self.dtype} "
                               f"{tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(weight.to(param.dtype))
        self.stats["tensors_updated"] += 1
        if empty_cache:  # OpenRLHF sets it on the last tensor of a sync
            self.stats["weight_syncs"] += 1
            self._write(weights=True)

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        if not all(self.awake.values()):
            raise RuntimeError(f"generate while asleep ({self.awake}): OpenRLHF wakes the engine first")
        self._unfinished += 1
        try:
            return await asyncio.to_thread(self._generate, list(prompt_token_ids), sampling_params)
        finally:
            self._unfinished -= 1

    # --- a token-by-token decode shaped as vLLM's RequestOutput ---------------------------------

    def _generate(self, prompt_ids: list[int], params):
        limit = (self.kwargs.get("max_model_len") or 2048) - len(prompt_ids)
        rule = StopRule.of(params, self.tokenizer.eos_token_id, self.generation_eos, max_tokens=limit)
        temperature = float(getattr(params, "temperature", 1.0) or 0.0)
        top_k, top_p = int(getattr(params, "top_k", -1) or -1), float(getattr(params, "top_p", 1.0) or 1.0)
        skip_special = bool(getattr(params, "skip_special_tokens", True))
        with self._lock, torch.no_grad():
            # Each request draws from its own seed (its prompt and how often that prompt came before),
            # not from one stream in arrival order as vLLM: OpenRLHF's agents run concurrently, so the
            # arrival order, and with one stream every sample, would depend on the machine's load.
            key = zlib.crc32(repr(prompt_ids).encode())
            seen = self._prompts_seen.get(key, 0)
            self._prompts_seen[key] = seen + 1
            generator = torch.Generator().manual_seed((self._seed * 1_000_003 + key * 7919 + seen) % 2**63)
            ids, raw_logprobs, text, past = [], [], "", None
            feed, finish = torch.tensor([prompt_ids]), None
            while finish is None:
                out = self.model(input_ids=feed, past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[0, -1].float()
                log_softmax = torch.log_softmax(logits, dim=-1)  # vLLM's default: the raw log-probs
                if len(ids) < rule.min_tokens:
                    logits[sorted(rule.masked_early)] = float("-inf")
                token = sample(logits, temperature, top_k, top_p, generator)
                ids.append(token)
                raw_logprobs.append(float(log_softmax[token]))
                new_text = self.tokenizer.decode(ids, skip_special_tokens=skip_special)
                finish, text = rule.check(ids, new_text, len(new_text) - len(text)), new_text
                feed = torch.tensor([[token]])
        finish_reason, stop_reason = finish
        logprobs = None
        if getattr(params, "logprobs", None) is not None:
            logprobs = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, raw_logprobs)]
        self.stats["generate_calls"] += 1
        self.stats["generated_tokens"] += len(ids)
        self.stats["finishes"][f"{finish_reason}:{type(stop_reason).__name__}"] = (
            self.stats["finishes"].get(f"{finish_reason}:{type(stop_reason).__name__}", 0) + 1)
        completion = SimpleNamespace(index=0, token_ids=ids, text=text, logprobs=logprobs,
                                     finish_reason=finish_reason, stop_reason=stop_reason, cumulative_logprob=None)
        return SimpleNamespace(request_id=uuid_hex(), prompt_token_ids=prompt_ids, outputs=[completion],
                               finished=True)


def uuid_hex() -> str:
    import uuid

    return uuid.uuid4().hex


HFRolloutActor = ray.remote(HFRolloutActorImpl)
