"""snr.Refill, DAPO's dynamic sampling bookkeeping, and the filter field that turns it on."""

from __future__ import annotations

import pytest
import torch

import snr
from ragen2.config import ConfigError, load_config
from snr import FilterConfig, FilterConfigError

DAPO = snr.load_preset("dapo-dynamic")
REWARD = FilterConfig(strategy="top_p", value=1.0, include_zero=False, max_rounds=3)


def test_rounds_fill_the_batch_with_groups_with_spread_in_order_and_stop_when_full():
    refill = snr.Refill(REWARD, num_groups=3)
    assert refill.add([[0, 0], [0, 1], [1, 1]]) == [1]  # only the middle group has spread
    assert not refill.done
    assert refill.add([[2, 0], [5, 5], [0, 0.5], [1, 0]]) == [0, 2]  # two missing: the first two found
    assert (refill.found, refill.rounds, refill.flat, refill.full, refill.exhausted) == (3, 2, 3, True, False)
    with pytest.raises(snr.FilterInputError, match="sampling is done"):
        refill.add([[0, 1]])


def test_the_round_limit_ends_sampling_before_the_batch_is_full():
    refill = snr.Refill(REWARD, num_groups=2)
    for _ in range(3):
        assert refill.add([[1, 1], [0, 0]]) == []
    assert refill.done and refill.exhausted and refill.found == 0 and refill.flat == 6


def test_spread_is_measured_on_the_filter_signal_with_the_filter_spread_function():
    rewards = torch.tensor([[1.0, 0.9], [1.0, 0.0]])  # group 0: only a format penalty differs
    success = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert snr.Refill(DAPO, 2).add(rewards, signal=success) == [1]
    assert snr.Refill(REWARD, 2).add(rewards) == [0, 1]
    with pytest.raises(snr.FilterInputError, match="signal"):
        snr.Refill(DAPO, 2).add(rewards)  # the outcome was not passed
    # within ZERO_SPREAD_TOL counts as equal, as it does for the filter
    assert snr.Refill(REWARD, 1).add([[1.0, 1.0 + snr.ZERO_SPREAD_TOL / 2]]) == []


def test_max_rounds_is_read_only_with_include_zero_false():
    for config in ({"max_rounds": 2}, {"strategy": "top_k", "value": 0.25, "max_rounds": 2}):
        with pytest.raises(FilterConfigError, match=r"max_rounds=2 is ignored by .*read by include_zero false"):
            FilterConfig(**config)
    for bad in (0, 1.5, True):
        with pytest.raises(FilterConfigError, match="max_rounds must be a whole number >= 1"):
            FilterConfig(strategy="top_p", include_zero=False, max_rounds=bad)
    assert DAPO.max_rounds == 4 and DAPO.signal == "success" and not DAPO.include_zero and DAPO.value == 1.0


def test_the_training_config_takes_the_preset_and_labels_a_changed_round_limit():
    cfg = load_config(filter="dapo-dynamic", overrides=["filter.max_rounds=2"])
    assert cfg.filter.max_rounds == 2 and cfg.filter_preset == "dapo-dynamic+max_rounds=2"
    with pytest.raises(ConfigError, match="filter.max_rounds=3 is ignored by strategy none"):
        load_config(overrides=["filter.max_rounds=3"])


def test_engines_that_cannot_sample_more_refuse_it_instead_of_ignoring_it():
    from ragen2.engines.openrlhf.flags import unsupported
    from ragen2.integrations.trl.filtering import SNRFilterArgs

    cfg = load_config(filter="dapo-dynamic")
    assert any(line.startswith("filter.max_rounds=4: dynamic sampling") for line in unsupported(cfg))
    assert not any("max_rounds" in line for line in unsupported(load_config(filter="snr-top-p")))
    with pytest.raises(ValueError, match="max_rounds=4: dynamic sampling .* local engine only"):
        SNRFilterArgs(filter="dapo-dynamic")
