"""RAGEN2GRPOTrainer: TRL 1.16's real GRPOTrainer with the SNR filter and the collapse probe, on a
tiny Llama built in-process. Skipped when TRL is not installed (pip install -e ".[trl]")."""

import warnings

import pytest
import torch

import mi_probe
import snr
from tests.tiny import tiny_llama, tiny_tokenizer

G = 4
# One row per prompt: its G completions' rewards (group 0 has no spread).
REWARDS = [[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.2], [1.0, 0.0, 1.0, 1.0]]
PROMPTS = ["You are playing a bandit game.", "Turn 1:\nState:\n", "Reward:\n0.1\n", "The quick brown fox"]


@pytest.fixture(scope="module")
def trl():
    # Imported here, not at collection: importing TRL sets an environment variable and warning
    # filters; the module-scoped state fixture puts the variable back, this puts the filters back.
    with warnings.catch_warnings():
        return pytest.importorskip("trl")


@pytest.fixture
def make_trainer(trl, tmp_path):
    from datasets import Dataset

    from ragen2.integrations.trl import RAGEN2GRPOTrainer

    def make(reward_funcs, *, train_dataset=None, max_steps=2, weight_decay=0.0, **ragen2):
        tokenizer = tiny_tokenizer("chatml")
        model = tiny_llama(tokenizer, seed=0).train()
        data = train_dataset if train_dataset is not None else Dataset.from_dict({"prompt": PROMPTS})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # TRL sets deprecated gradient-checkpointing flags
            warnings.filterwarnings("ignore", message=".*'rollout_func'.*experimental")
            args = trl.GRPOConfig(
                output_dir=str(tmp_path), per_device_train_batch_size=len(PROMPTS) * G, num_generations=G,
                max_completion_length=6, max_steps=max_steps, learning_rate=1e-2, weight_decay=weight_decay,
                logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0)
            return RAGEN2GRPOTrainer(model=model, reward_funcs=reward_funcs, args=args, train_dataset=data,
                                     processing_class=tokenizer, **ragen2)
    return make


def scripted(completions, **kwargs):
    return [r for row in REWARDS for r in row][:len(completions)]


def constant(completions, **kwargs):
    return [0.5] * len(completions)


def generation_batch_of(prompts):
    """What TRL's RepeatSampler hands `_generate_and_score_completions`: each prompt G times in a row."""
    return [{"prompt": p} for p in prompts for _ in range(G)]


def generation_batch():
    return generation_batch_of(PROMPTS)


@pytest.mark.parametrize("config", ["snr-top-p", snr.FilterConfig(strategy="top_k", value=0.5, metric="reward_std")])
def test_kept_groups_are_snrs_and_dropped_ones_leave_the_loss(make_trainer, config):
    from ragen2.integrations.trl import SNRFilterArgs

    args = SNRFilterArgs(filter=config, loss_scaling="linear")
    trainer = make_trainer(scripted, snr_filter=args)
    out = trainer._generate_and_score_completions(generation_batch())

    rewards = torch.tensor(REWARDS)
    selection = snr.select_groups(rewards, args.filter)
    keep = selection.sample_mask(G)
    assert 0 < selection.kept.numel() < len(REWARDS)  # the case where the filter does something
    assert torch.equal(out["tool_mask"].bool().any(dim=1), keep)  # the loss mask: kept rows only
    # Kept rows keep TRL's group advantage (r - mean) / (std + 1e-4), times the kept fraction.
    trl_advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
    expected = torch.where(keep, trl_advantages * selection.kept_fraction, torch.zeros(()))
    torch.testing.assert_close(out["advantages"], expected)
    assert int(out["num_items_in_batch"]) == int(out["completion_mask"][keep].sum())
    assert not bool(out["ragen2_skip"])
    logged = trainer._metrics["train"]
    assert logged["snr/kept_fraction"][-1] == selection.kept_fraction
    assert logged["snr/groups_kept"][-1] == selection.kept.numel()


def _loss_and_grads(trainer, batch):
    trainer.current_gradient_accumulation_steps = 1  # train() sets it; compute_loss reads it
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


def test_the_filtered_loss_is_trls_loss_on_the_kept_groups_alone(make_trainer):
    trainer = make_trainer(scripted, snr_filter="snr-top-p")
    out = trainer._generate_and_score_completions(generation_batch())
    keep = snr.select_groups(torch.tensor(REWARDS), snr.load_preset("snr-top-p")).sample_mask(G)
    alone = {key: (value[keep] if isinstance(value, torch.Tensor) and value.dim() > 0 else value)
             for key, value in out.items() if key not in ("tool_mask", "ragen2_skip")}
    alone["num_items_in_batch"] = alone["completion_mask"].sum()  # as TRL counts a batch of these groups
    loss, grads = _loss_and_grads(trainer, out)
    loss_alone, grads_alone = _loss_and_grads(trainer, alone)
    torch.testing.assert_close(loss, loss_alone)
    for grad, grad_alone in zip(grads, grads_alone, strict=True):
        torch.testing.assert_close(grad, grad_alone)


def _weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_a_skipped_step_changes_no_weight_and_repeated_skips_stop(make_trainer):
    from ragen2.integrations.trl import SNRFilterArgs

    stop = snr.StopConfig(max_consecutive_skips=2)  # the stop rules are opted into, never implied
    trainer = make_trainer(constant, max_steps=4, weight_decay=0.1,
                           snr_filter=SNRFilterArgs(snr.load_preset("snr-top-p"), stop=stop), mi_probe=None)
    before = _weights(trainer.model)
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.ragen2_stop_reason == "consecutive_skips"
    for name, value in _weights(trainer.model).items():
        assert torch.equal(value, before[name]), name
    rows = [row for row in trainer.state.log_history if "snr/skipped" in row]
    assert [row["snr/skipped"] for row in rows] == [1.0, 1.0]
    assert rows[-1]["snr/total_skips"] == 2.0 and rows[-1]["snr/stopped"] == 1.0


@pytest.mark.parametrize("snr_filter", ["snr-top-p", snr.load_preset("snr-top-p")])
def test_a_preset_alone_filters_and_skips_but_never_stops_the_run(make_trainer, snr_filter):
    trainer = make_trainer(constant, max_steps=3, snr_filter=snr_filter, mi_probe=None)
    trainer.train()
    assert trainer.state.global_step == 3 and trainer.ragen2_stop_reason is None  # TRL's max_steps decided
    assert trainer.ragen2_filter.stop_policy is None
    rows = [row for row in trainer.state.log_history if "snr/skipped" in row]
    assert [row["snr/skipped"] for row in rows] == [1.0] * 3 and "snr/total_skips" not in rows[-1]


def test_a_log_row_carries_the_essential_keys_unless_every_key_is_asked_for(make_trainer):
    from ragen2.integrations.trl import MIProbeArgs
    from ragen2.integrations.trl.trainer import ESSENTIAL

    logged = {}
    for choice in ("essential", "all"):
        trainer = make_trainer(scripted, snr_filter="snr-top-p", mi_probe=MIProbeArgs(every=1), ragen2_metrics=choice)
        trainer._generate_and_score_completions(generation_batch())
        logged[choice] = {key for key in trainer._metrics["train"] if key.startswith(("snr/", "probe/", "alert/"))}
    essential = {key for key in logged["essential"] if not key.startswith("probe/dtype/")}
    assert essential <= ESSENTIAL and {"snr/kept_fraction", "probe/mi_estimate", "probe/mi_zscore_ema"} <= essential
    assert logged["essential"] < logged["all"] and len(logged["all"]) > 3 * len(logged["essential"])
    with pytest.raises(ValueError, match="ragen2_metrics must be one of"):
        make_trainer(scripted, ragen2_metrics="some")


def test_without_the_filter_the_same_step_moves_the_weights(make_trainer):
    # The control: the optimizer really steps here (weight decay moves the weights even with zero
    # advantages), so the test above sees the skip, not an optimizer that does nothing anyway.
    trainer = make_trainer(constant, max_steps=1, weight_decay=0.1)
    before = _weights(trainer.model)
    trainer.train()
    assert any(not torch.equal(value, before[name]) for name, value in _weights(trainer.model).items())


@pytest.mark.parametrize("dtype", ["float32", "policy"])
def test_the_logged_probe_is_mi_probe_on_the_same_tensors(make_trainer, dtype):
    """In fp32 the logged probe equals a naive fp32 scoring to 1e-5; by default it scores in TRL's
    own mixed precision (GRPOConfig's bf16, on by default, here on CPU), within bf16's rounding of
    it, and each row names the dtype."""
    from ragen2.integrations.trl import MIProbeArgs

    trainer = make_trainer(scripted, mi_probe=MIProbeArgs(every=1, ks=(1,), dtype=dtype), ragen2_metrics="all")
    assert trainer.accelerator.mixed_precision == "bf16"
    out = trainer._generate_and_score_completions(generation_batch())
    columns, completions, owners = {}, [], []
    for row in range(out["prompt_ids"].shape[0]):
        prompt = tuple(out["prompt_ids"][row][out["prompt_mask"][row].bool()].tolist())
        owners.append(columns.setdefault(prompt, len(columns)))
        completions.append(out["completion_ids"][row][out["completion_mask"][row].bool()].tolist())
    scores = mi_probe.cross_score_naive(trainer.model, [list(p) for p in columns], completions, owners)
    expected = mi_probe.mi_metrics_both(scores.L, scores.L_sum, scores.owner, column_ids=scores.column_ids, ks=(1,))
    expected.update(mi_probe.ZScoreEMA(0.9).update(expected))
    logged = trainer._metrics["train"]
    assert logged[f"probe/dtype/{'float32' if dtype == 'float32' else 'bfloat16'}"] == [1.0]
    if dtype == "float32":
        for key in ("mi_estimate", "mi_zscore", "mi_zscore_ema", "retrieval_accuracy@1", "retrieval_chance_level@1",
                    "retrieval_above_chance@1", "mi_estimate_seq"):
            assert logged[f"probe/{key}"][-1] == pytest.approx(expected[key], abs=1e-5), key
    else:
        assert logged["probe/mi_estimate"][-1] != expected["mi_estimate"]  # scored in bf16, not fp32
        assert logged["probe/mi_estimate"][-1] == pytest.approx(expected["mi_estimate"], abs=0.05)
    assert expected["retrieval_chance_level@1"] == 1 / len(PROMPTS)


def test_a_collapse_alert_stops_training_when_asked(make_trainer):
    from ragen2.integrations.trl import MIProbeArgs

    trainer = make_trainer(scripted, mi_probe=MIProbeArgs(every=1, stop_on_collapse=True))
    alert = mi_probe.Alert("template_collapse", 0, "template collapse: test")
    trainer.ragen2_probe.detector.update = lambda step, **series: [alert]
    trainer._generate_and_score_completions(generation_batch())
    assert trainer.control.should_training_stop and trainer.ragen2_stop_reason == "template_collapse"
    assert trainer._metrics["train"]["alert/template_collapse"] == [1.0]


def test_two_real_steps_on_bandit_with_filter_and_probe(make_trainer):
    from ragen2.integrations.trl import EnvReward, MIProbeArgs

    tokenizer = tiny_tokenizer("chatml")
    reward = EnvReward("bandit", tokenizer, require_think=False)
    trainer = make_trainer([reward], train_dataset=reward.dataset(range(4)), max_steps=2,
                           snr_filter="snr-top-p", mi_probe=MIProbeArgs(every=1))
    trainer.train()
    assert trainer.state.global_step == 2
    rows = [row for row in trainer.state.log_history if "loss" in row]
    for key in ("rewards/ragen2_bandit/mean", "ragen2_bandit/format_ok", "snr/kept_fraction", "snr/skipped",
                "probe/mi_estimate", "probe/mi_zscore_ema", "probe/retrieval_accuracy@1",
                "probe/retrieval_chance_level@1"):
        assert all(key in row for row in rows), key


def test_multi_turn_episodes_train_through_rollout_func(make_trainer):
    from ragen2.integrations.trl import MIProbeArgs
    from ragen2.integrations.trl.env_rollout import EnvRollout

    tokenizer = tiny_tokenizer("chatml")
    episodes = EnvRollout("frozenlake", tokenizer, max_turns=2, max_new_tokens=6, max_context_tokens=2048)
    trainer = make_trainer([episodes.reward], train_dataset=episodes.dataset(range(4)), max_steps=1,
                           rollout_func=episodes, snr_filter="snr-top-p", mi_probe=MIProbeArgs(every=1))
    group_filter, trainer.ragen2_filter = trainer.ragen2_filter, None  # TRL's own masks, unfiltered
    out = trainer._generate_and_score_completions(generation_batch_of(episodes.dataset(range(4))["prompt"]))
    trainer.ragen2_filter = group_filter
    # TRL's loss mask is completion_mask x tool_mask (from env_mask; TRL pads it with 1): every row has
    # sampled tokens in it, and the env's turns in between lie inside the completion but outside it.
    completion_mask = out["completion_mask"].bool()
    loss_mask = completion_mask & out["tool_mask"].bool()
    assert loss_mask.any(dim=1).all()
    assert (completion_mask & ~loss_mask).any(dim=1).all()  # 2 turns: the "Reward:" and next state
    trainer.train()
    row = next(row for row in trainer.state.log_history if "loss" in row)
    for key in ("rewards/ragen2_frozen_lake/mean", "ragen2_frozen_lake/format_ok", "snr/kept_fraction",
                "probe/mi_estimate"):
        assert key in row, key


def test_the_example_runs_end_to_end(trl, tiny_model_dir, tmp_path, capsys):
    from ragen2.integrations.trl.example import main

    rows = main(["--model", str(tiny_model_dir), "--steps", "1", "--groups", "2", "--group-size", "2",
                 "--max-tokens", "4", "--output-dir", str(tmp_path)])
    assert len(rows) == 1 and "snr/kept_fraction" in rows[0] and "probe/mi_estimate" in rows[0]
    assert "reward=" in capsys.readouterr().out
