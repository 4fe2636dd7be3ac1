"""The filter's signal: the reward as trained (RAGEN-2's) or the outcome (issue 52 item 2).

The batch below is the case the issue names: every episode of a group has the same outcome, and
its rewards differ only by the format penalty (-0.1 on a turn whose action was invalid). Under
the reward that is spread, and the filter trains on it; under the outcome it is none.
"""

import pytest
import torch

import snr
from ragen2.config import ConfigError, load_config
from ragen2.engines.local.trainer import group_signal
from ragen2.rollout.batch import EPISODE_SIGNALS, RolloutBatch, TrajectoryRecord
from snr import FilterConfig, FilterInputError, select_groups

# [P=3, G=4]: group 0 all succeed (1.0, or 0.9 with a format penalty), group 1 all fail (0 or
# -0.1), group 2 all succeed without a penalty: no outcome spread anywhere.
FORMAT_ONLY_REWARDS = [[1.0, 0.9, 1.0, 0.9], [0.0, -0.1, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
FORMAT_ONLY_SUCCESS = [[True] * 4, [False] * 4, [True] * 4]


def _batch(rewards, success):
    trajectories = [TrajectoryRecord(group=g, member=m, seed=g, turn_rewards=[r], format_ok=[r in (0.0, 1.0)],
                                     think_lengths=[0], response_lengths=[1], finish_reasons=["stop"],
                                     success=success[g][m])
                    for g, row in enumerate(rewards) for m, r in enumerate(row)]
    empty = torch.zeros(0)
    return RolloutBatch(*(empty,) * 13, trajectories=trajectories, reasoning_spans=[], group_size=len(rewards[0]))


def _select(batch, preset, signal):
    cfg = FilterConfig(**{**snr.load_preset(preset).to_dict(), "signal": signal})
    return select_groups(batch.reward_matrix(), cfg, signal=group_signal(batch, cfg.signal))


@pytest.mark.parametrize("preset", ["snr-top-p", "snr-top-p-std", "snr-top-k", "snr-min-p"])
def test_format_penalty_spread_is_kept_under_the_reward_and_dropped_under_the_outcome(preset):
    batch = _batch(FORMAT_ONLY_REWARDS, FORMAT_ONLY_SUCCESS)
    by_reward = _select(batch, preset, "reward")
    assert not by_reward.skip and set(by_reward.kept.tolist()) <= {0, 1} and by_reward.kept.numel() >= 1
    by_outcome = _select(batch, preset, "success")
    assert by_outcome.skip and by_outcome.kept.tolist() == []
    assert by_outcome.metrics["snr/zero_spread_groups"] == 3.0  # no group has an outcome spread
    assert by_reward.metrics["snr/zero_spread_groups"] == 1.0  # group 2 only


def test_under_the_outcome_groups_with_an_outcome_spread_are_the_ones_kept():
    # group 1's rewards differ by a penalty only; group 0 has one success in four
    rewards = [[1.0, 0.0, 0.0, 0.0], [0.0, -0.1, -0.1, 0.0], [0.9, 0.9, 0.9, 0.9]]
    success = [[True, False, False, False], [False] * 4, [True] * 4]
    batch = _batch(rewards, success)
    assert _select(batch, "snr-top-p", "success").kept.tolist() == [0]
    assert _select(batch, "snr-top-p", "reward").kept.tolist() == [0]  # 0.25 vs 0.0033: group 0 carries 0.9
    assert _select(batch, "snr-top-k", "reward").kept.tolist() == [0]
    # a ranking that reaches group 1 under the reward, never under the outcome
    assert _select(batch, "snr-min-p", "reward").kept.tolist() == [0]  # 0.0033 < 0.1 x 0.25
    keep_all = FilterConfig(strategy="top_p", value=1.0, include_zero=False)
    assert select_groups(batch.reward_matrix(), keep_all).kept.tolist() == [0, 1]
    outcome_all = FilterConfig(strategy="top_p", value=1.0, include_zero=False, signal="success")
    assert select_groups(batch.reward_matrix(), outcome_all, signal=group_signal(batch, "success")).kept.tolist() == [0]


def test_the_report_names_the_signal():
    batch = _batch(FORMAT_ONLY_REWARDS, FORMAT_ONLY_SUCCESS)
    by_outcome = _select(batch, "snr-top-p", "success").metrics
    by_reward = _select(batch, "snr-top-p", "reward").metrics
    # the ranked spread is named after the signal; the reward's stays under its own names
    for key in ("snr/success_std_mean", "snr/success_variance_max", "snr/kept_success_std_mean",
                "snr/kept_success_variance_share"):
        assert key in by_outcome and key not in by_reward
    assert by_outcome["snr/success_std_max"] == 0.0
    assert by_reward["snr/reward_std_mean"] > 0
    assert by_outcome["snr/reward_std_mean"] == pytest.approx(by_reward["snr/reward_std_mean"])
    # the keys a reward-signal row has are all still there (the stop rule and the collapse watch read them)
    assert set(by_reward) <= set(by_outcome)


def test_the_run_label_and_summary_config_name_the_signal():
    cfg = load_config(filter="snr-top-p", overrides=["filter.signal=success"])
    assert cfg.filter.signal == "success"
    assert cfg.filter_preset == "snr-top-p+signal=success"
    assert load_config(filter="snr-top-p").filter_preset == "snr-top-p"


def test_signal_values_and_config_must_agree():
    rewards = torch.tensor(FORMAT_ONLY_REWARDS)
    outcome = FilterConfig(strategy="top_p", value=0.9, signal="success")
    with pytest.raises(FilterInputError, match="config.signal is 'success': pass its value for each rollout"):
        select_groups(rewards, outcome)
    with pytest.raises(FilterInputError, match="signal values were passed but config.signal is 'reward'"):
        select_groups(rewards, FilterConfig(strategy="top_p", value=0.9), signal=torch.ones(3, 4))
    with pytest.raises(FilterInputError, match=r"has shape \(3, 2\); the rewards have \(3, 4\)"):
        select_groups(rewards, outcome, signal=torch.ones(3, 2))
    with pytest.raises(FilterInputError, match="signal 'success'.*NaN"):
        select_groups(rewards, outcome, signal=torch.full((3, 4), float("nan")))


@pytest.mark.parametrize("bad", ["Success", "kept_reward", "a-b", "", 3])
def test_signal_names_are_checked(bad):
    with pytest.raises(snr.FilterConfigError, match="signal must be reward, success or the name"):
        FilterConfig(strategy="top_p", value=0.9, signal=bad)


def test_the_local_engine_takes_its_episode_fields_and_refuses_others():
    batch = _batch(FORMAT_ONLY_REWARDS, FORMAT_ONLY_SUCCESS)
    assert group_signal(batch, "reward") is None  # the rewards themselves
    assert batch.signal_matrix("success").tolist() == [[1.0] * 4, [0.0] * 4, [1.0] * 4]
    assert batch.signal_matrix("reward").tolist() == batch.reward_matrix().tolist()
    assert set(EPISODE_SIGNALS) >= {"reward", "success"}
    with pytest.raises(ValueError, match="filter signal 'score' is no per-episode field.*valid: reward, success"):
        batch.signal_matrix("score")
    with pytest.raises(ConfigError, match="filter.signal: 'score' is no per-episode field"):
        load_config(filter="snr-top-p", overrides=["filter.signal=score"])
    assert load_config(filter="snr-top-p", overrides=["filter.signal=context_truncated"]).filter.signal == \
        "context_truncated"
