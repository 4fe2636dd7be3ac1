"""The TRL filter's pure part: TRL's rewards -> snr's matrix -> the loss mask TRL reads (no TRL needed)."""

import math

import pytest
import torch

import snr
from ragen2.integrations.trl.filtering import GroupFilter, SNRFilterArgs, drop_from_loss, group_rewards

G = 4
REWARDS = torch.tensor([[0.0, 0.0, 0.0, 0.0],   # no spread: dropped by snr-top-p
                        [0.0, 1.0, 0.0, 1.0],   # the largest variance
                        [0.0, 0.0, 0.0, 0.2],
                        [1.0, 0.0, 1.0, 1.0]])


def test_group_rewards_is_trls_weighted_reward_in_group_rows():
    per_func = torch.stack([REWARDS.flatten(), torch.ones(16)], dim=1)  # two reward functions
    weights = torch.tensor([2.0, 0.5])
    expected = (2.0 * REWARDS + 0.5)
    assert torch.equal(group_rewards(per_func, weights, G), expected)


def test_an_unscored_completion_takes_its_group_mean_and_adds_no_spread():
    per_func = REWARDS.flatten().unsqueeze(1).clone()
    per_func[5, 0] = math.nan  # group 1, completion 1: no reward function scored it
    per_func[8:12, 0] = math.nan  # group 2: none scored
    matrix = group_rewards(per_func, torch.ones(1), G)
    assert matrix[1].tolist() == pytest.approx([0.0, 1 / 3, 0.0, 1.0])  # the mean of 0, 0, 1
    assert matrix[2].tolist() == [0.0] * G
    assert torch.isfinite(matrix).all()


def test_group_rewards_rejects_a_batch_that_is_not_whole_groups():
    with pytest.raises(ValueError, match="whole groups"):
        group_rewards(torch.zeros(6, 1), torch.ones(1), G)


@pytest.mark.parametrize("config", ["snr-top-p", "starpo-s", snr.FilterConfig(strategy="min_p", value=0.5),
                                    snr.FilterConfig(strategy="top_k_abs", value=1, metric="reward_std")])
def test_the_kept_groups_are_snrs(config):
    args = SNRFilterArgs(filter=config, loss_scaling="sqrt")
    step = GroupFilter(args).step(REWARDS)
    expected = snr.select_groups(REWARDS, args.filter)
    assert torch.equal(step.selection.kept, expected.kept)
    assert torch.equal(step.sample_mask, expected.sample_mask(G))
    assert step.scale == snr.kept_fraction_scale(expected.kept_fraction, "sqrt")
    assert step.metrics["snr/kept_fraction"] == expected.kept_fraction
    assert not step.skip


def test_a_preset_name_is_loaded_with_snrs_loader():
    assert SNRFilterArgs("starpo-s").filter == snr.load_preset("starpo-s")
    assert SNRFilterArgs("starpo-s").stop is None and SNRFilterArgs.coerce("snr-top-p").stop is None  # opt-in
    assert SNRFilterArgs.coerce(snr.load_preset("snr-top-p")).filter == snr.load_preset("snr-top-p")
    with pytest.raises(snr.FilterConfigError):
        SNRFilterArgs("no-such-preset")
    with pytest.raises(ValueError, match="loss_scaling"):
        SNRFilterArgs(loss_scaling="square")


def test_no_spread_skips_and_the_stop_policy_counts_it():
    group_filter = GroupFilter(SNRFilterArgs(stop=snr.StopConfig(max_consecutive_skips=2)))
    flat = torch.zeros(3, G)
    first, second = group_filter.step(flat), group_filter.step(flat)
    assert first.skip and not first.decision.stop and first.metrics["snr/total_skips"] == 1.0
    assert second.decision.stop and second.decision.reason == "consecutive_skips"
    assert GroupFilter(SNRFilterArgs(stop=None)).step(flat).decision is None


def _trl_batch(rows: int = 6, length: int = 5) -> dict:
    completion_mask = torch.ones(rows, length, dtype=torch.long)
    completion_mask[1, 3:] = 0  # right padding
    return {"advantages": torch.arange(1.0, rows + 1.0), "completion_mask": completion_mask}


def test_drop_from_loss_zeroes_dropped_rows_in_the_loss_mask_only():
    batch = _trl_batch()
    keep = torch.tensor([True, True, False, True, False, False])
    attention = batch["completion_mask"].clone()
    drop_from_loss(batch, keep, 0.5)
    assert batch["advantages"].tolist() == [0.5, 1.0, 0.0, 2.0, 0.0, 0.0]
    assert torch.equal(batch["completion_mask"], attention)  # attention untouched
    assert batch["tool_mask"].sum(dim=1).tolist() == [5, 5, 0, 5, 0, 0]


def test_drop_from_loss_keeps_an_existing_tool_mask():
    batch = _trl_batch(rows=2)
    batch["tool_mask"] = torch.tensor([[1, 0, 0, 1, 1], [1, 1, 1, 1, 1]])
    batch["advantages"] = torch.ones(2, 5)  # per-token advantages, as a TRL subclass may give
    drop_from_loss(batch, torch.tensor([True, False]), 1.0)
    assert batch["tool_mask"].tolist() == [[1, 0, 0, 1, 1], [0, 0, 0, 0, 0]]
    assert batch["advantages"].sum(dim=1).tolist() == [5.0, 0.0]
