"""Issue 34's silent traps, each now fixed or said: presets for SearchQA and DeepCoder, a note on
slow CPU steps, RAGEN-2's "up to N actions" wording explained, line editing in `envs play`."""

import io
import sys

import pytest

import ragen2.commands.envs as envs_command
from ragen2.cli import main
from ragen2.config import load_config


@pytest.mark.parametrize("env, turns, tokens", [("searchqa", 4, 64), ("deepcoder", 1, 384)])
def test_searchqa_and_deepcoder_have_presets_sized_for_their_task(env, turns, tokens):
    # both got base.yaml's single turn of 32 tokens: no answer after a search, no program at all
    cfg = load_config(env=env)
    assert (cfg.rollout.max_turns, cfg.rollout.max_new_tokens) == (turns, tokens)
    assert cfg.rollout.max_context_tokens == 4096 and cfg.env.overrides == {}


def _plan(capsys, *argv) -> str:
    assert main(["train", "--dry-run", "--model", "org/some-model", "model.device=cpu", *argv]) == 0
    return capsys.readouterr().err


def test_a_large_step_on_a_cpu_says_it_will_take_minutes(capsys):
    assert "note: a step samples up to 3072 tokens" in _plan(capsys, "--env", "deepcoder")
    assert "note:" not in _plan(capsys)  # the default Bandit job: 512 tokens


def test_envs_show_says_why_the_prompt_names_the_whole_budget(capsys):
    assert main(["envs", "show", "sokoban"]) == 0
    captured = capsys.readouterr()
    assert "You can make up to 10 actions" in captured.out
    assert "RAGEN-2's wording for the whole episode's budget; each turn runs at most 2" in captured.err
    assert main(["envs", "show", "sokoban", "prompt_action_limit=per_turn"]) == 0
    assert "note:" not in capsys.readouterr().err  # the prompt states the per-turn limit itself


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_play_turns_line_editing_on_for_a_terminal(monkeypatch, capsys):
    pytest.importorskip("readline")
    assert envs_command.enable_line_editing(_Terminal()) is True
    assert envs_command.enable_line_editing(io.StringIO()) is False  # piped: no escape codes
    calls = []
    monkeypatch.setattr(envs_command, "enable_line_editing", lambda: calls.append(True))
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert main(["envs", "play", "bandit"]) == 0
    assert calls == [True]
