"""The OpenRLHF agent against the local engine where vLLM's semantics matter (no OpenRLHF needed).

- End of turn: vLLM stops at the tokenizer's EOS (stop_reason None) and at the generation config's
  other EOS ids (stop_reason = the id), keeping the token (vllm 0.29.0: SamplingParams.
  update_from_generation_config, v1/core/sched/utils.check_stop). The local engine stops at both
  sets too (rollout.agent_loop.eos_token_ids). With a Llama-3 base-style tokenizer (EOS
  <|end_of_text|>, turns closed by <|eot_id|>, which is in generation_config.eos_token_id) both
  engines must write the same trained context, token for token.
- Rollout indices: each evaluation replays the same validation rows; their samples get 0..G-1
  every time, as the local engine's groups do.

The agent file is loaded by path as OpenRLHF loads it, over a bare AgentExecutorBase when
OpenRLHF is not installed (the agent only subclasses it).
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig

import envs
from ragen2.rollout import RolloutConfig, rollout
from tests import agent_file
from tests.tiny import ScriptedPolicy, tiny_tokenizer

# No reply closes </answer>, so no stop string fires: every turn ends at the model's <|eot_id|>.
REPLIES = {1: " go up</think> <answer>Up", 2: " down</think> Down", 3: " left"}
STOP = "</answer>"


def load_agent_module():
    return agent_file.load_agent_module('ragen2_agent_vs_local')


@pytest.fixture(scope="module")
def agent():
    return load_agent_module()


@pytest.fixture(scope="module")
def llama3_base():
    """Llama-3 base's layout: the tokenizer's EOS is <|end_of_text|>, the chat template closes turns with
    <|eot_id|>, and the generation config lists both as EOS ids."""
    tok = tiny_tokenizer("llama3")
    tok.eos_token = "<|end_of_text|>"
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    assert tok.eos_token_id != eot
    return tok, GenerationConfig(eos_token_id=[tok.eos_token_id, eot])


def turn_of(tok, prompt_ids) -> int:
    return int(tok.decode(prompt_ids, skip_special_tokens=False).rsplit("Turn ", 1)[1].split(":")[0])


class VLLMLikeEngine:
    """generate() as vLLM 0.29.0 answers: the scripted reply + <|eot_id|>, cut where vLLM stops."""

    def __init__(self, tok, generation_config, replies=REPLIES):
        self.tok, self.replies = tok, replies
        self.stop_ids = set(generation_config.eos_token_id) - {tok.eos_token_id}
        self.calls = []

    async def generate(self, prompt_token_ids, sampling_params):
        self.calls.append(list(prompt_token_ids))
        ids = self.tok(self.replies[turn_of(self.tok, prompt_token_ids)] + "<|eot_id|>",
                       add_special_tokens=False)["input_ids"]
        for i, token in enumerate(ids):
            text = self.tok.decode(ids[:i + 1], skip_special_tokens=True)
            if token == self.tok.eos_token_id:
                finish, reason = "stop", None
            elif token in self.stop_ids:
                finish, reason = "stop", token
            elif STOP in text:
                finish, reason = "stop", STOP
            else:
                continue
            ids = ids[:i + 1]
            break
        else:
            finish, reason = "length", None
        output = SimpleNamespace(token_ids=ids, logprobs=None, finish_reason=finish, stop_reason=reason)
        return SimpleNamespace(outputs=[output])


def sokoban():
    return envs.make("sokoban")


def local_ids(tok, generation_config) -> list[int]:
    policy = ScriptedPolicy(tok, lambda p: REPLIES[int(p.rsplit("Turn ", 1)[1].split(":")[0])] + "<|eot_id|>",
                            generation_prompt="<think>")
    policy.generation_config = generation_config  # what rollout.agent_loop.eos_token_ids reads
    cfg = RolloutConfig(group_size=1, max_turns=3, max_new_tokens=40, max_context_tokens=4096)
    batch = rollout(policy, tok, sokoban, [5], cfg, torch.Generator().manual_seed(0))
    ids = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
    return ids[:max(i for i, m in enumerate(batch.response_mask[0].tolist()) if m) + 1]


def label(seed=5, group_size=None) -> str:
    data = {"env": "sokoban", "env_config": {}, "seed": seed, "max_turns": 3, "max_new_tokens": 40}
    return json.dumps(data | ({"group_size": group_size} if group_size else {}))


def test_a_generation_config_eos_ends_the_turn_as_in_the_local_engine_token_for_token(agent, llama3_base):
    tok, generation_config = llama3_base
    engine = VLLMLikeEngine(tok, generation_config)
    params = SimpleNamespace(temperature=1.0, max_tokens=40, logprobs=None)
    out = asyncio.run(agent.AgentExecutor().execute("p", label(), params, 4096, tok, engine))
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    ours, local = out["observation_tokens"], local_ids(tok, generation_config)
    assert len(engine.calls) == 3
    assert ours == local
    # each finished turn is closed by one <|eot_id|>, the sampled one (not the template's as well)
    for (_, end), _turn in zip(out["action_ranges"][:-1], range(2)):
        assert ours[end - 1] == eot and ours[end] != eot
    assert not any(a == b == eot for a, b in zip(ours, ours[1:]))  # never <|eot_id|><|eot_id|>


@pytest.mark.parametrize("ids,finish,stop_reason,expected", [
    ([5, 9, 2], "stop", None, "eos"),  # the tokenizer's EOS (vLLM: stop_reason None)
    ([5, 9, 7], "stop", 7, "eos"),  # a generation-config EOS (Qwen2.5's <|endoftext|>, Llama-3's <|eot_id|>)
    ([5, 9, 11], "stop", "</answer>", "stop"),  # a stop string
    ([5, 9, 11], "length", None, "length"),
])
def test_vllms_finish_and_stop_reason_become_the_episodes_finish(agent, ids, finish, stop_reason, expected):
    output = SimpleNamespace(finish_reason=finish, stop_reason=stop_reason)
    assert agent.finish_reason(output, ids, {2}) == expected


def test_every_evaluation_numbers_a_rows_samples_0_to_g_minus_1(agent, llama3_base, monkeypatch):
    tok, generation_config = llama3_base
    env_cls = envs.spec("sokoban").env_cls
    indices = []
    original_reset = env_cls.reset

    def reset(self, seed=None, options=None):
        indices.append((seed, options["rollout_index"]))
        return original_reset(self, seed=seed, options=options)

    monkeypatch.setattr(env_cls, "reset", reset)
    executor = agent.AgentExecutor()  # one per rollout actor: it outlives every evaluation
    params = SimpleNamespace(temperature=1.0, max_tokens=40, logprobs=None)

    async def evaluation(rows, group):  # OpenRLHF's generate_responses: G concurrent calls per row
        await asyncio.gather(*(executor.execute("p", label(seed, group), params, 4096, tok,
                                                VLLMLikeEngine(tok, generation_config))
                               for seed in rows for _ in range(group)))

    for _ in range(2):
        asyncio.run(evaluation([5, 6], 3))
    assert indices == [(seed, k) for seed in (5, 6) for k in range(3)] * 2
