"""Bandit: one pull of one of two arms whose names hint at their risk (RAGEN's Bandit).

Each instance is a pair of words, e.g. ("Teacher", "Trader"): the first sounds safe, the
second risky. In `bandit` the safe-sounding arm is the low-risk arm (always pays 0.1) and
the risky-sounding arm is the high-risk arm (pays 1.0 with probability 0.25, else 0).
The high-risk arm has the higher expected value (0.25 > 0.1), so choosing it is success.
`bandit_rev` swaps which name gets which payoff, so the names' intuition misleads.

The seed picks the pair and the order the arms are shown in; the payoff coin flip draws
from `self.dynamics_rng`, so the G rollouts of a group see different payoffs
(`deterministic_payoff=True` pays the high-risk arm its expected value instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.base import ActionOutcome, EnvConfig, EnvConfigError, TextEnv
from envs import ragen_text
from envs.registry import register

# (safe-sounding, risky-sounding) name pairs, RAGEN's train and held-out test splits.
ARM_NAME_PAIRS = {
    "train": (
        ("Teacher", "Trader"),
        ("Nurse", "StartupFounder"),
        ("Librarian", "Investor"),
        ("Accountant", "StockBroker"),
        ("Engineer", "RealEstateAgent"),
        ("Pharmacist", "Musician"),
        ("Clerk", "Freelancer"),
        ("Technician", "Youtuber"),
        ("Planner", "Artist"),
        ("Postman", "Pilot"),
        ("Banker", "VentureCapitalist"),
        ("Gardener", "Cryptominer"),
    ),
    "test": (
        ("Receptionist", "Explorer"),
        ("Archivist", "Filmmaker"),
        ("Bookkeeper", "Consultant"),
        ("SocialWorker", "Photographer"),
        ("Mechanic", "GameDesigner"),
        ("Secretary", "Entrepreneur"),
        ("Cashier", "DataScientist"),
        ("CivilServant", "StartupAccelerator"),
    ),
}

INSTRUCTION = (
    "You are playing a bandit game. Goal: maximize your reward by choosing which arm to pull; "
    "you get one pull.\n"
    "Game rules:\n"
    "1. There are 2 arms, each named after a word.\n"
    "2. Each arm has its own reward distribution, related to its name.\n"
    "3. Think about what each name symbolizes to guess how its rewards might behave.\n"
    "4. Pull the arm you believe gives the higher reward on average by answering with its name, "
    "like <answer> NAME </answer>."
)


@dataclass(frozen=True)
class BanditConfig(EnvConfig):
    max_actions_per_turn: int = 1
    max_actions_per_traj: int = 1
    split: str = "train"  # which name pairs: "train" or the held-out "test"
    names_reversed: bool = False  # True: the safe-sounding name gets the high-risk payoff (BanditRev)
    low_risk_payoff: float = 0.1
    high_risk_win_payoff: float = 1.0
    high_risk_lose_payoff: float = 0.0
    high_risk_win_prob: float = 0.25
    # True: the high-risk arm pays its expected payoff every pull, so a group's reward spread comes
    # from the policy's choices alone (a coin's spread over identical replies carries no gradient)
    deterministic_payoff: bool = False

    def __post_init__(self) -> None:
        if self.split not in ARM_NAME_PAIRS:
            raise EnvConfigError(f"split must be one of {sorted(ARM_NAME_PAIRS)}, got {self.split!r}")
        for key in ("low_risk_payoff", "high_risk_win_payoff", "high_risk_lose_payoff"):
            if not np.isfinite(getattr(self, key)):
                raise EnvConfigError(f"{key} must be a finite number, got {getattr(self, key)}")
        if not (0.0 <= self.high_risk_win_prob <= 1.0):
            raise EnvConfigError(f"high_risk_win_prob must be in [0, 1], got {self.high_risk_win_prob}")
        # Success means "chose the arm with the higher expected value": a tie leaves it undefined.
        if self.high_risk_expected_payoff == self.low_risk_payoff:
            raise EnvConfigError(
                f"the arms' expected payoffs must differ (both are {self.low_risk_payoff}): "
                "success is choosing the arm with the higher expected payoff"
            )
        super().__post_init__()

    @property
    def high_risk_expected_payoff(self) -> float:
        return (self.high_risk_win_prob * self.high_risk_win_payoff
                + (1.0 - self.high_risk_win_prob) * self.high_risk_lose_payoff)


class BanditEnv(TextEnv):
    config_cls = BanditConfig
    config: BanditConfig

    def __init__(self, config: BanditConfig | None = None):
        super().__init__(config)
        self.safe_name = ""
        self.risky_name = ""
        self.shown_order: tuple[str, ...] = ()
        self.last_pull: tuple[str, float] | None = None

    @property
    def ragen_instruction(self) -> str:
        return ragen_text.BANDIT  # empty: RAGEN-2 states the game in the first observation

    @property
    def instruction(self) -> str:
        return INSTRUCTION

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        """The two arm names in the order the prompt shows them (so the order leaks nothing)."""
        if not self.shown_order:
            raise RuntimeError("the bandit's arm names are drawn at reset(): call reset() first")
        return self.shown_order

    @property
    def high_risk_arm(self) -> str:
        """The arm paying high_risk_win_payoff with probability high_risk_win_prob."""
        return self.safe_name if self.config.names_reversed else self.risky_name

    @property
    def low_risk_arm(self) -> str:
        """The arm always paying low_risk_payoff."""
        return self.risky_name if self.config.names_reversed else self.safe_name

    @property
    def best_arm(self) -> str:
        """The arm with the higher expected payoff: choosing it is success."""
        config = self.config
        high_is_better = config.high_risk_expected_payoff > config.low_risk_payoff
        return self.high_risk_arm if high_is_better else self.low_risk_arm

    def _reset(self, rng: np.random.Generator) -> dict:
        pairs = ARM_NAME_PAIRS[self.config.split]
        self.safe_name, self.risky_name = pairs[int(rng.integers(len(pairs)))]
        pair = (self.safe_name, self.risky_name)
        self.shown_order = pair if rng.random() < 0.5 else pair[::-1]
        self.last_pull = None
        return {"high_risk_arm": self.high_risk_arm, "low_risk_arm": self.low_risk_arm}

    def _apply_action(self, action: str) -> ActionOutcome:
        config = self.config
        if action == self.high_risk_arm and config.deterministic_payoff:
            payoff = config.high_risk_expected_payoff  # no draw: dynamics_rng stays where it was
        elif action == self.high_risk_arm:
            won = bool(self.dynamics_rng.random() < config.high_risk_win_prob)
            payoff = config.high_risk_win_payoff if won else config.high_risk_lose_payoff
        else:
            payoff = config.low_risk_payoff
        self.last_pull = (action, float(payoff))
        info = {"arm": action, "high_risk": action == self.high_risk_arm, "payoff": float(payoff)}
        return ActionOutcome(reward=float(payoff), terminated=True, success=action == self.best_arm, info=info)

    def render(self) -> str:
        if not self.shown_order:
            return "(no arms yet: call reset())"
        if self.last_pull is not None:
            arm, payoff = self.last_pull
            return f"You pulled {arm}: {payoff:g} points."
        first, second = self.shown_order
        if self.config.instruction_style == "ragen":  # RAGEN-2 states the whole game here
            return ragen_text.BANDIT_OBSERVATION.format(name_a=first, name_b=second)
        return (
            f"There are 2 arms, named {first} and {second}. Which arm do you pull? "
            f"Answer <answer> {first} </answer> or <answer> {second} </answer>."
        )


register("bandit", BanditEnv, BanditConfig(split="train"),
         "Two-armed bandit named by a word pair (train pairs); the risky-sounding arm has the higher mean")
register("bandit_test", BanditEnv, BanditConfig(split="test"),
         "Two-armed bandit on the held-out test word pairs")
register("bandit_rev", BanditEnv, BanditConfig(names_reversed=True),
         "Bandit whose names mislead: the safe-sounding arm is the high-risk, higher-mean arm")
