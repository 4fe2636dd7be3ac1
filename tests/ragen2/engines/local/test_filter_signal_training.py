"""filter.signal in a real training run: spread from format penalties alone trains under the
reward and is skipped under the outcome (issue 52 item 2).

The throwaway env succeeds on every episode; its parser marks a random half of the replies as
carrying an invalid action (from the env's dynamics generator, so the text does not matter),
which costs the env's format penalty. Rewards are 1.0 or 0.9, success is always 1.
"""

from __future__ import annotations

import json

import pytest

from envs.base import ActionOutcome
from envs.parsing import ParsedResponse
from tests.one_pull import OnePullEnv, registered, train

ENV_NAME = "filter_signal_penalty"
NUM_GROUPS, GROUP_SIZE, STEPS = 4, 3, 2
SETTINGS = [f"env.name={ENV_NAME}", f"rollout.num_groups={NUM_GROUPS}", f"rollout.group_size={GROUP_SIZE}",
            "rollout.max_new_tokens=4", "trainer.val_groups=2", "optim.micro_batch_size=4",
            "optim.mini_batch_size=4", "probe.every=0", "stop.max_consecutive_skips=0"]


class PenaltyOnlyEnv(OnePullEnv):
    """One pull that always succeeds; a random half of the replies pay the format penalty."""

    def parse(self, response: str) -> ParsedResponse:
        invalid = int(self.dynamics_rng.uniform() < 0.5)
        return ParsedResponse(format_ok=True, answer="pull", actions=("pull",), num_invalid=invalid)

    def _apply_action(self, action: str) -> ActionOutcome:
        return ActionOutcome(reward=1.0, terminated=True, success=True)


@pytest.fixture(scope="module")
def penalty_env():
    with registered((ENV_NAME, PenaltyOnlyEnv)):
        yield ENV_NAME


def _train(model_dir, out, *extra: str) -> list[dict]:
    return train(model_dir, out, "--filter", "snr-top-p", "--steps", str(STEPS), *SETTINGS, *extra)


def test_format_penalty_spread_trains_under_the_reward_and_skips_under_the_outcome(penalty_env, tiny_model_dir,
                                                                                   tmp_path):
    by_reward = _train(tiny_model_dir, tmp_path / "reward")
    assert all(row["rollout/success_rate"] == 1.0 for row in by_reward)  # the outcome never varies
    assert any(row["snr/reward_std_mean"] > 0 for row in by_reward)  # the penalties do
    assert [row["snr/skipped"] for row in by_reward] == [0.0 if row["snr/reward_std_max"] > 0 else 1.0
                                                         for row in by_reward]
    assert sum(row["update/optimizer_steps"] for row in by_reward) > 0

    by_outcome = _train(tiny_model_dir, tmp_path / "success", "filter.signal=success")
    assert [row["snr/skipped"] for row in by_outcome] == [1.0] * STEPS
    assert [row["update/optimizer_steps"] for row in by_outcome] == [0.0] * STEPS
    assert all(row["snr/success_std_max"] == 0.0 and row["snr/zero_spread_groups"] == NUM_GROUPS
               for row in by_outcome)
    summary = json.loads((tmp_path / "success" / "r" / "summary.json").read_text())
    assert summary["config"]["signal"] == "success" and summary["steps_skipped"] == STEPS
