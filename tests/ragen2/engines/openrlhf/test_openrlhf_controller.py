"""The controller subclass's schedule and bookkeeping, on the real class (OpenRLHF's parent
methods replaced by recorders): evaluation after a skipped last step, rollout metrics over all
rollouts, the prompt loader in dataset order, checkpoints on rollout steps and no "best" ones."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.ragen2.engines.openrlhf import openrlhf_stubs

modules = openrlhf_stubs.load()
Experience = modules["openrlhf.trainer.ppo_utils.experience"].Experience
trainer_patch = modules["ragen2.engines.openrlhf.trainer_patch"]

from ragen2.config import load_config  # noqa: E402
from ragen2.engines.openrlhf.flags import Cluster, trainer_settings  # noqa: E402
from ragen2.engines.openrlhf.selection import rollout_metrics  # noqa: E402
from tests.tiny import tiny_tokenizer  # noqa: E402

G = 4
FLAT = [[0.5] * G] * 4  # no spread anywhere: snr-top-p skips the step
# Group 1 alone has spread; the step's mean is 0.175 over all 16 rollouts, 0.25 over the kept group
SPREAD = [[0.1] * G, [0.0, 0.5, 0.0, 0.5], [0.1] * G, [0.25] * G]


def experience(reward: float, label: str, success: float, turns: float, format_ok: float) -> Experience:
    return Experience(sequences=torch.ones(1, 6, dtype=torch.long), attention_mask=torch.ones(1, 6, dtype=torch.long),
                      action_mask=torch.ones(1, 5, dtype=torch.bool), rewards=torch.tensor([reward]),
                      scores=torch.tensor([success]), response_length=torch.tensor([5]),
                      truncated=torch.tensor([False]), total_length=torch.tensor([6]), prompts=[label], labels=[label],
                      info={"env/num_turns": torch.tensor([turns]), "env/format_ok_fraction": torch.tensor([format_ok]),
                            "env/context_truncated": torch.tensor([0.0])})


def samples(rewards) -> list:
    return [experience(r, f"group-{g}", float(r > 0.3), 1.0 + j % 2, 1.0 if j % 2 == 0 else 0.5)
            for g, row in enumerate(rewards) for j, r in enumerate(row)]


@pytest.fixture
def controller(monkeypatch):
    calls = {"train": [], "logs": [], "eval": [], "save_steps": []}
    base = trainer_patch._Base
    monkeypatch.setattr(base, "train_step", lambda self, kept, step: (calls["train"].append(len(kept)) or (
        {"rollout/reward_mean": sum(float(s.rewards[0]) for s in kept) / len(kept), "policy_loss": 0.1}, step + 1)))

    def save_logs(self, step, logs=None, states=None):
        calls["logs"].append(step)
        calls["save_steps"].append(self.args.ckpt.save_steps)

    monkeypatch.setattr(base, "save_logs_and_checkpoints", save_logs)
    monkeypatch.setattr(base, "evaluate", lambda self, step, **kw: calls["eval"].append(self.ragen.step) or {"e": 1.0})
    monkeypatch.setattr(base, "save_best_checkpoint", lambda *a, **k: calls.setdefault("best", []).append(a))
    cfg = load_config(filter="snr-top-p", overrides=["rollout.group_size=4", "rollout.num_groups=4", "probe.every=0",
                                                     "optim.micro_batch_size=1", "optim.mini_batch_size=4",
                                                     "trainer.total_steps=3", "trainer.val_every=2",
                                                     "trainer.save_every=2", "stop.max_consecutive_skips=5"])
    instance = trainer_patch.RagenPPOTrainer.__new__(trainer_patch.RagenPPOTrainer)
    instance.args = SimpleNamespace(rollout=SimpleNamespace(micro_batch_size=1), ckpt=SimpleNamespace(save_steps=2),
                                    ds=SimpleNamespace(ring_attn_size=1, tensor_parallel_size=1))
    instance._ragen_setup(trainer_settings(cfg, Cluster(gpus_per_node=1)), tiny_tokenizer("chatml"))
    instance.calls = calls
    return instance


def fit(controller, steps) -> None:
    """OpenRLHF 0.11.2's PPOTrainer.fit, reduced to the calls it makes per step (eval.steps = 1)."""
    global_step = 0
    for rewards in steps:
        status, global_step = controller.train_step(samples(rewards), global_step)
        controller.save_logs_and_checkpoints(global_step, status, {})
        if global_step % 1 == 0:
            controller.save_best_checkpoint(controller.evaluate(global_step), global_step, {})


def test_a_skipped_last_step_still_gets_the_final_evaluation(controller):
    fit(controller, [SPREAD, SPREAD, FLAT])  # step 3 of 3 is skipped: OpenRLHF's global step stays at 2
    assert controller.calls["train"] == [4, 4] and controller.ragen.ledger.total == 1
    assert controller.calls["eval"] == [2, 3]  # val_every=2, and after the last step although it was skipped
    assert "best" not in controller.calls  # save_best_checkpoint is ours: no DeepSpeed "best" checkpoint


def test_a_stop_evaluates_once_more_as_the_local_engine_does(controller):
    import dataclasses

    import snr

    policy = controller.ragen.stop_policy
    controller.ragen.stop_policy = snr.StopPolicy(dataclasses.replace(policy.config, max_consecutive_skips=1))
    fit(controller, [FLAT])
    assert controller.ragen.stop_reason == "consecutive_skips" and controller.calls["eval"] == [1]


def test_checkpoints_follow_rollout_steps_skipped_ones_included(controller):
    fit(controller, [FLAT, SPREAD, SPREAD])
    # logged (trained) steps are rollout steps 2 and 3; save_every=2 is due at rollout step 2 only
    assert controller.calls["logs"] == [1, 2] and controller.calls["save_steps"] == [1, float("inf")]


def test_rollout_metrics_are_over_all_rollouts_in_the_local_definitions(controller):
    status, _ = controller.train_step(samples(SPREAD), 0)
    assert controller.calls["train"] == [4]  # only group 1 is trained on
    flat = torch.tensor(SPREAD, dtype=torch.float64).reshape(-1)
    assert status["rollout/reward_mean"] == pytest.approx(0.175) and status["trained/reward_mean"] == 0.25
    assert status["rollout/reward_std"] == pytest.approx(float(flat.std(unbiased=False)))
    assert status["rollout/in_group_reward_std_mean"] == pytest.approx((0.5 / 3 ** 0.5) / 4)  # ddof 1, group 1 only
    assert status["rollout/in_group_reward_variance_mean"] == pytest.approx((1 / 12) / 4)
    assert status["rollout/success_rate"] == pytest.approx(2 / 16)  # the two 0.5 rewards are successes
    # turns alternate 1, 2 with format 1.0, 0.5: per turn (1 + 2 * 0.5) / 3 = 2/3, not the episode mean 0.75
    assert status["rollout/turns_mean"] == 1.5 and status["rollout/format_ok_fraction"] == pytest.approx(2 / 3)
    assert status["rollout/num_trajectories"] == 16.0 and status["rollout/num_groups"] == 4.0
    assert rollout_metrics(samples(SPREAD), G)["rollout/truncated_rate"] == 0.0


def test_the_prompt_loader_reads_rows_in_dataset_order():
    """OpenRLHF's prepare_datasets builds a shuffling loader; ours replaces it with its own setup_dataloader."""
    DeepspeedStrategy = __import__("openrlhf.utils.deepspeed", fromlist=["DeepspeedStrategy"]).DeepspeedStrategy
    rows = list(range(40))
    collate = lambda batch: batch  # noqa: E731
    strategy = SimpleNamespace(seed=0)
    strategy.setup_dataloader = DeepspeedStrategy.setup_dataloader.__get__(strategy)  # the real method
    shuffled = strategy.setup_dataloader(rows, 1, True, True, collate)  # as prepare_datasets calls it
    torch.manual_seed(0)
    assert [b[0] for b in shuffled] != rows
    instance = trainer_patch.RagenPPOTrainer.__new__(trainer_patch.RagenPPOTrainer)
    instance.strategy, instance.prompts_dataloader = strategy, shuffled
    instance.args = SimpleNamespace(data=SimpleNamespace(dataloader_num_workers=0))
    instance.samples_generator = SimpleNamespace(prompts_dataloader=shuffled)
    instance._ragen_keep_dataset_order()
    assert instance.samples_generator.prompts_dataloader is instance.prompts_dataloader
    assert [b[0] for b in instance.prompts_dataloader] == rows


def test_the_probes_dtype_reaches_our_rows_but_not_openrlhfs_numeric_logs(controller, monkeypatch, tmp_path):
    """A probe row records its dtype (a string) in metrics.jsonl, trained step or skipped; the status
    handed to OpenRLHF's loggers stays numeric (its TensorBoard logging takes numbers only)."""
    from ragen2.engines.openrlhf.run_files import RunFiles
    from ragen2.run_dir import read_metrics

    monkeypatch.setattr(trainer_patch, "probe_metrics",
                        lambda *a, **k: {"probe/mi_estimate": 0.1, "probe/dtype": "bfloat16"})
    state = controller.ragen
    state.probe.cfg = state.probe.cfg.model_copy(update={"every": 1})
    state.files = RunFiles(tmp_path)
    statuses = []
    real_save = controller.save_logs_and_checkpoints
    monkeypatch.setattr(controller, "save_logs_and_checkpoints",
                        lambda step, status, states: statuses.append(status) or real_save(step, status, states))
    fit(controller, [SPREAD, FLAT])  # one trained step, one skipped
    rows = [row for row in read_metrics(tmp_path) if "snr/skipped" in row]  # the steps, not the evaluation
    assert [row["probe/dtype"] for row in rows] == ["bfloat16", "bfloat16"]
    assert [row["probe/mi_estimate"] for row in rows] == [0.1, 0.1]
    assert statuses and all(isinstance(v, (int, float)) for status in statuses for v in status.values())
