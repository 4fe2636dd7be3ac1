import subprocess
import sys
from pathlib import Path

import pytest

import envs
from envs.base import EnvConfigError, EpisodeOverError

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_env_names_the_registered_ones():
    with pytest.raises(EnvConfigError, match=r"unknown env 'sokobam'.*'sokoban'"):
        envs.make("sokobam")


def test_names_ignore_case_and_separators():
    assert envs.spec("Frozen-Lake").name == envs.spec("frozen_lake").name == envs.spec("FROZENLAKE").name


def test_unknown_config_key_names_the_valid_keys():
    with pytest.raises(EnvConfigError, match=r"unknown config key\(s\) \['dimx'\].*valid keys: \[.*'max_actions_per_turn'"):
        envs.make("sokoban", dimx=8)


def test_wrong_type_is_rejected():
    with pytest.raises(EnvConfigError, match="max_actions_per_turn must be int, got str"):
        envs.make("sokoban", max_actions_per_turn="3")


@pytest.mark.parametrize("key, value, message", [
    ("max_actions_per_turn", 0, "max_actions_per_turn must be >= 1"),
    ("max_actions_per_traj", -1, "max_actions_per_traj must be >= 1"),
    ("format_penalty", 0.5, "format_penalty must be a finite number <= 0"),
])
def test_bad_shared_values_are_rejected(key, value, message):
    with pytest.raises(EnvConfigError, match=message):
        envs.make("frozen_lake", **{key: value})


def test_command_line_strings_are_coerced_by_field_type():
    entry = envs.spec("sokoban")
    typed = envs.coerce_overrides(entry, {"max_actions_per_turn": "3", "format_penalty": "-0.5",
                                          "require_think": "false"})
    assert typed == {"max_actions_per_turn": 3, "format_penalty": -0.5, "require_think": False}
    with pytest.raises(EnvConfigError, match="max_actions_per_turn must be int, got 'three'"):
        envs.coerce_overrides(entry, {"max_actions_per_turn": "three"})


def test_seed_must_be_a_non_negative_int():
    env = envs.make("sokoban")
    for bad in (-1, "3", 1.5, True):
        with pytest.raises(EnvConfigError, match="seed must be a non-negative int"):
            env.reset(seed=bad)
    with pytest.raises(EnvConfigError, match=r"unknown reset options \['colour'\]"):
        env.reset(seed=1, options={"colour": 1})


def test_stepping_before_reset_is_a_clear_error():
    with pytest.raises(EpisodeOverError, match="call reset"):
        envs.make("sokoban").step("<think></think><answer>Up</answer>")


def test_format_penalty_is_configurable_and_budget_truncates():
    env = envs.make("sokoban", format_penalty=-0.5, max_actions_per_traj=2, max_actions_per_turn=5)
    env.reset(seed=0)
    assert env.step("garbage")[1] == -0.5
    # Two actions left: a turn of five runs two, then the episode is truncated (unless solved).
    _, _, terminated, truncated, info = env.step("<think></think><answer>Up||Up||Up||Up||Up</answer>")
    assert len(info["actions_executed"]) == 2 and info["actions_over_budget"] == ["Up"] * 3
    assert truncated != terminated and env.actions_left == 0
    assert not info["success"] or terminated


def _load_open_room(env):
    # Player with floor above: "Up" is a plain move (-0.1, no push, not solved).
    env.load_room(["######", "#____#", "#_P__#", "#_XO_#", "#____#", "######"])


def test_format_penalty_by_default_hits_any_invalid_action_as_in_ragen2():
    # RAGEN-2 es_manager: penalty when len(valid) != len(actions) or not valid. "Up || Jump":
    # Up runs (-0.1 step) and Jump is invalid (-0.1 penalty): -0.2 in all.
    env = envs.make("sokoban")
    env.reset(seed=0)
    _load_open_room(env)
    _, reward, *_, info = env.step("<think></think><answer>Up || Jump</answer>")
    assert info["actions_executed"] == ["Up"] and info["format_penalty"] == pytest.approx(-0.1)
    assert reward == pytest.approx(-0.2)
    # Pieces beyond max_actions_per_turn (2, RAGEN-2's) are cut before the check, as RAGEN-2 does.
    env.reset(seed=0)
    _load_open_room(env)
    _, reward, *_, info = env.step("<think></think><answer>Up||Up||Jump</answer>")
    assert info["format_penalty"] == 0.0 and reward == pytest.approx(2 * -0.1)


def test_none_valid_rule_penalises_only_turns_with_nothing_valid():
    env = envs.make("sokoban", format_penalty_rule="none_valid")
    env.reset(seed=0)
    _load_open_room(env)
    _, reward, *_, info = env.step("<think></think><answer>Up || Jump</answer>")
    assert info["format_penalty"] == 0.0 and reward == pytest.approx(-0.1)
    _, reward, *_ = env.step("<think></think><answer>Jump</answer>")
    assert reward == pytest.approx(-0.1)  # nothing ran: the penalty alone
    with pytest.raises(EnvConfigError, match=r"format_penalty_rule must be one of \['any_invalid', 'none_valid'\]"):
        envs.make("sokoban", format_penalty_rule="sometimes")


def test_same_seed_same_instance_in_another_process():
    code = ("import envs, json; print(json.dumps([envs.make(n).reset(seed=s)[0] "
            "for n in ('sokoban','frozen_lake','countdown','bandit','metamathqa') for s in (0, 99)]))")
    outputs = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              env={"PYTHONHASHSEED": str(seed), "PATH": ""}, check=True).stdout
               for seed in (1, 2)}
    assert len(outputs) == 1


@pytest.mark.parametrize("package", ["envs", "snr", "mi_probe"])
def test_pure_packages_do_not_import_ragen2(package):
    code = f"import sys, {package}; print('ragen2' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
    sources = "\n".join(p.read_text() for p in (ROOT / package).rglob("*.py"))
    assert "import ragen2" not in sources and "from ragen2" not in sources
