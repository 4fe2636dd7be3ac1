from pathlib import Path

import pytest

from ragen2.config import CONFIG_DIR, ConfigError, load_config


def test_layers_compose_in_order():
    cfg = load_config(env="sokoban", algo="grpo", filter="snr-top-p", overrides=["rollout.group_size=8"])
    assert (cfg.env.name, cfg.algo.advantage, cfg.filter.strategy, cfg.rollout.group_size) == \
        ("sokoban", "grpo", "top_p", 8)
    assert cfg.rollout.max_turns == 5  # from configs/envs/sokoban.yaml
    assert cfg.env.overrides == {}  # base.yaml's answer-only override belongs to its own env section only


def test_base_is_the_cpu_default():
    cfg = load_config()
    assert cfg.env.name == "bandit" and cfg.env.overrides == {"require_think": False}
    assert cfg.model.name == "bundled" and cfg.algo.advantage == "grpo" and not cfg.algo.uses_critic
    assert cfg.algo.kl_coef == 0.0  # so no reference model loads either


def test_starpo_s_preset_is_ppo_clip_higher_no_kl_top_quarter_by_std():
    cfg = load_config(algo="starpo-s")
    assert cfg.algo.advantage == "gae" and (cfg.algo.clip_low, cfg.algo.clip_high) == (0.2, 0.28)
    assert cfg.algo.kl_coef == 0.0
    assert (cfg.filter.strategy, cfg.filter.value, cfg.filter.metric) == ("top_k", 0.25, "reward_std")


def test_paper_configs_load_after_presets():
    cfg = load_config(env="sokoban", filter="snr-top-p", extra=[CONFIG_DIR / "paper" / "ragen2-main.yaml"])
    assert cfg.model.name == "Qwen/Qwen2.5-3B-Instruct" and cfg.rollout.max_new_tokens == 400
    assert cfg.env.name == "sokoban" and cfg.filter.strategy == "top_p"


@pytest.mark.parametrize("overrides, message", [
    (["rollout.group_sze=3"], "rollout.group_sze: unknown key (did you mean rollout.group_size?); valid keys: ['context', 'group_size'"),
    (["algo.advantage=foo"], "algo.advantage: Input should be 'gae', 'bilevel_gae', 'grpo' or 'dr_grpo'"),
    (["trainer.total_steps=0"], "trainer.total_steps: Input should be greater than or equal to 1"),
    (["rollout.group_size=1", "algo.advantage=grpo"], "needs rollout.group_size >= 2"),
    (["env.name=sokobam"], "unknown env 'sokobam'"),
    (["env.overrides.dim_x=5"], "unknown config key(s) ['dim_x'] for env 'bandit'"),
    (["nonsense"], "is not KEY=VALUE"),
    (["model.lora_rank=-1"], "model.lora_rank: Input should be greater than or equal to 0"),
    (["optim.critic_warmup_steps=2"], "optim.critic_warmup_steps needs a critic: algo.advantage=grpo has none"),
])
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(overrides=overrides)
    assert message in str(error.value)


def test_unknown_presets_and_files_list_what_exists(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown algo preset 'ppo2' \(did you mean ppo\?\); available: .*\bppo\b"):
        load_config(algo="ppo2")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(extra=[tmp_path / "missing.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: [1, 2")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(extra=[bad])


def test_resolved_config_round_trips_through_yaml():
    import yaml

    from ragen2.config import build_config

    cfg = load_config(env="frozen_lake", algo="dapo")
    assert build_config(yaml.safe_load(cfg.to_yaml())) == cfg
    assert Path(CONFIG_DIR / "base.yaml").is_file()


def test_a_run_saved_before_probe_dtype_existed_resumes_scoring_in_fp32():
    from ragen2.config import upgrade_saved

    assert upgrade_saved({"probe": {"every": 5}})["probe"]["dtype"] == "float32"
    assert upgrade_saved({"probe": {"dtype": "policy"}})["probe"]["dtype"] == "policy"
