"""The two engines' turn protocols give the same conversation, token for token (no OpenRLHF needed).

The OpenRLHF agent (ragen2/engines/openrlhf/agent.py) is loaded by path as OpenRLHF loads it,
with a bare `openrlhf.utils.agent.AgentExecutorBase` when OpenRLHF is not installed (the agent
only subclasses it); a fake engine replays the same replies a ScriptedPolicy gives the local
rollout. Both must render RAGEN-2's "Reward:" message (the env reward, no format penalty), and
both must take every protocol decision in ragen2.rollout.episode: a change made there alone shows
up in both engines' token ids.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
import torch

import envs
import ragen2.rollout.episode as episode_module
from ragen2.rollout import RolloutConfig, rollout
from tests import agent_file
from tests.tiny import ScriptedPolicy

# Turn 1 runs nothing (penalty -0.5, shown "0"); turn 2 one step Down and one invalid piece
# (-0.1 - 0.5 trained, "-0.1" shown); turn 3 steps Up (-0.1).
REPLIES = {1: "<think>a</think><answer>Jump</answer>", 2: "<think>b</think><answer>Down || Fly</answer>",
           3: "<think>c</think><answer>Up</answer>"}


def load_agent_module():
    return agent_file.load_agent_module('ragen2_agent_under_test')


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


def room_env(**config):
    env = envs.make("sokoban", format_penalty=-0.5, **config)
    original_reset = env.reset

    def reset(seed=None, options=None):  # a hand-built room: every step's reward is known
        original_reset(seed=seed, options=options)
        env.load_room(["######", "#PXO_#", "#____#", "######"])
        return env.render(), {}

    env.reset = reset
    return env


def local_episode(tok, context_limit=4096, **config) -> tuple[list[int], float, bool]:
    """(token ids, reward, context-truncated) of the episode the local rollout plays."""
    policy = ScriptedPolicy(tok, lambda p: REPLIES[int(p.rsplit("Turn ", 1)[1].split(":")[0])][len("<think>"):],
                            generation_prompt="<think>", end_with_eos=True)
    cfg = RolloutConfig(group_size=1, max_turns=3, max_new_tokens=40, max_context_tokens=context_limit)
    batch = rollout(policy, tok, lambda: room_env(**config), [5], cfg, torch.Generator().manual_seed(0))
    ids = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
    return ids, batch.traj_rewards[0].item(), bool(batch.context_truncated[0])


def openrlhf_output(tok, monkeypatch, context_limit=4096, **config) -> dict:
    """What the OpenRLHF agent, loaded by path as OpenRLHF loads it, returns for the same episode."""
    agent = load_agent_module()
    monkeypatch.setattr(agent.EpisodeSpec, "make_env", lambda self: room_env(**config))
    label = json.dumps({"env": "sokoban", "env_config": {}, "seed": 5, "max_turns": 3, "max_new_tokens": 40})
    params = SimpleNamespace(temperature=1.0, max_tokens=40, logprobs=None)
    return asyncio.run(agent.AgentExecutor().execute("p", label, params, context_limit, tok, FakeEngine(tok)))


def openrlhf_episode(tok, monkeypatch, context_limit=4096, **config) -> tuple[list[int], float, bool]:
    out = openrlhf_output(tok, monkeypatch, context_limit, **config)
    return out["observation_tokens"], out["reward"].item(), out["extra_logs"]["env/context_truncated"] == 1.0


def local_text(tok, **config) -> str:
    ids, reward, _ = local_episode(tok, **config)
    assert reward == pytest.approx(-0.5 + -0.6 + -0.1)
    return tok.decode(ids, skip_special_tokens=False)


def openrlhf_text(tok, monkeypatch, **config) -> str:
    ids, reward, _ = openrlhf_episode(tok, monkeypatch, **config)
    assert reward == pytest.approx(-1.2)
    return tok.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("feedback, shown", [("env", ("0", "-0.1")), ("with_penalty", ("-0.5", "-0.6"))])
def test_both_engines_write_the_same_conversation_and_reward_message(tok, monkeypatch, feedback, shown):
    local = local_text(tok, reward_feedback=feedback)
    remote = openrlhf_text(tok, monkeypatch, reward_feedback=feedback)
    assert local == remote
    assert f"<|im_start|>user\nReward:\n{shown[0]}\n\nTurn 2:\n" in local
    assert f"<|im_start|>user\nReward:\n{shown[1]}\n\nTurn 3:\n" in local


def test_a_protocol_change_made_in_the_episode_module_alone_reaches_both_engines(tok, monkeypatch):
    """Both engines take the first messages and the reward / next-turn message from the episode
    module: rewrite them there and both token lists change, identically."""
    first_turn, after = episode_module.first_turn_messages, episode_module.after_turn

    def marked_first_turn(env, observation, max_response_words=None):
        system, user = first_turn(env, observation, max_response_words)
        return {**system, "content": system["content"] + " [protocol v2]"}, user

    def marked_after(env, next_turn, observation, reward, info, **kwargs):
        feedback, state = after(env, next_turn, observation, reward, info, **kwargs)
        return f"Score {next_turn - 1}: " + feedback, state

    before = local_text(tok)
    monkeypatch.setattr(episode_module, "first_turn_messages", marked_first_turn)
    monkeypatch.setattr(episode_module, "after_turn", marked_after)
    local, remote = local_text(tok), openrlhf_text(tok, monkeypatch)
    assert local == remote != before
    assert local.count("[protocol v2]") == 1
    assert "user\nScore 1: Reward:\n0\n" in local and "user\nScore 2: Reward:\n-0.1\n" in local


@pytest.mark.parametrize("turns_that_fit", [1, 2])
def test_both_engines_end_an_episode_at_the_same_turn_when_the_context_runs_out(tok, monkeypatch, turns_that_fit):
    starts = [start for start, _ in openrlhf_output(tok, monkeypatch)["action_ranges"]]  # = each prompt's length
    limit = starts[turns_that_fit] + 40 - 1  # the next prompt + its 40-token cap is one token too many
    local, remote = local_episode(tok, limit), openrlhf_episode(tok, monkeypatch, limit)
    assert local == remote
    ids, reward, context_truncated = local
    assert context_truncated and reward == pytest.approx([-0.5, -0.5 - 0.6][turns_that_fit - 1])
    assert tok.decode(ids).count("<|im_start|>assistant") == turns_that_fit


def test_both_engines_refuse_a_first_prompt_without_room_for_a_turn_naming_the_limit(tok, monkeypatch):
    limit = openrlhf_output(tok, monkeypatch)["action_ranges"][0][0] + 40 - 1
    local_error = rf"first prompt of group 0 \(SokobanEnv seed 5\) .* max_context_tokens={limit}"
    with pytest.raises(ValueError, match=local_error):
        local_episode(tok, limit)
    with pytest.raises(ValueError, match=f"first prompt of SokobanEnv seed 5 .* exceeds --data.max_len={limit}"):
        openrlhf_episode(tok, monkeypatch, limit)


def test_an_episode_driven_by_hand_needs_no_engine_and_ends_on_an_empty_reply(tok):
    from ragen2.rollout.chat import ChatFormat

    rules = episode_module.TurnRules(max_turns=3, max_new_tokens=40, max_context_tokens=4096)
    episode = episode_module.Episode(room_env(), ChatFormat(tok), rules, seed=5)
    episode.reset()
    with pytest.raises(RuntimeError, match="without a pending next_prompt"):
        episode.take_reply([5], [0.0], "stop")
    prompt = episode.next_prompt()
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n<think>") and episode.next_prompt() == prompt
    reply = tok(REPLIES[1][len("<think>"):], add_special_tokens=False)["input_ids"]
    episode.take_reply(reply, [-0.5] * len(reply), "stop")
    assert episode.record.response_texts == [REPLIES[1]] and episode.record.turn_rewards == [-0.5]
    assert "Reward:\n0\n" in tok.decode(episode.next_prompt())
    episode.take_reply([], [], "length")  # nothing sampled: nothing to step the env with
    assert episode.done and episode.next_prompt() is None and episode.record.turn_rewards == [-0.5]
    [row] = episode.rows()
    assert row.input_ids[-len(reply):] == reply and sum(row.sampled) == len(reply)
