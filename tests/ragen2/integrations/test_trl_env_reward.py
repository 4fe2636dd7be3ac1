"""ragen2's envs as TRL data and reward (single turn), checked against the env and ragen2's own prompt."""

import pytest

import envs
from envs.parsing import prefill_tag
from ragen2.integrations.trl.env_reward import EnvReward, env_dataset
from ragen2.rollout.chat import ChatFormat
from ragen2.rollout.episode import Episode, TurnRules
from tests.tiny import tiny_tokenizer


@pytest.fixture(scope="module")
def chatml():
    return tiny_tokenizer("chatml")


@pytest.mark.parametrize("template", ["chatml", "llama3"])
@pytest.mark.parametrize("require_think", [True, False])
def test_trl_tokenizes_the_prompt_into_ragen2s_first_prompt(template, require_think):
    tokenizer = tiny_tokenizer(template)
    reward = EnvReward("bandit", tokenizer, require_think=require_think)
    text = reward.prompt(7)
    assert text.endswith(prefill_tag(require_think))
    # TRL encodes a text prompt with tokenizer(text) (special tokens on): it must give ragen2's ids.
    rules = TurnRules(max_turns=1, max_new_tokens=0, max_context_tokens=10**9)
    episode = Episode(envs.make("bandit", require_think=require_think), ChatFormat(tokenizer), rules, seed=7)
    episode.reset()
    assert tokenizer(text)["input_ids"] == episode.next_prompt()


def test_dataset_rows_are_seeds_and_their_prompts(chatml):
    data = env_dataset("bandit", chatml, [3, 4], require_think=False)
    assert data.column_names == ["prompt", "seed"] and data["seed"] == [3, 4]
    assert data["prompt"][0] == EnvReward("bandit", chatml, require_think=False).prompt(3)


def _encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def test_reward_is_the_env_step_reward_with_its_format_penalty(chatml):
    reward = EnvReward("bandit", chatml, require_think=False)
    env = envs.make("bandit", require_think=False)
    env.reset(seed=5)
    risky, safe = env.high_risk_arm, env.low_risk_arm
    replies = [f" {risky} </answer>"] * 8 + [f" {safe} </answer>", " Nurse || x </answer>", "no answer at all"]
    ids = [_encode(chatml, r) for r in replies]
    logged = {}
    got = reward(prompts=[""] * len(ids), completions=replies, completion_ids=ids, seed=[5] * len(ids),
                 log_metric=logged.__setitem__)
    expected = []
    for member, reply in enumerate(replies):  # member = the completion's place in its group at step 0
        env.reset(seed=5, options={"rollout_index": member})
        expected.append(env.step("<answer>" + reply)[1])
    assert got == expected
    assert expected[-3:] == [0.1, -0.1, -0.1]  # the safe arm; an invalid action and no format: the penalty
    assert len(set(got[:8])) == 2  # the risky arm's coin differs across the group (1.0 or 0.0)
    assert logged["ragen2_bandit/success"] == pytest.approx(8 / 11)
    assert logged["ragen2_bandit/format_ok"] == pytest.approx(10 / 11)


def test_the_coin_moves_on_with_the_step(chatml):
    reward = EnvReward("bandit", chatml, require_think=False)
    env = envs.make("bandit", require_think=False)
    env.reset(seed=5)
    ids = [_encode(chatml, f" {env.high_risk_arm} </answer>")] * 16

    class State:
        global_step = 0

    by_step = []
    for step in (0, 1):
        State.global_step = step
        by_step.append(reward(prompts=[""] * 16, completions=[""] * 16, completion_ids=ids, seed=[5] * 16,
                              trainer_state=State))
    assert by_step[0] != by_step[1]


def test_a_truncated_completion_is_scored_as_the_env_sees_it(chatml):
    reward = EnvReward("bandit", chatml, require_think=False)
    ids = chatml(" Teach", add_special_tokens=False)["input_ids"]  # no EOS: cut by max_completion_length
    record = reward.score(ids, seed=5)
    assert record.finish_reasons == ["length"] and record.turn_rewards == [-0.1]
    assert reward.__name__ == "ragen2_bandit"
