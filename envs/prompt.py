"""Chat messages for an env, in RAGEN's prompt format.

system: "You're a helpful assistant. " + instruction (+ actions, + how many per turn); the
        instruction is RAGEN-2's verbatim (`instruction_style="ragen"`) or ours ("explicit")
user:   "Turn k:\\nState:\\n{obs}\\nYou have {n} actions left. Always output: … "
assistant: the model's turn
user:   "Reward:\\n{r}\\n"  (after every assistant turn; r as `reward_feedback` says)

The "up to N actions" line is RAGEN-2's by default: N is the trajectory budget, although
the parser cuts each turn at `max_actions_per_turn`; `prompt_action_limit="per_turn"`
states the per-turn limit instead, which is what the model can actually use. RAGEN-2 always
ends a turn message with "Max response length: {max_tokens} words (tokens)." (envs.yaml:
100, coordinate variants 120, WebShop 200, SearchQA 300, DeepCoder 8000): here
`max_response_words` when given, else the env's RAGEN-2 value in the "ragen" instruction
style, else (explicit style) no such sentence.
"""

from __future__ import annotations

from envs.base import TextEnv
from envs.parsing import ACTION_SEPARATOR

SYSTEM_PREFIX = "You're a helpful assistant. "
THINK_FORMAT = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
ANSWER_FORMAT = "<answer> [your answer] </answer>"
NO_VALID_ACTION_WARNING = (
    "No valid action provided previously. Environment state remains the same. Please try again.\n"
)


def _actions(count: int) -> str:
    return f"{count} action" + ("" if count == 1 else "s")


def system_message(env: TextEnv) -> dict:
    verbatim = env.ragen_instruction if env.config.instruction_style == "ragen" else None
    if verbatim is not None:  # not stripped: RAGEN-2 keeps the YAML text's trailing newline
        content, vocabulary = SYSTEM_PREFIX + verbatim, env.ragen_actions
    else:
        content, vocabulary = SYSTEM_PREFIX + env.instruction.strip(), env.action_vocabulary
    if vocabulary is not None:
        content += "\nYour available actions are:\n" + ", ".join(vocabulary)
        if env.config.prompt_action_limit == "per_traj":  # RAGEN-2's line, verbatim
            content += (f"\nYou can make up to {env.config.max_actions_per_traj} actions, "
                        f'separated by the action separator " {ACTION_SEPARATOR} "\n')
        else:  # the limit the parser enforces
            content += (
                f"\nYou can make up to {_actions(env.config.max_actions_per_turn)} per turn, "
                f'separated by the action separator " {ACTION_SEPARATOR} "'
            )
    return {"role": "system", "content": content}


def turn_message(env: TextEnv, turn: int, observation: str, *, max_response_words: int | None = None,
                 previous_turn_invalid: bool = False) -> dict:
    """The user message that opens turn `turn` (1-based)."""
    answer_format = THINK_FORMAT if env.config.require_think else ANSWER_FORMAT
    warning = NO_VALID_ACTION_WARNING if previous_turn_invalid else ""
    content = (
        f"\nTurn {turn}:\nState:\n{observation}\n{warning}"
        # RAGEN-2 writes "actions" whatever the count ("You have 1 actions left"): kept verbatim.
        f"You have {env.actions_left} actions left. Always output: {answer_format} "
        f"with no extra text. Strictly follow this format."
    )
    if max_response_words is None and env.config.instruction_style == "ragen":
        max_response_words = env.ragen_max_words  # RAGEN-2 writes it in every turn
    if max_response_words is not None:
        content += f" Max response length: {max_response_words} words (tokens)."
    return {"role": "user", "content": content + "\n"}


def reward_text(env: TextEnv, reward: float, info: dict) -> str:
    """The number shown after a turn, from `env.step`'s reward and info."""
    if env.config.reward_feedback == "with_penalty":
        return f"{reward:g}"
    # RAGEN-2 shows `acc_reward`: int 0 plus each executed action's env reward (the penalty is
    # kept apart in rollout_cache["penalty"]), printed with str(): "0" when nothing ran, "0.0",
    # "-0.2", "10.9" otherwise.
    return str(float(info["env_reward"])) if info["actions_executed"] else "0"


def reward_message(reward: float | str) -> dict:
    text = reward if isinstance(reward, str) else f"{reward:g}"
    return {"role": "user", "content": f"Reward:\n{text}\n"}


def after_turn(env: TextEnv, next_turn: int, observation: str, reward: float, info: dict, *,
               max_response_words: int | None = None) -> tuple[str, str]:
    """(the "Reward:" message, the state message of turn `next_turn`) that follow an assistant turn.

    Their concatenation is the next user message. The episode both engines drive
    (ragen2/rollout/episode.py) calls this, so their turn protocol cannot drift apart.
    """
    feedback = reward_message(reward_text(env, reward, info))["content"]
    state = turn_message(env, next_turn, observation, max_response_words=max_response_words,
                         previous_turn_invalid=not info["action_is_valid"])["content"]
    return feedback, state


def first_turn_messages(env: TextEnv, observation: str, max_response_words: int | None = None) -> list[dict]:
    return [system_message(env), turn_message(env, 1, observation, max_response_words=max_response_words)]


def render_messages(messages: list[dict]) -> str:
    """A plain-text view of a conversation, for people (not the chat template)."""
    blocks = []
    for message in messages:
        blocks.append(f"[{message['role']}]\n{message['content'].strip()}")
    return "\n\n".join(blocks)
