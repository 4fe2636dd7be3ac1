"""`ragen2 demos` and `ragen2 sft`'s rows: demos replay through their env, show the model what a
rollout shows it, and train exactly the tokens an RL update of the same trajectory trains."""

from __future__ import annotations

import json
import re

import pytest
import torch

import envs
from ragen2 import demos as demos_lib
from ragen2.cli import main
from ragen2.config import load_config
from ragen2.engines.local.sft import demo_rows, step_rows
from ragen2.rollout import RolloutConfig, rollout
from tests.tiny import ScriptedPolicy, build_tiny_tokenizer

SETTINGS = [("frozen_lake", "grounded"), ("frozen_lake", "none"), ("sokoban", "template"), ("sokoban", "grounded")]


def _spec(env: str, reasoning: str) -> demos_lib.DemoSpec:
    settings = demos_lib.settings_for(reasoning, {})
    return demos_lib.DemoSpec(env, demos_lib.env_args_of(env, settings), max_turns=5, max_response_words=100)


@pytest.mark.parametrize("env,reasoning", SETTINGS)
def test_demos_replay_and_rebuild_their_env(env, reasoning):
    spec = _spec(env, reasoning)
    for seed in range(6):
        demo = demos_lib.render_demo(spec, seed, 0, reasoning)
        demos_lib.replay_demo(demo)  # raises on any difference
        rebuilt = envs.make(demo["env"], **demo["env_args"])
        assert rebuilt.config.require_think == (reasoning != "none")
        texts = demos_lib.assistant_texts(demo)
        assert texts and all(t.startswith("<think>" if reasoning != "none" else "<answer>") for t in texts)
        assert [m["role"] for m in demo["messages"][:3]] == ["system", "user", "assistant"]


def test_template_reasoning_is_one_text_and_grounded_differs():
    grounded, template = set(), set()
    for seed in range(8):
        for reasoning, bucket in (("grounded", grounded), ("template", template)):
            demo = demos_lib.render_demo(_spec("sokoban", reasoning), seed, 0, reasoning)
            bucket.update(re.findall(r"<think>(.*)</think>", t)[0] for t in demos_lib.assistant_texts(demo))
    assert len(template) == 1
    assert len(grounded) > 8


def _rollout_of(demo: dict, tokenizer, cfg):
    """The demo's assistant turns sampled by a scripted policy through the real rollout."""
    texts = demos_lib.assistant_texts(demo)

    def respond(prompt: str) -> str:
        turn = int(re.findall(r"Turn (\d+):", prompt)[-1])
        return texts[turn - 1]  # the prompt ends with the prefilled tag: the script starts with it too

    policy = ScriptedPolicy(tokenizer, respond, generation_prompt="<|im_start|>assistant\n")
    env_args = demo["env_args"]
    rollout_cfg = RolloutConfig(group_size=1, max_turns=demo["rollout"]["max_turns"], max_new_tokens=cfg.rollout.max_new_tokens,
                                max_response_words=demo["rollout"]["max_response_words"],
                                max_context_tokens=cfg.rollout.max_context_tokens)
    return rollout(policy, tokenizer, lambda: envs.make(demo["env"], **env_args), [demo["seed"]], rollout_cfg,
                   torch.Generator().manual_seed(0))


@pytest.mark.parametrize("env,reasoning", [("frozen_lake", "grounded"), ("sokoban", "none")])
def test_sft_rows_are_the_rollouts_training_rows(env, reasoning):
    """Same ids, same response mask (prefill and template excluded), and the user turns a rollout shows."""
    tokenizer = build_tiny_tokenizer()
    cfg = load_config(env=env, overrides=["rollout.max_new_tokens=400", "rollout.max_context_tokens=8192"])
    for seed in (1, 2, 3):
        demo = demos_lib.render_demo(_spec(env, reasoning), seed, 0, reasoning)
        rows = demo_rows([demo], tokenizer, cfg)
        sampled = _rollout_of(demo, tokenizer, cfg)
        width = int(sampled.attention_mask.sum())
        assert torch.equal(rows.input_ids[0, :width], sampled.input_ids[0, :width])
        assert torch.equal(rows.response_mask[0, :width], sampled.response_mask[0, :width])
        assert rows.response_mask.sum() > 0
        assert sampled.trajectories[0].response_texts == demos_lib.assistant_texts(demo)
        assert sampled.trajectories[0].reward == pytest.approx(demo["return"])
        # the prefilled tag is prompt, not trained: every trained run starts right after it
        ids = rows.input_ids[0].tolist()
        mask = rows.response_mask[0].tolist()
        starts = [i for i in range(1, width) if mask[i] and not mask[i - 1]]
        tag = "<think>" if reasoning != "none" else "<answer>"
        assert all(tokenizer.decode(ids[:s]).endswith(tag) for s in starts)


def test_step_rows_cover_each_epoch_once_and_repeat():
    cfg = load_config(overrides=["sft.batch_episodes=3", "trainer.seed=5"])
    seen = [r for step in range(4) for r in step_rows(cfg, step, 6)[0]]
    assert sorted(seen[:6]) == list(range(6)) and sorted(seen[6:12]) == list(range(6))
    assert step_rows(cfg, 2, 6) == step_rows(cfg, 2, 6)


def _write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _good(seed=0):
    return demos_lib.render_demo(_spec("frozen_lake", "grounded"), seed, 0, "grounded")


@pytest.mark.parametrize("case,expected", [
    ("empty", "empty"),
    ("other_role", "role 'tool'"),
    ("no_assistant", "no assistant turn"),
    ("other_env", "is not what env"),
    ("not_json", "not JSON"),
])
def test_bad_demos_files_exit_2_with_one_line_before_a_model_loads(tmp_path, capsys, case, expected):
    demo = _good()
    if case == "empty":
        path = tmp_path / "d.jsonl"
        path.write_text("")
    elif case == "not_json":
        path = tmp_path / "d.jsonl"
        path.write_text("{nope\n")
    else:
        if case == "other_role":
            demo["messages"].append({"role": "tool", "content": "x"})
        elif case == "no_assistant":
            demo["messages"] = demo["messages"][:2]
        elif case == "other_env":
            demo["env"] = "sokoban"
            demo["env_args"] = {"require_think": True}
        path = _write(tmp_path / "d.jsonl", [demo])
    code = main(["sft", "--demos", str(path), "--model", str(tmp_path / "no-such-model")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and expected in err and "\n" not in err


def test_demos_command_writes_what_it_says(tmp_path, capsys):
    out = tmp_path / "fl.jsonl"
    assert main(["demos", "--env", "frozen_lake", "--episodes", "5", "--seed", "3", "--reasoning", "grounded",
                 "--env-arg", "success_rate=1.0", "--out", str(out)]) == 0
    lines = demos_lib.read_demos(out)  # replays each
    assert len(lines) == 5 and all(d["success"] for d in lines)  # deterministic ice: the expert always wins
    assert lines[0]["env_args"] == {"success_rate": 1.0, "require_think": True}
    again = tmp_path / "again.jsonl"
    main(["demos", "--env", "frozen_lake", "--episodes", "5", "--seed", "3", "--reasoning", "grounded",
          "--env-arg", "success_rate=1.0", "--out", str(again)])
    assert again.read_text() == out.read_text()  # deterministic for a seed
    assert main(["demos", "--env", "frozen_lake", "--reasoning", "none", "--env-arg", "require_think=true",
                 "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "require_think" in capsys.readouterr().err


def test_sft_end_to_end_writes_a_model_that_train_takes_and_resumes(tmp_path, tiny_model_dir, single_thread):
    from ragen2.models import check_model_source, resolve_model_source
    from ragen2.run_dir import read_steps

    demos = tmp_path / "d.jsonl"
    assert main(["demos", "--env", "bandit", "--episodes", "6", "--reasoning", "grounded", "--out", str(demos)]) == 0
    common = ["--model", str(tiny_model_dir), "--quiet", "trainer.out=" + str(tmp_path), "trainer.run_name=sft",
              "trainer.val_groups=1", "sft.batch_episodes=4", "sft.lr=1e-3", "sft.warmup_steps=0",
              "rollout.max_new_tokens=40"]
    assert main(["sft", "--demos", str(demos), "--steps", "2", *common]) == 0
    run_dir = tmp_path / "sft"
    assert (run_dir / "model" / "config.json").is_file() and (run_dir / "summary.json").is_file()
    assert check_model_source(run_dir) == "local" and resolve_model_source(run_dir) == str(run_dir / "model")
    from ragen2.run_dir import warm_start_of

    started_from = warm_start_of(str(run_dir))  # what a run with --model RUN records as its start
    assert len(started_from["model_sha256"]) == 64 and len(started_from["demos_sha256"]) == 64
    assert warm_start_of(str(tiny_model_dir)) is None
    # --resume with more steps continues from step 2 (rows of steps 3-4 are the epoch order's next)
    assert main(["sft", "--resume", str(run_dir), "--quiet", "sft.steps=4"]) == 0
    steps = read_steps(run_dir)
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    losses = [s["sft/loss"] for s in steps]
    assert losses[-1] < losses[0]  # 1e-3 on a tiny model: the demos' tokens get likelier
    assert "val/success_rate" in steps[-1] and "val/spread_share" in steps[-1]


def test_train_notes_a_warm_start_fine_tuned_on_other_env_settings(tmp_path):
    from ragen2.commands.train import warm_start_note

    run = tmp_path / "sft"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    tuned = load_config(env="frozen_lake", overrides=["env.overrides.require_think=false"])
    (run / "config.yaml").write_text(tuned.to_yaml())
    same = load_config(env="frozen_lake", overrides=["env.overrides.require_think=false", f"model.name={run}"])
    other = load_config(env="frozen_lake", overrides=[f"model.name={run}"])
    assert warm_start_note(same) is None
    assert "require_think" in warm_start_note(other)
    assert warm_start_note(load_config()) is None  # the bundled model: no note


class _GradientCapture(torch.optim.SGD):
    """Stands in for AdamW in sft_step: records the gradient it would step with, changes nothing."""

    def step(self, closure=None):
        self.grads = [p.grad.detach().clone() for p in self.param_groups[0]["params"]]


@pytest.mark.parametrize("padding_free", [False, True])
def test_sft_trains_the_nll_through_the_actor_loss_builder(single_thread, padding_free):
    # sft_step takes its loss from the actor's one builder (learner.actor_loss) at advantage 1 and
    # ratio 1: the gradient it steps with must be the token-mean NLL's, and `sft/loss` the NLL,
    # whether its micro-batches are padded or packed after a step prefix encoded once.
    import dataclasses

    from ragen2 import shared_prefix as prefix_lib
    from ragen2.algos import losses
    from ragen2.attention import use_grouped_sdpa
    from ragen2.engines.local import learner
    from ragen2.engines.local.sft import SFT_LOSS, sft_step
    from tests.ragen2.engines.local.test_shared_prefix import FedTokens
    from tests.tiny import tiny_llama

    tokenizer = build_tiny_tokenizer()
    cfg = load_config(env="frozen_lake", overrides=["rollout.max_new_tokens=400", "rollout.max_context_tokens=8192",
                                                    "optim.micro_batch_size=2", "optim.grad_clip=1e9",
                                                    f"sft.padding_free={str(padding_free).lower()}"])
    demos = [demos_lib.render_demo(_spec("frozen_lake", "grounded"), seed, 0, "grounded") for seed in range(4)]
    rows = demo_rows(demos, tokenizer, cfg)
    policy = use_grouped_sdpa(tiny_llama(tokenizer, seed=1))
    policy.train()
    log_probs, _ = learner.policy_log_probs(policy, rows, shared_prefix=False)
    nll = losses.sft_loss(log_probs, rows.response_mask)
    nll.backward()
    expected = [p.grad.detach().clone() for p in policy.parameters()]
    policy.zero_grad(set_to_none=True)

    optimizer = _GradientCapture(policy.parameters(), lr=0.0)
    models = learner.Models(policy, tokenizer, None, None, torch.device("cpu"))
    fed = FedTokens(policy.get_decoder())
    every = torch.arange(rows.input_ids.shape[0])
    metrics = sft_step(models, optimizer, rows, every.tolist(), cfg, step=0)
    if padding_free:  # the step's common prefix once, nothing padded: the packed path ran
        skip = prefix_lib.step_prefix_length(rows, every)
        assert skip > 100 and fed.count <= int(rows.attention_mask.sum()) - (len(every) - 1) * skip
    assert metrics[SFT_LOSS] == pytest.approx(nll.item(), rel=1e-5) and nll.item() > 1.0  # a random model's NLL
    assert len(optimizer.grads) == len(expected)
    for mine, theirs in zip(optimizer.grads, expected):  # micro-batches sum in another order: rounding only
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5 * float(theirs.abs().max()))
    # one padded micro-batch, the same rows: the ratio-1 policy loss's gradient is the NLL's bit for bit
    settings = dataclasses.replace(learner.ActorLossSettings.supervised(cfg), shared_prefix=False, padding_free=False)
    built = learner.actor_loss(policy, learner.ActorBatch.demonstrations(rows, every), settings, {})
    built.terms["task"].backward()
    assert all(torch.equal(p.grad, theirs) for p, theirs in zip(policy.parameters(), expected))


def test_train_points_the_bundled_model_on_a_multi_turn_game_at_the_warm_start():
    from ragen2.commands.train import cold_start_note

    note = cold_start_note(load_config(env="frozen_lake"))
    assert "ragen2 demos --env frozen_lake" in note and "ragen2 sft" in note
    assert cold_start_note(load_config()) is None  # Bandit: the bundled model learns it as it is
    assert cold_start_note(load_config(env="sokoban", overrides=["model.name=some/model"])) is None
