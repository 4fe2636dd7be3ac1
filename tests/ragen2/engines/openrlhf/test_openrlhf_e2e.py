"""End to end: `ragen2 train --engine openrlhf` on OpenRLHF 0.11.2's real pipeline, on CPU.

Each case runs the CLI as a user would (no --dry-run): our `launch` module starts a real local Ray
instance and runs OpenRLHF's unmodified `train_ppo_ray` with our `RagenPPOTrainer`; DeepSpeed
trains for real (CPU accelerator, gloo, bf16); the rollout actor is OpenRLHF's own class with only
vLLM's engine replaced by Hugging Face `generate`, loading our `AgentExecutor` through OpenRLHF's
loader. The CUDA-only calls OpenRLHF makes are shimmed in cpu_harness/ (nothing in site-packages is
edited); cpu_harness/orl_cpu.py lists each shim with the OpenRLHF line it serves.

Cost (measured on the 2-core AMD EPYC dev machine while ~6 other jobs shared it, load average ~12):
130-190 s per run warm, and DeepSpeed's JIT build of its CPU ops (shm comm, fused Adam) once per
session, several minutes under that load (about 80 s on an idle machine); the ops are cached for
the session in TORCH_EXTENSIONS_DIR (RAGEN2_TORCH_EXTENSIONS_DIR keeps them across sessions).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

for _name in ("openrlhf", "ray", "deepspeed", "torchdata"):
    pytest.importorskip(_name, reason="the OpenRLHF 0.11.2 stack (see .ci/run)")

HARNESS = Path(__file__).resolve().parent / "cpu_harness"


def _harness_module(name: str):
    """A cpu_harness module, loaded by path (sys.path stays as it is)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"cpu_harness_{name}", HARNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tiny_models = _harness_module("tiny_models")

import snr  # noqa: E402
import torch  # noqa: E402
from ragen2.seeding import step_seeds, validation_seeds  # noqa: E402

# The prompt the Bandit fixture was fine-tuned after (our "explicit" instruction, no word limit),
# sampled cooler: most replies then close "<think> ... </think>", so every group has reasoning for
# the MI probe to score.
FIXTURE_PROMPT = ["rollout.max_response_words=null", "env.overrides.instruction_style=explicit",
                  "rollout.temperature=0.5"]
RUN_TIMEOUT_S = 900  # a warm run takes about a minute on an idle 2-core machine
# Small enough for 2 cores: 2 groups x 4 samples, one DeepSpeed micro-batch of 4 per optimizer step.
SMALL = ["model.dtype=bfloat16", "rollout.num_groups=2", "rollout.group_size=4", "rollout.max_new_tokens=24",
         "optim.mini_batch_size=4", "optim.micro_batch_size=4", "trainer.val_groups=2"]


@pytest.fixture(scope="session")
def extensions_dir(tmp_path_factory):
    """DeepSpeed's JIT-built CPU ops (fused_adam, shm comm: ~80 s to build), shared by every run."""
    kept = os.environ.get("RAGEN2_TORCH_EXTENSIONS_DIR")
    return Path(kept) if kept else tmp_path_factory.mktemp("torch_extensions")


@pytest.fixture(scope="session")
def random_model(tmp_path_factory):
    return tiny_models.random_model(tmp_path_factory.mktemp("tiny-random"))


@pytest.fixture(scope="session")
def llama3_model():
    """Committed (500 KB), made by tiny_models.llama3_model: Llama-3 base's EOS layout, every Sokoban turn
    answered with tiny_models.LLAMA3_REPLY + <|eot_id|>."""
    return Path(__file__).resolve().parent / "fixtures" / "tiny-llama3"


@pytest.fixture(scope="session")
def bandit_model():
    """Committed (500 KB): fine-tuning it here would cost CI minutes. Made by tiny_models.bandit_model."""
    return Path(__file__).resolve().parent / "fixtures" / "tiny-bandit"


class Run:
    def __init__(self, run_dir: Path, harness_dir: Path, log: str):
        self.run_dir, self.harness_dir, self.log = run_dir, harness_dir, log

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]

    def step_rows(self) -> list[dict]:
        return [r for r in self.rows() if "rollout/reward_mean" in r]

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def traced_steps(self) -> list[dict]:
        return [json.loads(line) for line in (self.harness_dir / "steps.jsonl").read_text().splitlines()]

    def members(self) -> list[dict]:
        """Each sample's seed and rollout index, in the order the agents numbered them (harness T2)."""
        return [json.loads(line) for line in (self.harness_dir / "members.jsonl").read_text().splitlines()]

    def episodes(self) -> list[dict]:
        """Each episode the agent returned to OpenRLHF: seed, rollout index, trained context (harness T3)."""
        return [json.loads(line) for line in (self.harness_dir / "episodes.jsonl").read_text().splitlines()]

    def engines(self) -> list[dict]:
        return [json.loads(p.read_text()) | {"weights": p.with_suffix(".safetensors")}
                for p in sorted(self.harness_dir.glob("engine-*.json"))]


def train(tmp_path: Path, extensions: Path, model: Path, *args: str, gpus: int = 1) -> Run:
    """`ragen2 train --engine openrlhf ... --out OUT` in a child process with the CPU harness on."""
    out, harness_dir = tmp_path / "runs", tmp_path / "harness"
    harness_dir.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="r2ray-", dir="/tmp")  # Ray's socket paths must stay short
    env = dict(os.environ)
    env.update(RAGEN2_OPENRLHF_CPU_HARNESS="1", RAGEN2_HARNESS_DIR=str(harness_dir), RAGEN2_HARNESS_GPUS=str(gpus),
               RAGEN2_HARNESS_CPUS=str(4 * gpus), RAGEN2_HARNESS_RAY_TMP=ray_tmp,
               PYTHONPATH=os.pathsep.join([str(HARNESS), *filter(None, [env.get("PYTHONPATH")])]),
               DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(extensions),
               TORCHDYNAMO_DISABLE="1",  # @torch.compile'd entropy: a C++ build per process on CPU
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"), RAY_USAGE_STATS_ENABLED="0",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               RAY_agent_register_timeout_ms="300000")  # a loaded machine starts Ray's Python agents slowly
    command = [sys.executable, "-m", "ragen2.cli", "train", "--engine", "openrlhf", "--model", str(model),
               "--out", str(out), "--gpus-per-node", str(gpus), *args]
    # Its own session: whatever is left when it ends or times out (the launched process, Ray's
    # processes, a DeepSpeed op build) is killed with it.
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd=tmp_path, start_new_session=True)
    try:
        log, _ = child.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log = f"timed out after {RUN_TIMEOUT_S} s"
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert child.returncode == 0, log[-8000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return Run(run_dir, harness_dir, log)


def saved_model_equals_engine_weights(run_dir: Path, engine_weights: Path) -> bool:
    from safetensors.torch import load_file

    saved, engine = load_file(run_dir / "model" / "model.safetensors"), load_file(engine_weights)
    return set(saved) == set(engine) and all(saved[k].dtype == engine[k].dtype and bool((saved[k] == engine[k]).all())
                                             for k in saved)


def saved_config(run: Run):
    from ragen2.config import saved_config

    return saved_config(run.run_dir / "config.yaml")


def checkpoint_tags(run: Run) -> list[str]:
    folder = run.run_dir / "checkpoints" / "_actor"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def test_two_grpo_steps_train_sync_evaluate_twice_checkpoint_and_run_the_mi_probe(tmp_path, extensions_dir,
                                                                                  bandit_model):
    run = train(tmp_path, extensions_dir, bandit_model, "--env", "bandit", "--algo", "grpo", "--filter", "none",
                "--steps", "2", *SMALL, "algo.kl_coef=0", "probe.every=1", "probe.num_samples=8",
                "trainer.save_every=1", "trainer.keep_last=1", "trainer.val_every=1",
                *FIXTURE_PROMPT)
    cfg = saved_config(run)
    # the command that ran is the one the project emits: the attention implementation resolved from the
    # config (auto: no flash-attn installed here), nothing appended by the harness
    assert cfg.openrlhf.attn_implementation == "sdpa" and "--ds.attn_implementation sdpa" in run.log
    summary = run.summary()
    assert (summary["steps"], summary["steps_trained"], summary["steps_skipped"]) == (2, 2, 0)
    assert summary["engine"] == "openrlhf" and summary["final_val_reward_mean"] is not None

    # Same instances per step as the local engine (OpenRLHF's loader would shuffle them); within a
    # step the groups arrive in the order their requests finish.
    traced = run.traced_steps()
    assert [sorted(t["seeds"]) for t in traced] == [sorted(step_seeds(cfg, k)) for k in range(2)]
    steps = run.step_rows()
    assert [r["step"] for r in steps] == [0, 1]
    for row, trace in zip(steps, traced):
        rewards = [r for group in trace["rewards"] for r in group]
        assert row["rollout/num_trajectories"] == 8.0 and row["snr/groups_trained"] == 2.0
        assert row["rollout/reward_mean"] == pytest.approx(sum(rewards) / len(rewards))  # over all rollouts
        assert "policy_loss" in row and "actor_grad_norm" in row and row["ragen2/skipped_steps"] == 0.0
        # The MI probe scored (prompt, reasoning) pairs through the actor group's forward on DeepSpeed.
        assert "probe/skipped_too_few_groups" not in row and row["probe/num_rows"] >= 2
        assert all(isinstance(row[k], float) for k in ("probe/mi_estimate", "probe/mi_zscore",
                                                       "probe/retrieval_accuracy@1"))
    evals = [r for r in run.rows() if "val/reward_mean" in r]
    assert [r["step"] for r in evals] == [0, 1]  # val_every=1
    # Both evaluations played the same validation instances with rollout indices 0..G-1, as the local
    # engine does (the agent outlives them: its count once ran on to G..2G-1).
    val = validation_seeds(cfg)
    numbered = [(m["seed"], m["member"]) for m in run.members() if m["seed"] in set(val)]
    assert len(numbered) == 2 * len(val) * 4
    for half in (numbered[:len(numbered) // 2], numbered[len(numbered) // 2:]):
        assert sorted(half) == sorted((seed, k) for seed in val for k in range(4))

    (engine,) = run.engines()
    assert engine["executor"] == "ragen2.engines.openrlhf.agent.AgentExecutor"  # via OpenRLHF's loader
    assert engine["weight_syncs"] == 2 and engine["generate_calls"] == 2 * 8 + 2 * len(val) * 4
    assert saved_model_equals_engine_weights(run.run_dir, engine["weights"])  # synced weights = the trained model
    # save_every=1, keep_last=1: one DeepSpeed checkpoint left (--ckpt.max_num), no "best" one
    assert checkpoint_tags(run) == ["global_step2"]


def test_the_snr_skip_path_stops_the_run_still_evaluates_and_saves_the_model(tmp_path, extensions_dir, random_model):
    # The random model never closes the answer format: every reward is the -0.1 penalty, no spread.
    run = train(tmp_path, extensions_dir, random_model, "--env", "bandit", "--algo", "grpo", "--filter",
                "snr-top-p", "--steps", "4", *SMALL, "algo.kl_coef=0", "stop.max_consecutive_skips=2")
    summary = run.summary()
    assert (summary["steps"], summary["steps_trained"], summary["steps_skipped"]) == (2, 0, 2)
    assert summary["stop_reason"] == "consecutive_skips"
    traced = run.traced_steps()
    cfg = saved_config(run)
    assert [sorted(t["seeds"]) for t in traced] == [sorted(step_seeds(cfg, k)) for k in range(2)]
    # the local engine's filter on the same reward matrices decides the same: skip
    assert [t["skip"] for t in traced] == [True, True]
    assert all(snr.select_groups(torch.tensor(t["rewards"], dtype=torch.float64), cfg.filter).skip
               for t in traced)
    rows = run.rows()
    assert [r["step"] for r in rows if "rollout/reward_mean" in r] == [0, 1]
    assert all(r["snr/skipped"] == 1.0 and r["rollout/reward_mean"] == pytest.approx(-0.1)
               for r in rows if "rollout/reward_mean" in r)
    # The final evaluation runs after the stop although OpenRLHF's own step count never advanced.
    assert [r["step"] for r in rows if "val/reward_mean" in r] == [1]
    (engine,) = run.engines()
    assert engine["weight_syncs"] == 0
    assert (run.run_dir / "model" / "model.safetensors").is_file()  # fit returned normally; the model was saved


def test_ppo_with_critic_and_reference_and_the_local_engines_metric_names(tmp_path, extensions_dir, bandit_model):
    args = ["--env", "bandit", "--algo", "ppo", "--filter", "none", "--steps", "1", *SMALL,
            "algo.kl_coef=0.01", "probe.every=1", "probe.num_samples=8", *FIXTURE_PROMPT]
    run = train(tmp_path, extensions_dir, bandit_model, *args)
    (row,) = run.step_rows()
    assert "critic_loss" in row and "policy_loss" in row and "kl" in row  # critic trained, KL to the reference
    cfg = saved_config(run)
    assert cfg.algo.uses_critic and cfg.algo.kl_coef == 0.01

    (trace,) = run.traced_steps()
    assert sorted(trace["seeds"]) == sorted(step_seeds(cfg, 0)) and trace["kept"] == [0, 1]

    # The local engine on the same config and model: the same metric names, and run directories that
    # plot, audit and the bench report all read.
    local_out = tmp_path / "local"
    done = subprocess.run([sys.executable, "-m", "ragen2.cli", "train", "--model", str(bandit_model), "--out",
                           str(local_out), *args, "model.dtype=float32"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (local_dir,) = [p for p in local_out.iterdir() if p.is_dir()]
    local_row = json.loads((local_dir / "metrics.jsonl").read_text().splitlines()[0])
    probed = ["probe/skipped_too_few_groups" not in r for r in (row, local_row)]
    for prefix in ("rollout/", "snr/") + (("probe/",) if probed[0] == probed[1] else ()):
        ours = {k for k in row if k.startswith(prefix)} - OPENRLHF_ONLY
        assert ours and ours <= set(local_row), (prefix, sorted(ours - set(local_row)))
    from ragen2.bench.report import cell_result
    from ragen2.cli import main as cli

    for run_dir in (run.run_dir, local_dir):
        assert cli(["plot", str(run_dir)]) in (0, None) and (run_dir / "curves.png").is_file()
        assert cli(["audit", str(run_dir)]) in (0, None) and any((run_dir / "audit").iterdir())
        result = cell_result({"name": run_dir.name, "run_dir": str(run_dir)})
        assert result["status"] == "done" and result["steps"] == 1 and result["train_reward_mean"] is not None


# OpenRLHF's own rollout statistics beside the local engine's names, and the batch-unit trimming
OPENRLHF_ONLY = {"rollout/response_length_mean", "rollout/truncated_rate", "snr/groups_dropped_for_batch",
                 "snr/groups_trained"}


def test_two_deepspeed_ranks_train_and_sync_both_engines(tmp_path, extensions_dir, random_model):
    run = train(tmp_path, extensions_dir, random_model, "--env", "bandit", "--algo", "grpo", "--filter", "none",
                "--steps", "1", *SMALL, "optim.mini_batch_size=8", "algo.kl_coef=0", "trainer.val_groups=1",
                gpus=2)
    (row,) = run.step_rows()
    assert row["rollout/num_trajectories"] == 8.0 and "policy_loss" in row
    engines = run.engines()
    assert len(engines) == 2 and all(e["weight_syncs"] == 1 for e in engines)
    # each engine rebuilt the handle of its own device (vllm_worker_wrap), not the first one offered
    assert all(e["ipc_devices_offered"] == sorted(e["ipc_device"] for e in engines) for e in engines)
    assert all(saved_model_equals_engine_weights(run.run_dir, e["weights"]) for e in engines)
    assert sum(e["generate_calls"] for e in engines) == 8 + 4  # the prompts were spread over both engines


def local_engine_contexts(cfg, model_dir: Path, seeds) -> dict:
    """The local engine's trained context and sampled positions per (seed, rollout index), in-process."""
    from ragen2.engines.local.run import env_factory
    from ragen2.rollout import rollout
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()  # the engine's dtype
    batch = rollout(model, tokenizer, env_factory(cfg), seeds, cfg.rollout, torch.Generator().manual_seed(0))
    contexts = {}
    for row, (seed, member) in enumerate((s, m) for s in seeds for m in range(cfg.rollout.group_size)):
        sampled = [i for i, m in enumerate(batch.response_mask[row].tolist()) if m]
        ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
        contexts[(seed, member)] = (ids[:sampled[-1] + 1], sampled)
    return contexts


def test_a_llama3_turn_closed_by_a_generation_config_eos_trains_the_local_engines_context(tmp_path, extensions_dir,
                                                                                          llama3_model):
    # At temperature 0.1 the fixture's replies (per-token probability ~0.999, so ~1e-30 for any other
    # token after the temperature) are the same in both engines; not 0, which OpenRLHF's actor would
    # divide the logits by. Every turn ends at <|eot_id|>, which only the
    # generation config lists as an EOS (vLLM: finish "stop", stop_reason = its id); before the agent
    # counted it as the end of the turn, the template closed the turn with a second one.
    run = train(tmp_path, extensions_dir, llama3_model, "--env", "sokoban", "--algo", "grpo", "--filter", "none",
                "--steps", "1", *SMALL, "rollout.max_turns=2", "rollout.temperature=0.1", "algo.kl_coef=0",
                "trainer.val_groups=1", "trainer.val_temperature=0.1")
    cfg = saved_config(run)
    seeds = step_seeds(cfg, 0)
    assert not set(seeds) & set(validation_seeds(cfg))  # the step's episodes are told apart by seed
    (engine,) = run.engines()
    assert engine["finishes"] == {"stop:int": engine["generate_calls"]}  # every turn: the generation-config EOS
    assert engine["largest_batch"] > 1  # concurrent requests were decoded together
    ours = {(e["seed"], e["member"]): e for e in run.episodes() if e["seed"] in set(seeds)}
    assert sorted(ours) == sorted((s, m) for s in seeds for m in range(cfg.rollout.group_size))
    local = local_engine_contexts(cfg, llama3_model, seeds)
    eot = 4  # <|eot_id|> in the fixture's vocabulary
    for key, episode in ours.items():
        context, sampled = local[key]
        assert episode["observation_tokens"] == context, key  # token for token
        assert [i for start, end in episode["action_ranges"] for i in range(start, end)] == sampled, key
        assert len(episode["action_ranges"]) == 2 and all(context[end - 1] == eot for _, end in episode["action_ranges"])
        assert not any(a == b == eot for a, b in zip(context, context[1:]))  # never <|eot_id|><|eot_id|>
