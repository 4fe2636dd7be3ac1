"""The rollout tests' tiny ChatML tokenizer and Llama, built once per module that asks for them."""

import pytest

from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer("chatml")


@pytest.fixture(scope="module")
def llama(tok):
    return tiny_llama(tok, seed=0)
