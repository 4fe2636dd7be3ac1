"""scripts/gpu_smoke.sh on CPU: --dry runs through to its first GPU-only step; without --dry it stops
there with one JSON line. (Its GPU checks are in ragen2/engines/openrlhf/smoke.py; check_case is
exercised here on a hand-made run directory.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
SMOKE_AGENT = REPO / "ragen2/engines/openrlhf/smoke_agent.py"


def smoke(tmp_path, model_dir, *args):
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(["bash", str(REPO / "scripts/gpu_smoke.sh"), "--model", str(model_dir), "--out",
                           str(tmp_path / "out"), *args], capture_output=True, text=True, env=env, timeout=300)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, (done.stdout + done.stderr)[-3000:]
    return done.returncode, json.loads(lines[0])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 400,
                                                    "num_attention_heads": 4, "intermediate_size": 128}))
    return folder


def test_the_dry_mode_plans_both_runs_as_the_cli_prints_them_and_stops_before_the_gpu(tmp_path, model_dir):
    code, report = smoke(tmp_path, model_dir, "--dry")
    assert code == 0 and report["mode"] == "dry" and report["ok"] is True
    for case in ("grpo", "ppo"):
        command = report["commands"][case]
        assert "-m ragen2.engines.openrlhf.launch --ragen2.settings" in command
        assert f"--train.agent_func_path {SMOKE_AGENT}" in command  # ragen2's agent, recording
        assert command.endswith("--algo.advantage.is_correction_level token "
                                "--algo.advantage.is_correction_threshold 0 1e9")
        assert (tmp_path / "out" / case / case / "openrlhf" / "settings.json").is_file()
    assert "--algo.advantage.estimator group_norm" in report["commands"]["grpo"]
    assert "--critic.model_name_or_path" in report["commands"]["ppo"] and "--algo.kl.init_coef 0.01" in \
        report["commands"]["ppo"]


def test_without_a_gpu_the_smoke_stops_at_the_first_gpu_step(tmp_path, model_dir):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    code, report = smoke(tmp_path, model_dir)
    assert code == 2 and report["ok"] is False and "no CUDA GPU" in report["failures"][0]


def test_a_run_is_checked_against_vllms_stop_semantics_and_the_evaluation_indices(tmp_path):
    from ragen2.engines.openrlhf.smoke import check_case

    run = tmp_path / "grpo"
    (run / "checkpoints/_actor/global_step2").mkdir(parents=True)
    from ragen2.config import load_config
    from ragen2.seeding import validation_seeds

    cfg = load_config(overrides=["trainer.val_groups=2"])
    (run / "config.yaml").write_text(cfg.to_yaml())
    val = validation_seeds(cfg)
    rows = [{"step": k, "policy_loss": 0.1, "rollout/reward_mean": 0.0, "vllm_kl": 0.001, "probe/mi_estimate": 0.2}
            for k in range(2)] + [{"step": k, "val/reward_mean": 0.0} for k in range(2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = "\n".join(f"(RolloutRayActor pid=7) update weight: model.embed_tokens.weight, dtype: bf16, shape: x\n"
                    "(RolloutRayActor pid=7) update weight: model.norm.weight, dtype: bf16, shape: y" for _ in range(2))
    members = [{"kind": "member", "seed": s, "member": k} for _ in range(2) for s in val for k in range(4)]
    generates = [{"kind": "generate", "finish": "stop", "stop_reason": None, "ok": True}]
    smoke_log = tmp_path / "smoke.jsonl"
    smoke_log.write_text("".join(json.dumps(r) + "\n" for r in members + generates))
    assert check_case("grpo", run, log, smoke_log)["failures"] == []
    # the second evaluation numbered on (4..7), a generate that broke vLLM's rules, a sync missing
    drift = [{"kind": "member", "seed": s, "member": k + 4 * e} for e in range(2) for s in val for k in range(4)]
    smoke_log.write_text("".join(json.dumps(r) + "\n" for r in drift + [generates[0] | {"ok": False}]))
    failures = check_case("grpo", run, log.split("\n", 2)[-1], smoke_log)["failures"]
    assert len(failures) == 3 and "indices 0..G-1" in failures[2] and "stop semantics" in failures[1]
    assert failures[0].startswith("1 full weight syncs for 2 trained steps")


def test_the_smoke_agent_loads_as_openrlhf_loads_it_and_records_each_generate(tmp_path, monkeypatch):
    import asyncio
    from types import SimpleNamespace

    from tests.ragen2.engines.openrlhf import openrlhf_stubs
    from tests.ragen2.engines.openrlhf.test_openrlhf_agent_vs_local import VLLMLikeEngine, label
    from tests.tiny import tiny_tokenizer
    from transformers import GenerationConfig

    modules = openrlhf_stubs.load()  # skips without the OpenRLHF stack
    executor = modules["openrlhf.trainer.ray.vllm_engine"]._load_agent_executor(str(SMOKE_AGENT))
    assert isinstance(executor, modules["ragen2.engines.openrlhf.agent"].AgentExecutor)
    log = tmp_path / "smoke.jsonl"
    monkeypatch.setenv("RAGEN2_SMOKE_LOG", str(log))
    tok = tiny_tokenizer("llama3")
    engine = VLLMLikeEngine(tok, GenerationConfig(eos_token_id=[tok.eos_token_id]))
    params = SimpleNamespace(temperature=1.0, max_tokens=40, logprobs=None)
    asyncio.run(executor.execute("p", label(group_size=2), params, 4096, tok, engine))
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert rows[0] == {"kind": "member", "seed": 5, "member": 0}
    generates = [r for r in rows if r["kind"] == "generate"]
    assert len(generates) == 3 and all(r["ok"] and r["finish"] == "stop" and r["stop_reason"] is None
                                       for r in generates)  # <|eot_id|> is this tokenizer's EOS
