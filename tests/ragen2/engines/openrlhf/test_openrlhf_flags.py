"""Golden tests: ragen2 configs → OpenRLHF 0.11.2 commands (full lists), and the refusals.

These need no OpenRLHF install (the translation is pure); the last tests feed the commands to
OpenRLHF's own argument parser and checks, and skip when OpenRLHF is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragen2.config import load_config
from ragen2.engines.openrlhf import flags as flags_module
from ragen2.engines.openrlhf.flags import (Cluster, UnsupportedConfig, agent_path, batch_unit, dataset_rows,
                                           plan_launch)

REPO = Path(__file__).resolve().parents[4]
RUN = Path("/runs/x")
AGENT = str(agent_path())
# GPU-sized settings over the env presets (those are CPU-sized: 2 x 4 episodes, 48 tokens)
SMALL = ["model.dtype=bfloat16", "rollout.num_groups=8", "rollout.group_size=8", "optim.micro_batch_size=2",
         "optim.mini_batch_size=16", "rollout.max_new_tokens=96", "trainer.val_groups=8"]


FLASH_ATTN_USABLE = flags_module.flash_attn_usable  # the real check (the fixture below replaces it)


@pytest.fixture(autouse=True)
def flash_attn_on_the_gpu_nodes(monkeypatch):
    """The golden commands are a GPU node's, where flash-attn is installed (openrlhf.attn_implementation=auto)."""
    monkeypatch.setattr(flags_module, "flash_attn_usable", lambda: True)


def command(cluster=Cluster(), **compose):
    cfg = load_config(**compose)
    return plan_launch(cfg, RUN, cluster, python="python").command


def head() -> list[str]:
    return ["python", "-m", "ragen2.engines.openrlhf.launch", "--ragen2.settings", f"{RUN}/openrlhf/settings.json"]


def data_flags(group: int) -> list[str]:
    # --eval.steps 1: fit asks every rollout step, the controller evaluates on the local schedule
    return ["--train.agent_func_path", AGENT, "--data.prompt_dataset", f"{RUN}/openrlhf/train.jsonl",
            "--data.input_key", "prompt", "--data.label_key", "label", "--eval.dataset", f"{RUN}/openrlhf/val.jsonl",
            "--eval.steps", "1", "--eval.temperature", "0.5", "--eval.n_samples_per_prompt", str(group)]


COLOCATE = ["--vllm.tensor_parallel_size", "1", "--vllm.gpu_memory_utilization", "0.5", "--train.colocate_all",
            "--vllm.enable_sleep", "--ds.enable_sleep"]
NO_REWARD_CLIP = ["--reward.clip_range", "-1000000000.0", "1000000000.0"]


def test_ppo_paper_config_on_one_node_of_8_gpus():
    # The paper config asks for veRL's micro_batch loss scope, which OpenRLHF cannot run (see below).
    got = command(env="sokoban", algo="ppo", extra=[REPO / "configs/paper/ragen2-main.yaml"],
                  overrides=["optim.loss_scope=mini_batch"])
    model = "Qwen/Qwen2.5-3B-Instruct"
    assert got == head() + [
        "--actor.model_name_or_path", model, "--ds.param_dtype", "bf16", "--ds.attn_implementation", "flash_attention_2",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "8",
        "--critic.model_name_or_path", model, "--critic.num_nodes", "1", "--critic.num_gpus_per_node", "8",
        "--vllm.num_engines", "8", *COLOCATE, *data_flags(16),
        "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "16", "--rollout.max_new_tokens", "400",
        "--data.max_len", "3600", "--rollout.temperature", "1.0", "--rollout.top_p", "1.0",
        "--rollout.micro_batch_size", "1", "--train.batch_size", "32", "--train.micro_batch_size", "1",
        "--train.max_epochs", "1", "--train.num_episodes", "1", "--train.seed", "0", *NO_REWARD_CLIP,
        "--algo.advantage.estimator", "gae", "--algo.advantage.gamma", "1.0", "--algo.advantage.lambd", "1.0",
        "--actor.eps_clip_low_high", "0.2", "0.28", "--actor.dual_clip", "3.0", "--actor.loss_agg_mode", "token-mean",
        "--actor.entropy_coef", "0.001", "--algo.kl.init_coef", "0.0",
        "--actor.adam.lr", "1e-06", "--actor.adam.betas", "0.9", "0.999", "--actor.adam.weight_decay", "0.0",
        "--actor.max_norm", "1.0", "--actor.lr_scheduler", "constant",
        "--critic.adam.lr", "1e-05", "--critic.adam.betas", "0.9", "0.999", "--critic.adam.weight_decay", "0.0",
        "--critic.max_norm", "1.0", "--critic.lr_scheduler", "constant", "--critic.value_clip", "0.5",
        "--ckpt.output_dir", f"{RUN}/model", "--ckpt.path", f"{RUN}/checkpoints", "--ckpt.save_steps", "50",
        "--ckpt.max_num", "2", "--ckpt.best_metric_key", "none",
        "--logger.logging_steps", "1"]


def test_grpo_has_no_critic_and_a_kl_loss_with_the_reference_model():
    got = command(env="frozen_lake", algo="grpo", overrides=["model.name=Qwen/Qwen2.5-0.5B-Instruct", *SMALL])
    assert got == head() + [
        "--actor.model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "flash_attention_2",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "8",
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "8",
        "--vllm.num_engines", "8", *COLOCATE, *data_flags(8),
        "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "8", "--rollout.max_new_tokens", "96",
        "--data.max_len", "2048", "--rollout.temperature", "1.0", "--rollout.top_p", "1.0",
        "--rollout.micro_batch_size", "2", "--train.batch_size", "16", "--train.micro_batch_size", "2",
        "--train.max_epochs", "1", "--train.num_episodes", "1", "--train.seed", "0", *NO_REWARD_CLIP,
        "--algo.advantage.estimator", "group_norm",
        "--actor.eps_clip_low_high", "0.2", "0.2", "--actor.dual_clip", "3.0", "--actor.loss_agg_mode", "seq-mean-token-mean",
        "--actor.entropy_coef", "0.001", "--algo.kl.init_coef", "0.001", "--algo.kl.use_loss",
        "--algo.kl.estimator", "k3",
        "--actor.adam.lr", "1e-05", "--actor.adam.betas", "0.9", "0.999", "--actor.adam.weight_decay", "0.0",
        "--actor.max_norm", "1.0", "--actor.lr_scheduler", "constant",
        "--ckpt.output_dir", f"{RUN}/model", "--ckpt.path", f"{RUN}/checkpoints", "--ckpt.save_steps", "-1",
        "--ckpt.max_num", "2", "--ckpt.best_metric_key", "none",
        "--logger.logging_steps", "1"]


def test_starpo_s_on_two_nodes():
    got = command(Cluster(nodes=2, gpus_per_node=8), env="sokoban", algo="starpo-s", filter="starpo-s",
                  extra=[REPO / "configs/paper/starpo-s.yaml"], overrides=["optim.micro_batch_size=2"])
    model = "Qwen/Qwen2.5-0.5B-Instruct"
    assert got == head() + [
        "--actor.model_name_or_path", model, "--ds.param_dtype", "bf16", "--ds.attn_implementation", "flash_attention_2",
        "--actor.num_nodes", "2", "--actor.num_gpus_per_node", "8",
        "--critic.model_name_or_path", model, "--critic.num_nodes", "2", "--critic.num_gpus_per_node", "8",
        "--vllm.num_engines", "16", *COLOCATE, *data_flags(16),
        "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "16", "--rollout.max_new_tokens", "400",
        "--data.max_len", "2048", "--rollout.temperature", "1.0", "--rollout.top_p", "1.0",
        "--rollout.micro_batch_size", "2", "--train.batch_size", "32", "--train.micro_batch_size", "2",
        "--train.max_epochs", "1", "--train.num_episodes", "1", "--train.seed", "0", *NO_REWARD_CLIP,
        "--algo.advantage.estimator", "gae", "--algo.advantage.gamma", "1.0", "--algo.advantage.lambd", "1.0",
        "--actor.eps_clip_low_high", "0.2", "0.28", "--actor.dual_clip", "3.0", "--actor.loss_agg_mode", "token-mean",
        "--actor.entropy_coef", "0.001", "--algo.kl.init_coef", "0.0",
        "--actor.adam.lr", "1e-06", "--actor.adam.betas", "0.9", "0.999", "--actor.adam.weight_decay", "0.0",
        "--actor.max_norm", "1.0", "--actor.lr_scheduler", "constant",
        "--critic.adam.lr", "1e-05", "--critic.adam.betas", "0.9", "0.999", "--critic.adam.weight_decay", "0.0",
        "--critic.max_norm", "1.0", "--critic.lr_scheduler", "constant", "--critic.value_clip", "0.5",
        "--ckpt.output_dir", f"{RUN}/model", "--ckpt.path", f"{RUN}/checkpoints", "--ckpt.save_steps", "-1",
        "--ckpt.max_num", "2", "--ckpt.best_metric_key", "none",
        "--logger.logging_steps", "1"]


def test_snr_top_p_with_dual_clip_checkpointing_sdpa_and_logging_on_4_gpus():
    got = command(Cluster(gpus_per_node=4), env="frozen_lake", algo="ppo", filter="snr-top-p", overrides=[
        "model.name=/models/qwen", *SMALL, "algo.dual_clip=3.0", "openrlhf.attn_implementation=sdpa",
        "openrlhf.vllm_gpu_memory_utilization=0.35",
        "model.gradient_checkpointing=true", "trainer.wandb=true", "trainer.tensorboard=true", "trainer.save_every=20"])
    assert got == head() + [
        "--actor.model_name_or_path", "/models/qwen", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "sdpa",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "4",
        "--critic.model_name_or_path", "/models/qwen", "--critic.num_nodes", "1", "--critic.num_gpus_per_node", "4",
        "--vllm.num_engines", "4", "--vllm.tensor_parallel_size", "1", "--vllm.gpu_memory_utilization", "0.35",
        *COLOCATE[4:], *data_flags(8),
        "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "8", "--rollout.max_new_tokens", "96",
        "--data.max_len", "2048", "--rollout.temperature", "1.0", "--rollout.top_p", "1.0",
        "--rollout.micro_batch_size", "2", "--train.batch_size", "16", "--train.micro_batch_size", "2",
        "--train.max_epochs", "1", "--train.num_episodes", "1", "--train.seed", "0", *NO_REWARD_CLIP,
        "--algo.advantage.estimator", "gae", "--algo.advantage.gamma", "1.0", "--algo.advantage.lambd", "1.0",
        "--actor.eps_clip_low_high", "0.2", "0.28", "--actor.dual_clip", "3.0", "--actor.loss_agg_mode", "token-mean",
        "--actor.entropy_coef", "0.001", "--algo.kl.init_coef", "0.0",
        "--actor.adam.lr", "1e-05", "--actor.adam.betas", "0.9", "0.999", "--actor.adam.weight_decay", "0.0",
        "--actor.max_norm", "1.0", "--actor.lr_scheduler", "constant",
        "--critic.adam.lr", "0.0001", "--critic.adam.betas", "0.9", "0.999", "--critic.adam.weight_decay", "0.0",
        "--critic.max_norm", "1.0", "--critic.lr_scheduler", "constant", "--critic.value_clip", "0.5",
        "--actor.gradient_checkpointing_enable",
        "--ckpt.output_dir", f"{RUN}/model", "--ckpt.path", f"{RUN}/checkpoints", "--ckpt.save_steps", "20",
        "--ckpt.max_num", "2", "--ckpt.best_metric_key", "none",
        "--logger.logging_steps", "1", "--logger.tensorboard_dir", f"{RUN}/tensorboard",
        "--logger.wandb.key", "${WANDB_API_KEY}", "--logger.wandb.project", "ragen2", "--logger.wandb.run_name", "x"]


def test_settings_and_datasets_carry_the_filter_and_the_local_engines_seeds():
    cfg = load_config(env="frozen_lake", algo="ppo", filter="snr-top-p", overrides=["model.name=m", *SMALL,
                                                                                    "trainer.total_steps=3"])
    plan = plan_launch(cfg, RUN, Cluster(gpus_per_node=4))
    settings = json.loads(plan.files[RUN / "openrlhf/settings.json"])
    assert settings["filter"] == {"strategy": "top_p", "value": 0.9, "metric": "reward_variance", "order": "largest",
                                  "top_p_mode": "linear", "include_zero": False, "eps": 0.01, "ddof": 1,
                                  "signal": "reward", "max_rounds": 1}
    assert settings["group_size"] == 8 and settings["batch_unit"] == 16 and settings["prefill"] == "<think>"
    # the controller's eval / checkpoint schedule, in rollout steps (skipped ones count)
    assert (settings["total_steps"], settings["val_every"], settings["save_every"]) == (
        3, cfg.trainer.val_every, cfg.trainer.save_every)
    rows = [json.loads(line) for line in plan.files[RUN / "openrlhf/train.jsonl"].splitlines()]
    from ragen2.seeding import step_seeds

    assert [json.loads(r["label"])["seed"] for r in rows] == [s for k in range(3) for s in step_seeds(cfg, k)]
    label = json.loads(rows[0]["label"])
    assert label["env"] == "frozen_lake" and label["max_turns"] == cfg.rollout.max_turns
    assert label["max_new_tokens"] == 96 and rows[0]["prompt"] == f"frozen_lake seed={label['seed']}"
    assert len(dataset_rows(cfg, "val")) == cfg.trainer.val_groups


def test_batch_unit_is_the_lcm_of_the_global_batch_and_the_data_parallel_micro_batches():
    cfg = load_config(overrides=["optim.micro_batch_size=2", "optim.mini_batch_size=48"])
    assert batch_unit(cfg, Cluster(gpus_per_node=8)) == 48  # lcm(2 x 8, 48)
    cfg = load_config(overrides=["optim.micro_batch_size=4", "optim.mini_batch_size=8"])
    assert batch_unit(cfg, Cluster(gpus_per_node=1)) == 8


@pytest.mark.parametrize("overrides,cluster,needle", [
    ([], Cluster(), "model.name=bundled"),
    (["model.name=m"], Cluster(), "model.dtype=float32"),
    (["model.name=m", "model.dtype=float16"], Cluster(), "model.dtype=float16"),
    (["model.name=m", "model.lora_rank=8"], Cluster(), "model.lora_rank=8"),
    (["model.name=m", "model.device=cpu"], Cluster(), "model.device=cpu"),
    (["model.name=m", "rollout.context=window"], Cluster(), "rollout.context=window"),
    (["model.name=m", "rollout.stop_strings=[]"], Cluster(), "rollout.stop_strings=[]"),
    (["model.name=m", "rollout.prefill_tag=false"], Cluster(), "rollout.prefill_tag=false"),
    (["model.name=m", "algo.advantage=bilevel_gae"], Cluster(), "algo.advantage=bilevel_gae"),
    (["model.name=m", "algo.advantage=gae", "rollout.max_turns=3", "algo.gamma=0.99"], Cluster(), "algo.gamma=0.99"),
    (["model.name=m", "algo.loss_agg=seq-mean-token-sum"], Cluster(), "algo.loss_agg=seq-mean-token-sum"),
    (["model.name=m", "algo.advantage=gae", "algo.value_clip=null"], Cluster(), "algo.value_clip=null"),
    (["model.name=m", "algo.grpo_std_eps=0.01"], Cluster(), "algo.grpo_std_eps=0.01"),
    (["model.name=m", "algo.filter_loss_scaling=sqrt"], Cluster(), "algo.filter_loss_scaling=sqrt"),
    (["model.name=m", "probe.grad_every=5"], Cluster(), "probe.grad_every=5"),
    # the actor's forward runs in DeepSpeed's bf16: no fp32 copy to score with
    (["model.name=m", "probe.dtype=float32"], Cluster(), "probe.dtype=float32"),
    (["model.name=m", "optim.loss_scope=micro_batch"], Cluster(), "optim.loss_scope=micro_batch"),
    (["model.name=m", "probe.stop_on_collapse=true"], Cluster(), "probe.stop_on_collapse=true"),
    (["model.name=m", "optim.micro_batch_size=4", "optim.mini_batch_size=16"], Cluster(), "optim.mini_batch_size=16"),
    (["model.name=m", "rollout.num_groups=3", "optim.micro_batch_size=1", "optim.mini_batch_size=8"], Cluster(),
     "rollout.num_groups=3"),
    (["model.name=m", "filter.strategy=top_k", "filter.value=0.25", "optim.micro_batch_size=1",
      "optim.mini_batch_size=8"], Cluster(), "filter.value=0.25"),
])
def test_values_openrlhf_cannot_express_fail_naming_the_key(overrides, cluster, needle):
    with pytest.raises(UnsupportedConfig) as error:
        command(cluster, overrides=[*overrides, "model.dtype=float32"] if "dtype=float32" in needle else
                ["model.dtype=bfloat16", *overrides])
    assert needle in str(error.value)


def test_the_paper_configs_micro_batch_loss_scope_is_refused_not_ignored():
    # OpenRLHF 0.11.2 normalises over the whole optimizer step (our mini_batch); veRL's
    # per-micro-batch means (configs/paper/ragen2-main.yaml) cannot be expressed.
    with pytest.raises(UnsupportedConfig) as error:
        command(env="sokoban", algo="ppo", extra=[REPO / "configs/paper/ragen2-main.yaml"])
    assert "optim.loss_scope=micro_batch" in str(error.value) and "optim.loss_scope=mini_batch" in str(error.value)
    assert command(env="sokoban", algo="ppo", extra=[REPO / "configs/paper/ragen2-main.yaml"],
                   overrides=["optim.loss_scope=mini_batch"])  # the scope OpenRLHF runs is accepted


def test_all_problems_are_reported_together():
    with pytest.raises(UnsupportedConfig) as error:
        command(overrides=["rollout.context=window", "algo.loss_agg=seq-mean-token-sum", "model.dtype=float32"])
    text = str(error.value)
    for key in ("model.name=bundled", "model.dtype=float32", "rollout.context=window", "algo.loss_agg"):
        assert key in text


def test_model_dtype_auto_trains_in_bf16_on_the_cluster():
    cfg = load_config(algo="grpo", overrides=["model.name=m", *SMALL[1:]])
    assert cfg.model.dtype == "auto"
    flags = plan_launch(cfg, RUN, Cluster()).command
    assert flags[flags.index("--ds.param_dtype") + 1] == "bf16"


def test_grpo_std_eps_left_at_its_default_is_a_note_not_an_error():
    cfg = load_config(algo="grpo", overrides=["model.name=m", "model.dtype=bfloat16", "optim.micro_batch_size=1",
                                              "optim.mini_batch_size=8"])
    plan = plan_launch(cfg, RUN, Cluster())
    assert any("std + 1e-09" in note for note in plan.notes)


def test_cli_dry_run_prints_the_command_and_writes_the_files(tmp_path, capsys):
    from ragen2.cli import main

    code = main(["train", "--engine", "openrlhf", "--dry-run", "--algo", "grpo", "--model", "org/model",
                 "--out", str(tmp_path), "--gpus-per-node", "2", "model.dtype=bfloat16", "trainer.run_name=r",
                 "optim.micro_batch_size=2", "optim.mini_batch_size=4"])
    out = capsys.readouterr().out
    assert code == 0
    run = tmp_path / "r"
    assert "-m ragen2.engines.openrlhf.launch --ragen2.settings " + str(run / "openrlhf/settings.json") in out
    assert "--actor.num_gpus_per_node 2" in out and "--algo.advantage.estimator group_norm" in out
    for name in ("openrlhf/train.jsonl", "openrlhf/val.jsonl", "openrlhf/settings.json", "config.yaml"):
        assert (run / name).is_file() and f"# {run / name}" in out
    assert not (run / "model").exists()  # nothing launched


def test_cli_dry_run_names_the_keys_openrlhf_cannot_run(tmp_path, capsys):
    # (--dry-run of the local engine is the train command's, tested with it)
    from ragen2.cli import main

    assert main(["train", "--engine", "openrlhf", "--dry-run", "--out", str(tmp_path)]) == 2
    assert "model.name=bundled" in capsys.readouterr().err


@pytest.mark.parametrize("override,fix", [("model.lora_rank=8", "model.lora_rank=0"),
                                          ("model.dtype=float16", "model.dtype=bfloat16")])
def test_configs_that_die_at_the_first_weight_sync_are_refused_in_one_line(tmp_path, capsys, override, fix):
    # LoRA: OpenRLHF 0.11.2 sends the PEFT names unmerged; fp16: it starts vLLM in bf16 and asserts equal dtypes.
    from ragen2.cli import main

    code = main(["train", "--engine", "openrlhf", "--dry-run", "--model", "org/model", "--out", str(tmp_path),
                 "--gpus-per-node", "2", "optim.micro_batch_size=2", "optim.mini_batch_size=4", override])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: the OpenRLHF 0.11.2 engine cannot run this config: " + override + ":")
    assert fix in line


def test_the_attention_implementation_is_resolved_at_launch_passed_and_recorded(monkeypatch):
    cfg = load_config(algo="grpo", overrides=["model.name=m", "model.dtype=bfloat16", "optim.micro_batch_size=1",
                                              "optim.mini_batch_size=8"])
    assert cfg.openrlhf.attn_implementation == "auto"
    for usable, expected in ((False, "sdpa"), (True, "flash_attention_2")):
        monkeypatch.setattr(flags_module, "flash_attn_usable", lambda: usable)
        plan = plan_launch(cfg, RUN, Cluster())
        flags = plan.openrlhf_flags
        assert flags[flags.index("--ds.attn_implementation") + 1] == expected
        assert f"attn_implementation: {expected}" in plan.files[RUN / "config.yaml"]  # recorded as resolved
        assert any(f"resolved to {expected}" in note for note in plan.notes)
    explicit = load_config(algo="grpo", overrides=["model.name=m", "model.dtype=bfloat16", "optim.micro_batch_size=1",
                                                   "optim.mini_batch_size=8", "openrlhf.attn_implementation=eager"])
    flags = plan_launch(explicit, RUN, Cluster()).openrlhf_flags
    assert flags[flags.index("--ds.attn_implementation") + 1] == "eager"


def test_a_flash_attn_module_without_the_installed_package_does_not_count(monkeypatch):
    # The CPU harness (and OpenRLHF's own tests) put a stand-in flash_attn module in sys.modules.
    import sys
    import types

    import importlib.metadata

    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    try:
        importlib.metadata.version("flash_attn")
        pytest.skip("flash-attn is installed here")
    except importlib.metadata.PackageNotFoundError:
        pass
    assert FLASH_ATTN_USABLE() is False


def test_under_ray_job_submit_the_launcher_adds_no_variable_the_jobs_runtime_env_sets():
    # `ray job submit --runtime-env-json '{"env_vars": {"NCCL_DEBUG": "INFO", ...}}' -- <printed command>`:
    # Ray refuses a ray.init runtime env that sets one of the job's variables again.
    from ragen2.engines.openrlhf import SETTINGS_ENV
    from ragen2.engines.openrlhf.launch import RAY_ENV_DEFAULTS, RAY_JOB_CONFIG_ENV, runtime_env_vars

    job = {"env_vars": {"NCCL_DEBUG": "INFO", "TOKENIZERS_PARALLELISM": "false"}, "working_dir": "/code"}
    environ = {RAY_JOB_CONFIG_ENV: json.dumps({"runtime_env": job}), SETTINGS_ENV: '{"version": 1}',
               "NCCL_DEBUG": "INFO", "TOKENIZERS_PARALLELISM": "false"}  # Ray sets the job's variables
    ours = runtime_env_vars(environ)
    assert ours == {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1", SETTINGS_ENV: '{"version": 1}'}
    # outside a job: every default (the environment's value where it sets one) and the settings
    assert runtime_env_vars({SETTINGS_ENV: "{}", "NCCL_DEBUG": "INFO"}) == RAY_ENV_DEFAULTS | {
        "NCCL_DEBUG": "INFO", SETTINGS_ENV: "{}"}
    with pytest.raises(SystemExit, match=SETTINGS_ENV):
        runtime_env_vars(environ | {RAY_JOB_CONFIG_ENV: json.dumps({"runtime_env": {"env_vars": {SETTINGS_ENV: "{}"}}})})
    merge = pytest.importorskip("ray.runtime_env.runtime_env", reason="ray (the openrlhf extra)")._merge_runtime_env
    merged = merge(job, {"env_vars": ours})  # what ray.init does with a job's runtime env (None: a conflict)
    assert merged is not None and merged["env_vars"]["NCCL_DEBUG"] == "INFO"


# ----------------------------------------------------------------------------- OpenRLHF's own parser


def parse_with_openrlhf(flags: list[str], monkeypatch):
    """Run the `__main__` block of OpenRLHF 0.11.2's train_ppo_ray.py (its argparse and its checks)
    with `train` replaced by a capture, so the real parser validates our flags without Ray."""
    import argparse
    import ast
    import datetime
    import importlib.util

    pytest.importorskip("openrlhf", reason="openrlhf is not installed: pip install 'ragen2[openrlhf]' (see .ci/run)")
    pytest.importorskip("pylatexenc", reason="openrlhf.utils needs pylatexenc (an openrlhf dependency)")
    source_path = importlib.util.find_spec("openrlhf.cli.train_ppo_ray").origin
    tree = ast.parse(Path(source_path).read_text())
    main_block = next(node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
    captured = {}
    namespace = {"argparse": argparse, "datetime": datetime.datetime, "os": __import__("os"),
                 "train": lambda args: captured.setdefault("args", args)}
    monkeypatch.setattr("sys.argv", ["train_ppo_ray.py", *flags])
    exec(compile(ast.Module(body=main_block.body, type_ignores=[]), source_path, "exec"), namespace)
    return captured["args"]


def test_openrlhf_parses_and_accepts_the_ppo_command(monkeypatch):
    cfg = load_config(env="sokoban", algo="ppo", extra=[REPO / "configs/paper/ragen2-main.yaml"],
                      overrides=["optim.loss_scope=mini_batch"])
    args = parse_with_openrlhf(plan_launch(cfg, RUN, Cluster()).openrlhf_flags, monkeypatch)
    assert args.actor.model_name_or_path == args.critic.model_name_or_path == "Qwen/Qwen2.5-3B-Instruct"
    assert args.actor.eps_clip_low_high == [0.2, 0.28] and args.actor.dual_clip == 3.0
    assert args.algo.advantage.estimator == "gae" and args.algo.kl.init_coef == 0.0
    assert (args.rollout.batch_size, args.rollout.n_samples_per_prompt) == (8, 16)
    assert (args.train.batch_size, args.train.micro_batch_size, args.rollout.micro_batch_size) == (32, 1, 1)
    assert args.reward.remote_url == ["agent"] and args.train.agent_func_path == AGENT  # the agent path is on
    assert list(args.reward.clip_range) == [-1e9, 1e9] and args.critic.value_clip == 0.5
    assert args.actor.adam.lr == 1e-6 and list(args.actor.adam.betas) == [0.9, 0.999]
    assert args.vllm.num_engines == 8 and args.train.colocate_all and args.vllm.enable_sleep


def test_openrlhf_parses_the_grpo_and_snr_commands(monkeypatch):
    cfg = load_config(env="frozen_lake", algo="grpo", overrides=["model.name=m", *SMALL])
    args = parse_with_openrlhf(plan_launch(cfg, RUN, Cluster()).openrlhf_flags, monkeypatch)
    assert args.critic.model_name_or_path is None  # no critic for group_norm
    assert args.algo.advantage.estimator == "group_norm" and args.algo.kl.use_loss
    assert args.algo.kl.estimator == "k3" and args.actor.loss_agg_mode == "seq-mean-token-mean"
    cfg = load_config(env="frozen_lake", algo="ppo", filter="snr-top-p", overrides=[
        "model.name=m", *SMALL, "algo.dual_clip=3.0", "trainer.tensorboard=true", "openrlhf.attn_implementation=sdpa"])
    args = parse_with_openrlhf(plan_launch(cfg, RUN, Cluster(gpus_per_node=4)).openrlhf_flags, monkeypatch)
    assert args.actor.dual_clip == 3.0 and args.ds.lora.rank == 0 and args.actor.num_gpus_per_node == 4
    assert args.ds.attn_implementation == "sdpa" and args.ds.param_dtype == "bf16"
    assert args.logger.tensorboard_dir == f"{RUN}/tensorboard"



def test_critic_warmup_becomes_openrlhfs_critic_freezing_steps(monkeypatch):
    cfg = load_config(env="frozen_lake", algo="ppo", overrides=["model.name=m", *SMALL, "optim.critic_warmup_steps=3"])
    flags = plan_launch(cfg, RUN, Cluster()).openrlhf_flags
    assert flags[flags.index("--critic.freezing_steps") + 1] == "3"
    args = parse_with_openrlhf(flags, monkeypatch)
    # OpenRLHF trains the actor once global_step > freezing_steps: steps 1-3 train the critic only,
    # as the local engine's steps 0-2.
    assert args.critic.freezing_steps == 3

def test_the_wandb_key_comes_from_the_environment_at_launch_only():
    from ragen2.engines.openrlhf.launch import describe, resolved_command

    cfg = load_config(overrides=["model.name=m", "model.dtype=bfloat16", "optim.micro_batch_size=1",
                                 "optim.mini_batch_size=8", "trainer.wandb=true"])
    plan = plan_launch(cfg, RUN, Cluster())
    assert "${WANDB_API_KEY}" in describe(plan)
    command = resolved_command(plan, {"WANDB_API_KEY": "k-123"})
    assert command[command.index("--logger.wandb.key") + 1] == "k-123"
    with pytest.raises(UnsupportedConfig, match="WANDB_API_KEY"):
        resolved_command(plan, {})


def test_the_launcher_refuses_an_argv_without_its_settings_file():
    from ragen2.engines.openrlhf.launch import split_argv

    assert split_argv(["--ragen2.settings", "s.json", "--a", "1"]) == (Path("s.json"), ["--a", "1"])
    with pytest.raises(SystemExit, match="usage"):
        split_argv(["--actor.model_name_or_path", "m"])
