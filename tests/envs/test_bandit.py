"""Bandit, BanditTest and BanditRev: word pairs, payoffs, success, and the env contract."""

import math

import pytest

import envs
from envs.bandit import ARM_NAME_PAIRS, BanditConfig, BanditEnv
from envs.parsing import format_response

VARIANTS = ("bandit", "bandit_test", "bandit_rev")


def pull(env: BanditEnv, arm: str):
    return env.step(format_response([arm], think="pick"))


def within_binomial_tolerance(hits: int, n: int, p: float, sigmas: float = 4.5) -> bool:
    """Is hits/n within `sigmas` binomial standard deviations of p? (4.5σ: ~1e-5 false alarms)"""
    return abs(hits / n - p) <= sigmas * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("name", VARIANTS)
def test_registered_variant_passes_the_checker(name):
    envs.check_env(lambda: envs.make(name))


def test_registered_defaults_and_names():
    assert envs.make("bandit").config == BanditConfig(split="train")
    assert envs.make("BanditTest").config == BanditConfig(split="test")
    assert envs.make("Bandit-Rev").config == BanditConfig(names_reversed=True)
    config = envs.make("bandit").config
    assert (config.max_actions_per_traj, config.max_actions_per_turn) == (1, 1)
    assert (config.low_risk_payoff, config.high_risk_win_payoff, config.high_risk_win_prob) == (0.1, 1.0, 0.25)


def test_splits_hold_ragens_pairs_and_share_no_word():
    train, test = ARM_NAME_PAIRS["train"], ARM_NAME_PAIRS["test"]
    assert (len(train), len(test)) == (12, 8)
    assert train[0] == ("Teacher", "Trader") and test[0] == ("Receptionist", "Explorer")
    train_words = {word for pair in train for word in pair}
    test_words = {word for pair in test for word in pair}
    assert len(train_words) == 24 and len(test_words) == 16
    assert not train_words & test_words


@pytest.mark.parametrize("split", ["train", "test"])
def test_each_split_draws_only_and_all_of_its_pairs(split):
    env = BanditEnv(BanditConfig(split=split))
    drawn = set()
    for seed in range(400):
        env.reset(seed=seed)
        drawn.add((env.safe_name, env.risky_name))
    assert drawn == set(ARM_NAME_PAIRS[split])


def test_vocabulary_is_the_pair_in_the_order_shown_and_the_order_is_random():
    env = BanditEnv()
    safe_first = 0
    for seed in range(400):
        observation, _ = env.reset(seed=seed)
        first, second = env.action_vocabulary
        assert {first, second} == {env.safe_name, env.risky_name}
        assert observation.index(first) < observation.index(second)
        safe_first += first == env.safe_name
    assert within_binomial_tolerance(safe_first, 400, 0.5)


def test_vocabulary_before_reset_says_to_reset():
    with pytest.raises(RuntimeError, match="reset"):
        BanditEnv().action_vocabulary


def test_high_risk_arm_pays_one_a_quarter_of_the_time():
    env = BanditEnv()
    draws = 4000
    wins = 0
    for rollout_index in range(draws):
        env.reset(seed=7, options={"rollout_index": rollout_index})
        _, reward, terminated, truncated, info = pull(env, env.risky_name)
        assert reward in (0.0, 1.0) and terminated and not truncated
        wins += reward == 1.0
    assert within_binomial_tolerance(wins, draws, 0.25)


def test_high_risk_frequency_holds_across_seeds_too():
    env = BanditEnv(BanditConfig(split="test"))
    wins = 0
    for seed in range(3000):
        env.reset(seed=seed)
        wins += pull(env, env.risky_name)[1] == 1.0
    assert within_binomial_tolerance(wins, 3000, 0.25)


def test_low_risk_arm_always_pays_a_tenth():
    env = BanditEnv()
    for rollout_index in range(300):
        env.reset(seed=rollout_index % 17, options={"rollout_index": rollout_index})
        _, reward, terminated, _, info = pull(env, env.safe_name)
        assert reward == 0.1 and terminated and info["success"] is False


def test_group_rollouts_share_the_instance_but_not_the_coin():
    env = BanditEnv()
    observations, rewards = set(), []
    for rollout_index in range(16):
        observations.add(env.reset(seed=11, options={"rollout_index": rollout_index})[0])
        rewards.append(pull(env, env.risky_name)[1])
    assert len(observations) == 1
    assert set(rewards) == {0.0, 1.0}  # P(16 equal flips) = 0.75^16 + 0.25^16 ≈ 1%, and this draw is fixed
    env.reset(seed=11, options={"rollout_index": 3})
    assert pull(env, env.risky_name)[1] == rewards[3]  # same (seed, rollout_index), same flip


def test_rev_swaps_the_payoffs_of_the_same_names():
    normal, reversed_ = BanditEnv(), envs.make("bandit_rev")
    for seed in range(60):
        obs_normal, _ = normal.reset(seed=seed)
        obs_reversed, _ = reversed_.reset(seed=seed)
        assert obs_normal == obs_reversed  # same pair, same order: only the payoffs differ
        assert normal.high_risk_arm == normal.risky_name == reversed_.low_risk_arm
        assert normal.low_risk_arm == normal.safe_name == reversed_.high_risk_arm
    rev_safe_rewards = set()
    for rollout_index in range(64):
        reversed_.reset(seed=5, options={"rollout_index": rollout_index})
        rev_safe_rewards.add(pull(reversed_, reversed_.safe_name)[1])
        reversed_.reset(seed=5, options={"rollout_index": rollout_index})
        assert pull(reversed_, reversed_.risky_name)[1] == 0.1
    assert rev_safe_rewards == {0.0, 1.0}


def test_success_is_choosing_the_higher_expected_value_arm_whatever_it_paid():
    env = BanditEnv()
    outcomes = set()
    for rollout_index in range(40):
        env.reset(seed=2, options={"rollout_index": rollout_index})
        _, reward, _, _, info = pull(env, env.risky_name)
        assert info["success"] is True
        outcomes.add(reward)
    assert outcomes == {0.0, 1.0}  # success even when the risky arm paid 0
    rev = BanditEnv(BanditConfig(names_reversed=True))
    rev.reset(seed=2)
    assert pull(rev, rev.safe_name)[4]["success"] is True
    rev.reset(seed=2)
    assert pull(rev, rev.risky_name)[4]["success"] is False
    # If the safe arm had the higher mean (0.5 > 0.25), choosing it would be the success.
    generous = BanditEnv(BanditConfig(low_risk_payoff=0.5))
    generous.reset(seed=2)
    assert pull(generous, generous.safe_name)[4]["success"] is True


def test_render_after_the_pull_says_what_was_pulled_and_paid():
    env = BanditEnv()
    env.reset(seed=0)
    observation, reward, *_ = pull(env, env.safe_name)
    assert observation == f"You pulled {env.safe_name}: 0.1 points." and env.render() == observation
    for rollout_index in range(50):
        env.reset(seed=0, options={"rollout_index": rollout_index})
        observation, reward, *_ = pull(env, env.risky_name)
        assert observation == f"You pulled {env.risky_name}: {reward:g} points."


def test_a_name_outside_the_pair_is_a_format_penalty_not_a_pull():
    env = BanditEnv()
    env.reset(seed=0)
    outsider = next(word for pair in ARM_NAME_PAIRS["test"] for word in pair)
    _, reward, terminated, truncated, info = pull(env, outsider)
    assert reward == -0.1 and not terminated and not truncated
    assert info["parse"]["dropped"][0]["reason"] == "not in the action vocabulary"
    _, reward, terminated, _, _ = env.step(f"<think>x</think><answer> {env.safe_name.upper()} </answer>")
    assert reward == 0.1 and terminated  # case-insensitive names


@pytest.mark.parametrize("overrides, message", [
    ({"split": "val"}, "split must be one of"),
    ({"high_risk_win_prob": 1.5}, "high_risk_win_prob must be in"),
    ({"low_risk_payoff": 0.25}, "expected payoffs must differ"),
    ({"high_risk_win_payoff": float("nan")}, "high_risk_win_payoff must be a finite"),
])
def test_bad_config_is_a_specific_error(overrides, message):
    with pytest.raises(envs.EnvConfigError, match=message):
        envs.make("bandit", **overrides)
