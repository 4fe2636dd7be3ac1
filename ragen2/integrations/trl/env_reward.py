"""Any registered ragen2 env as a TRL GRPO task: a prompt dataset and a reward function.

    reward = EnvReward("bandit", tokenizer, require_think=False)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[reward],
                          train_dataset=reward.dataset(range(64)), args=GRPOConfig(...))

Single turn. A row is one env instance (a seed): its prompt is the env's first turn as ragen2's
local engine writes it (`envs.prompt.first_turn_messages`, the tokenizer's chat template, and the
prefilled `<think>` / `<answer>` tag), as text, so TRL generates after exactly those tokens. The
reward of a completion is the env's step reward for that turn with the env's format rules (the
format penalty included): it is scored by `ragen2.rollout.episode.Episode`, the turn protocol both
ragen2 engines run, so the env sees what it would see under ragen2 (prefill + the decoded reply,
the final EOS dropped).

Multi-turn episodes need the env between turns, which a reward function cannot be:
`ragen2.integrations.trl.env_rollout.EnvRollout` runs them as TRL's `rollout_func`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import envs
from envs.parsing import prefill_tag
from envs.prompt import first_turn_messages
from ragen2.rollout.chat import ChatFormat
from ragen2.rollout.episode import Episode, TurnRules

# A prompt is any length: the context limit is the trainer's business (max_prompt_length, the model's).
_NO_CONTEXT_LIMIT = 2**62


class EnvReward:
    """A TRL reward function scoring completions with a ragen2 env (see the module doc).

    env                a registered env name (`ragen2 envs list` shows them).
    tokenizer          the policy's tokenizer, with a chat template.
    prefill            open the assistant turn with `<think>` (`<answer>` in answer-only mode), as ragen2 does.
    max_response_words the prompt's length hint; None: the env's default.
    env_overrides      the env's config fields (e.g. require_think=False).

    TRL calls it with the dataset's `seed` column; TRL logs its rewards under its `__name__`
    (`ragen2_<env>`) and, through `log_metric`, the turn's success and format rates.
    """

    def __init__(self, env: str, tokenizer, *, prefill: bool = True, max_response_words: int | None = None,
                 **env_overrides: Any):
        spec = envs.spec(env)
        self.env_name = spec.name
        self.env = spec.env_cls(spec.make_config(**env_overrides))
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.rules = TurnRules(max_turns=1, max_new_tokens=0, max_context_tokens=_NO_CONTEXT_LIMIT,
                               max_response_words=max_response_words, prefill=prefill)
        self.__name__ = f"ragen2_{spec.name}"
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}

    # --- the data ---------------------------------------------------------------------------

    def prompt(self, seed: int) -> str:
        """The first-turn prompt of the instance `seed`, as text for TRL to tokenize."""
        return first_prompt_text(self.env, self.chat, self.rules, seed)

    def dataset(self, seeds: Iterable[int]):
        """A `datasets.Dataset` with columns `prompt` (text) and `seed`: one row per env instance."""
        return seed_dataset(self.prompt, seeds)

    # --- the reward -------------------------------------------------------------------------

    def __call__(self, prompts: list, completions: list, completion_ids: list[list[int]], seed: list[int],
                 trainer_state=None, log_metric=None, **kwargs: Any) -> list[float]:
        # The G completions of a seed are its group: each gets its own dynamics stream (a risky arm's
        # coin), and the stream moves on with the step, so a finite dataset seen again draws anew.
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        seen: Counter[int] = Counter()
        rewards, successes, formats = [], [], []
        for ids, instance in zip(completion_ids, seed, strict=True):
            instance = int(instance)
            member = step * len(completion_ids) + seen[instance]
            seen[instance] += 1
            record = self.score(list(ids), instance, member)
            rewards.append(float(sum(record.turn_rewards)))
            successes.append(float(record.success))
            formats.append(float(all(record.format_ok)) if record.format_ok else 0.0)
        if log_metric is not None and rewards:
            log_metric(f"{self.__name__}/success", sum(successes) / len(successes))
            log_metric(f"{self.__name__}/format_ok", sum(formats) / len(formats))
        return rewards

    def score(self, ids: list[int], seed: int, rollout_index: int = 0):
        """The `TrajectoryRecord` of one completion `ids` on instance `seed` (one turn)."""
        episode = Episode(self.env, self.chat, self.rules, seed=seed, rollout_index=rollout_index)
        episode.reset()
        episode.next_prompt()
        finish = "eos" if ids and ids[-1] in self.eos_ids else "length"
        episode.take_reply(ids, [0.0] * len(ids), finish)
        return episode.record


def first_prompt_text(env, chat: ChatFormat, rules: TurnRules, seed: int) -> str:
    """Instance `seed`'s first prompt as ragen2 writes it (messages, chat template, prefill), as text."""
    observation, _ = env.reset(seed=int(seed))
    messages = first_turn_messages(env, observation, rules.max_response_words)
    text = chat.render(messages, add_generation_prompt=True)
    if rules.prefill:
        text += prefill_tag(env.config.require_think)
    # TRL encodes a text prompt with the tokenizer's special tokens; one that adds BOS itself
    # (Llama-3) would then have two when the template also writes it.
    tokenizer = chat.tokenizer
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos) and tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]:
        text = text[len(bos):]
    return text


def seed_dataset(prompt_of, seeds: Iterable[int]):
    """A `datasets.Dataset` with columns `prompt` (`prompt_of(seed)`) and `seed`."""
    from datasets import Dataset

    seeds = [int(s) for s in seeds]
    return Dataset.from_dict({"prompt": [prompt_of(s) for s in seeds], "seed": seeds})


def env_dataset(env: str, tokenizer, seeds: Iterable[int], **kwargs: Any):
    """`EnvReward(env, tokenizer, **kwargs).dataset(seeds)`: the prompts alone."""
    return EnvReward(env, tokenizer, **kwargs).dataset(seeds)
