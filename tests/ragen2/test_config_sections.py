"""The rollout, filter, stop and probe.collapse sections are the libraries' own dataclasses: each
field is defined once (there), is a config key here, and is checked once."""

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import snr
from mi_probe import CollapseDetectorConfig
from ragen2.config import ConfigError, build_config, load_config, saved_config, upgrade_saved
from ragen2.rollout import RolloutConfig

OLD_RUN_CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "old_run_config.yaml"
SECTIONS = {"rollout": RolloutConfig, "filter": snr.FilterConfig, "stop": snr.StopConfig,
            "probe.collapse": CollapseDetectorConfig}


def _section(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("name", SECTIONS)
def test_every_library_field_is_a_config_key_and_the_section_is_the_library_config(name):
    cfg = load_config()
    library = SECTIONS[name]
    assert type(_section(cfg, name)) is library
    written = yaml.safe_load(cfg.to_yaml())
    for part in name.split("."):
        written = written[part]
    assert list(written) == [f.name for f in dataclasses.fields(library)]  # a field added there is a key here


def test_a_field_added_to_a_library_config_becomes_a_config_key():
    """Adding a field touches one place: snr.FilterConfig with one more field, before ragen2.config loads."""
    script = textwrap.dedent("""
        import dataclasses, snr, snr.config

        @dataclasses.dataclass(frozen=True)
        class FilterConfig(snr.FilterConfig):
            warmup_steps: int = 0

        snr.FilterConfig = snr.config.FilterConfig = FilterConfig
        from ragen2.config import load_config

        cfg = load_config(filter="snr-top-p", overrides=["filter.warmup_steps=3"])
        print(cfg.filter.warmup_steps, "warmup_steps: 3" in cfg.to_yaml())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "True"]
    with pytest.raises(ConfigError, match="filter.warmup_steps: unknown key"):
        load_config(overrides=["filter.warmup_steps=3"])


def test_a_partial_section_takes_the_one_default_of_each_other_field():
    # one default per field, the library dataclass's: no second one in ragen2.config or base.yaml
    cfg = load_config(overrides=["filter.strategy=top_k", "filter.value=0.25"])
    assert cfg.filter == snr.FilterConfig(strategy="top_k", value=0.25) and cfg.filter.include_zero is True
    cfg = load_config(overrides=["rollout.temperature=0.7"])
    assert cfg.rollout == dataclasses.replace(RolloutConfig(), temperature=0.7)
    assert (cfg.rollout.group_size, cfg.rollout.max_new_tokens, cfg.rollout.max_context_tokens) == (4, 32, 2048)
    assert build_config({}).rollout == RolloutConfig() and build_config({}).filter == snr.FilterConfig()


@pytest.mark.parametrize("override, message", [
    ("stop.max_consecutive_skip=1", "stop.max_consecutive_skip: unknown key (did you mean stop.max_consecutive_skips?)"),
    ("filter.valu=0.5", "filter.valu: unknown key (did you mean filter.value?); valid keys: ['ddof', 'eps',"),
    ("probe.collapse.mi_ration=0.3", "probe.collapse.mi_ration: unknown key (did you mean probe.collapse.mi_ratio?)"),
    ("filter.max_consecutive_skips=0", "filter.max_consecutive_skips: unknown key"),  # moved to stop.
    ("filter.value=5", "filter.value for strategy top_p must be in (0, 1]; got 5.0"),
    ("stop.spread_baseline=-1", "stop.spread_baseline must be a whole number >= 0; got -1"),
    ("rollout.top_p=1.5", "rollout.top_p must be in (0, 1], got 1.5"),
    ("rollout.context=windowed", "rollout.context: Input should be 'full' or 'window'"),
    ("probe.collapse.reward_std_reference=median", "probe.collapse.reward_std_reference: Input should be 'max' or"),
])
def test_errors_in_library_sections_name_the_full_dotted_key(override, message):
    with pytest.raises(ConfigError) as error:
        load_config(filter="snr-top-p", overrides=[override])
    assert message in str(error.value) and "Value error" not in str(error.value)


def test_library_sections_are_frozen_and_change_by_replace():
    cfg = load_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout.temperature = 0.5
    assert dataclasses.replace(cfg.rollout, temperature=0.5).temperature == 0.5
    cfg.rollout = dataclasses.replace(cfg.rollout, group_size=6)  # a whole section may be swapped
    assert cfg.rollout.group_size == 6


def test_a_config_yaml_of_the_earlier_layout_loads_with_its_keys_moved():
    old = yaml.safe_load(OLD_RUN_CONFIG.read_text())
    cfg = saved_config(OLD_RUN_CONFIG)
    assert cfg.filter_preset == "snr-top-p"
    assert cfg.stop == snr.StopConfig(max_consecutive_skips=7, spread_baseline=4, spread_ratio=0.2, spread_patience=6,
                                      low_val_success=0.05, low_val_patience=3)
    # the detector's single baseline count was both series' count
    assert cfg.probe.collapse == CollapseDetectorConfig(mi_baseline=5, mi_ratio=0.4, mi_patience=2,
                                                        reward_std_baseline=5)
    assert cfg.filter == snr.load_preset("snr-top-p")
    assert cfg.env.name == "sokoban" and cfg.rollout.max_turns == old["rollout"]["max_turns"]
    assert build_config(yaml.safe_load(cfg.to_yaml())) == cfg  # and the upgraded one is written in the new layout
    assert "collapse_mi_fraction" not in cfg.to_yaml() and "\n  preset:" not in cfg.to_yaml()
    assert old["rollout"]["backend"] == "fast" and "backend" not in cfg.to_yaml()  # a removed key is dropped
    with pytest.raises(ConfigError, match="filter.max_consecutive_skips: unknown key"):
        build_config(old)  # only a saved run's config is upgraded; a fresh one names its keys as they are now


def test_an_old_key_next_to_its_new_name_does_not_override_it():
    data = upgrade_saved({"filter": {"max_consecutive_skips": 1}, "stop": {"max_consecutive_skips": 2}})
    assert data == {"filter": {}, "stop": {"max_consecutive_skips": 2}}


def test_resume_of_a_run_written_by_the_earlier_layout_reads_its_config(tmp_path, capsys):
    from ragen2.cli import main

    run = tmp_path / "old"
    run.mkdir()
    (run / "config.yaml").write_text(OLD_RUN_CONFIG.read_text())
    assert main(["train", "--resume", str(run), "stop.spread_patience=9"]) == 2
    err = capsys.readouterr().err
    # the config was read (an override in the new layout on top): what stops it is the missing checkpoint
    assert "no complete checkpoint there" in err and "invalid config" not in err


def test_a_saved_config_takes_overrides_and_keeps_its_labels(tmp_path):
    # what --resume continues with: the recorded config, dotted overrides over it, no preset layer
    saved = tmp_path / "config.yaml"
    saved.write_text(load_config(extra=["paper/ragen2-main"], overrides=["filter.value=1.0"]).to_yaml())
    cfg = saved_config(saved, ["trainer.total_steps=900"])
    assert cfg.trainer.total_steps == 900 and cfg.filter.value == 1.0
    assert cfg.filter_preset == "ragen2-main+value=1.0" and cfg.rollout.max_new_tokens == 400
    with pytest.raises(ConfigError, match="override 'trainer' is not KEY=VALUE"):
        saved_config(saved, ["trainer"])
