"""The env protocol: gymnasium-style, text in and text out.

    env = envs.make("sokoban")
    obs, info = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("<think>…</think><answer>Up</answer>")

A subclass implements the game (`_reset`, `_apply_action`, `render`, `instruction`,
`action_vocabulary`); this class owns what every env shares: parsing the model's text,
the per-turn and per-trajectory action budgets, the format penalty, and seeding.

Seeding: `reset(seed)` builds the instance from `np.random.default_rng(seed)` only, so a
seed gives the same instance in every process and thread (no `hash()`, no global RNG).
Stochastic dynamics (a slippery lake, a risky arm) draw from a second generator keyed by
`(seed, rollout_index)`: the G rollouts of one group share the instance, and the rollout
engine passes `options={"rollout_index": g}` so they do not share every coin flip.
"""

from __future__ import annotations

import abc
import dataclasses
import secrets
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from envs import ragen_text
from envs.parsing import ParsedResponse, parse_response

DYNAMICS_STREAM = 0x5EED  # separates the dynamics generator from the instance generator
# When a turn gets the format penalty. any_invalid (RAGEN-2's es_manager: `len(valid_actions)
# != len(actions) or not valid_actions`): some parsed action is invalid, or none is valid.
# none_valid (our earlier rule): only a turn in which no action could run.
FORMAT_PENALTY_RULES = ("any_invalid", "none_valid")
# The system prompt's "You can make up to N actions" line. per_traj (RAGEN-2's text): N is
# the trajectory budget; per_turn (ours): N is the per-turn limit the parser enforces.
PROMPT_ACTION_LIMITS = ("per_traj", "per_turn")
# The number in the "Reward:" message after each turn. env (RAGEN-2's es_manager/ctx_manager):
# the env's reward for the actions run, without the format penalty, as Python's str() prints it;
# with_penalty (ours earlier): the turn's reward as trained on, penalty included, `{:g}`.
REWARD_FEEDBACKS = ("env", "with_penalty")
# The system prompt's task text. ragen: RAGEN-2's words verbatim (envs/ragen_text.py), so the
# model reads what RAGEN-2's numbers were measured with; explicit (ours): the symbols actually
# drawn, coordinates explained, every fixed action listed.
INSTRUCTION_STYLES = ("ragen", "explicit")


class EnvConfigError(ValueError):
    """A bad env name, config key or config value."""


@dataclass(frozen=True)
class EnvConfig:
    """Fields every env has. Subclasses add their own (all with defaults)."""

    max_actions_per_turn: int = 1
    max_actions_per_traj: int = 10
    format_penalty: float = -0.1
    format_penalty_rule: str = "any_invalid"  # see FORMAT_PENALTY_RULES
    prompt_action_limit: str = "per_traj"     # see PROMPT_ACTION_LIMITS
    reward_feedback: str = "env"              # see REWARD_FEEDBACKS
    instruction_style: str = "ragen"          # see INSTRUCTION_STYLES
    require_think: bool = True  # False: answer-only mode, `<answer>…</answer>` alone

    def __post_init__(self) -> None:
        if self.max_actions_per_turn < 1:
            raise EnvConfigError(f"max_actions_per_turn must be >= 1, got {self.max_actions_per_turn}")
        if self.max_actions_per_traj < 1:
            raise EnvConfigError(f"max_actions_per_traj must be >= 1, got {self.max_actions_per_traj}")
        if not np.isfinite(self.format_penalty) or self.format_penalty > 0:
            raise EnvConfigError(f"format_penalty must be a finite number <= 0, got {self.format_penalty}")
        if self.prompt_action_limit not in PROMPT_ACTION_LIMITS:
            raise EnvConfigError(f"prompt_action_limit must be one of {list(PROMPT_ACTION_LIMITS)}, "
                                 f"got {self.prompt_action_limit!r}")
        if self.instruction_style not in INSTRUCTION_STYLES:
            raise EnvConfigError(f"instruction_style must be one of {list(INSTRUCTION_STYLES)}, "
                                 f"got {self.instruction_style!r}")
        if self.reward_feedback not in REWARD_FEEDBACKS:
            raise EnvConfigError(f"reward_feedback must be one of {list(REWARD_FEEDBACKS)}, "
                                 f"got {self.reward_feedback!r}")
        if self.format_penalty_rule not in FORMAT_PENALTY_RULES:
            raise EnvConfigError(f"format_penalty_rule must be one of {list(FORMAT_PENALTY_RULES)}, "
                                 f"got {self.format_penalty_rule!r}")


@dataclass
class ActionOutcome:
    """The result of applying one valid action to the game."""

    reward: float
    terminated: bool = False
    success: bool = False
    info: dict = dataclasses.field(default_factory=dict)


class EpisodeOverError(RuntimeError):
    pass


class TextEnv(abc.ABC):
    config_cls: ClassVar[type[EnvConfig]] = EnvConfig

    def __init__(self, config: EnvConfig | None = None):
        self.config = config if config is not None else self.config_cls()
        if not isinstance(self.config, self.config_cls):
            raise EnvConfigError(
                f"{type(self).__name__} needs a {self.config_cls.__name__}, got {type(self.config).__name__}"
            )
        self.seed: int | None = None
        self.actions_taken = 0
        self.episode_over = True
        self.dynamics_rng = np.random.default_rng(0)

    # --- what a game implements -------------------------------------------------------

    @property
    @abc.abstractmethod
    def instruction(self) -> str:
        """The task description for the system prompt."""

    @property
    def action_vocabulary(self) -> tuple[str, ...] | None:
        """The valid actions, or None when the answer is free-form text."""
        return None

    @property
    def ragen_instruction(self) -> str | None:
        """RAGEN-2's text after "You're a helpful assistant. ", verbatim; None: no counterpart
        (the system prompt then uses `instruction` whatever the style)."""
        return None

    @property
    def ragen_max_words(self) -> int:
        """RAGEN-2's "Max response length" for this env (envs.yaml max_tokens)."""
        return ragen_text.MAX_TOKENS

    @property
    def ragen_actions(self) -> tuple[str, ...] | None:
        """The action list RAGEN-2 appends (its default config's action_lookup), or None."""
        return None

    @abc.abstractmethod
    def _reset(self, rng: np.random.Generator) -> dict:
        """Build a new instance from `rng`; return extra reset info."""

    @abc.abstractmethod
    def _apply_action(self, action: str) -> ActionOutcome:
        """Apply one valid (canonical) action."""

    @abc.abstractmethod
    def render(self) -> str:
        """The current state as text: the observation the model sees."""

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random valid action, for checkers and fuzzers."""
        vocabulary = self.action_vocabulary
        if vocabulary is None:
            raise NotImplementedError(f"{type(self).__name__} has free-form actions: override sample_action")
        return vocabulary[int(rng.integers(len(vocabulary)))]

    def expert_turn(self, turns_left: int | None = None):
        """An env of your own overrides this to give `ragen2 demos` an expert: return an
        `envs.experts.ExpertTurn(actions, grounded)` for the current state (read only what the
        observations have shown, so the demos teach something the policy can see; docs/custom_env.md).
        `turns_left`: the turns the rollout still allows, None for no limit. This default returns None,
        "no expert of its own": `envs.experts.expert_turn(env)` then uses the built-in envs' table.
        (It does not call that table itself: the experts import every env, and this module sits below.)"""
        return None

    # --- the shared protocol ----------------------------------------------------------

    @property
    def actions_left(self) -> int:
        return max(0, self.config.max_actions_per_traj - self.actions_taken)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        if seed is None:
            seed = secrets.randbits(63)
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise EnvConfigError(f"seed must be a non-negative int, got {seed!r}")
        options = dict(options or {})
        rollout_index = int(options.pop("rollout_index", 0))
        if options:
            raise EnvConfigError(f"unknown reset options {sorted(options)}; valid: ['rollout_index']")
        self.seed = int(seed)
        self.actions_taken = 0
        self.episode_over = False
        self.dynamics_rng = np.random.default_rng([self.seed, rollout_index, DYNAMICS_STREAM])
        info = {"seed": self.seed, "rollout_index": rollout_index}
        info.update(self._reset(np.random.default_rng(self.seed)))
        return self.render(), info

    def parse(self, response: str) -> ParsedResponse:
        return parse_response(
            response,
            vocabulary=self.action_vocabulary,
            max_actions=self.config.max_actions_per_turn,
            require_think=self.config.require_think,
        )

    def step(self, response: str) -> tuple[str, float, bool, bool, dict]:
        """Parse one model turn, apply its valid actions, return the gymnasium 5-tuple."""
        if self.episode_over:
            raise EpisodeOverError("the episode is over (or never started): call reset() first")
        parsed = self.parse(response)
        budget = self.actions_left
        to_run, over_budget = parsed.actions[:budget], parsed.actions[budget:]

        reward, terminated, success = 0.0, False, False
        executed: list[str] = []
        action_infos: list[dict] = []
        for action in to_run:
            outcome = self._apply_action(action)
            self.actions_taken += 1
            executed.append(action)
            reward += float(outcome.reward)
            action_infos.append(outcome.info)
            if outcome.terminated:
                terminated, success = True, bool(outcome.success)
                break

        # `executed` is empty exactly when no parsed action was valid (the budget is >= 1 here).
        penalized = not executed or (self.config.format_penalty_rule == "any_invalid" and parsed.num_invalid > 0)
        format_penalty = float(self.config.format_penalty) if penalized else 0.0
        env_reward = reward
        reward += format_penalty
        truncated = not terminated and self.actions_taken >= self.config.max_actions_per_traj
        self.episode_over = terminated or truncated
        info = {
            "parse": parsed.to_info(),
            "actions_executed": executed,
            "actions_over_budget": list(over_budget),
            "action_infos": action_infos,
            "action_is_valid": bool(executed),
            "format_penalty": format_penalty,
            "env_reward": env_reward,  # the game's reward alone (what RAGEN-2 shows the model)
            "actions_left": self.actions_left,
            "success": success and not truncated,
        }
        return self.render(), reward, terminated, truncated, info

    def close(self) -> None:
        self.episode_over = True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"
