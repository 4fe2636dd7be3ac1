"""`ragen2 eval`: statistics over instances, held-out variants, and checkpoints of a tiny trained model."""

import json
import math
import re

import pytest
import torch

import envs
from ragen2 import models as model_lib
from ragen2.cli import main
from ragen2.commands.eval import episode_statistics, evaluate_policy
from ragen2.rollout import RolloutConfig, TrajectoryRecord
from tests.tiny import ScriptedPolicy, tiny_llama, tiny_tokenizer
from ragen2.seeding import EVAL_STREAM

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: threads cost more than they save


def test_statistics_are_over_instances_with_standard_errors():
    outcomes = {0: [(True, 1.0), (False, -0.1)], 1: [(False, 0.0), (False, 0.0)], 2: [(True, 0.5), (True, 0.5)]}
    records = [TrajectoryRecord(g, m, g, turn_rewards=[r], format_ok=[r >= 0], success=s)
               for g, members in outcomes.items() for m, (s, r) in enumerate(members)]
    stats = episode_statistics(records)
    # per-instance success 0.5, 0, 1 → mean 0.5, sample std 0.5, se 0.5/√3
    assert stats["success_rate"] == {"mean": 0.5, "se": pytest.approx(0.5 / math.sqrt(3)), "n": 3}
    # pass@2 per instance 1, 0, 1 → mean 2/3, sample variance 1/3, se √(1/9) = 1/3
    assert stats["pass_at_g"]["mean"] == pytest.approx(2 / 3) and stats["pass_at_g"]["se"] == pytest.approx(1 / 3)
    # reward per instance 0.45, 0, 0.5
    rewards = [0.45, 0.0, 0.5]
    mean = sum(rewards) / 3
    se = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 2 / 3)
    assert stats["reward"]["mean"] == pytest.approx(mean) and stats["reward"]["se"] == pytest.approx(se)
    assert stats["format_ok_fraction"] == 5 / 6 and (stats["episodes"], stats["instances"]) == (6, 3)
    one = episode_statistics(records[:2])
    assert one["success_rate"] == {"mean": 0.5, "se": None, "n": 1}  # no spread from one instance


@pytest.mark.parametrize("env_name", ["bandit_rev", "bandit_test"])
def test_held_out_bandits_score_a_scripted_first_arm_policy_exactly(env_name):
    tok = tiny_tokenizer("chatml")

    def respond(prompt):  # always the first arm the prompt lists
        first = re.findall(r"There are 2 arms, named (\w+) and", prompt)[0]  # RAGEN-2's observation
        return f"<think>first</think><answer>{first}</answer>"

    policy = ScriptedPolicy(tok, respond, generation_prompt="<|im_start|>assistant\n")
    config = RolloutConfig(group_size=2, max_turns=1, max_new_tokens=30, prefill_tag=False)
    stats = evaluate_policy(policy, tok, env_name, {}, config, num_groups=6, seed=4)
    expected = []
    for seed in stats["instance_seeds"]:
        env = envs.make(env_name)
        env.reset(seed=seed)
        expected.append(float(env.action_vocabulary[0] == env.best_arm))
    assert len(stats["instance_seeds"]) == 6 and stats["episodes"] == 12
    assert 0 < sum(expected) < 6  # the seeds cover both arm orders, so the check has teeth
    assert stats["success_rate"]["mean"] == pytest.approx(sum(expected) / 6)
    assert stats["pass_at_g"]["mean"] == pytest.approx(sum(expected) / 6)  # a scripted group agrees with itself
    import numpy as np

    drawn = np.random.default_rng([4, EVAL_STREAM]).integers(0, 2**31 - 1, size=6).tolist()
    assert stats["instance_seeds"] == drawn  # the eval stream, apart from training and validation seeds


TINY = ["rollout.num_groups=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "trainer.val_groups=2",
        "optim.micro_batch_size=2", "optim.mini_batch_size=4", "probe.every=0"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    tokenizer = tiny_tokenizer("chatml")
    tiny_llama(tokenizer, seed=0).save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    code = main(["train", "--quiet", "--algo", "grpo", "--filter", "none", "--model", str(folder / "model"),
                 "--out", str(folder), "--steps", "1", "trainer.run_name=run", *TINY])
    assert code == 0
    return folder


def test_eval_a_run_directory_loads_its_latest_checkpoint_and_writes_json(trained_run, monkeypatch, capsys):
    loaded = []
    real = model_lib.load_model_weights
    monkeypatch.setattr(model_lib, "load_model_weights", lambda m, d: loaded.append(d) or real(m, d))
    run = trained_run / "run"
    assert main(["eval", str(run), "--env", "bandit_rev", "--episodes", "5", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert loaded == [run / "checkpoints" / "step_000001" / "policy"]
    path = run / "eval" / "run-step_000001-bandit_rev.json"
    assert f"wrote {path}" in out and "success rate" in out and "pass@2" in out
    result = json.loads(path.read_text())
    assert (result["episodes"], result["instances"], result["group_size"]) == (6, 3, 2)  # 5 rounded up to groups
    assert result["env_overrides"] == {"require_think": False}  # the run was answer-only; so is its eval
    assert result["temperature"] == 0.5 and result["max_new_tokens"] == 6
    assert set(result["success_rate"]) == {"mean", "se", "n"} and 0 <= result["success_rate"]["mean"] <= 1
    # The checkpoint folder itself names the same weights; a model folder is evaluated as it is.
    assert main(["eval", str(run / "checkpoints" / "step_000001"), "--env", "larger_sokoban", "--episodes", "2",
                 "--max-turns", "2", "--out", str(trained_run / "c.json")]) == 0
    assert json.loads((trained_run / "c.json").read_text())["max_turns"] == 2
    assert main(["eval", str(trained_run / "model"), "--env", "bandit_test", "--episodes", "2",
                 "--out", str(trained_run / "m.json")]) == 0
    assert json.loads((trained_run / "m.json").read_text())["checkpoint"] is None


def test_eval_of_a_run_without_env_uses_the_runs_env_and_settings(trained_run, capsys, tmp_path):
    # `eval RUN` required --env although the run's config.yaml names it
    assert main(["eval", str(trained_run / "run"), "--episodes", "2", "--out", str(tmp_path / "e.json")]) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    assert (result["env"], result["env_overrides"]) == ("bandit", {"require_think": False})  # answer-only, as trained
    assert (result["max_new_tokens"], result["temperature"]) == (6, 0.5)
    assert main(["eval", str(trained_run / "model"), "--episodes", "2"]) == 2
    assert "is a model, not a run: name the env to evaluate on with --env" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--env", "atari"], "unknown env 'atari'"),
    (["--env", "bandit_rev", "--env-override", "nope=1"], "nope"),
    (["--env", "bandit_rev", "--episodes", "0"], "--episodes and --group-size must be at least 1"),
])
def test_eval_bad_input_is_one_clear_line(trained_run, capsys, argv, message):
    assert main(["eval", str(trained_run / "run"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_eval_a_run_without_checkpoint_says_why(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("{}")
    assert main(["eval", str(tmp_path / "run"), "--env", "bandit"]) == 2
    assert "keep_final_checkpoint: true" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["eval", str(tmp_path / "empty"), "--env", "bandit"]) == 2
    assert "not a checkpoint" in capsys.readouterr().err



def test_a_model_is_evaluated_with_the_envs_training_preset_as_train_does(tmp_path):
    # `ragen2 eval bundled --env sokoban` used base.yaml's 1 turn of 32 answer-only tokens;
    # configs/envs/sokoban.yaml (what `ragen2 train --env sokoban` uses) says 5 turns of 48, think mode.
    from ragen2.config import load_config

    tokenizer = tiny_tokenizer("chatml")
    tiny_llama(tokenizer, seed=0).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    for env_name, family in (("sokoban", "sokoban"), ("larger_sokoban", "sokoban"), ("frozen_lake", "frozen_lake")):
        out = tmp_path / f"{env_name}.json"
        assert main(["eval", str(tmp_path / "model"), "--env", env_name, "--episodes", "2", "--group-size", "2",
                     "--out", str(out)]) == 0
        result, trained = json.loads(out.read_text()), load_config(env=family)
        assert (result["max_turns"], result["max_new_tokens"]) == (
            trained.rollout.max_turns, trained.rollout.max_new_tokens) != (1, 32), env_name
        assert "require_think" not in result["env_overrides"], env_name  # think mode, as trained
