"""Fixtures shared by test modules.

Every test starts from the same process-global state and leaves it so: torch's thread
count, its global RNG, default dtype, grad mode, float32 matmul precision and determinism
flag, the global numpy and Python RNGs and the environment variables are put back after each
test, so a test that passes alone passes in any order.
"""

import os
import random

import numpy as np
import pytest
import torch

from tests.tiny import tiny_llama, tiny_tokenizer


def _restoring_process_state():
    threads, rng, environ = torch.get_num_threads(), torch.get_rng_state(), dict(os.environ)
    dtype, grad, matmul = torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_float32_matmul_precision()
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    numpy_rng, python_rng = np.random.get_state(), random.getstate()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    torch.set_rng_state(rng)
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
    torch.set_float32_matmul_precision(matmul)
    torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    np.random.set_state(numpy_rng)
    random.setstate(python_rng)
    if dict(os.environ) != environ:
        os.environ.clear()
        os.environ.update(environ)


# Module-scoped fixtures (a reference run shared by a module's tests) run before the per-test
# restore records the state, so what they change would outlive the module without this one.
_restore_module_state = pytest.fixture(autouse=True, scope="module", name="_restore_module_state")(
    _restoring_process_state)
_restore_process_state = pytest.fixture(autouse=True, name="_restore_process_state")(_restoring_process_state)


@pytest.fixture
def single_thread():
    """One torch thread for this test (tiny models run faster without thread hand-offs)."""
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Llama and its ChatML tokenizer saved to disk: a `--model` for real CLI runs."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = tiny_tokenizer("chatml")
    tiny_llama(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
