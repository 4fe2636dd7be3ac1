"""Multi-turn episodes as TRL's rollout_func output (no TRL needed: a stand-in trainer carries what
TRL's GRPOTrainer gives a rollout_func)."""

from types import SimpleNamespace

import pytest
import torch

import envs
from ragen2.integrations.trl.env_rollout import REWARD_FIELD, EnvRollout
from ragen2.rollout.agent_loop import rollout
from ragen2.rollout.config import RolloutConfig
from tests.tiny import tiny_llama, tiny_tokenizer

G = 2
SETTINGS = dict(max_turns=2, max_new_tokens=6, max_context_tokens=2048)


def stand_in_trainer(model, step=3):
    return SimpleNamespace(
        model=model, num_generations=G, num_generations_eval=G,
        args=SimpleNamespace(temperature=1.0, top_p=1.0, seed=7),
        state=SimpleNamespace(global_step=step),
        accelerator=SimpleNamespace(unwrap_model=lambda m: m))


@pytest.fixture(scope="module")
def setup():
    tokenizer = tiny_tokenizer("chatml")
    model = tiny_llama(tokenizer, seed=2).train()
    episodes = EnvRollout("frozenlake", tokenizer, **SETTINGS)
    data = episodes.dataset([5, 6])
    return tokenizer, model, episodes, data


def test_the_output_is_ragen2s_rollout_with_env_tokens_masked(setup):
    tokenizer, model, episodes, data = setup
    prompts = [p for p in data["prompt"] for _ in range(G)]  # TRL's sampler: each prompt G times in a row
    out = episodes(prompts, stand_in_trainer(model))
    assert model.training  # put back after sampling

    # The same rollout, run directly with the generator the adapter derives from (seed, step).
    generator = torch.Generator().manual_seed(7 * 1_000_003 + 3)
    config = RolloutConfig(group_size=G, prefill_tag=True, context="full", **SETTINGS)
    batch = rollout(model, tokenizer, lambda: envs.make("frozenlake"), [5, 6], config, generator)
    model.train()
    assert len(out["completion_ids"]) == len(prompts)
    for row in range(len(prompts)):
        length = int(batch.attention_mask[row].sum())
        ids = batch.input_ids[row, :length].tolist()
        prompt, completion = out["prompt_ids"][row], out["completion_ids"][row]
        assert prompt + completion == ids
        assert tokenizer(prompts[row])["input_ids"] == prompt  # the dataset's text is the first prompt
        assert out["env_mask"][row] == batch.response_mask[row, len(prompt):length].int().tolist()
        assert len(out["logprobs"][row]) == len(completion)
        assert out[REWARD_FIELD][row] == batch.trajectories[row].reward
    # More than one turn: the env's feedback lies inside the completion, masked out of the loss.
    assert any(0 in mask[:-1] for mask in out["env_mask"])


def test_the_reward_function_reads_the_episode_reward_and_logs_rates(setup):
    _, _, episodes, _ = setup
    logged = {}
    rewards = episodes.reward(completions=["a", "b"], log_metric=logged.__setitem__,
                              **{REWARD_FIELD: [-0.2, 1.0], "ragen2_success": [0.0, 1.0],
                                 "ragen2_format_ok": [0.0, 1.0]})
    assert rewards == [-0.2, 1.0] and episodes.reward.__name__ == "ragen2_frozen_lake"
    assert logged == {"ragen2_frozen_lake/success": 0.5, "ragen2_frozen_lake/format_ok": 0.5}


def test_prompts_must_be_whole_groups_of_its_own_dataset(setup):
    _, model, episodes, data = setup
    with pytest.raises(ValueError, match="whole groups"):
        episodes(data["prompt"][:1] * 3, stand_in_trainer(model))
    with pytest.raises(ValueError, match="its own dataset"):
        episodes(["some other prompt"] * G, stand_in_trainer(model))


def test_settings_left_unset_are_the_envs_training_preset_and_given_ones_win(setup):
    from ragen2.config import load_config

    tokenizer = setup[0]
    preset = load_config(env="sokoban").rollout
    assert (preset.max_turns, preset.max_new_tokens, preset.max_response_words) == (5, 48, 100)  # configs/envs/sokoban.yaml
    episodes = EnvRollout("sokoban", tokenizer)
    assert episodes.settings == dict(max_turns=5, max_new_tokens=48, max_context_tokens=preset.max_context_tokens,
                                     max_response_words=100, prefill_tag=preset.prefill_tag, context="full")
    given = EnvRollout("sokoban", tokenizer, max_turns=2, max_response_words=None)
    assert (given.settings["max_turns"], given.settings["max_new_tokens"], given.settings["max_response_words"]) == (2, 48, None)
