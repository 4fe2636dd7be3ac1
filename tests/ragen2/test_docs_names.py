"""docs/names.md (what "dapo" means, and ragen2's names in DAPO, veRL and TRL) against the code: every
preset it maps exists and every shipped preset is mapped, and the TRL and ragen2 settings it names are
what they say."""

import warnings
from pathlib import Path

import pytest

import snr
from ragen2.config import load_config
from ragen2.presets import preset_dir

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "names.md").read_text()


def test_every_shipped_preset_is_on_the_page():
    for name in snr.available_presets():
        assert f"| `{name}` |" in PAGE or f"`{name}`, `" in PAGE or f", `{name}` |" in PAGE, name
    for path in preset_dir("algos").glob("*.yaml"):
        assert f"`{path.stem}`" in PAGE or path.stem.startswith("ragen2-"), path.stem


def test_the_three_dapos_are_configured_as_the_page_says():
    dapo, row = load_config(algo="dapo").algo, load_config(algo="ragen2-dapo").algo
    assert (dapo.advantage, dapo.clip_low, dapo.clip_high, dapo.kl_coef, dapo.loss_agg) == \
        ("grpo", 0.2, 0.28, 0.0, "token-mean")
    assert row.advantage == "gae" and row.uses_critic and (row.gamma, row.lam) == (1.0, 1.0)
    recipe = load_config(algo="dapo", filter="dapo-dynamic").filter
    assert (recipe.max_rounds, recipe.signal, recipe.include_zero) == (4, "success", False)


def test_the_trl_settings_named_exist_with_the_defaults_given():
    with warnings.catch_warnings():  # importing TRL changes the warning filters
        trl = pytest.importorskip("trl")
    config = trl.GRPOConfig(output_dir="unused", use_cpu=True, report_to="none")
    assert config.loss_type == "dapo" and config.beta == 0.0 and config.epsilon == 0.2
    assert config.epsilon_high is None or config.epsilon_high == config.epsilon  # clip-higher is opt-in
    assert config.mask_truncated_completions is False
