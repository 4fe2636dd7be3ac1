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


def _modules_after(argv: list[str]) -> set[str]:
    """The modules a fresh `ragen2 ARGV` process has imported when it finishes."""
    import subprocess
    import sys

    code = ("import sys, contextlib, io\nfrom ragen2.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass\n"
            "print(' '.join(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_help_lists_every_command_and_imports_none_of_them(capsys):
    from ragen2.commands import COMMANDS

    with pytest.raises(SystemExit):
        main(["--help"])
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line[:4] == "    " and line[4:5].strip()]
    assert listed == list(COMMANDS)
    loaded = _modules_after(["--help"])
    assert not {f"ragen2.commands.{name}" for name in COMMANDS} & loaded
    assert not {"torch", "matplotlib", "pydantic", "ragen2.config"} & loaded


def test_a_command_imports_its_own_module_only():
    loaded = _modules_after(["envs", "list"])
    assert "ragen2.commands.envs" in loaded
    assert not {"ragen2.commands.train", "ragen2.commands.bench", "torch", "matplotlib"} & loaded
    loaded = _modules_after(["plot", "--help"])  # a command's --help: its parser, not its heavy logic
    assert "ragen2.commands.plot" in loaded and not {"matplotlib", "torch"} & loaded


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("ragen2 ")


def test_output_into_a_closed_pipe_ends_quietly_with_sigpipes_code():
    """`ragen2 audit RUN | head -1` gave a BrokenPipeError traceback once head had left."""
    import subprocess
    import sys

    script = ("import os, sys\n"
              "read_end, write_end = os.pipe()\n"
              "os.close(read_end)  # the reader has gone\n"
              "os.dup2(write_end, 1)\n"
              "from ragen2.cli import main\n"
              "sys.exit(main(['envs', 'show', 'sokoban']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 141
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
