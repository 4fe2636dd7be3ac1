"""docs/config.md is generated from the config's own models, and is current; --explain reads the same."""

import json
from pathlib import Path

import pytest

from ragen2 import config_reference
from ragen2.cli import main
from ragen2.config import Config, ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _leaves(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict) and key != "overrides":  # env.overrides is one key (a mapping)
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def test_the_committed_reference_is_what_the_generator_writes():
    committed = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert committed == config_reference.markdown(), (
        "docs/config.md is out of date: python -m ragen2.config_reference --out docs/config.md")


def test_every_key_the_validation_knows_is_listed_with_a_meaning():
    listed = [key.key for key in config_reference.keys()]
    assert listed == _leaves(json.loads(Config().model_dump_json()))
    undocumented = [key.key for key in config_reference.keys() if not key.meaning]
    assert not undocumented, f"document these fields beside their definition: {undocumented}"


def test_types_defaults_and_meanings_come_from_the_models():
    keys = {key.key: key for key in config_reference.keys()}
    assert keys["trainer.total_steps"].type == "int (>= 1)"
    assert keys["algo.advantage"].type == "one of gae, bilevel_gae, grpo, dr_grpo"
    assert (keys["rollout.max_new_tokens"].default, keys["rollout.max_new_tokens"].field_default) == ("32", "")
    # base.yaml sets only what it changes on purpose, and the reference shows the Python default beside it
    assert (keys["env.overrides"].default, keys["env.overrides"].field_default) == ('{"require_think": false}', "{}")
    assert keys["filter.ddof"].meaning.startswith("1 (default) divides by G - 1")  # snr.FilterConfig's docstring
    assert keys["rollout.window_turns"].meaning == "see context"
    assert "veRL's critic.cliprange_value" in keys["algo.value_clip"].meaning  # the comment beside the field


def test_explain_prints_one_key_or_says_what_was_meant(capsys):
    assert main(["train", "--explain", "filter.eps"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("filter.eps\n  type     float\n  default  0.01\n  meaning  slack of the linear top-p")
    assert main(["train", "--explain", "rollout.grup_size"]) == 2
    assert "no config key 'rollout.grup_size'; did you mean rollout.group_size" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="sections: model, env, rollout"):
        config_reference.explain("nothing")
    assert config_reference.explain("stop").count("\n  meaning") == 6  # a section: each of its keys
