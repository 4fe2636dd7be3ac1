"""A worked example of an env of your own: guess a secret number with higher/lower hints.

docs/custom_env.md walks through it. Train on it from this folder with

    ragen2 train --env guess_number:GuessNumber rollout.max_turns=4 rollout.max_new_tokens=48 \\
      --env-arg require_think=false

(answer-only: the bundled 135M model rarely closes a <think> block), or from Python with
`ragen2.train(ragen2.load_config(env="guess_number:GuessNumber", ...))`. It has an expert
(`expert_turn`, a binary search), so it can be warm-started on demonstrations first
(docs/custom_env.md, section 5):

    ragen2 demos --env guess_number:GuessNumber --episodes 256 --out guess_demos.jsonl rollout.max_turns=4
    ragen2 sft --demos guess_demos.jsonl trainer.run_name=guess_sft rollout.max_turns=4 rollout.max_new_tokens=48
    ragen2 train --env guess_number:GuessNumber --env-arg require_think=false --model runs/guess_sft \\
      rollout.max_turns=4 rollout.max_new_tokens=48
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import envs
from envs import ActionOutcome, EnvConfig, EnvConfigError, TextEnv
from envs.experts import ExpertTurn


@dataclass(frozen=True)
class GuessConfig(EnvConfig):
    """Every field needs a default: `--env-arg span=20` overrides one from the command line."""

    max_actions_per_turn: int = 1  # one guess a turn
    max_actions_per_traj: int = 4  # four guesses in all (log2 of 10 is about 3.3)
    span: int = 10  # the secret is one of `span` consecutive numbers

    def __post_init__(self) -> None:
        if self.span < 2:
            raise EnvConfigError(f"span must be >= 2, got {self.span}")
        super().__post_init__()  # the shared fields' checks


class GuessNumber(TextEnv):
    """Guess a secret number in a range drawn per seed; each wrong guess is told higher or lower."""

    config_cls = GuessConfig
    config: GuessConfig

    def __init__(self, config: GuessConfig | None = None):
        super().__init__(config)
        self.low, self.secret, self.hint = 1, None, ""
        self.bounds = (1, 1)  # the numbers the hints so far leave possible

    @property
    def instruction(self) -> str:  # the system prompt's task text
        return ("Guess the secret whole number. After a wrong guess you are told whether the secret is "
                "higher or lower. Answer with one number, like <answer> 7 </answer>.")

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        # the valid answers: the parser matches them, and anything else gets the format penalty
        return tuple(str(n) for n in range(self.low, self.low + self.config.span))

    def _reset(self, rng: np.random.Generator) -> dict:
        # only `rng` (seeded by reset(seed)) draws the instance: one seed, one game, in every process
        self.low = int(rng.integers(1, 90))
        self.secret = self.low + int(rng.integers(self.config.span))
        self.bounds = (self.low, self.low + self.config.span - 1)
        self.hint = f"The secret is between {self.low} and {self.low + self.config.span - 1}. Your first guess?"
        return {"secret": self.secret}

    def _apply_action(self, action: str) -> ActionOutcome:
        guess = int(action)  # canonical: one of action_vocabulary
        if guess == self.secret:
            self.hint = f"{guess} is right."
            return ActionOutcome(reward=1.0, terminated=True, success=True)
        self.hint = f"{guess} is wrong: the secret is {'higher' if guess < self.secret else 'lower'}."
        low, high = self.bounds
        self.bounds = (max(low, guess + 1), high) if guess < self.secret else (low, min(high, guess - 1))
        return ActionOutcome(reward=0.0)  # the base class truncates when the guesses run out

    def render(self) -> str:  # the observation the model sees each turn
        return self.hint or "(call reset() first)"

    def expert_turn(self, turns_left: int | None = None) -> ExpertTurn:
        # The expert `ragen2 demos` plays: a binary search over what the hints leave possible (never
        # self.secret, which the model cannot see), so span 10 is always solved in 4 guesses.
        low, high = self.bounds
        guess = (low + high) // 2
        return ExpertTurn((str(guess),), f"The secret is between {low} and {high}, so I guess the middle: {guess}.")


# Importing the module registers it; `--env guess_number:GuessNumber` imports it, so the
# registered name works in that process too (`--env guess_number` once imported).
envs.register("guess_number", GuessNumber, GuessConfig(), "Guess a number with higher/lower hints")


if __name__ == "__main__":
    envs.check_env(lambda: envs.make("guess_number"))  # the contract every env keeps
    env = envs.make("guess_number")
    obs, info = env.reset(seed=0)
    print(obs)
    print(env.step(f"<think>start in the middle</think><answer>{env.low + 5}</answer>")[:2])
