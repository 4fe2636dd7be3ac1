"""completions.jsonl: a few trajectories per step with text, parse results and reward; on the
console on request, to wandb / TensorBoard when on; no effect on a run's numbers."""

import json
import re
import shutil
import sys
import types

import pytest
import torch
import yaml

import envs
from ragen2.instruments import completions as comp
from ragen2.seeding import step_seeds
from ragen2.engines.local import trainer as trainer_lib
from ragen2.cli import main
from ragen2.config import build_config
from ragen2.rollout import RolloutConfig, rollout
from tests.tiny import ScriptedPolicy, tiny_tokenizer
from ragen2.run_dir import RunLog, read_completions, read_metrics
from ragen2.commands.train import compose

TINY = ["rollout.num_groups=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "trainer.val_groups=2",
        "optim.micro_batch_size=2", "optim.mini_batch_size=4", "probe.every=0", "trainer.num_threads=1",
        "--filter", "none", "--algo", "grpo"]
SCRIPT = {1: "<think>l</think><answer>Left</answer>", 2: "I refuse",
          3: "<think>hm</think><answer>Right || Fly</answer>"}


def _deterministic(rows):
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "throughput/"))} for row in rows]


@pytest.fixture
def captured_batches(monkeypatch):
    """The pre-filter RolloutBatch of every training step, in order."""
    from ragen2.engines.local import dynamic_sampling  # where a step's rollouts are sampled

    batches, real = [], dynamic_sampling.rollout

    def recording(*args, **kwargs):
        batches.append(real(*args, **kwargs))
        return batches[-1]

    monkeypatch.setattr(dynamic_sampling, "rollout", recording)
    return batches


def test_choose_is_best_and_worst_first_ties_to_the_earlier():
    rewards = [0.5, -0.1, 0.9, -0.1, 0.9]
    assert comp.choose(rewards, 2) == [(2, "best"), (1, "worst")]
    assert comp.choose(rewards, 4) == [(2, "best"), (4, "best_2"), (3, "worst_2"), (1, "worst")]
    assert [i for i, _ in comp.choose(rewards, 9)] == [2, 4, 0, 3, 1]  # all of them, best first
    assert comp.choose(rewards, 0) == [] and comp.choose([], 3) == []


def test_a_hand_made_episode_records_its_turns_and_parse_results():
    # Sokoban seed 3: Left is a legal move (-0.1); "I refuse" has no tags (format penalty -0.5);
    # "Right || Fly" runs Right and has one invalid action (-0.1 - 0.5).
    tok = tiny_tokenizer("chatml")
    policy = ScriptedPolicy(tok, lambda p: SCRIPT[int(re.findall(r"Turn (\d+):", p)[-1])],
                            generation_prompt="<|im_start|>assistant\n", end_with_eos=True)
    cfg = RolloutConfig(group_size=2, max_turns=3, max_new_tokens=40, prefill_tag=False)
    batch = rollout(policy, tok, lambda: envs.make("sokoban", format_penalty=-0.5), [3], cfg,
                    torch.Generator().manual_seed(0))
    [record] = comp.pick(batch, 1, kept_groups=[])
    assert (record["group"], record["member"], record["seed"], record["rank"]) == (0, 0, 3, "best")
    assert record["reward"] == pytest.approx(-1.2) and record["success"] is False and record["kept"] is False
    assert [t["response"] for t in record["turns"]] == [SCRIPT[1], SCRIPT[2], SCRIPT[3]]
    assert [t["reward"] for t in record["turns"]] == pytest.approx([-0.1, -0.5, -0.6])
    parses = [t["parse"] for t in record["turns"]]
    assert [(p["format_ok"], p["error"], p["executed"], p["num_invalid"]) for p in parses] == [
        (True, None, ["Left"], 0), (False, "no <think> tag", [], 0), (True, None, ["Right"], 1)]
    assert parses[2]["parsed"] == ["Right"] and parses[1]["finish_reason"] == "eos"
    assert record["turns"][0]["state"] == "######\n######\n#O####\n#X####\n#_P###\n######"
    assert record["turns"][1]["state"] == record["turns"][2]["state"] != record["turns"][0]["state"]  # nothing moved
    assert record["final_state"] == record["turns"][0]["state"]  # Left, then Right: back where it started
    text = comp.console_text([record])
    assert "[best] group 0 member 0 seed 3 | reward -1.200 | success no filtered out" in text
    assert "turn 2 (format error: no <think> tag, -0.50): I refuse" in text
    assert "turn 3 (1 invalid action(s), -0.60)" in text
    json.dumps(record)  # a JSON line as it stands


def test_training_records_the_configured_count_with_the_batchs_rewards(tiny_model_dir, tmp_path, capsys,
                                                                       captured_batches):
    # log_completions=3 of 4 trajectories, shown on the console; then the same run with 0.
    assert main(["train", "--show-completions", "--model", str(tiny_model_dir), "--out", str(tmp_path),
                 "--steps", "2", "trainer.run_name=shown", "trainer.log_completions=3", *TINY]) == 0
    err = capsys.readouterr().err
    records = read_completions(tmp_path / "shown")
    cfg = build_config(yaml.safe_load((tmp_path / "shown" / "config.yaml").read_text()))
    assert [r["step"] for r in records] == [0, 0, 0, 1, 1, 1]
    for step, batch in enumerate(captured_batches[:2]):  # [2] is validation's
        rewards = {(t.group, t.member): t.reward for t in batch.trajectories}
        mine = [r for r in records if r["step"] == step]
        assert [r["rank"] for r in mine] == ["best", "best_2", "worst"]
        for r in mine:
            traj = batch.trajectories[r["group"] * 2 + r["member"]]
            assert r["reward"] == rewards[(r["group"], r["member"])] == traj.reward
            assert r["success"] == traj.success and r["kept"] is True  # filter none keeps every group
            assert [t["response"] for t in r["turns"]] == traj.response_texts
            assert [t["parse"]["format_ok"] for t in r["turns"]] == traj.format_ok
        assert mine[0]["reward"] == max(rewards.values()) and mine[-1]["reward"] == min(rewards.values())
        seeds = step_seeds(cfg, step)  # the env instances of the step
        assert [r["seed"] for r in mine] == [seeds[r["group"]] for r in mine] == [
            batch.trajectories[r["group"] * 2 + r["member"]].seed for r in mine]
    # each step line is followed by its three trajectories
    lines = err.splitlines()
    for step in (1, 2):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"step {step}/2"))
        assert [line.split("]")[0].strip() for line in lines[at + 1:at + 8] if line.startswith("  [")] == [
            "[best", "[best_2", "[worst"]

    assert main(["train", "--quiet", "--model", str(tiny_model_dir), "--out", str(tmp_path), "--steps", "2",
                 "trainer.run_name=none", "trainer.log_completions=0", *TINY]) == 0
    assert not (tmp_path / "none" / "completions.jsonl").exists()
    assert _deterministic(read_metrics(tmp_path / "shown")) == _deterministic(read_metrics(tmp_path / "none"))


def test_resume_drops_the_redone_steps_lines_and_writes_them_again(tiny_model_dir, tmp_path):
    assert main(["train", "--quiet", "--model", str(tiny_model_dir), "--out", str(tmp_path), "--steps", "2",
                 "trainer.run_name=r", "trainer.save_every=1", *TINY]) == 0
    run = tmp_path / "r"
    before = (run / "completions.jsonl").read_text()
    shutil.rmtree(run / "checkpoints" / "step_000002")  # as if killed after step 2's lines, before its save
    with (run / "completions.jsonl").open("a") as handle:
        handle.write('{"step": 1, "gro')  # and mid-line
    assert main(["train", "--quiet", "--resume", str(run)]) == 0
    assert (run / "completions.jsonl").read_text() == before  # step 1 redone bit for bit, once
    assert [r["step"] for r in read_completions(run)] == [0, 0, 1, 1]


def test_console_only_when_asked_and_never_under_quiet(tmp_path, capsys):
    record = {"group": 1, "member": 0, "seed": 7, "rank": "best", "reward": 0.9, "success": True, "kept": None,
              "num_turns": 1, "turns": [{"state": "s", "response": "<answer>Left</answer>", "reward": 0.9,
                                         "parse": {"format_ok": True, "error": None, "executed": ["Left"],
                                                   "num_invalid": 0, "finish_reason": "stop"}}]}
    for name, kwargs, shown in (("a", {}, False), ("b", {"print_completions": True}, True),
                                ("c", {"print_completions": True, "quiet": True}, False)):
        (tmp_path / name).mkdir()
        log = RunLog(tmp_path / name, 3, {}, **kwargs)
        log.step(0, {"rollout/reward_mean": 0.9}, [record])
        log.close()
        err = capsys.readouterr().err
        assert ("[best] group 1 member 0 seed 7 | reward +0.900 | success yes" in err) == shown, name
        assert ("turn 1 (ok, +0.90): <answer>Left</answer>" in err) == shown
        assert read_completions(tmp_path / name) == [{"step": 0, **record}]  # the file either way


def test_the_show_completions_flag_sets_the_config_key(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    from ragen2.commands.train import add_parser

    add_parser(parser.add_subparsers())
    for argv, wanted in ((["train"], False), (["train", "--show-completions"], True)):
        args = parser.parse_args([*argv, "--out", str(tmp_path)])
        cfg, _, _ = compose(args)
        assert cfg.trainer.print_completions is wanted and cfg.trainer.log_completions == 2


def test_tensorboard_gets_the_completions_as_text(tmp_path, monkeypatch):
    texts = []

    class SummaryWriter:
        def __init__(self, folder):
            pass

        def add_scalar(self, *args):
            pass

        def add_text(self, tag, text, step):
            texts.append((tag, text, step))

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=SummaryWriter))
    record = {"group": 0, "member": 1, "seed": 5, "rank": "worst", "reward": -0.1, "success": False, "kept": True,
              "num_turns": 1, "turns": [{"state": "s", "response": "I refuse", "reward": -0.1,
                                         "parse": {"format_ok": False, "error": "no <think> tag"}}]}
    log = RunLog(tmp_path, 3, {}, use_tensorboard=True, quiet=True)
    log.step(4, {"x": 1.0}, [record])
    log.step(5, {"x": 1.0}, [])
    log.close()
    [(tag, text, step)] = texts
    assert tag == "completions" and step == 4
    assert "**worst**: group 0, member 1, seed 5, reward -0.100" in text and "    I refuse" in text
    assert "format error: no <think> tag" in text


def _openrlhf_sample(tok, replies: list[str], reward: float, success: float, seed: int):
    """A one-sample Experience as OpenRLHF builds it from our agent's output: left-padded ids,
    action_mask[t] marking token t+1 as sampled (the agent's turn spans)."""
    from types import SimpleNamespace

    from ragen2.rollout.chat import ChatFormat, TokenTrajectory

    chat = ChatFormat(tok)
    trajectory = TokenTrajectory(chat, [{"role": "system", "content": "s"}, {"role": "user", "content": "Turn 1"}],
                                 prefill="<think>")
    for k, reply in enumerate(replies):
        ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
        trajectory.add_reply(ids, [0.0] * len(ids), "<think>" + reply, ended_with_eos=True)
        if k + 1 < len(replies):
            trajectory.add_user(f"Reward:\n0\n\nTurn {k + 2}")
    ids, pad = trajectory.input_ids[:trajectory.last_sampled_end()], 3
    action = [False] * (len(ids) - 1)
    for start, end in trajectory.turn_spans:
        for t in range(start, end):
            action[t - 1] = True
    label = json.dumps({"env": "sokoban", "env_config": {}, "seed": seed, "max_turns": 2, "max_new_tokens": 40})
    return SimpleNamespace(sequences=torch.tensor([[tok.pad_token_id] * pad + ids]),
                           attention_mask=torch.tensor([[0] * pad + [1] * len(ids)]),
                           action_mask=torch.tensor([[False] * pad + action]), rewards=torch.tensor([reward]),
                           scores=torch.tensor([success]), labels=[label],
                           info={"env/format_ok_fraction": torch.tensor([0.5])})


def test_openrlhf_samples_give_the_same_records_from_their_tokens(tmp_path):
    from ragen2.engines.openrlhf.completions import pick_samples
    from ragen2.engines.openrlhf.run_files import RunFiles

    tok = tiny_tokenizer("chatml")
    good, bad = "hm</think><answer>Left</answer>", "no closing tag"
    samples = [_openrlhf_sample(tok, [good, bad], -0.6, 0.0, 11), _openrlhf_sample(tok, [good], 0.9, 1.0, 11),
               _openrlhf_sample(tok, [bad], -0.1, 0.0, 12), _openrlhf_sample(tok, [good], -0.1, 0.0, 12)]
    records = pick_samples(samples, 2, 2, tok, "<think>", kept_groups=[1])
    best, worst = records
    assert (best["rank"], best["group"], best["member"], best["seed"], best["success"], best["kept"]) == (
        "best", 0, 1, 11, True, False)
    assert (worst["rank"], worst["group"], worst["member"], worst["seed"], worst["kept"]) == ("worst", 0, 0, 11, False)
    assert best["reward"] == pytest.approx(0.9) and worst["reward"] == pytest.approx(-0.6)
    assert [t["response"] for t in worst["turns"]] == ["<think>" + good, "<think>" + bad]  # as the env saw them
    assert [(t["parse"]["format_ok"], t["parse"]["error"]) for t in worst["turns"]] == [
        (True, None), (False, "<think> is never closed")]
    assert worst["format_ok_fraction"] == 0.5 and worst["turns"][0]["reward"] is None  # not carried by a sample
    files = RunFiles(tmp_path)
    files.log_completions(3, records)
    files.finish(4, 0, None)
    assert read_completions(tmp_path) == [{"step": 3, **r} for r in records]
    assert "turn 1 (ok, n/a)" in comp.console_text(records)
