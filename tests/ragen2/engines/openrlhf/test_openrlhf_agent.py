"""Our AgentExecutor (OpenRLHF's agent API) on a fake vLLM engine: a full multi-turn Sokoban episode.

The engine replays scripted replies; everything else is real: the env, the chat template (a tiny
ChatML tokenizer), OpenRLHF's AgentExecutorBase and its SamplesGenerator turning the episode into
an Experience.
"""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import pytest
import torch

from tests.ragen2.engines.openrlhf import openrlhf_stubs

modules = openrlhf_stubs.load()
agent_lib = modules["ragen2.engines.openrlhf.agent"]
SamplesGenerator = modules["openrlhf.trainer.ppo_utils.samples_generator"].SamplesGenerator
AgentExecutorBase = modules["openrlhf.utils.agent"].AgentExecutorBase

import envs  # noqa: E402
from envs.prompt import after_turn, first_turn_messages  # noqa: E402
from ragen2.rollout.chat import ChatFormat  # noqa: E402
from tests.tiny import tiny_tokenizer  # noqa: E402

MAX_NEW_TOKENS = 40
# Turn 1 has no valid action (format penalty); turn 2 stops on "</answer>" without EOS; turn 3 ends with EOS.
REPLIES = [(" I will jump </think> <answer>Jump</answer>", True),
           (" go up </think> <answer>Up</answer>", False),
           (" now left </think> <answer>Left</answer>", True)]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer("chatml")


def label(seed=7, max_turns=3, **extra) -> str:
    data = {"env": "sokoban", "env_config": {}, "seed": seed, "max_turns": max_turns,
            "max_new_tokens": MAX_NEW_TOKENS, "max_response_words": None, **extra}
    return json.dumps(data, sort_keys=True)


class FakeEngine:
    """Stands in for OpenRLHF's RolloutRayActor.generate: scripted token ids, per-token log-probs."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.calls = tokenizer, list(replies), []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        text, with_eos = self.replies[len(self.calls) % len(self.replies)]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = ids + [self.tokenizer.eos_token_id] if with_eos else ids
        self.calls.append((list(prompt_token_ids), sampling_params))
        logprobs = [{tok: SimpleNamespace(logprob=-0.01 * (i + 1))} for i, tok in enumerate(ids)]
        # as vLLM reports them: EOS -> stop_reason None, a stop string -> the string
        output = SimpleNamespace(token_ids=ids, text=text, logprobs=logprobs, finish_reason="stop",
                                 stop_reason=None if with_eos else "</answer>")
        return SimpleNamespace(outputs=[output])


def run(executor, tokenizer, engine, lab, max_length=4096, logprobs=1):
    params = openrlhf_stubs.SamplingParams(temperature=1.0, max_tokens=MAX_NEW_TOKENS, logprobs=logprobs)
    return asyncio.run(executor.execute(prompt="sokoban seed=7", label=lab, sampling_params=params,
                                        max_length=max_length, hf_tokenizer=tokenizer, llm_engine=engine))


def replay(seed, texts, rollout_index=0):
    """The same episode on a fresh env: the messages the agent must have rendered, and the rewards."""
    env = envs.make("sokoban")
    observation, _ = env.reset(seed=seed, options={"rollout_index": rollout_index})
    messages = list(first_turn_messages(env, observation))
    rewards = []
    for k, text in enumerate(texts):
        observation, reward, terminated, truncated, info = env.step(text)
        rewards.append(reward)
        messages.append({"role": "assistant", "content": text})
        if k + 1 < len(texts):
            feedback, nxt = after_turn(env, k + 2, observation, reward, info)
            messages.append({"role": "user", "content": feedback + nxt})
    return messages, rewards


def test_a_full_multi_turn_episode_has_exact_tokens_ranges_rewards_and_logs(tokenizer):
    executor = agent_lib.AgentExecutor()
    assert isinstance(executor, AgentExecutorBase)
    engine = FakeEngine(tokenizer, REPLIES)
    out = run(executor, tokenizer, engine, label())

    tokens, ranges = out["observation_tokens"], out["action_ranges"]
    assert len(ranges) == 3 and len(engine.calls) == 3
    eos = tokenizer.eos_token_id
    for (start, end), (text, with_eos) in zip(ranges, REPLIES):
        expected = tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos] if with_eos else [])
        assert tokens[start:end] == expected  # the sampled ids, untouched
    assert ranges[-1][1] == len(tokens)  # nothing after the last sampled token
    # Each prompt the engine saw is exactly the token list so far; the cap is per turn.
    for (prompt, params), (start, _) in zip(engine.calls, ranges):
        assert prompt == tokens[:start]
        assert params.max_tokens == MAX_NEW_TOKENS and params.stop == ["</answer>"]

    texts = ["<think>" + text for text, _ in REPLIES]
    messages, rewards = replay(7, texts)
    rendered = ChatFormat(tokenizer).render(messages, add_generation_prompt=False)
    assert tokenizer.decode(tokens, skip_special_tokens=False) == rendered.rstrip("\n")
    assert rewards[0] == pytest.approx(-0.1)  # the format penalty of the invalid turn
    # ...which the model is not shown (RAGEN-2 shows the env's own reward: nothing ran, "0");
    # turn 2's Up is one plain step, -0.1.
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    assert "<|im_start|>user\nReward:\n0\n\nTurn 2:\n" in text and "user\nReward:\n-0.1\n\nTurn 3:\n" in text
    assert isinstance(out["reward"], torch.Tensor) and out["reward"].item() == pytest.approx(sum(rewards))
    assert out["extra_logs"] == {"env/success": 0.0, "env/num_turns": 3.0, "env/format_ok_fraction": 1.0,
                                 "env/valid_action_fraction": 2 / 3, "env/actions_executed": 2.0, "env/context_truncated": 0.0}
    # Sampling log-probs on sampled tokens, 0 on template and env tokens.
    for (start, end) in ranges:
        assert out["rollout_log_probs"][start:end] == pytest.approx([-0.01 * (i + 1) for i in range(end - start)])
    sampled = set(i for s, e in ranges for i in range(s, e))
    assert all(out["rollout_log_probs"][i] == 0.0 for i in range(len(tokens)) if i not in sampled)


def test_openrlhf_turns_the_episode_into_an_experience_with_env_tokens_masked(tokenizer):
    out = run(agent_lib.AgentExecutor(), tokenizer, FakeEngine(tokenizer, REPLIES), label())
    experience = SamplesGenerator._process_response_into_experience(None, out, max_len=4096)
    mask = torch.zeros(len(out["observation_tokens"]), dtype=torch.long)
    for start, end in out["action_ranges"]:
        mask[start:end] = 1
    assert torch.equal(experience.action_mask[0].long(), mask[1:])  # action_mask[t] marks token t + 1
    assert experience.sequences[0].tolist() == out["observation_tokens"]
    assert experience.rewards.item() == pytest.approx(out["reward"].item())
    assert experience.info["env/valid_action_fraction"].item() == pytest.approx(2 / 3)
    logprobs = experience.rollout_log_probs[0]
    assert torch.all(logprobs[mask[1:] == 0] == 0) and torch.all(logprobs[mask[1:] == 1] < 0)


def test_env_code_runs_off_the_event_loop_and_group_members_get_their_own_rollout_index(tokenizer, monkeypatch):
    env_cls = envs.spec("sokoban").env_cls
    seen = {"threads": set(), "indices": []}
    original_step, original_reset = env_cls.step, env_cls.reset

    def step(self, response):
        seen["threads"].add(threading.get_ident())
        return original_step(self, response)

    def reset(self, seed=None, options=None):
        seen["threads"].add(threading.get_ident())
        seen["indices"].append(options["rollout_index"])
        return original_reset(self, seed=seed, options=options)

    monkeypatch.setattr(env_cls, "step", step)
    monkeypatch.setattr(env_cls, "reset", reset)
    executor = agent_lib.AgentExecutor()
    loop_thread = threading.get_ident()  # asyncio.run drives the loop in this thread
    for _ in range(2):
        run(executor, tokenizer, FakeEngine(tokenizer, REPLIES), label())
    assert seen["indices"] == [0, 1]
    assert loop_thread not in seen["threads"]


def test_an_episode_ends_when_the_next_turn_does_not_fit_and_a_too_long_first_prompt_raises(tokenizer):
    first = run(agent_lib.AgentExecutor(), tokenizer, FakeEngine(tokenizer, REPLIES), label(), logprobs=None)
    (start, end), second_start = first["action_ranges"][0], first["action_ranges"][1][0]
    # Room for turn 1 but not for turn 2's prompt + its cap.
    out = run(agent_lib.AgentExecutor(), tokenizer, FakeEngine(tokenizer, REPLIES), label(),
              max_length=second_start + MAX_NEW_TOKENS - 1, logprobs=None)
    assert out["action_ranges"] == [(start, end)] and len(out["observation_tokens"]) == end
    assert out["extra_logs"]["env/context_truncated"] == 1.0 and out["rollout_log_probs"] is None
    with pytest.raises(ValueError, match="raise rollout.max_context_tokens"):
        run(agent_lib.AgentExecutor(), tokenizer, FakeEngine(tokenizer, REPLIES), label(), max_length=start + 5)


def test_a_label_not_written_by_ragen2_is_refused():
    with pytest.raises(agent_lib.EpisodeLabelError, match="missing"):
        agent_lib.EpisodeSpec.from_label(json.dumps({"env": "sokoban"}))
    with pytest.raises(agent_lib.EpisodeLabelError, match="not a ragen2 episode spec"):
        agent_lib.EpisodeSpec.from_label("the answer is 42")


# ----------------------------------------------------------------------------- loaded as OpenRLHF loads it


def test_openrlhfs_own_loader_runs_the_agent_file_the_flags_name(tmp_path):
    """vllm_engine._load_agent_executor: spec_from_file_location + exec_module, no sys.modules entry."""
    from ragen2.engines.openrlhf.flags import agent_path

    load = modules["openrlhf.trainer.ray.vllm_engine"]._load_agent_executor
    executor = load(str(agent_path()))
    assert type(executor) is agent_lib.AgentExecutor  # the entry file hands over the one installed class
    assert isinstance(executor, AgentExecutorBase) and executor._members == {}
    # agent.py itself loads that way too (a second copy of the class, under OpenRLHF's module name)
    direct = load(str(agent_path().with_name("agent.py")))
    assert type(direct).__module__ == "agent_module" and isinstance(direct, AgentExecutorBase)
    assert direct.__class__ is not agent_lib.AgentExecutor
    # What broke before: a dataclass under `from __future__ import annotations` in a file run this way.
    broken = tmp_path / "broken_agent.py"
    broken.write_text("from __future__ import annotations\nfrom dataclasses import dataclass\n"
                      "@dataclass\nclass Spec:\n    seed: int\n")
    with pytest.raises(AttributeError, match="__dict__"):
        load(str(broken))
