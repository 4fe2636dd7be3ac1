"""Import OpenRLHF 0.11.2's real modules on a CPU machine, with stand-ins for flash_attn and vllm.

`import openrlhf.models` imports flash_attn (CUDA-only wheels) and the trainer imports vllm; the
code under test never calls them, so bare stand-in modules are enough, as in OpenRLHF's own
tests (tests/test_deepspeed_save_model.py). The stand-ins live in sys.modules only while the
modules below are imported, then are removed again, so that no other test (or transformers'
"is flash_attn available" check) sees them. Everything else is real: torch, ray, deepspeed,
transformers, peft, and OpenRLHF itself.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types

import pytest

NEEDED = ("openrlhf", "ray", "deepspeed", "torchdata", "aiohttp", "pylatexenc")
MODULES = (
    "openrlhf.models.loss",
    "openrlhf.models.actor",
    "openrlhf.trainer.ppo_utils.experience",
    "openrlhf.trainer.ppo_utils.experience_maker",
    "openrlhf.trainer.ppo_utils.kl_controller",
    "openrlhf.trainer.ppo_utils.samples_generator",
    "openrlhf.utils.agent",
    "openrlhf.trainer.ppo_trainer",
    "openrlhf.trainer.ray.vllm_engine",  # _load_agent_executor, the loader of --train.agent_func_path
    "ragen2.engines.openrlhf.agent",
    "ragen2.engines.openrlhf.trainer_patch",
)
_loaded: dict[str, types.ModuleType] = {}


class SamplingParams:
    """vllm.SamplingParams stand-in: keeps whatever it is given (the agent deep-copies and edits it)."""

    def __init__(self, **kwargs):
        self.logprobs = None
        self.max_tokens = None
        self.__dict__.update(kwargs)


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    module.__path__ = []
    return module


def _stand_ins() -> dict[str, types.ModuleType]:
    flash_attn, bert_padding = _module("flash_attn"), _module("flash_attn.bert_padding")
    fa_utils, fa_distributed = _module("flash_attn.utils"), _module("flash_attn.utils.distributed")
    for name in ("index_first_axis", "pad_input", "rearrange", "unpad_input"):
        setattr(bert_padding, name, None)  # imported by ring_attn_utils, used only with packing
    fa_distributed.all_gather = None
    vllm, vllm_inputs, vllm_utils = _module("vllm"), _module("vllm.inputs"), _module("vllm.utils")
    vllm.__version__ = "0.29.0"  # the version the openrlhf[vllm] extra pins
    vllm.SamplingParams = SamplingParams
    vllm.AsyncEngineArgs = vllm.AsyncLLMEngine = None  # only the rollout actor (not tested) uses them
    vllm_inputs.TokensPrompt = dict
    vllm_utils.random_uuid = lambda: "stand-in"
    return {m.__name__: m for m in (flash_attn, bert_padding, fa_utils, fa_distributed, vllm, vllm_inputs,
                                    vllm_utils)}


def load() -> dict[str, types.ModuleType]:
    """The modules above, imported once; skips the calling test module if the extra is missing."""
    for name in NEEDED:
        pytest.importorskip(name, reason=f"{name} is not installed: the OpenRLHF engine tests need the "
                                         "OpenRLHF 0.11.2 test stack (see .ci/run)")
    if _loaded:
        return _loaded
    stand_ins = {name: module for name, module in _stand_ins().items() if name not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        for name in MODULES:
            _loaded[name] = importlib.import_module(name)
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)
    return _loaded
