"""`AgentExecutor` for OpenRLHF's `--train.agent_func_path`: one ragen2 env episode per call.

OpenRLHF loads this file by path in every vLLM rollout worker and calls
`execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine)` once per sample.
Why our own executor rather than OpenRLHF's MultiTurnAgentExecutor: that one lets a turn use
all the context that is left (`max_tokens = max_length - len(tokens)`), re-tokenizes env
feedback without the chat template, and has no format penalty. Here:

- The label (JSON, written by `flags.episode_label`) carries the env, its config, the seed and
  the per-turn limits; the prompt string is only an id.
- The turn protocol is the local engine's own, `ragen2.rollout.episode.Episode`: RAGEN's
  prompts through the tokenizer's chat template, tokenized incrementally (the ids trained on
  are exactly the ids sampled), the prefilled tag, the stop strings, the context rule (here the
  limit is `max_length`, i.e. --data.max_len), the "Reward:" messages and the record. This file
  only samples each turn through vLLM, at most `max_new_tokens` per turn.
- The env's step reward already holds the format penalty; the episode reward is their sum,
  returned as a tensor. Success goes to `scores` and, with other env metrics, to `extra_logs`.
- Only the sampled tokens are in `action_ranges`: template and env tokens are masked out of
  the loss by OpenRLHF's action mask.
- End of turn as the local engine sees it (`finish_reason`): vLLM stops at the tokenizer's EOS
  (finish "stop", stop_reason None) and at the model's generation-config EOS ids (finish "stop",
  stop_reason = the token id), keeping the token either way; both are "eos" here, as the local
  engine stops at the tokenizer's and the generation config's EOS ids. A stop string is "stop".
- Rollout indices: the G samples of a prompt are G concurrent calls with the same label; they get
  indices 0..G-1 (the label's `group_size`), every time the label comes back (each evaluation
  replays the same validation instances), as the local engine numbers each group's members.
- Env code (construction, reset, step, close) may block (DeepCoder runs a sandbox): it runs in
  a thread (`asyncio.to_thread`: the episode's `reset` and `take_reply`, the only calls that
  touch the env), never on the engine's event loop.

Loadable by path: OpenRLHF runs this file with `spec_from_file_location` without registering it
in `sys.modules`, so no `from __future__ import annotations` here (dataclasses would look the
string annotations up in `sys.modules[__module__]` and fail). `flags.agent_path()` names
`agent_entry.py`, which imports this module properly; both load (test_openrlhf_agent.py).
"""

import asyncio
import json
from collections import defaultdict
from copy import deepcopy
from dataclasses import dataclass

import torch
from openrlhf.utils.agent import AgentExecutorBase

import envs
from ragen2 import metric_names as names
from ragen2.rollout.chat import ChatFormat
from ragen2.rollout.episode import STOP_STRINGS, Episode, TurnRules

EXTRA_LOG_KEYS = ("env/success", names.ENV_NUM_TURNS, names.ENV_FORMAT_OK_FRACTION, names.ENV_VALID_ACTION_FRACTION,
                  "env/actions_executed", names.ENV_CONTEXT_TRUNCATED)


class EpisodeLabelError(ValueError):
    """A prompt row's label is not an episode spec written by ragen2."""


@dataclass(frozen=True)
class EpisodeSpec:
    env: str
    env_config: dict
    seed: int
    max_turns: int
    max_new_tokens: int
    max_response_words: int | None = None
    group_size: int | None = None  # samples per prompt (None: a label written before it was added)

    @classmethod
    def from_label(cls, label) -> "EpisodeSpec":
        try:
            data = json.loads(label) if isinstance(label, str) else dict(label)
        except (TypeError, ValueError) as error:
            raise EpisodeLabelError(f"label {label!r:.200} is not a ragen2 episode spec (JSON): {error}") from None
        missing = [k for k in ("env", "env_config", "seed", "max_turns", "max_new_tokens") if k not in data]
        if missing:
            raise EpisodeLabelError(f"label is missing {missing}; was the dataset written by ragen2's flags?")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def make_env(self):
        entry = envs.spec(self.env)
        return entry.env_cls(entry.make_config(**self.env_config))


def _sampled_logprobs(output, ids: list[int]) -> list[float]:
    """vLLM's per-position {token: Logprob} dicts → the sampled tokens' log-probs."""
    values = []
    for token, candidates in zip(ids, output.logprobs):
        entry = candidates.get(token) if candidates is not None else None
        values.append(float(entry.logprob) if entry is not None else 0.0)
    return values


_NO_STOP_REASON = object()


def finish_reason(output, ids: list[int], eos_ids: set[int]) -> str:
    """vLLM's completion in the episode's terms: "eos" (a sampled end-of-turn token, kept as the
    last id), "stop" (a stop string) or "length"."""
    reason = output.finish_reason
    stop_reason = getattr(output, "stop_reason", _NO_STOP_REASON)
    if not ids or reason != "stop":
        return reason
    if stop_reason is _NO_STOP_REASON:  # an engine that does not say why it stopped
        return "eos" if ids[-1] in eos_ids else reason
    # vLLM (v1 check_stop): its EOS leaves stop_reason None, a stop token id (the generation
    # config's other EOS ids) sets it to that id; a stop string sets it to the string
    if stop_reason is None or (isinstance(stop_reason, int) and not isinstance(stop_reason, bool)
                               and ids[-1] == stop_reason):
        return "eos"
    return reason


class AgentExecutor(AgentExecutorBase):
    def __init__(self):
        # The G samples of one prompt are G calls with the same label, started in order (OpenRLHF's
        # generate_responses): count them so that each gets its own rollout_index (its own dynamics
        # coins on the same instance), 0..G-1 again whenever the label comes back.
        self._members: dict[str, int] = defaultdict(int)

    def _next_member(self, label, group_size: int | None = None) -> int:
        key = label if isinstance(label, str) else json.dumps(label, sort_keys=True)
        member = self._members[key]
        self._members[key] += 1
        return member % group_size if group_size else member

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        spec = EpisodeSpec.from_label(label)
        member = self._next_member(label, spec.group_size)
        env = await asyncio.to_thread(spec.make_env)
        try:
            return await self._play(spec, member, env, prompt, label, sampling_params, max_length, hf_tokenizer,
                                    llm_engine, images)
        finally:
            await asyncio.to_thread(env.close)

    async def _play(self, spec, member, env, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine,
                    images):
        # The context limit is --data.max_len, which the flags set from rollout.max_context_tokens.
        rules = TurnRules(max_turns=spec.max_turns, max_new_tokens=spec.max_new_tokens, max_context_tokens=max_length,
                          max_response_words=spec.max_response_words, limit_name="--data.max_len")
        episode = Episode(env, ChatFormat(hf_tokenizer), rules, seed=spec.seed, rollout_index=member)
        await asyncio.to_thread(episode.reset)
        eos_ids = {t for t in (getattr(hf_tokenizer, "eos_token_id", None),) if t is not None}
        want_logprobs = getattr(sampling_params, "logprobs", None) is not None

        while (tokens := episode.next_prompt()) is not None:
            params = deepcopy(sampling_params)
            params.max_tokens = rules.max_new_tokens  # the per-turn cap, not the context left
            params.stop = list(STOP_STRINGS)
            params.include_stop_str_in_output = True
            request = await llm_engine.generate(tokens, params)
            output = request.outputs[0]
            ids = list(output.token_ids)  # vLLM samples min_tokens >= 1; an empty reply ends the episode
            logprobs = _sampled_logprobs(output, ids) if want_logprobs else [0.0] * len(ids)
            await asyncio.to_thread(episode.take_reply, ids, logprobs, finish_reason(output, ids, eos_ids))
        return self._result(episode, prompt, label, images, want_logprobs)

    @staticmethod
    def _result(episode, prompt, label, images, want_logprobs) -> dict:
        record, trajectory = episode.record, episode.tokens
        end = trajectory.last_sampled_end()  # trailing template / next-turn prompt is not trained on
        turns = len(trajectory.turn_spans)
        actions_executed = sum(len(turn["executed"]) for turn in record.actions)
        extra_logs = dict(zip(EXTRA_LOG_KEYS, (
            float(record.success), float(turns), sum(record.format_ok) / max(1, len(record.format_ok)),
            sum(episode.valid) / max(1, len(episode.valid)), float(actions_executed), float(record.context_truncated))))
        return {
            "prompt": prompt,
            "label": label,
            "images": images,
            "mm_train_inputs": None,
            "reward": torch.tensor(record.reward, dtype=torch.float32),
            "scores": torch.tensor(float(record.success), dtype=torch.float32),
            "observation_tokens": list(trajectory.input_ids[:end]),
            "action_ranges": [tuple(span) for span in trajectory.turn_spans],
            "rollout_log_probs": list(trajectory.logprobs[:end]) if want_logprobs else None,
            # the last turn ran out of tokens
            "truncated": bool(record.finish_reasons) and record.finish_reasons[-1] == "length",
            "extra_logs": extra_logs,
        }
