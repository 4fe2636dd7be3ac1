"""One preset lookup for every layer: filter presets live in snr (and ship with it), names match
one way everywhere, labels agree with the settings they name, bundled configs load by name."""

import pytest

import snr
from ragen2 import presets
from ragen2.config import ConfigError, load_config


def test_the_training_config_and_snr_load_the_same_filter_presets():
    names = snr.available_presets()
    assert {"none", "starpo-s", "snr-top-p", "ragen2-main"} <= set(names)
    assert presets.preset_dir("filters") == snr.PRESETS_DIR and snr.PRESETS_DIR.parent.name == "snr"
    for name in names:
        cfg = load_config(filter=name)
        assert cfg.filter == snr.load_preset(name) and cfg.filter_preset == name


@pytest.mark.parametrize("spelling", ["snr_top_p", "SNR-Top-P", "snr-top-p"])
def test_names_match_the_same_way_in_snr_and_the_config(spelling):
    assert snr.load_preset(spelling) == load_config(filter=spelling).filter
    assert load_config(filter=spelling).filter_preset == "snr-top-p"


def test_an_unknown_preset_lists_the_real_ones_and_the_closest():
    with pytest.raises(snr.UnknownPresetError) as error:
        snr.load_preset("snr-top-q")
    message = str(error.value)
    assert "did you mean snr-top-p?" in message and "available: dapo-dynamic, none, ragen2-main" in message
    with pytest.raises(ConfigError, match=r"unknown filter preset 'snr-top-q' \(did you mean snr-top-p\?\)"):
        load_config(filter="snr-top-q")
    with pytest.raises(snr.UnknownPresetError, match=r"available: none \(.* holds no presets\)"):
        snr.load_preset("x", presets_dir=snr.PRESETS_DIR / "missing")


def test_algo_name_picks_the_preset_instead_of_relabelling_the_run():
    # algo.name=ppo used to rename the dapo defaults "ppo": no critic, GRPO advantages
    cfg = load_config(overrides=["algo.name=ppo"])
    assert (cfg.algo.name, cfg.algo.advantage, cfg.algo.uses_critic) == ("ppo", "gae", True)
    assert cfg == load_config(algo="ppo")
    assert load_config(overrides=["algo.name=GRPO"]).algo.name == "grpo"  # the preset's spelling
    with pytest.raises(ConfigError, match=r"unknown algo preset 'ppp' \(did you mean ppo\?\)"):
        load_config(overrides=["algo.name=ppp"])
    with pytest.raises(ConfigError, match="the algo is given twice: --algo grpo and algo.name=ppo"):
        load_config(algo="grpo", overrides=["algo.name=ppo"])


def test_a_file_that_renames_the_algo_to_another_presets_name_must_match_it(tmp_path):
    relabel = tmp_path / "relabel.yaml"
    relabel.write_text("algo: {name: ppo}\n")  # over base.yaml's dapo: advantage grpo, no critic
    with pytest.raises(ConfigError, match=r"algo.name=ppo names the ppo preset \(algo.advantage=gae\), but the "
                                          r"config has algo.advantage=grpo.*--algo ppo"):
        load_config(extra=[relabel])
    own = tmp_path / "own.yaml"
    own.write_text("algo: {name: my-ppo, advantage: gae}\n")  # a name of one's own is free
    assert load_config(extra=[own]).algo.name == "my-ppo"
    whole = tmp_path / "whole.yaml"
    whole.write_text("algo: {name: ppo, advantage: gae}\n")
    assert load_config(extra=[whole]).algo.uses_critic


@pytest.mark.parametrize("name", ["paper/ragen2-main", "paper/Ragen2_Main", "configs/paper/ragen2-main.yaml"])
def test_config_takes_a_bundled_configs_name_from_anywhere(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ folder here: the bundled copy is found
    cfg = load_config(extra=[name], env="sokoban")
    assert (cfg.filter_preset, cfg.rollout.max_new_tokens, cfg.algo.name) == ("ragen2-main", 400, "ppo")


def test_an_unknown_config_lists_the_bundled_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"config file paper/ragen2-mian does not exist; bundled configs "
                                          r"\(--config NAME\): paper/ragen2-main, paper/starpo-s"):
        load_config(extra=["paper/ragen2-mian"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(extra=[tmp_path / "missing.yaml"])


def test_a_label_names_a_preset_only_on_that_presets_settings():
    # the paper config's own advice for its no-filter column must not leave the run named ragen2-main
    cfg = load_config(extra=["paper/ragen2-main"], overrides=["filter.value=1.0"])
    assert cfg.filter.value == 1.0 and cfg.filter_preset == "ragen2-main+value=1.0"
    assert load_config(extra=["paper/ragen2-main"]).filter_preset == "ragen2-main"
    cfg = load_config(overrides=["filter.strategy=top_k", "filter.value=0.25"])  # a filter under the label none
    assert cfg.filter_preset == "none+strategy=top_k+value=0.25"
    cfg = load_config(algo="ppo", overrides=["algo.advantage=bilevel_gae"])
    assert cfg.algo.name == "ppo+advantage=bilevel_gae" and cfg.algo.uses_critic
    own = load_config(overrides=["filter_preset=mine", "filter.strategy=top_k", "filter.value=0.5"])
    assert own.filter_preset == "mine"  # a label of one's own is left alone
    assert (load_config().algo.name, load_config().filter_preset) == ("dapo", "none")
