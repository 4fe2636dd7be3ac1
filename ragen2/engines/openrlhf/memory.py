"""Per-GPU memory of an OpenRLHF 0.11.2 run as ragen2 launches it, estimated for `--dry-run`.

Every model is colocated on every GPU (`--train.colocate_all`). Two phases alternate:

- generation: vLLM awake (it takes `openrlhf.vllm_gpu_memory_utilization` x the GPU's memory for
  its weights and KV cache) while DeepSpeed sleeps. DeepSpeed's sleep (`offload_deepspeed_states`)
  moves optimizer states, fp32 master weights and gradients to the CPU but not the bf16 weights,
  so the actor's, critic's and reference's weights stay: 2 bytes x parameters each.
- training: vLLM asleep (level 1: weights to the CPU, KV cache freed), one model trains with its
  ZeRO-2 states back on the GPU (bf16 gradients 2 B, fp32 master weights 4 B and Adam's two
  moments 8 B per parameter, divided over the data-parallel GPUs) plus the activations of one
  micro-batch of `rollout.max_context_tokens` tokens: per token, hidden x layers x 34 bytes
  (2 with gradient checkpointing; Korthikanti et al. 2022, no attention-score term with flash /
  sdpa attention) and vocabulary x 8 bytes for the logits and their fp32 log-softmax.

Each process on a GPU (one per model, plus vLLM) adds about 1 GiB (CUDA context, NCCL, allocator
slack). The parameter count comes from the model's config.json, read where it is on this machine
(a directory, or the Hugging Face cache); without it nothing is estimated. An estimate, not a
measurement: docs/distributed.md gives the formula and what it leaves out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

GIB = 1024 ** 3
PROCESS_OVERHEAD_GIB = 1.0
ZERO2_STATE_BYTES = 2 + 4 + 8  # per parameter, over the data-parallel ranks: grads, fp32 master, Adam m and v


@dataclass(frozen=True)
class ModelShape:
    params: int
    hidden: int
    layers: int
    vocab: int

    @classmethod
    def from_config(cls, config: dict) -> "ModelShape | None":
        try:
            h, layers, vocab = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["vocab_size"])
            inter = int(config.get("intermediate_size") or 4 * h)
            heads = int(config["num_attention_heads"])
        except (KeyError, TypeError, ValueError):
            return None  # an architecture described with other keys: no estimate
        head_dim = int(config.get("head_dim") or h // heads)
        kv = int(config.get("num_key_value_heads") or heads)
        attention = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o; k, v
        mlp = 3 * h * inter  # gate, up, down
        embeddings = vocab * h * (1 if config.get("tie_word_embeddings", False) else 2)
        return cls(params=layers * (attention + mlp + 2 * h) + embeddings + h, hidden=h, layers=layers, vocab=vocab)


def read_model_config(name: str) -> dict | None:
    """config.json of a model directory or of a hub id already in the Hugging Face cache; None if neither."""
    path = Path(name) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json")
        except Exception:  # noqa: BLE001 - not a repo id, or no cache
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Estimate:
    gpu_gib: float
    models: tuple[str, ...]  # DeepSpeed models on each GPU
    weights_gib: float  # one model's bf16 weights
    vllm_gib: float
    vllm_weights_gib: float  # inside vLLM's share, per GPU (tensor parallel splits them)
    train_state_gib: float
    activations_gib: float
    overhead_gib: float

    @property
    def resident_gib(self) -> float:
        return len(self.models) * self.weights_gib

    @property
    def generation_gib(self) -> float:
        return self.vllm_gib + self.resident_gib + self.overhead_gib

    @property
    def training_gib(self) -> float:
        return self.resident_gib + self.train_state_gib + self.activations_gib + self.overhead_gib

    def lines(self) -> list[str]:
        g = f"{self.gpu_gib:g} GiB GPUs"
        return [
            f"memory per GPU (estimate, {g}): generation {self.generation_gib:.1f} GiB = vLLM's share "
            f"{self.vllm_gib:.1f} (its weights {self.vllm_weights_gib:.1f}) + resident bf16 weights "
            f"{self.resident_gib:.1f} ({', '.join(self.models)}: {self.weights_gib:.1f} each) + overhead "
            f"{self.overhead_gib:.1f}",
            f"memory per GPU (estimate, {g}): training {self.training_gib:.1f} GiB = resident weights "
            f"{self.resident_gib:.1f} + ZeRO-2 states {self.train_state_gib:.1f} + activations "
            f"{self.activations_gib:.1f} + overhead {self.overhead_gib:.1f}",
        ]

    def problems(self) -> list[str]:
        out = []
        if self.generation_gib > self.gpu_gib:
            room = math.floor(100 * (self.gpu_gib - self.resident_gib - self.overhead_gib) / self.gpu_gib) / 100
            out.append(f"memory: while vLLM generates, each {self.gpu_gib:g} GiB GPU would hold "
                       f"{self.generation_gib:.1f} GiB (vLLM's share {self.vllm_gib:.1f} + the resident weights of "
                       f"{', '.join(self.models)} {self.resident_gib:.1f} + overhead {self.overhead_gib:.1f}); "
                       + (f"lower openrlhf.vllm_gpu_memory_utilization to {room:.2f} or less, " if room > 0 else "")
                       + "or use a smaller model / larger GPUs (--gpu-memory-gib)")
        if self.vllm_weights_gib >= self.vllm_gib:
            out.append(f"memory: vLLM's share ({self.vllm_gib:.1f} GiB) does not hold its weights "
                       f"({self.vllm_weights_gib:.1f} GiB) and a KV cache; raise "
                       "openrlhf.vllm_gpu_memory_utilization or --vllm-tp")
        if self.training_gib > self.gpu_gib:
            out.append(f"memory: while training, each {self.gpu_gib:g} GiB GPU would hold {self.training_gib:.1f} GiB "
                       f"(resident weights {self.resident_gib:.1f} + ZeRO-2 states {self.train_state_gib:.1f} + "
                       f"activations {self.activations_gib:.1f} + overhead {self.overhead_gib:.1f}); lower "
                       "optim.micro_batch_size or rollout.max_context_tokens, set model.gradient_checkpointing=true, "
                       "or use more GPUs")
        return out


def estimate(cfg, shape: ModelShape, gpu_gib: float, data_parallel: int, vllm_tp: int) -> Estimate:
    models = ("actor",) + (("critic",) if cfg.algo.uses_critic else ()) + (("reference",) if cfg.algo.kl_coef > 0
                                                                          else ())
    per_token = shape.hidden * shape.layers * (2 if cfg.model.gradient_checkpointing else 34) + shape.vocab * 8
    tokens = cfg.optim.micro_batch_size * cfg.rollout.max_context_tokens
    share = cfg.openrlhf.vllm_gpu_memory_utilization
    return Estimate(gpu_gib=gpu_gib, models=models, weights_gib=2 * shape.params / GIB, vllm_gib=share * gpu_gib,
                    vllm_weights_gib=2 * shape.params / vllm_tp / GIB,
                    train_state_gib=ZERO2_STATE_BYTES * shape.params / data_parallel / GIB,
                    activations_gib=tokens * per_token / GIB,
                    overhead_gib=PROCESS_OVERHEAD_GIB * (len(models) + 1))
