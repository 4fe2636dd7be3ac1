"""The two engines' turn protocols give the same conversation, token for token (no OpenRLHF needed).

The OpenRLHF agent (ragen2/engines/openrlhf/agent.py) is loaded by path as OpenRLHF loads it,
with a bare `openrlhf.utils.agent.AgentExecutorBase` when OpenRLHF is not installed (the agent
only subclasses it); a fake engine replays the same replies a ScriptedPolicy gives the local
rollout. Both must render RAGEN-2's "Reward:" message (the env reward, no format penalty).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import envs
from ragen2.rollout import RolloutConfig, rollout
from ragen2.rollout.tiny import ScriptedPolicy, tiny_tokenizer

AGENT_FILE = Path(__file__).resolve().parents[1] / "ragen2/engines/openrlhf/agent.py"
# Turn 1 runs nothing (penalty -0.5, shown "0"); turn 2 one step Down and one invalid piece
# (-0.1 - 0.5 trained, "-0.1" shown); turn 3 steps Up (-0.1).
REPLIES = {1: "<think>a</think><answer>Jump</answer>", 2: "<think>b</think><answer>Down || Fly</answer>",
           3: "<think>c</think><answer>Up</answer>"}


def load_agent_module():
    try:
        import openrlhf.utils.agent  # noqa: F401  (the real base class when installed)
        stand_ins = {}
    except ImportError:
        names = ("openrlhf", "openrlhf.utils", "openrlhf.utils.agent")
        stand_ins = {name: types.ModuleType(name) for name in names if name not in sys.modules}
        stand_ins.setdefault("openrlhf.utils.agent", types.ModuleType("openrlhf.utils.agent"))
        stand_ins["openrlhf.utils.agent"].AgentExecutorBase = type("AgentExecutorBase", (), {})
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location("ragen2_agent_under_test", AGENT_FILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # as OpenRLHF does: not registered in sys.modules
        return module
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


class FakeEngine:
    """vLLM's generate: the scripted reply of the turn the prompt ends in, cut at "</answer>"."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    async def generate(self, prompt_token_ids, sampling_params):
        prompt = self.tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
        turn = int(prompt.rsplit("Turn ", 1)[1].split(":")[0])
        text = REPLIES[turn][len("<think>"):]  # the agent prefills "<think>"
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]  # the stop string comes before EOS
        output = SimpleNamespace(token_ids=ids, logprobs=None, finish_reason="stop")
        return SimpleNamespace(outputs=[output])


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer("chatml")


def room_env(**config):
    env = envs.make("sokoban", format_penalty=-0.5, **config)
    original_reset = env.reset

    def reset(seed=None, options=None):  # a hand-built room: every step's reward is known
        original_reset(seed=seed, options=options)
        env.load_room(["######", "#PXO_#", "#____#", "######"])
        return env.render(), {}

    env.reset = reset
    return env


def local_text(tok, **config) -> str:
    policy = ScriptedPolicy(tok, lambda p: REPLIES[int(p.rsplit("Turn ", 1)[1].split(":")[0])][len("<think>"):],
                            generation_prompt="<think>", end_with_eos=True)
    cfg = RolloutConfig(group_size=1, max_turns=3, max_new_tokens=40)
    batch = rollout(policy, tok, lambda: room_env(**config), [5], cfg, torch.Generator().manual_seed(0))
    assert batch.traj_rewards.tolist() == pytest.approx([-0.5 + -0.6 + -0.1])
    return tok.decode(batch.input_ids[0][batch.attention_mask[0].bool()], skip_special_tokens=False)


def openrlhf_text(tok, monkeypatch, **config) -> str:
    agent = load_agent_module()
    monkeypatch.setattr(agent.EpisodeSpec, "make_env", lambda self: room_env(**config))
    label = json.dumps({"env": "sokoban", "env_config": {}, "seed": 5, "max_turns": 3, "max_new_tokens": 40})
    params = SimpleNamespace(temperature=1.0, max_tokens=40, logprobs=None)
    out = asyncio.run(agent.AgentExecutor().execute("p", label, params, 4096, tok, FakeEngine(tok)))
    assert out["reward"].item() == pytest.approx(-1.2)
    return tok.decode(out["observation_tokens"], skip_special_tokens=False)


@pytest.mark.parametrize("feedback, shown", [("env", ("0", "-0.1")), ("with_penalty", ("-0.5", "-0.6"))])
def test_both_engines_write_the_same_conversation_and_reward_message(tok, monkeypatch, feedback, shown):
    local = local_text(tok, reward_feedback=feedback)
    remote = openrlhf_text(tok, monkeypatch, reward_feedback=feedback)
    assert local == remote
    assert f"<|im_start|>user\nReward:\n{shown[0]}\n\nTurn 2:\n" in local
    assert f"<|im_start|>user\nReward:\n{shown[1]}\n\nTurn 3:\n" in local
