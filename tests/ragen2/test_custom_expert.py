"""An env of your own, warm-started (issue 49, item 7): `TextEnv.expert_turn`, the hook that
envs.experts dispatches to; the worked example's expert (examples/guess_number.py); and
docs/custom_env.md's section 5 commands, demos -> sft -> train, run as written from the example's
folder on a tiny model."""

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import envs
from envs.bandit import BanditEnv
from envs.experts import ExpertTurn, NoExpertError, expert_turn, has_expert
from envs.parsing import format_response

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "guess_number.py"
DOC = ROOT / "docs" / "custom_env.md"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("guess_number_expert_test", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)  # registers "guess_number" (as importing it from examples/ does)
    yield module
    sys.modules.pop(spec.name, None)


def _play(env, seed: int) -> tuple[bool, int]:
    env.reset(seed=seed)
    turns = 0
    while not env.episode_over:
        turn = expert_turn(env)
        _, _, _, _, info = env.step(format_response(list(turn.actions), think=turn.grounded))
        turns += 1
    return bool(info["success"]), turns


def test_the_examples_expert_wins_every_game_within_its_guesses(example):
    env = example.GuessNumber()
    results = [_play(env, seed) for seed in range(300)]
    assert all(won for won, _ in results)  # binary search: 1 of 10 numbers in at most 4 guesses
    assert max(turns for _, turns in results) == 4 and min(turns for _, turns in results) == 1


def test_the_examples_expert_reads_only_what_the_hints_showed(example):
    env = example.GuessNumber()
    env.reset(seed=5)
    env.step(format_response([expert_turn(env).actions[0]], think="x"))
    before = expert_turn(env)
    env.secret = None  # what the model cannot see: the expert must not need it
    assert expert_turn(env) == before
    assert f"between {env.bounds[0]} and {env.bounds[1]}" in before.grounded


def test_the_hook_is_what_expert_turn_and_has_expert_use(example):
    env = example.GuessNumber()
    env.reset(seed=1)
    assert has_expert(example.GuessNumber) and has_expert(env) and has_expert("guess_number")
    assert env.expert_turn() == expert_turn(env) == expert_turn(env, turns_left=2)
    lake = envs.make("frozen_lake")  # a built-in env: no method of its own, the table's expert plays it
    lake.reset(seed=3)
    assert lake.expert_turn() is None and expert_turn(lake).actions


def test_an_override_wins_over_the_table_and_may_omit_turns_left():
    class AlwaysFirstArm(BanditEnv):
        def expert_turn(self):
            return ExpertTurn((self.shown_order[0],), "I always pull the first arm shown.")

    env = AlwaysFirstArm()
    env.reset(seed=0)
    assert expert_turn(env, turns_left=1).actions == (env.shown_order[0],)


def test_an_env_without_an_expert_or_with_a_bad_one_is_told_what_to_return(example):
    class NoExpert(example.GuessNumber):
        expert_turn = envs.TextEnv.expert_turn  # back to the default: no expert for this class

    class BadExpert(example.GuessNumber):
        def expert_turn(self, turns_left=None):
            return "50"

    assert not has_expert(NoExpert)
    env = NoExpert()
    env.reset(seed=0)
    with pytest.raises(NoExpertError, match="override its expert_turn"):
        expert_turn(env)
    bad = BadExpert()
    bad.reset(seed=0)
    with pytest.raises(TypeError, match=r"BadExpert.expert_turn returned '50': return envs.experts.ExpertTurn"):
        expert_turn(bad)


def _doc_commands() -> list[list[str]]:
    """The `ragen2 ...` commands of docs/custom_env.md's warm-start section, continuations joined."""
    section = DOC.read_text().split("## 5. Warm-start it")[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    return [shlex.split(line) for line in block.splitlines() if line.startswith("ragen2 ")]


def _cli() -> list[str]:
    script = Path(sys.executable).parent / "ragen2"
    return [str(script)] if script.is_file() else [sys.executable, "-c", "import sys; from ragen2.cli import main; "
                                                                          "sys.exit(main())"]


def test_the_docs_warm_start_commands_run_for_the_example(tmp_path, tiny_model_dir):
    demos_cmd, sft_cmd, train_cmd = _doc_commands()
    assert [c[1] for c in (demos_cmd, sft_cmd, train_cmd)] == ["demos", "sft", "train"]
    folder = tmp_path / "examples"
    folder.mkdir()
    (folder / "guess_number.py").write_text(EXAMPLE.read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    small = ["rollout.max_new_tokens=8", "trainer.val_groups=1"]  # each command's own overrides come last
    extra = {"demos": [[], ["--episodes", "8"]],
             "sft": [[*small, "sft.batch_episodes=4"], ["--model", str(tiny_model_dir), "--steps", "1", "--quiet"]],
             "train": [[*small, "rollout.num_groups=2", "rollout.group_size=2", "probe.every=0",
                        "optim.micro_batch_size=2", "optim.mini_batch_size=4"], ["--steps", "1", "--quiet"]]}
    for command in (demos_cmd, sft_cmd, train_cmd):
        overrides, flags = extra[command[1]]
        out = subprocess.run([*_cli(), *command[1:], *overrides, *flags], cwd=folder, env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"{shlex.join(command)}:\n{out.stderr[-3000:]}"

    demos = [json.loads(line) for line in (folder / "guess_demos.jsonl").read_text().splitlines()]
    assert len(demos) == 8 and all(d["success"] for d in demos)  # the expert wins every game
    assert {d["env"] for d in demos} == {"guess_number:GuessNumber"}  # a new process re-imports it
    assert {d["rollout"]["max_turns"] for d in demos} == {4} and {d["env_args"]["require_think"] for d in demos} == {False}
    assert (folder / "runs" / "guess_sft" / "model" / "config.json").is_file()
    (trained,) = [p for p in (folder / "runs").iterdir() if p.name != "guess_sft"]
    config = yaml.safe_load((trained / "config.yaml").read_text())
    assert config["model"]["name"] == "runs/guess_sft" and config["env"]["overrides"] == {"require_think": False}
    assert len((trained / "metrics.jsonl").read_text().splitlines()) == 1


def test_the_examples_docstring_gives_the_pages_commands(example):
    # the docstring is where a reader of the example looks first: it once omitted require_think=false
    text = example.__doc__.replace("\\\n", " ")
    given = [shlex.split(line) for line in text.splitlines() if line.strip().startswith("ragen2 ")]
    assert {shlex.join(c) for c in _doc_commands()} <= {shlex.join(c) for c in given}
    trains = [c for c in given if c[1] == "train"]
    assert len(trains) == 2 and all("require_think=false" in c for c in trains)
