"""The per-test restore in conftest puts back every process-global setting a test may change, so
no test's result depends on the tests run before it (issue 32 item 8's class of failure)."""

import os
import random

import numpy as np
import pytest
import torch

from tests import conftest


def test_a_test_that_changes_global_state_leaves_none_of_it_behind():
    before = (torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled(),
              torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled(), dict(os.environ))
    restore = conftest._restoring_process_state()
    next(restore)
    torch_rng, numpy_rng, python_rng = torch.get_rng_state(), np.random.get_state(), random.getstate()
    torch.set_num_threads(max(1, before[0] - 1) if before[0] > 1 else 2)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(not before[2])
    torch.set_float32_matmul_precision("medium" if before[3] != "medium" else "high")
    torch.use_deterministic_algorithms(not before[4])
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    os.environ["RAGEN2_TEST_LEFTOVER"] = "1"
    with pytest.raises(StopIteration):
        next(restore)
    assert torch.get_num_threads() == before[0]
    assert torch.get_default_dtype() == before[1] and torch.is_grad_enabled() == before[2]
    assert torch.get_float32_matmul_precision() == before[3]
    assert torch.are_deterministic_algorithms_enabled() == before[4]
    assert torch.equal(torch.get_rng_state(), torch_rng)
    assert np.array_equal(np.random.get_state()[1], numpy_rng[1]) and random.getstate() == python_rng
    assert dict(os.environ) == before[5]
