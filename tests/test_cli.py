import io

import pytest

import envs
from ragen2.cli import main


def test_envs_list_shows_every_env(capsys):
    assert main(["envs", "list"]) == 0
    out = capsys.readouterr().out
    for entry in envs.specs():
        assert entry.name in out


def test_envs_show_prints_the_first_turn_prompt(capsys):
    assert main(["envs", "show", "sokoban", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    obs, _ = envs.make("sokoban").reset(seed=3)
    assert "You're a helpful assistant." in out
    assert "Turn 1:\nState:\n" + obs in out
    assert "Your available actions are:\nUp, Down, Left, Right" in out
    assert "You have 10 actions left. Always output: <think> [Your thoughts] </think>" in out


def test_envs_show_applies_overrides(capsys):
    assert main(["envs", "show", "sokoban", "--seed", "1", "max_actions_per_traj=4"]) == 0
    assert "You have 4 actions left." in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["envs", "show", "nope"], "unknown env 'nope'"),
    (["envs", "show", "sokoban", "dimx=3"], "unknown config key(s) ['dimx']"),
    (["envs", "show", "sokoban", "max_actions_per_turn=lots"], "max_actions_per_turn must be int"),
    (["envs", "show", "sokoban", "oops"], "override 'oops' is not KEY=VALUE"),
])
def test_bad_input_is_one_clear_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def _play(monkeypatch, capsys, argv, lines):
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(line + "\n" for line in lines)))
    assert main(argv) == 0
    return capsys.readouterr().out


def test_play_accepts_bare_actions_and_reports_the_result(monkeypatch, capsys):
    env = envs.make("bandit")
    env.reset(seed=5)
    arm = env.action_vocabulary[0]
    out = _play(monkeypatch, capsys, ["envs", "play", "bandit", "--seed", "5"], [arm.lower()])
    assert f"executed ['{arm}']" in out
    assert "total reward" in out


def test_play_shows_parser_errors_and_quits_on_eof(monkeypatch, capsys):
    out = _play(monkeypatch, capsys, ["envs", "play", "sokoban", "--seed", "0"],
                ["<think>x</think><answer>fly</answer>"])
    assert "dropped 'fly': not in the action vocabulary" in out
    assert "reward -0.1" in out
    assert "quit after 1 turns" in out
