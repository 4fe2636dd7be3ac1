"""RAGEN-2's batch adjustment after filtering (agent_trainer.adjust_batch), as row indices.

RAGEN-2 pads (copy) or trims (delete) the kept rows to a multiple of
lcm(env groups, PPO mini-batch, GPUs) = lcm(8, 32, 8) = 32 in its main table.
"""

import pytest
import torch

from ragen2.rollout.batch import (RolloutBatch, RowRecord, TrajectoryRecord, adjusted_rows,
                                  ragen_size_divisor)


def test_the_main_tables_divisor():
    assert ragen_size_divisor(8, 32, 8) == 32 and ragen_size_divisor(6, 32, 1) == 96


def test_copy_duplicates_distinct_random_rows_up_to_the_next_multiple():
    # 3 of 8 groups of 16 kept = 48 rows; remainder 16 → 16 more rows, none drawn twice.
    order = adjusted_rows(48, 32, "copy", torch.Generator().manual_seed(0))
    assert len(order) == 64 and order[:48] == list(range(48))
    assert len(set(order[48:])) == 16 and set(order[48:]) <= set(range(48))


def test_copy_draws_with_replacement_when_more_rows_are_needed_than_there_are():
    order = adjusted_rows(10, 32, "copy", torch.Generator().manual_seed(0))  # 22 more from 10 rows
    assert len(order) == 32 and order[:10] == list(range(10)) and set(order[10:]) <= set(range(10))


def test_delete_removes_the_remainder_at_random_and_keeps_the_order():
    order = adjusted_rows(48, 32, "delete", torch.Generator().manual_seed(0))
    assert len(order) == 32 and order == sorted(order) and len(set(order)) == 32
    assert adjusted_rows(10, 32, "delete", torch.Generator().manual_seed(0)) == []  # as RAGEN-2: all go


def test_divisible_batches_and_none_are_untouched_and_draws_are_seeded():
    assert adjusted_rows(64, 32, "copy") == list(range(64)) == adjusted_rows(64, 32, "delete")
    assert adjusted_rows(48, 32, "none") == list(range(48))
    a, b = (adjusted_rows(48, 32, "copy", torch.Generator().manual_seed(7)) for _ in range(2))
    assert a == b
    with pytest.raises(ValueError, match="batch adjust mode"):
        adjusted_rows(48, 32, "pad")


def test_take_rows_copies_keep_their_group_trajectory_and_reasoning():
    trajectories = [TrajectoryRecord(group=g, member=0, seed=g, turn_rewards=[float(g)]) for g in range(3)]
    rows = [RowRecord(traj=t, input_ids=[1, 2, 3][: t + 1] + [9], sampled=[False] * (t + 1) + [True],
                      logprobs=[0.0] * (t + 1) + [-0.5], turn_index=[-1] * (t + 1) + [0],
                      turn_ends=[(0, t + 1)], reasoning=[(0, t + 1, t + 2)]) for t in range(3)]
    batch = RolloutBatch.from_records(rows, trajectories, pad_token_id=0, group_size=1)
    out = batch.take_rows([0, 1, 2, 2, 0])
    assert out.group_ids.tolist() == [0, 1, 2, 2, 0] and out.traj_index.tolist() == [0, 1, 2, 2, 0]
    assert out.traj_rewards.tolist() == [0.0, 1.0, 2.0, 2.0, 0.0]
    assert torch.equal(out.input_ids[3], batch.input_ids[2]) and out.reasoning_spans[3] == (3, 0, 3, 4)
    assert out.trajectories is batch.trajectories  # episodes are still counted once
