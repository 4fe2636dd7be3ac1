"""The collapse watch's reward spread is the one the filter ranks by, with the filter's ddof."""

import pytest
import torch

import snr
from ragen2.instruments.probe import series_values
from ragen2.rollout.batch import RolloutBatch, TrajectoryRecord


def _batch(rewards):
    trajectories = [TrajectoryRecord(group=g, member=m, seed=g, turn_rewards=[r], format_ok=[True],
                                     think_lengths=[0], response_lengths=[1], finish_reasons=["stop"])
                    for g, row in enumerate(rewards) for m, r in enumerate(row)]
    empty = torch.zeros(0)
    return RolloutBatch(*(empty,) * 13, trajectories=trajectories, reasoning_spans=[], group_size=len(rewards[0]))


@pytest.mark.parametrize("ddof", [0, 1])
def test_the_watch_sees_the_filters_spread(ddof):
    batch = _batch([[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    cfg = snr.FilterConfig(strategy="top_p", value=0.9, ddof=ddof)
    selection = snr.select_groups(batch.reward_matrix(), cfg)
    logged = {**batch.metrics(), **selection.metrics}  # what a training step logs
    filter_spread = float(snr.group_spread(batch.reward_matrix(), ddof)[1].mean())
    assert series_values(logged)["reward_std"] == pytest.approx(filter_spread)
    # and the batch's own spread, asked for with the filter's ddof, is that same number
    assert batch.metrics(ddof=ddof)["rollout/in_group_reward_std_mean"] == pytest.approx(filter_spread)
    if ddof == 0:  # 0.25 vs 1/3 for group 0: the two ddofs give different spreads
        assert filter_spread != pytest.approx(batch.metrics(ddof=1)["rollout/in_group_reward_std_mean"])


def test_rows_without_the_filters_metrics_fall_back_to_the_rollout_spread():
    assert series_values({"rollout/in_group_reward_std_mean": 0.4})["reward_std"] == 0.4
