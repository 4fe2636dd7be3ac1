"""Bandit's deterministic_payoff: the high-risk arm pays its expected value, so a group of identical
replies has no reward spread (issue 50: spread from a coin carries no gradient)."""

import envs
from envs.bandit import BanditConfig, BanditEnv
from envs.parsing import format_response


def rewards_of_one_arm(config: BanditConfig, seed: int, pulls: int) -> list[float]:
    out = []
    for member in range(pulls):  # the G members of one group: same instance, own dynamics stream
        env = BanditEnv(config)
        env.reset(seed=seed, options={"rollout_index": member})
        out.append(env.step(format_response([env.high_risk_arm], think="pick"))[1])
    return out


def test_deterministic_payoff_pays_the_expected_value_and_keeps_the_default_random():
    assert BanditConfig().deterministic_payoff is False and envs.make("bandit").config == BanditConfig(split="train")
    coin = rewards_of_one_arm(BanditConfig(), seed=3, pulls=32)
    assert set(coin) == {0.0, 1.0}  # the default still flips a coin per episode
    fixed = rewards_of_one_arm(BanditConfig(deterministic_payoff=True), seed=3, pulls=32)
    assert fixed == [0.25] * 32  # 0.25 x 1.0 + 0.75 x 0.0: identical replies, no spread
    env = BanditEnv(BanditConfig(deterministic_payoff=True))
    env.reset(seed=3)
    _, reward, *_ = env.step(format_response([env.low_risk_arm], think="pick"))
    assert reward == 0.1


def test_deterministic_payoff_passes_the_env_checker():
    envs.check_env(lambda: BanditEnv(BanditConfig(deterministic_payoff=True)))
