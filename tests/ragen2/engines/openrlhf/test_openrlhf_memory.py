"""--dry-run's per-GPU memory estimate (ragen2/engines/openrlhf/memory.py) and its refusal."""

from __future__ import annotations

import json

import pytest

from ragen2.config import load_config
from ragen2.engines.openrlhf import flags as flags_module
from ragen2.engines.openrlhf.flags import Cluster, UnsupportedConfig, plan_launch
from ragen2.engines.openrlhf.memory import GIB, ModelShape

# Llama-2-7B's shape: 6.74 B parameters
LLAMA_7B = {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008, "num_attention_heads": 32,
            "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False}
RUN = "/runs/x"
BATCH = ["optim.micro_batch_size=1", "optim.mini_batch_size=8", "model.dtype=bfloat16",
         "rollout.max_context_tokens=2048"]


@pytest.fixture(autouse=True)
def no_flash_attn(monkeypatch):
    monkeypatch.setattr(flags_module, "flash_attn_usable", lambda: False)


@pytest.fixture
def model_7b(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_7B))
    return str(tmp_path)


def test_the_parameter_count_follows_the_config():
    assert ModelShape.from_config(LLAMA_7B).params == pytest.approx(6.74e9, rel=2e-3)
    assert ModelShape.from_config({"n_embd": 4096}) is None  # other key names: no estimate


def test_a_7b_ppo_with_kl_at_half_an_80_gib_gpu_for_vllm_is_refused_with_the_numbers(model_7b):
    cfg = load_config(algo="ppo", overrides=[f"model.name={model_7b}", *BATCH, "algo.kl_coef=0.01"])
    with pytest.raises(UnsupportedConfig) as error:
        plan_launch(cfg, RUN, Cluster(gpus_per_node=8))
    text = str(error.value)
    # vLLM 40 + three models' bf16 weights 3 x 12.6 + 4 processes' overhead > 80
    assert "memory: while vLLM generates, each 80 GiB GPU would hold 81.7 GiB" in text
    assert "actor, critic, reference 37.7" in text and "vllm_gpu_memory_utilization to 0.47 or less" in text
    # at the share it suggests, the same run fits, and --dry-run prints both phases
    plan = plan_launch(load_config(algo="ppo", overrides=[f"model.name={model_7b}", *BATCH, "algo.kl_coef=0.01",
                                                          "openrlhf.vllm_gpu_memory_utilization=0.47"]),
                       RUN, Cluster(gpus_per_node=8))
    lines = [n for n in plan.notes if n.startswith("memory per GPU")]
    assert len(lines) == 2 and "generation 79.3 GiB" in lines[0] and "training " in lines[1]


def test_training_memory_counts_activations_of_one_micro_batch(model_7b):
    long = [f"model.name={model_7b}", "optim.micro_batch_size=8", "optim.mini_batch_size=64",
            "rollout.max_context_tokens=8192", "model.dtype=bfloat16", "algo.kl_coef=0", "rollout.num_groups=8",
            "rollout.group_size=8"]
    with pytest.raises(UnsupportedConfig, match="memory: while training") as error:
        plan_launch(load_config(algo="grpo", overrides=long), RUN, Cluster(gpus_per_node=8))
    assert "model.gradient_checkpointing=true" in str(error.value)
    # checkpointing keeps one hidden state per layer: 2 bytes instead of 34 per hidden unit and layer
    plan = plan_launch(load_config(algo="grpo", overrides=[*long, "model.gradient_checkpointing=true"]), RUN,
                       Cluster(gpus_per_node=8))
    expected = 8 * 8192 * (4096 * 32 * 2 + 32000 * 8) / GIB
    assert any(f"activations {expected:.1f}" in note for note in plan.notes)


def test_without_a_local_config_json_nothing_is_estimated_or_refused():
    cfg = load_config(algo="grpo", overrides=["model.name=org/not-downloaded", *BATCH])
    plan = plan_launch(cfg, RUN, Cluster(gpu_memory_gib=1.0))
    assert any("not estimated" in note for note in plan.notes)


def test_the_cli_takes_the_gpus_memory(model_7b, tmp_path, capsys):
    from ragen2.cli import main

    code = main(["train", "--engine", "openrlhf", "--dry-run", "--algo", "grpo", "--model", model_7b, "--out",
                 str(tmp_path / "runs"), "--gpus-per-node", "8", "--gpu-memory-gib", "40", *BATCH])
    err = capsys.readouterr().err
    assert code == 2 and "each 40 GiB GPU" in err and "Traceback" not in err
