"""The StarPO rollout: P groups x G samples, K turns, one batched generation per turn.

    batch = rollout(model, tokenizer, lambda: envs.make("sokoban"), seeds=[11, 12], config=cfg,
                    generator=torch.Generator().manual_seed(0))

Group g's G members reset with the same seed (the same instance) and `rollout_index` = member
(their own dynamics coins). Each turn: every live episode's prompt goes into one `generate`
call; each reply is decoded (special tokens skipped) and passed to `env.step`; episodes that
are terminated, truncated, out of turns, or whose next prompt would not fit in
`max_context_tokens` leave the batch.

Prompts follow RAGEN: [system, user("Turn 1: ...")], and after turn k the user message
"Reward:\\n{r}\\n" with the next turn's state message appended to it (one user message;
`envs.prompt.after_turn`, shared with the OpenRLHF agent; r is the env's reward without the
format penalty unless the env's `reward_feedback="with_penalty"`).
Context "full" keeps the whole history as one token list (chat.TokenTrajectory: exact sampled
ids, one training row per trajectory); "window" prompts with the system message plus the last
`window_turns` turns (the current one included) and makes each turn its own training row.

Rewards: a turn's reward is the env's step reward, which already includes the format penalty
(trained on, not shown in the "Reward:" message by default); the trajectory reward is their sum.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from envs.parsing import ANSWER_OPEN, THINK_OPEN
from envs.prompt import after_turn, first_turn_messages
from ragen2.progress import RolloutProgress
from ragen2.rollout.batch import RolloutBatch, RowRecord, TrajectoryRecord
from ragen2.rollout.chat import ChatFormat, TokenTrajectory, reasoning_span, reply_text
from ragen2.rollout.config import RolloutConfig, RolloutConfigError
from ragen2.rollout.generation import generate, use_fast_backend
from ragen2.rollout.session import GenerationSession


def eos_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's EOS plus the model's generation-config EOS ids (Llama-3 has several)."""
    ids = []
    candidates = [getattr(tokenizer, "eos_token_id", None)]
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    candidates += list(configured) if isinstance(configured, (list, tuple)) else [configured]
    for token in candidates:
        if token is not None and int(token) not in ids:
            ids.append(int(token))
    return ids


def pad_token_id(tokenizer) -> int:
    for token in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if token is not None:
            return int(token)
    return 0


class _Episode:
    """One env episode in progress: its messages, tokens and record."""

    def __init__(self, env, record: TrajectoryRecord, chat: ChatFormat, config: RolloutConfig, index: int):
        self.env, self.record, self.chat, self.config, self.index = env, record, chat, config, index
        observation, _ = env.reset(seed=record.seed, options={"rollout_index": record.member})
        record.observations.append(str(observation))
        system, first_user = first_turn_messages(env, observation, config.max_response_words)
        self.system = system
        self.user_contents = [first_user["content"]]  # the user message that opens each turn
        self.turn_texts = [first_user["content"]]  # the same without the previous "Reward:" part
        self.replies: list[str] = []
        self.rows: list[RowRecord] = []  # window mode: one per turn
        self.reasoning: list[tuple[int, int, int]] = []  # full mode: (turn, start, end) in the row
        self.prefill = (THINK_OPEN if env.config.require_think else ANSWER_OPEN) if config.prefill_tag else ""
        self.tokens = (TokenTrajectory(chat, [system, first_user], prefill=self.prefill)
                       if config.context == "full" else None)
        self.done = False

    @property
    def turn(self) -> int:
        return len(self.replies)

    def window_messages(self) -> list[dict]:
        k = self.turn
        start = max(0, k - self.config.window_turns + 1)
        messages = [self.system, {"role": "user", "content": self.turn_texts[start]}]
        for j in range(start, k):
            messages.append({"role": "assistant", "content": self.replies[j]})
            messages.append({"role": "user", "content": self.user_contents[j + 1]})
        return messages

    def prompt_ids(self) -> list[int]:
        if self.tokens is not None:
            return self.tokens.input_ids
        return self.chat.prompt_ids(self.window_messages(), self.prefill)

    def take_turn(self, prompt: list[int], ids: list[int], logprobs: list[float], finish_reason: str) -> None:
        k, ended_with_eos = self.turn, finish_reason == "eos"
        text = self.prefill + reply_text(self.chat, ids, ended_with_eos)
        observation, reward, terminated, truncated, info = self.env.step(text)
        span = reasoning_span(self.chat, ids, self.prefill)
        record = self.record
        record.turn_rewards.append(float(reward))
        record.response_texts.append(text)
        record.parse_errors.append(info["parse"]["error"])
        record.format_ok.append(bool(info["parse"]["format_ok"]))
        record.think_lengths.append(span[1] - span[0] if span else 0)
        record.response_lengths.append(len(ids))
        record.finish_reasons.append(finish_reason)
        record.observations.append(str(observation))
        record.actions.append({"parsed": list(info["parse"]["actions"]), "executed": list(info["actions_executed"]),
                               "num_invalid": int(info["parse"]["num_invalid"])})
        record.success = bool(info["success"])
        self.replies.append(text)

        if self.tokens is not None:  # full: extend the one row
            offset = len(self.tokens.input_ids)
            self.tokens.add_reply(ids, logprobs, text, ended_with_eos=ended_with_eos)
        else:  # window: this turn's prompt + reply is a row of its own
            offset = len(prompt)
        reasoning = [(k, offset + span[0], offset + span[1])] if span else []
        if self.tokens is not None:
            self.reasoning.extend(reasoning)
        else:
            self.rows.append(RowRecord(
                traj=self.index, input_ids=list(prompt) + list(ids),
                sampled=[False] * len(prompt) + [True] * len(ids),
                logprobs=[0.0] * len(prompt) + list(logprobs),
                turn_index=[-1] * len(prompt) + [k] * len(ids),
                turn_ends=[(k, offset + len(ids) - 1)],
                reasoning=reasoning,
            ))

        if terminated or truncated or k + 1 >= self.config.max_turns:
            self.done = True
            return
        feedback, next_turn = after_turn(self.env, k + 2, observation, reward, info,
                                         max_response_words=self.config.max_response_words)
        self.turn_texts.append(next_turn)
        self.user_contents.append(feedback + next_turn)
        if self.tokens is not None:
            self.tokens.add_user(self.user_contents[-1])

    def end_for_context(self) -> None:
        self.record.context_truncated = True
        self.record.success = False
        self.done = True

    def final_rows(self) -> list[RowRecord]:
        if self.tokens is None:
            return self.rows
        t = self.tokens
        end = t.last_sampled_end()  # the row ends at the last sampled token
        return [RowRecord(
            traj=self.index, input_ids=t.input_ids[:end], sampled=t.sampled[:end], logprobs=t.logprobs[:end],
            turn_index=t.turn_index[:end], turn_ends=[(k, e - 1) for k, (_, e) in enumerate(t.turn_spans)],
            reasoning=list(self.reasoning),
        )]


def rollout(model, tokenizer, env_factory: Callable[[], object], seeds: Sequence[int], config: RolloutConfig,
            generator: torch.Generator | None = None, progress=None) -> RolloutBatch:
    """Roll out len(seeds) groups of config.group_size episodes; see the module doc.

    With the fast backend one GenerationSession serves every turn: each episode keeps its KV
    cache, so turn k feeds only the tokens added since turn k-1 (the reply's last token, the
    env's reward and next state). `progress(ragen2.progress.RolloutProgress)` is called as
    tokens are sampled (ragen2.progress.LiveLine draws it).
    """
    if not seeds:
        raise ValueError("rollout needs at least one seed (one per group)")
    chat = ChatFormat(tokenizer)
    episodes = []
    for g, seed in enumerate(seeds):
        for member in range(config.group_size):
            record = TrajectoryRecord(group=g, member=member, seed=int(seed))
            episodes.append(_Episode(env_factory(), record, chat, config, index=len(episodes)))
    eos_ids, pad_id = eos_token_ids(model, tokenizer), pad_token_id(tokenizer)
    sampling = dict(temperature=config.temperature, top_p=config.top_p, stop_strings=config.stop_strings,
                    eos_token_ids=eos_ids, pad_token_id=pad_id, tokenizer=tokenizer, generator=generator)
    session = GenerationSession(model, **sampling) if use_fast_backend(model, config.backend) else None
    turn, sampled_before = 0, 0

    while True:
        live, prompts = [], []
        for episode in episodes:
            if episode.done:
                continue
            prompt = episode.prompt_ids()
            if len(prompt) + config.max_new_tokens > config.max_context_tokens:
                if episode.turn == 0:
                    raise RolloutConfigError(
                        f"the first prompt of group {episode.record.group} has {len(prompt)} tokens; with "
                        f"max_new_tokens={config.max_new_tokens} it exceeds max_context_tokens="
                        f"{config.max_context_tokens}: raise max_context_tokens")
                episode.end_for_context()
                continue
            live.append(episode)
            prompts.append(prompt)
        if session is not None:  # ended episodes free their cache rows
            session.release([e.index for e in episodes if e.done])
        if not live:
            break
        turn += 1
        done = sum(e.done for e in episodes)

        def on_step(rows: int, tokens: int, turn=turn, base=sampled_before, starting=len(live), done=done) -> None:
            progress(RolloutProgress(turn, config.max_turns, rows, starting, tokens, base + tokens,
                                     config.max_new_tokens, done, len(episodes)))

        if session is not None:
            results = session.generate([e.index for e in live], prompts, max_new_tokens=config.max_new_tokens,
                                       on_step=on_step if progress is not None else None)
        else:
            results = generate(model, prompts, max_new_tokens=config.max_new_tokens, backend="hf", **sampling)
        turn_tokens = sum(len(r.token_ids) for r in results)
        sampled_before += turn_tokens
        for episode, prompt, result in zip(live, prompts, results):
            episode.take_turn(list(prompt), result.token_ids, result.logprobs, result.finish_reason)
        if progress is not None:
            progress(RolloutProgress(turn, config.max_turns, 0, len(live), turn_tokens, sampled_before,
                                     config.max_new_tokens, sum(e.done for e in episodes), len(episodes)))

    rows = [row for episode in episodes for row in episode.final_rows()]
    for episode in episodes:
        episode.env.close()
    return RolloutBatch.from_records(rows, [e.record for e in episodes], pad_token_id=pad_id,
                                     group_size=config.group_size)


def group_pass_rate(trajectories: Sequence[TrajectoryRecord]) -> float:
    """The share of groups in which at least one member succeeded (pass@G)."""
    passed: dict[int, bool] = {}
    for t in trajectories:
        passed[t.group] = passed.get(t.group, False) or t.success
    return sum(passed.values()) / len(passed) if passed else 0.0


def evaluate(model, tokenizer, env_factory: Callable[[], object], seeds: Sequence[int], config: RolloutConfig,
             generator: torch.Generator | None = None, progress=None) -> dict[str, float]:
    """Validation: success rate over all episodes and pass@G (a group passes if any member succeeds)."""
    batch = rollout(model, tokenizer, env_factory, seeds, config, generator, progress=progress)
    metrics = batch.metrics(prefix="val/")
    return {
        "val/success_rate": metrics["val/success_rate"],
        f"val/pass@{config.group_size}": group_pass_rate(batch.trajectories),
        "val/reward_mean": metrics["val/reward_mean"],
        "val/format_ok_fraction": metrics["val/format_ok_fraction"],
        "val/num_groups": metrics["val/num_groups"],
    }
