"""One env episode under RAGEN's turn protocol, for any engine that samples tokens.

The protocol is written here once. The local rollout (`ragen2.rollout.agent_loop.rollout`: many
episodes per batched generate call) and the OpenRLHF agent (`ragen2/engines/openrlhf/agent.py`:
one episode per call, env code in a worker thread) both drive an `Episode` the same way:

    episode = Episode(env, ChatFormat(tokenizer), rules, seed=11, rollout_index=0)
    episode.reset()                                   # env.reset (may block)
    while (prompt := episode.next_prompt()) is not None:
        # the engine samples at most rules.max_new_tokens after `prompt`, stopping at STOP_STRINGS
        episode.take_reply(ids, logprobs, finish_reason)  # env.step (may block)

It never samples, and only `reset` and `take_reply` call the env, so a driver chooses where env
code runs (the OpenRLHF agent passes them to `asyncio.to_thread`: DeepCoder's sandbox blocks).

- Messages: [system, user("Turn 1: ...")] (`envs.prompt.first_turn_messages`); after turn k one
  user message, "Reward:\\n{r}\\n" + turn k+1's state (`envs.prompt.after_turn`: r is the env's
  reward without the format penalty unless the env's `reward_feedback="with_penalty"`).
- Every assistant turn opens with the prefilled tag (`envs.parsing.prefill_tag`); the env sees
  that tag + the decoded reply (special tokens skipped, a final sampled EOS dropped).
- Context: a prompt plus `max_new_tokens` must fit in `max_context_tokens`. A first prompt that
  does not is a `ContextLimitError` naming the limit; a later one ends the episode as
  context-truncated (and not a success).
- The episode ends when the env terminates or truncates, after `max_turns` turns, or on a turn
  with no sampled token (nothing to train on, no text to step with).
- Tokens: by default the whole history is one `chat.TokenTrajectory` (the exact sampled ids, one
  training row). With `window_turns=n` each prompt is re-rendered from the system message and
  the last n turns (the current one included), and each turn is a training row of its own.
- Rewards: a turn's reward is the env's step reward, format penalty included; the episode's is
  their sum (`record.reward`). `record` is the `TrajectoryRecord`; `rows()` the training rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from envs.parsing import STOP_STRINGS, prefill_tag
from envs.prompt import after_turn, first_turn_messages
from ragen2.rollout.batch import RowRecord, TrajectoryRecord
from ragen2.rollout.chat import ChatFormat, TokenTrajectory, reasoning_span, reply_text
from ragen2.rollout.config import RolloutConfigError

__all__ = ["STOP_STRINGS", "ContextLimitError", "Episode", "TurnRules"]


class ContextLimitError(RolloutConfigError):
    """An episode's first prompt leaves no room for a turn within the context limit: a limit
    too small for any turn is a config error, whichever engine meets it."""


@dataclass(frozen=True)
class TurnRules:
    """The per-episode limits of the protocol, whatever engine samples."""

    max_turns: int
    max_new_tokens: int  # the cap on one turn's sampled tokens
    max_context_tokens: int  # a prompt + max_new_tokens must fit
    max_response_words: int | None = None  # the prompt's length hint; None: the env's default
    prefill: bool = True  # open every assistant turn with `prefill_tag` in the prompt
    window_turns: int | None = None  # None: the full history; n: the system message + the last n turns
    limit_name: str = "max_context_tokens"  # how the engine's user sets the limit (for the error)


class Episode:
    """One env episode in progress: its messages, tokens and record (see the module doc)."""

    def __init__(self, env, chat: ChatFormat, rules: TurnRules, *, seed: int, rollout_index: int = 0,
                 group: int | None = None, index: int = 0):
        self.env, self.chat, self.rules, self.index, self.group = env, chat, rules, index, group
        self.record = TrajectoryRecord(group=0 if group is None else group, member=rollout_index, seed=int(seed))
        self.prefill = prefill_tag(env.config.require_think) if rules.prefill else ""
        self.system: dict | None = None
        self.user_contents: list[str] = []  # the user message that opens each turn
        self.turn_texts: list[str] = []  # the same without the previous "Reward:" part
        self.replies: list[str] = []  # what the env saw each turn (prefill + decoded reply)
        self.valid: list[bool] = []  # per turn: the env's `action_is_valid`
        self.tokens: TokenTrajectory | None = None  # full history only
        self._rows: list[RowRecord] = []  # window mode: one per turn
        self._reasoning: list[tuple[int, int, int]] = []  # full history: (turn, start, end) in the row
        self._prompt: list[int] | None = None  # the prompt handed out and not yet replied to
        self.done = False

    @property
    def turn(self) -> int:
        """Turns taken so far (the 0-based index of the next one)."""
        return len(self.replies)

    # ----------------------------------------------------------------------------- the protocol

    def reset(self) -> None:
        """Reset the env (same seed for a group's members; `rollout_index` = member) and write turn 1."""
        observation, _ = self.env.reset(seed=self.record.seed, options={"rollout_index": self.record.member})
        self.record.observations.append(str(observation))
        self.system, first_user = first_turn_messages(self.env, observation, self.rules.max_response_words)
        self.user_contents.append(first_user["content"])
        self.turn_texts.append(first_user["content"])
        if self.rules.window_turns is None:
            self.tokens = TokenTrajectory(self.chat, [self.system, first_user], prefill=self.prefill)

    def next_prompt(self) -> list[int] | None:
        """The ids to sample the next turn after, or None when the episode is over (the context
        rule may end it here)."""
        if self.done:
            return None
        if self.system is None:
            raise RuntimeError("next_prompt before reset")
        if self._prompt is not None:
            return list(self._prompt)
        if self.tokens is not None:
            prompt = list(self.tokens.input_ids)
        else:
            prompt = self.chat.prompt_ids(self.window_messages(), self.prefill)
        rules = self.rules
        if len(prompt) + rules.max_new_tokens > rules.max_context_tokens:
            if self.turn == 0:
                which = f"{type(self.env).__name__} seed {self.record.seed}"
                which = which if self.group is None else f"group {self.group} ({which})"
                raise ContextLimitError(
                    f"the first prompt of {which} has {len(prompt)} tokens; with max_new_tokens="
                    f"{rules.max_new_tokens} it exceeds {rules.limit_name}={rules.max_context_tokens}: "
                    "raise rollout.max_context_tokens")
            self.record.context_truncated = True
            self.record.success = False
            self.done = True
            return None
        self._prompt = prompt
        return list(prompt)

    def take_reply(self, ids: list[int], logprobs: list[float], finish_reason: str) -> None:
        """Take the sampled reply to `next_prompt()`: step the env, record the turn, write the next.

        `finish_reason` is "eos" when the last id is an EOS the policy sampled (it closes the turn
        and is trained on, but the env does not see it), else "stop" or "length".
        """
        prompt = self._prompt
        if prompt is None:
            raise RuntimeError("take_reply without a pending next_prompt()")
        self._prompt = None
        ids, logprobs = list(ids), list(logprobs)
        if not ids:
            self.done = True
            return
        k, ended_with_eos = self.turn, finish_reason == "eos"
        text = self.prefill + reply_text(self.chat, ids, ended_with_eos)
        observation, reward, terminated, truncated, info = self.env.step(text)
        span = reasoning_span(self.chat, ids, self.prefill)
        self._record_turn(text, ids, finish_reason, span, observation, reward, info)

        if self.tokens is not None:  # full: extend the one row
            offset = len(self.tokens.input_ids)
            self.tokens.add_reply(ids, logprobs, text, ended_with_eos=ended_with_eos)
        else:  # window: this turn's prompt + reply is a row of its own
            offset = len(prompt)
        reasoning = [(k, offset + span[0], offset + span[1])] if span else []
        if self.tokens is not None:
            self._reasoning.extend(reasoning)
        else:
            self._rows.append(RowRecord(
                traj=self.index, input_ids=prompt + ids,
                sampled=[False] * len(prompt) + [True] * len(ids),
                logprobs=[0.0] * len(prompt) + logprobs,
                turn_index=[-1] * len(prompt) + [k] * len(ids),
                turn_ends=[(k, offset + len(ids) - 1)],
                reasoning=reasoning,
            ))

        if terminated or truncated or k + 1 >= self.rules.max_turns:
            self.done = True
            return
        feedback, next_turn = after_turn(self.env, k + 2, observation, reward, info,
                                         max_response_words=self.rules.max_response_words)
        self.turn_texts.append(next_turn)
        self.user_contents.append(feedback + next_turn)
        if self.tokens is not None:
            self.tokens.add_user(self.user_contents[-1])

    def _record_turn(self, text, ids, finish_reason, span, observation, reward, info) -> None:
        """What a turn's `info` says, into the record: the parse, the actions, success."""
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
        self.valid.append(bool(info["action_is_valid"]))
        self.replies.append(text)

    # ----------------------------------------------------------------------------- views

    def window_messages(self) -> list[dict]:
        """Window mode's prompt messages: the system message and the last `window_turns` turns."""
        k = self.turn
        start = max(0, k - self.rules.window_turns + 1)
        messages = [self.system, {"role": "user", "content": self.turn_texts[start]}]
        for j in range(start, k):
            messages.append({"role": "assistant", "content": self.replies[j]})
            messages.append({"role": "user", "content": self.user_contents[j + 1]})
        return messages

    def rows(self) -> list[RowRecord]:
        """The training rows: one per turn in window mode, else the history up to its last sampled token."""
        if self.tokens is None:
            return list(self._rows)
        t = self.tokens
        end = t.last_sampled_end()
        return [RowRecord(
            traj=self.index, input_ids=t.input_ids[:end], sampled=t.sampled[:end], logprobs=t.logprobs[:end],
            turn_index=t.turn_index[:end], turn_ends=[(k, e - 1) for k, (_, e) in enumerate(t.turn_spans)],
            reasoning=list(self._reasoning),
        )]
