"""Fixtures shared by test modules."""

import pytest

from ragen2.rollout.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Llama and its ChatML tokenizer saved to disk: a `--model` for real CLI runs."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = tiny_tokenizer("chatml")
    tiny_llama(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
