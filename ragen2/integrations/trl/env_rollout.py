"""Multi-turn ragen2 episodes inside a TRL GRPO run, through TRL's `rollout_func`.

    episodes = EnvRollout("frozenlake", tokenizer, max_turns=3, max_new_tokens=48)
    trainer = RAGEN2GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(...),
                                rollout_func=episodes, reward_funcs=[episodes.reward],
                                train_dataset=episodes.dataset(range(64)), snr_filter="snr-top-p")

TRL 1.16 has two ways to put an environment between turns. `environment_factory` exposes an env's
methods as tools: the model must call them in its chat template's tool-call syntax, so the env's
own format (`<think>…</think><answer>…</answer>`, the "Reward:" feedback, the format penalty) is
not what the model writes, and it needs a tool-calling template. `rollout_func` (experimental in
1.16) hands the batch's prompts to a function that returns prompt ids, completion ids, log-probs,
an `env_mask` (1 on the tokens the policy sampled: the loss mask) and extra per-completion fields
for the reward functions. This uses the latter, so an episode is exactly ragen2's StarPO rollout
(`ragen2.rollout.rollout`, context "full": one row per episode): the completion is every token
after the first prompt, the env's turns masked out, and the reward is the episode's summed turn
rewards, format penalties included.

The prompt column is the first prompt as text (what `EnvReward.prompt` writes); TRL passes only
prompts to `rollout_func`, so each prompt maps back to its seed through the dataset this builds.
The G consecutive copies of a prompt that TRL's sampler yields are one group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

import envs
from ragen2.config import load_config
from ragen2.integrations.trl.env_reward import first_prompt_text, seed_dataset
from ragen2.rollout.chat import ChatFormat
from ragen2.rollout.config import RolloutConfig
from ragen2.rollout.episode import TurnRules

REWARD_FIELD = "ragen2_episode_reward"


# A setting left at FROM_PRESET takes the value `ragen2 train --env ENV` uses (configs/envs/ENV.yaml,
# else RolloutConfig's default): one default per field, not a second set here.
FROM_PRESET: Any = type("FromPreset", (), {"__repr__": lambda self: "FROM_PRESET"})()


class EnvRollout:
    """A TRL `rollout_func` running ragen2's multi-turn episodes of a registered env (see the module doc).

    max_turns, max_new_tokens (per turn), max_context_tokens, prefill, max_response_words:
    `ragen2.rollout.RolloutConfig`'s fields, each by default the env's training preset's value
    (`FROM_PRESET`; `self.settings` shows what was taken); temperature and top_p come from the
    trainer's GRPOConfig. env_overrides: the env's config fields.
    """

    def __init__(self, env: str, tokenizer, *, max_turns: int = FROM_PRESET, max_new_tokens: int = FROM_PRESET,
                 max_context_tokens: int = FROM_PRESET, prefill: bool = FROM_PRESET,
                 max_response_words: int | None = FROM_PRESET, **env_overrides: Any):
        spec = envs.spec(env)
        self.env_name = spec.name
        self._make_env = lambda: spec.env_cls(spec.make_config(**env_overrides))
        self.tokenizer = tokenizer
        given = dict(max_turns=max_turns, max_new_tokens=max_new_tokens, max_context_tokens=max_context_tokens,
                     max_response_words=max_response_words, prefill_tag=prefill)
        preset = load_config(env=env).rollout if any(v is FROM_PRESET for v in given.values()) else None
        self.settings = {key: getattr(preset, key) if value is FROM_PRESET else value for key, value in given.items()}
        self.settings["context"] = "full"
        RolloutConfig(**self.settings)  # fail on bad settings now, not at the first step
        self._seed_of: dict[str, int] = {}
        self.reward = _episode_reward(f"ragen2_{spec.name}")

    def prompt(self, seed: int) -> str:
        """Instance `seed`'s first prompt, as text (the dataset's `prompt`)."""
        rules = TurnRules(max_turns=1, max_new_tokens=0, max_context_tokens=2**62,
                          max_response_words=self.settings["max_response_words"], prefill=self.settings["prefill_tag"])
        text = first_prompt_text(self._make_env(), ChatFormat(self.tokenizer), rules, seed)
        self._seed_of.setdefault(text, int(seed))  # equal prompts are equal instances: any of their seeds will do
        return text

    def dataset(self, seeds: Iterable[int]):
        """A `datasets.Dataset` with columns `prompt` and `seed`; its prompts are the ones this maps back."""
        return seed_dataset(self.prompt, seeds)

    def __call__(self, prompts: list[str], trainer) -> dict[str, list]:
        from ragen2.rollout.agent_loop import rollout

        group_size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        seeds = self._group_seeds(prompts, group_size)
        config = RolloutConfig(group_size=group_size, temperature=float(trainer.args.temperature),
                               top_p=float(trainer.args.top_p), **self.settings)
        # The sampler's stream is the run's seed and the step: reproducible, new every step.
        generator = torch.Generator().manual_seed(int(trainer.args.seed) * 1_000_003 + int(trainer.state.global_step))
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        try:
            batch = rollout(model, self.tokenizer, self._make_env, seeds, config, generator)
        finally:
            model.train(was_training)  # ragen2's sampler puts the model in eval mode
        return self.to_trl(batch)

    def _group_seeds(self, prompts: list[str], group_size: int) -> list[int]:
        if len(prompts) % group_size:
            raise ValueError(f"{len(prompts)} prompts on this process are not whole groups of {group_size}: make "
                             "per_device_train_batch_size x steps_per_generation a multiple of num_generations")
        seeds = []
        for start in range(0, len(prompts), group_size):
            group = prompts[start:start + group_size]
            if any(p != group[0] for p in group) or not isinstance(group[0], str) or group[0] not in self._seed_of:
                raise ValueError("EnvRollout needs the prompts of its own dataset (EnvRollout.dataset), each "
                                 f"repeated num_generations={group_size} times in a row as TRL's sampler gives them")
            seeds.append(self._seed_of[group[0]])
        return seeds

    @staticmethod
    def to_trl(batch) -> dict[str, list]:
        """TRL's rollout output from a full-context `RolloutBatch`: one completion per episode."""
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                REWARD_FIELD: [], "ragen2_success": [], "ragen2_format_ok": []}
        for row in range(batch.input_ids.shape[0]):
            length = int(batch.attention_mask[row].sum())
            ids = batch.input_ids[row, :length].tolist()
            sampled = batch.response_mask[row, :length].bool()
            first = int(sampled.int().argmax()) if sampled.any() else length
            record = batch.trajectories[int(batch.traj_index[row])]
            out["prompt_ids"].append(ids[:first])
            out["completion_ids"].append(ids[first:])
            out["logprobs"].append(batch.sampling_logprobs[row, first:length].tolist())
            out["env_mask"].append(sampled[first:].int().tolist())
            out[REWARD_FIELD].append(record.reward)
            out["ragen2_success"].append(float(record.success))
            out["ragen2_format_ok"].append(float(all(record.format_ok)) if record.format_ok else 0.0)
        return out


def _episode_reward(name: str):
    """The reward function that reads each episode's reward from the rollout's extra fields."""

    def reward(completions, log_metric=None, **fields):
        rewards = [float(r) for r in fields[REWARD_FIELD]]
        if log_metric is not None and rewards:
            log_metric(f"{name}/success", sum(fields["ragen2_success"]) / len(rewards))
            log_metric(f"{name}/format_ok", sum(fields["ragen2_format_ok"]) / len(rewards))
        return rewards

    reward.__name__ = name
    return reward
