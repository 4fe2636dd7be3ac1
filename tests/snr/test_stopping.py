"""snr/: the skip/stop policy (consecutive skips, spread collapse, low validation success) and its state."""

import json

import pytest

from snr import StopConfig, StopPolicy, select_groups
from tests.snr.test_snr import REWARDS, recommended


def test_consecutive_skips_reset_by_a_trained_step():
    policy = StopPolicy(StopConfig(spread_patience=0))  # skips only
    counts = []
    for skipped in [True, True, False, True, True, True, True]:
        assert not policy.update(skipped).stop
        counts.append(policy.consecutive_skips)
    assert counts == [1, 2, 0, 1, 2, 3, 4]
    decision = policy.update(True)  # the 5th in a row
    assert decision.stop and decision.reason == "consecutive_skips"
    assert "5 consecutive steps" in decision.message
    assert policy.metrics()["snr/total_skips"] == 7.0 and policy.metrics()["snr/stopped"] == 1.0
    # The decision stands and counts freeze.
    assert policy.update(False, 1.0).stop and policy.steps == 8


def test_skip_rule_can_be_turned_off():
    policy = StopPolicy(StopConfig(max_consecutive_skips=0, spread_patience=0))
    assert not any(policy.update(True).stop for _ in range(50))


def feed(policy, series):
    """series items: a spread (trained step) or None (skipped step); returns decisions."""
    return [policy.update(s is None, s) for s in series]


COLLAPSE = [0.5] * 5 + [1.5] * 5 + [None]  # baseline mean 1.0 (the skip is not counted)


def test_spread_collapse_detection():
    policy = StopPolicy(StopConfig(max_consecutive_skips=0))
    feed(policy, COLLAPSE)
    assert policy.baseline == pytest.approx(1.0)
    # Threshold 0.1: nine below, then 0.1 (not below: strict) resets the run.
    assert not any(d.stop for d in feed(policy, [0.05] * 9 + [0.1]))
    assert policy.steps_below == 0
    # Nine below, skipped steps in between neither count nor reset, then the tenth stops.
    decisions = feed(policy, [0.05] * 5 + [None, None] + [0.0] * 4 + [0.09])
    assert [d.stop for d in decisions] == [False] * 11 + [True]
    assert decisions[-1].reason == "spread_collapse" and "10 consecutive trained steps" in decisions[-1].message


def test_collapse_configurable_and_off():
    policy = StopPolicy(StopConfig(spread_baseline=2, spread_patience=2, spread_ratio=0.5))
    assert [d.stop for d in feed(policy, [2.0, 4.0, 1.0, 1.4])] == [False, False, False, True]  # below 1.5
    off = StopPolicy(StopConfig(spread_patience=0))
    assert not any(d.stop for d in feed(off, [1.0] * 10 + [0.0] * 30))
    with pytest.raises(ValueError, match="spread_ratio must be in"):
        StopConfig(spread_ratio=0.0)
    with pytest.raises(ValueError, match="max_consecutive_skips must be a whole number"):
        StopConfig(max_consecutive_skips=-1)


def test_spread_required_and_finite_on_trained_steps():
    policy = StopPolicy()
    with pytest.raises(ValueError, match="spread must be a finite number"):
        policy.update(False)
    with pytest.raises(ValueError, match="spread must be a finite number"):
        policy.update(False, float("nan"))


def test_observe_reads_a_selection():
    policy = StopPolicy()
    sel = select_groups(REWARDS, recommended())
    assert not policy.observe(sel).stop
    assert policy.baseline_spreads == [pytest.approx(sel.metrics["snr/reward_std_mean"])]


def test_state_dict_round_trip():
    series = COLLAPSE + [0.05] * 4 + [None, None]
    whole = StopPolicy()
    feed(whole, series)
    half = StopPolicy()
    feed(half, series[:7])
    resumed = StopPolicy()
    resumed.load_state_dict(json.loads(json.dumps(half.state_dict())))  # checkpoint-safe types
    feed(resumed, series[7:])
    assert resumed.state_dict() == whole.state_dict()
    assert resumed.consecutive_skips == 2 and resumed.steps_below == 4
    rest = [0.05] * 6
    assert [d.stop for d in feed(resumed, rest)] == [d.stop for d in feed(whole, rest)] == [False] * 5 + [True]
    with pytest.raises(ValueError, match="missing keys \\['baseline'\\]"):
        StopPolicy().load_state_dict({k: v for k, v in half.state_dict().items() if k != "baseline"})


def test_low_validation_success_stops_after_five_in_a_row_as_ragen2():
    policy = StopPolicy(StopConfig())
    for rate in (0.0, 0.005, 0.0, 0.0):
        assert not policy.observe_validation(rate).stop
    assert not policy.observe_validation(0.01).stop  # 0.01 is not below 1%: the count starts again
    for _ in range(4):
        assert not policy.observe_validation(float("nan")).stop  # NaN: nothing succeeded
    decision = policy.observe_validation(0.0)
    assert decision.stop and decision.reason == "low_validation_success" and "5 validations" in decision.message
    restored = StopPolicy(StopConfig())
    restored.load_state_dict(policy.state_dict())
    assert restored.decision() == decision and restored.metrics()["snr/low_validations"] == 5.0


def test_low_validation_rule_off_and_old_states_load():
    policy = StopPolicy(StopConfig(low_val_patience=0))
    assert not any(policy.observe_validation(0.0).stop for _ in range(20))
    old = StopPolicy().state_dict()
    del old["low_validations"]  # a checkpoint written before the rule existed
    StopPolicy().load_state_dict(old)
    with pytest.raises(ValueError, match="low_val_success must be in"):
        StopConfig(low_val_success=1.5)
