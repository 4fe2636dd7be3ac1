"""Test harness only: OpenRLHF's rollout actor with vLLM's engine replaced by a Hugging Face model.

`HFRolloutActorImpl` subclasses the class under OpenRLHF's `ray.remote` RolloutRayActor
(trainer/ray/vllm_engine.py), so OpenRLHF's own request handling (`generate_responses`: one
`executor.execute(...)` per sample, with `llm_engine=self`) and agent loading
(`_load_agent_executor` on --train.agent_func_path) run unchanged. Replaced is what touched vLLM:
`__init__` (an HF model in the dtype create_vllm_engines passes), `generate` (token ids in, a
vLLM-shaped RequestOutput out), sleep / wake_up / prefix cache / pause, and the colocated weight sync
`update_weight_cuda_ipc` (as OpenRLHF's vllm_worker_wrap: the handle of this engine's own device,
`get_physical_gpu_id()`; with CPU tensors torch's reduce_tensor handle carries the storage, so
rebuilding it gives the trained weights). The NCCL broadcast path (init_process_group /
update_weight) is refused: it needs vLLM and CUDA.

As vLLM 0.29.0 (vllm_semantics.py, checked against vLLM's own code by test_openrlhf_stand_in.py):
each request's SamplingParams resolved as the input processor does (generation-config EOS ids as stop
ids, its sampling defaults not applied), stop / length / stop strings / finish_reason / stop_reason /
text as the scheduler and detokenizer make them, min_tokens masking, vLLM's top-k/top-p and draw, a
request's `seed` drawing from its own generator, raw log-probs (processed with
logprobs_mode=processed_logprobs). Requests that arrive while a batch decodes form the next batch
(left-padded, one forward per token for all rows), as vLLM batches concurrent requests.

Not vLLM: a request without a seed draws from a generator keyed on its prompt and how often that
prompt came before, not from one stream in arrival order (OpenRLHF's agents run concurrently, so the
order, and with one stream every sample, would depend on the machine's load); batches are formed
once, not continuously; no prefix cache.

For the test, after every full weight sync and every sleep, the engine writes its counters
(engine-<pid>.json: calls, tokens, batches, finish reasons, syncs, the IPC device) and after a sync
its weights (engine-<pid>.safetensors) to $RAGEN2_HARNESS_DIR.
"""
from __future__ import annotations

import asyncio
import importlib
import json
import os
import uuid
import zlib
from copy import deepcopy
from types import SimpleNamespace

import ray
import torch
import vllm_semantics as vs

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
        # vLLM: ModelConfig.try_get_generation_config() -> the generation config's non-default fields
        self.generation_config = self.model.generation_config.to_diff_dict()
        self.max_model_len = int(kwargs.get("max_model_len") or self.model.config.max_position_embeddings)
        self.processed_logprobs = kwargs.get("logprobs_mode") == "processed_logprobs"
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._seed = int(kwargs.get("seed", 0))
        self._prompts_seen: dict[int, int] = {}
        self._queue: list = []
        self._batcher: asyncio.Task | None = None
        self._unfinished = 0
        self.awake = {"weights": True, "kv_cache": True}
        self.stats = {"executor": f"{type(self.executor).__module__}.{type(self.executor).__name__}",
                      "generate_calls": 0, "generated_tokens": 0, "batches": 0, "largest_batch": 0, "sleeps": 0,
                      "wake_ups": 0, "tensors_updated": 0, "weight_syncs": 0, "ipc_device": None,
                      "ipc_devices_offered": [], "finishes": {}}
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
        from openrlhf.trainer.ray.utils import get_physical_gpu_id

        if not self.awake["weights"]:
            raise RuntimeError(f"weight update of {name} while the weights sleep (OpenRLHF wakes them first)")
        device = get_physical_gpu_id()  # vllm_worker_wrap.update_weight_cuda_ipc: this worker's own device
        if device not in ipc_handles:
            raise RuntimeError(f"weight update of {name}: no IPC handle for this engine's device {device!r} "
                               f"(handles for {sorted(ipc_handles)})")
        rebuild, args = ipc_handles[device]
        weight = rebuild(*args)
        param = self.model.get_parameter(name)
        if dtype != self.dtype or tuple(shape) != tuple(param.shape):
            raise RuntimeError(f"weight update of {name}: got {dtype} {tuple(shape)}, engine holds {self.dtype} "
                               f"{tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(weight.to(param.dtype))
        self.stats["tensors_updated"] += 1
        self.stats["ipc_device"], self.stats["ipc_devices_offered"] = device, sorted(ipc_handles)
        if empty_cache:  # OpenRLHF sets it on the last tensor of a sync
            self.stats["weight_syncs"] += 1
            self._write(weights=True)

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        if not all(self.awake.values()):
            raise RuntimeError(f"generate while asleep ({self.awake}): OpenRLHF wakes the engine first")
        prompt = list(prompt_token_ids)
        if len(prompt) >= self.max_model_len:  # vLLM's input processor refuses it too
            raise ValueError(f"The decoder prompt (length {len(prompt)}) is longer than the maximum model length "
                             f"of {self.max_model_len}.")
        params = deepcopy(sampling_params)  # as OpenRLHF's generate (and vLLM's clone)
        request = vs.resolve(params, self.generation_config, self.tokenizer.eos_token_id, self.max_model_len,
                             len(prompt))
        future = asyncio.get_running_loop().create_future()
        self._queue.append((prompt, request, self._generator(prompt, request), future))
        self._unfinished += 1
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._decode_queued())
        try:
            return await future
        finally:
            self._unfinished -= 1

    def _generator(self, prompt: list[int], request: vs.Resolved) -> torch.Generator:
        if request.seed is not None:  # vLLM: a seeded request draws from its own generator
            return torch.Generator().manual_seed(request.seed)
        key = zlib.crc32(repr(prompt).encode())
        seen = self._prompts_seen.get(key, 0)
        self._prompts_seen[key] = seen + 1
        return torch.Generator().manual_seed((self._seed * 1_000_003 + key * 7919 + seen) % 2**63)

    async def _decode_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                outputs = await asyncio.to_thread(self._decode, batch)
            except Exception as error:  # noqa: BLE001 - handed to each waiting request
                for *_, future in batch:
                    future.set_exception(error)
                continue
            for (*_, future), output in zip(batch, outputs):
                future.set_result(output)

    # --- one batch, decoded token by token and shaped as vLLM's RequestOutputs -------------------

    @torch.no_grad()
    def _decode(self, batch: list) -> list:
        rows, width = len(batch), max(len(prompt) for prompt, *_ in batch)
        ids = torch.full((rows, width), self.pad_id)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for i, (prompt, *_) in enumerate(batch):  # left-padded: every row's next token is at the end
            ids[i, width - len(prompt):] = torch.tensor(prompt)
            mask[i, width - len(prompt):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        completions = [vs.Completion(request, self.tokenizer, len(prompt), self.max_model_len)
                       for prompt, request, *_ in batch]
        logprobs: list[list[float]] = [[] for _ in batch]
        cache, feed = None, ids
        while not all(c.finish_reason for c in completions):
            out = self.model(input_ids=feed, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
            cache, logits = out.cache, out.logits[:, -1]
            next_ids = []
            for i, ((_, request, generator, _), completion) in enumerate(zip(batch, completions)):
                if completion.finish_reason:  # finished rows ride along on padding
                    next_ids.append(self.pad_id)
                    continue
                token, row_logprobs = vs.sample(logits[i], request, len(completion.token_ids), generator,
                                                processed_logprobs=self.processed_logprobs)
                logprobs[i].append(float(row_logprobs[token]))
                completion.step(token)
                next_ids.append(token)
            feed = torch.tensor(next_ids).unsqueeze(1)
            mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
        self.stats["batches"] += 1
        self.stats["largest_batch"] = max(self.stats["largest_batch"], rows)
        return [self._request_output(prompt, request, completion, row_logprobs)
                for (prompt, request, *_), completion, row_logprobs in zip(batch, completions, logprobs)]

    def _request_output(self, prompt, request: vs.Resolved, completion: vs.Completion, logprobs: list[float]):
        self.stats["generate_calls"] += 1
        self.stats["generated_tokens"] += len(completion.token_ids)
        key = f"{completion.finish_reason}:{type(completion.stop_reason).__name__}"
        self.stats["finishes"][key] = self.stats["finishes"].get(key, 0) + 1
        token_logprobs = None
        if request.logprobs is not None:  # vLLM: one {token id: Logprob} per position
            token_logprobs = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(completion.token_ids, logprobs)]
        output = SimpleNamespace(index=0, token_ids=list(completion.token_ids), text=completion.text,
                                 logprobs=token_logprobs, finish_reason=completion.finish_reason,
                                 stop_reason=completion.stop_reason, cumulative_logprob=None)
        return SimpleNamespace(request_id=uuid.uuid4().hex, prompt_token_ids=prompt, outputs=[output], finished=True)


HFRolloutActor = ray.remote(HFRolloutActorImpl)
