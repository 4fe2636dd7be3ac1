"""DAPO's dynamic sampling in real training runs (`--filter dapo-dynamic`): the batch is refilled to
num_groups groups with spread from extra rounds of their own seeds, the budget of every round is
logged and adds up, and a run whose groups never show spread stops sampling at the round limit
with an event instead of hanging.

The envs ignore the text (a random tiny model writes no valid answer): an instance is "live" or
"dead" by its seed, a live one pays a uniform draw per rollout (success above 0.5), a dead one 0.
So which groups have spread in the outcome follows from the env alone, and this file replays it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from envs.base import ActionOutcome
from ragen2 import seeding
from ragen2.bench.report import cell_result
from ragen2.config import load_config
from ragen2.engines.local import dynamic_sampling
from tests.one_pull import OnePullEnv, record_steps, registered, reward_of, train

LIVE, DEAD = "refill_probe_live", "refill_probe_dead"
P, G = 4, 3
SETTINGS = [f"rollout.num_groups={P}", f"rollout.group_size={G}", "rollout.max_new_tokens=4", "trainer.val_groups=1",
            "optim.micro_batch_size=6", "optim.mini_batch_size=12", "optim.batch_adjust=none", "probe.every=0",
            "stop.max_consecutive_skips=0"]


class LiveCoinEnv(OnePullEnv):
    """One pull. Two instances in five are live (a uniform reward per rollout); the rest pay 0."""

    live_share = 0.4

    def _reset(self, rng: np.random.Generator) -> dict:
        self.live = bool(rng.uniform() < self.live_share)
        return {}

    def _apply_action(self, action: str) -> ActionOutcome:
        reward = float(self.dynamics_rng.uniform()) if self.live else 0.0
        return ActionOutcome(reward=reward, terminated=True, success=reward > 0.5)


class DeadCoinEnv(LiveCoinEnv):
    live_share = 0.0  # no group ever has spread


@pytest.fixture(scope="module")
def coin_envs():
    with registered((LIVE, LiveCoinEnv), (DEAD, DeadCoinEnv)):
        yield


@pytest.fixture
def spies(monkeypatch):
    """Every training rollout (each round's) and the batch each update trained on, per call."""
    return record_steps(monkeypatch)


def expected_refill(cfg, step: int, max_rounds: int) -> tuple[list[list[int]], list[int]]:
    """Each round's seeds, and the seeds of the groups with spread in the outcome the batch takes."""
    rounds, taken = [], []
    while len(rounds) < max_rounds and len(taken) < P:
        seeds = seeding.step_seeds(cfg, step) if not rounds else seeding.refill_seeds(cfg, step, len(rounds))
        rounds.append(seeds)
        spread = [s for s in seeds if len({reward_of(LIVE, s, m) > 0.5 for m in range(G)}) == 2]
        taken += spread[:P - len(taken)]
    return rounds, taken


def _train(model_dir, out, *extra: str) -> list[dict]:
    return train(model_dir, out, "--filter", "dapo-dynamic", *SETTINGS, *extra)


def test_the_batch_is_refilled_to_num_groups_from_rounds_of_their_own_seeds(coin_envs, tiny_model_dir, tmp_path,
                                                                             spies):
    steps, max_rounds = 2, 10
    rows = _train(tiny_model_dir, tmp_path, f"env.name={LIVE}", f"trainer.total_steps={steps}",
                  f"filter.max_rounds={max_rounds}")
    cfg = load_config(filter="dapo-dynamic", overrides=[f"env.name={LIVE}", *SETTINGS])
    sampled = iter(spies["rollouts"])
    for step, row in enumerate(rows):
        rounds, taken = expected_refill(cfg, step, max_rounds)
        assert len(taken) == P and len(rounds) > 1  # the setting needs a refill and fills up
        batches = [next(sampled) for _ in rounds]
        # round 0 is the step's own instances (paired with every other arm), then the refill stream
        assert [sorted({t.seed for t in b.trajectories}) for b in batches] == [sorted(s) for s in rounds]
        assert row["sampling/rounds"] == len(rounds)
        assert row["sampling/episodes"] == len(rounds) * P * G == sum(len(b.trajectories) for b in batches)
        assert row["sampling/tokens"] == sum(sum(t.response_lengths) for b in batches for t in b.trajectories)
        assert row["sampling/round_limit"] == 0.0 and row["sampling/groups_found"] == P
        assert row["rollout/num_trajectories"] == P * G  # rollout/* describe round 0 only
        assert row["snr/groups_total"] == P and row["snr/groups_kept"] == P and row["snr/skipped"] == 0.0
        updated = spies["updated"][step]
        assert len(updated) == P * G and sorted(set(updated.group_ids.tolist())) == list(range(P))
        groups = {}
        for t in updated.trajectories:
            groups.setdefault(t.group, []).append(t)
        assert [members[0].seed for _, members in sorted(groups.items())] == taken  # first found, in order
        assert all(len({t.success for t in members}) == 2 for members in groups.values())  # all with spread
    assert next(sampled, None) is None  # no rollout beyond the expected rounds
    # the bench reads the budget of every round: env_episodes and sampled tokens add up
    result = cell_result({"name": "r", "run_dir": str(tmp_path / "r")})
    assert result["env_episodes"] == sum(len(b.trajectories) for b in spies["rollouts"])
    assert result["response_tokens"] == sum(sum(t.response_lengths) for b in spies["rollouts"] for t in b.trajectories)


def test_groups_that_never_show_spread_stop_sampling_at_the_round_limit_with_an_event(coin_envs, tiny_model_dir,
                                                                                      tmp_path, spies):
    rows = _train(tiny_model_dir, tmp_path, f"env.name={DEAD}", "trainer.total_steps=2", "filter.max_rounds=3")
    assert len(spies["rollouts"]) == 2 * 3 and spies["updated"] == []  # three rounds a step, no update
    for row in rows:
        assert row["sampling/rounds"] == 3 and row["sampling/round_limit"] == 1.0
        assert row["sampling/episodes"] == 3 * P * G and row["sampling/groups_found"] == 0
        assert row["snr/skipped"] == 1.0
    events = [json.loads(line) for line in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    limits = [e for e in events if e["kind"] == dynamic_sampling.LIMIT_EVENT]
    assert [(e["step"], e["rounds"], e["found"], e["wanted"]) for e in limits] == [(0, 3, 0, P), (1, 3, 0, P)]
    assert "found 0 of 4 groups with spread in success after 3 rounds (filter.max_rounds=3)" in limits[0]["message"]


def test_without_dynamic_sampling_one_round_is_logged_as_the_budget(coin_envs, tiny_model_dir, tmp_path, spies):
    row, = train(tiny_model_dir, tmp_path, "--filter", "snr-top-p", f"env.name={LIVE}", "trainer.total_steps=1",
                 *SETTINGS)
    assert row["sampling/rounds"] == 1 and row["sampling/episodes"] == P * G and row["sampling/round_limit"] == 0
    assert "sampling/groups_found" not in row and len(spies["rollouts"]) == 1
