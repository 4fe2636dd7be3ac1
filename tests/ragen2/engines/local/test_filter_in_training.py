"""The SNR filter inside a real training run: `--filter starpo-s` trains on exactly the top 25% of groups.

A random tiny model almost never writes a valid answer, so on a real env every reward would be
the format penalty and every group would have zero spread. The test registers a throwaway env
whose reward ignores the text and comes from the env's dynamics generator (seeded by the
instance seed and the rollout index): every group has spread, and the rewards of a step can be
recomputed here without the model. The config validates env names against the registry of this
process, so training runs in-process through `ragen2.cli.main`.
"""

from __future__ import annotations

import statistics

import pytest

from envs.base import ActionOutcome
from ragen2 import seeding
from ragen2.config import load_config
from ragen2.engines.local import learner, trainer
from tests.one_pull import OnePullEnv, record_steps, registered, reward_of, train

ENV_NAME = "filter_probe_coin"
NUM_GROUPS, GROUP_SIZE, STEPS = 8, 3, 3
SETTINGS = [f"env.name={ENV_NAME}", f"rollout.num_groups={NUM_GROUPS}", f"rollout.group_size={GROUP_SIZE}",
            "rollout.max_new_tokens=6", "trainer.val_groups=2", "optim.micro_batch_size=4",
            "optim.mini_batch_size=8", "probe.every=0", "stop.max_consecutive_skips=0"]


class CoinProbeEnv(OnePullEnv):
    """One pull; the reward is a uniform draw from the dynamics generator, whatever the text says."""

    def _apply_action(self, action: str) -> ActionOutcome:
        reward = float(self.dynamics_rng.uniform(0.0, 1.0))
        return ActionOutcome(reward=reward, terminated=True, success=reward > 0.5)


@pytest.fixture(scope="module")
def coin_env():
    with registered((ENV_NAME, CoinProbeEnv)):
        yield ENV_NAME


def expected_rewards(step: int) -> list[list[float]]:
    """[P][G] rewards of a step, from the env alone (instance seeds as the trainer draws them)."""
    cfg = load_config(filter="none", overrides=SETTINGS)
    return [[reward_of(ENV_NAME, seed, member) for member in range(GROUP_SIZE)]
            for seed in seeding.step_seeds(cfg, step)]


def top_groups_by_std(rewards: list[list[float]], keep: int) -> list[int]:
    stds = [statistics.stdev(row) for row in rewards]
    return sorted(sorted(range(len(rewards)), key=lambda g: -stds[g])[:keep])


@pytest.fixture
def spies(monkeypatch):
    """Record each step's full rollout, the batch handed to the update, and the rows PPO trained on."""
    seen = {**record_steps(monkeypatch), "ppo_rows": []}
    real_ppo = learner.ppo_update

    def ppo_update(models, optimizers, data, cfg, generator, options=None):
        seen["ppo_rows"].append(int(data.input_ids.shape[0]))
        return real_ppo(models, optimizers, data, cfg, generator, options)

    monkeypatch.setattr(learner, "ppo_update", ppo_update)
    return seen


def _train(model_dir, out, filter_name: str, *extra: str) -> list[dict]:
    return train(model_dir, out, "--filter", filter_name, "--steps", str(STEPS), *SETTINGS, *extra)


def test_starpo_s_trains_on_exactly_the_top_quarter_of_groups(coin_env, tiny_model_dir, tmp_path, spies):
    rows = _train(tiny_model_dir, tmp_path, "starpo-s", "optim.batch_adjust=none")
    keep = max(1, int(0.25 * NUM_GROUPS))  # StarPO-S: k = max(1, int(0.25 * P)) = 2
    assert [r["step"] for r in rows] == list(range(STEPS))
    for step, row in enumerate(rows):
        assert row["snr/groups_total"] == NUM_GROUPS
        assert row["snr/groups_kept"] == keep
        assert row["snr/kept_fraction"] == 0.25
        assert row["snr/skipped"] == 0.0
        assert row["rollout/num_rows"] == NUM_GROUPS * GROUP_SIZE  # the rollout itself is not filtered

        # The rollout's rewards are the env's, so the expected choice follows from the env alone.
        rewards = expected_rewards(step)
        full = spies["rollouts"][step]
        got = [[0.0] * GROUP_SIZE for _ in range(NUM_GROUPS)]
        for t in full.trajectories:
            got[t.group][t.member] = t.reward
        assert got == rewards
        want = top_groups_by_std(rewards, keep)

        updated = spies["updated"][step]
        assert sorted({t.group for t in updated.trajectories}) == want
        assert sorted(set(updated.group_ids.tolist())) == want
        assert len(updated) == keep * GROUP_SIZE
        assert spies["ppo_rows"][step] == keep * GROUP_SIZE  # PPO saw only the kept rows
        # Kept groups are whole: each kept group brings all G members, nothing else comes along.
        assert sorted((t.group, t.member) for t in updated.trajectories) == [
            (g, m) for g in want for m in range(GROUP_SIZE)]


def test_ragen2_batch_adjust_pads_the_kept_rows_with_copies_of_kept_rows(coin_env, tiny_model_dir, tmp_path, spies):
    """The default (RAGEN-2's copy mode): 2 kept groups x 3 = 6 rows, padded to lcm(8 groups,
    mini-batch 8) = 8 with 2 copies of kept rows; delete mode drops all 6 (6 < 8), so no update."""
    rows = _train(tiny_model_dir, tmp_path, "starpo-s")
    for step, row in enumerate(rows):
        want = top_groups_by_std(expected_rewards(step), 2)
        updated = spies["updated"][step]
        assert row["batch/update_rows"] == 8.0 and spies["ppo_rows"][step] == 8
        assert sorted(set(updated.group_ids.tolist())) == want
        pairs = list(zip(updated.group_ids.tolist(), updated.traj_index.tolist()))
        assert len(set(pairs)) == 6 and len(pairs) == 8  # every kept row once, plus 2 repeats
        assert pairs[:6] == sorted(set(pairs), key=pairs.index)  # the kept rows first, in order
    deleted = _train(tiny_model_dir, tmp_path / "delete", "starpo-s", "optim.batch_adjust=delete")
    assert [r["batch/update_rows"] for r in deleted] == [0.0] * STEPS
    assert len(spies["ppo_rows"]) == STEPS  # the delete run made no update


def test_no_filter_trains_on_every_row(coin_env, tiny_model_dir, tmp_path, spies):
    rows = _train(tiny_model_dir, tmp_path, "none")
    assert all(r["snr/groups_kept"] == NUM_GROUPS and r["snr/kept_fraction"] == 1.0 for r in rows)
    assert spies["ppo_rows"] == [NUM_GROUPS * GROUP_SIZE] * STEPS


def test_one_step_updates_skip_the_old_log_prob_pass_and_train_identically(coin_env, tiny_model_dir, tmp_path,
                                                                           monkeypatch):
    """With one optimiser step over the batch the old log-probs are the update's own first forward:
    skipping the separate pass must leave training unchanged (same losses, norms, next rollouts)."""
    whole_batch = [f"optim.mini_batch_size={NUM_GROUPS * GROUP_SIZE}"]

    def train(out, *extra):
        return _train(tiny_model_dir, out, "none", *extra)

    skipped = train(tmp_path / "skip", *whole_batch)
    assert all("time/old_log_probs_s" not in row for row in skipped)
    with monkeypatch.context() as patch:
        patch.setattr(trainer, "needs_old_log_probs", lambda run, rows: True)
        computed = train(tmp_path / "computed", *whole_batch)
    assert all(row["time/old_log_probs_s"] > 0 for row in computed)
    for a, b in zip(skipped, computed, strict=True):
        assert a["rollout/reward_mean"] == b["rollout/reward_mean"]
        assert a["rollout/response_tokens_mean"] == b["rollout/response_tokens_mean"]
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    # Two mini-batches: the second sees weights the first changed, so the pass is needed again.
    split = train(tmp_path / "split")  # SETTINGS: mini_batch_size 8 < 24 rows
    assert all(row["time/old_log_probs_s"] > 0 for row in split)


def test_critic_warmup_freezes_the_policy_for_its_first_steps(coin_env, tiny_model_dir, tmp_path):
    rows = _train(tiny_model_dir, tmp_path, "none", "--algo", "ppo", "optim.critic_warmup_steps=2")
    assert [row["actor/frozen_for_critic_warmup"] for row in rows] == [1.0, 1.0, 0.0]
    assert ["actor/pg_loss" in row for row in rows] == [False, False, True]
    assert all(row["critic/value_loss"] >= 0 for row in rows)
    # Frozen policy: the first two steps sample from the same weights, so their rollouts are
    # drawn from one distribution; the old-log-prob pass is skipped while the actor is frozen.
    assert all("time/old_log_probs_s" not in row for row in rows[:2])
