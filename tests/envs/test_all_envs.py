"""Every registered env keeps the same contract: the checker, and hostile model output."""

import math
import re
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envs
from envs.base import ActionOutcome, EnvConfig, TextEnv
from envs import checker
from envs.checker import EnvCheckError, check_hostile_outputs
from envs.parsing import format_response

ALL_ENVS = [entry.name for entry in envs.specs()]

HOSTILE_PIECES = [
    "<think>", "</think>", "<answer>", "</answer>", "<THINK>", "<answer><answer>", "</answer></answer>",
    "||", "|| || ||", "|", " ", "\n", "\t", "\x00", "🙂", "ß", "\u202e", "Up", "down", "LEFT", "right",
    "1 + 2", "(", ")", "* /", "99999999999999999999", "1/0", "__import__('os').system('echo hi')",
    "exec", "lambda: 0", "nan", "inf", "-", "search[", "click[", "]",
]


@pytest.mark.parametrize("name", ALL_ENVS)
def test_env_passes_the_checker(name):
    envs.check_env(lambda: envs.make(name))


class FragileEnv(TextEnv):
    """Acts on any answer, and (like DeepCoder's judge did on a 989-deep list) raises on some."""

    config_cls = EnvConfig

    @property
    def instruction(self) -> str:
        return "Say anything."

    def _reset(self, rng: np.random.Generator) -> dict:
        return {}

    def _apply_action(self, action: str) -> ActionOutcome:
        return ActionOutcome(reward=float(len(action.encode("utf-8")) % 2), terminated=True)

    def render(self) -> str:
        return "Say anything."


def test_the_checker_fails_an_env_whose_step_raises_on_model_output():
    with pytest.raises(EnvCheckError, match=r"FragileEnv: step raised UnicodeEncodeError.*hostile output"):
        check_hostile_outputs(FragileEnv(EnvConfig(max_actions_per_traj=3)))


class QuadraticEnv(FragileEnv):
    """Acts with DeepCoder's fence regex as it was (quadratic on a fence and a blank run)."""

    old_fence = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)

    def _apply_action(self, action: str) -> ActionOutcome:
        self.old_fence.findall(action[:20_000])  # about 0.2 s on a fence and 20,000 blanks; linear: 0.1 ms
        return ActionOutcome(reward=0.0, terminated=True)


class SandboxedEnv(FragileEnv):
    """Spends host CPU on its first action and reports it as a sandbox's, as DeepCoder does."""

    spent = False

    def _apply_action(self, action: str) -> ActionOutcome:
        start, burned = time.process_time(), 0.0
        while not SandboxedEnv.spent and burned < 0.2:
            burned = time.process_time() - start
        SandboxedEnv.spent = True
        return ActionOutcome(reward=0.0, terminated=True, info={"sandbox_host_cpu_seconds": burned})


def test_the_checker_fails_an_env_whose_step_is_slow_on_adversarial_text(monkeypatch):
    monkeypatch.setattr(checker, "STEP_CPU_SECONDS", 0.05)
    monkeypatch.setattr(checker, "STEP_CPU_SECONDS_PER_MILLION_CHARS", 0.0)
    with pytest.raises(EnvCheckError, match=r"QuadraticEnv: step took .* of host CPU \(bound 0.05 s\) on '.*```"):
        check_hostile_outputs(QuadraticEnv(EnvConfig(max_actions_per_traj=3)))
    check_hostile_outputs(SandboxedEnv(EnvConfig(max_actions_per_traj=3)))  # a sandbox's CPU is not the step's


@pytest.mark.parametrize("name", ALL_ENVS)
def test_env_lists_itself_and_builds_from_its_spec(name):
    entry = envs.spec(name)
    env = envs.make(name)
    assert isinstance(env, entry.env_cls) and env.config == entry.config
    assert entry.description.strip()


def _play_hostile(env, texts, seed):
    env.reset(seed=seed)
    for text in texts:
        obs, reward, terminated, truncated, info = env.step(text)
        assert isinstance(obs, str)
        assert math.isfinite(reward)
        assert info["action_is_valid"] or reward == env.config.format_penalty
        if terminated or truncated:
            return


@pytest.mark.parametrize("name", ALL_ENVS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.lists(st.sampled_from(HOSTILE_PIECES) | st.text(max_size=40), max_size=25)
                      .map("".join), min_size=1, max_size=6),
       seed=st.integers(0, 2**32))
def test_hostile_text_never_escapes_as_an_exception(name, texts, seed):
    _play_hostile(envs.make(name), texts, seed)


@pytest.mark.parametrize("name", ALL_ENVS)
def test_huge_and_stormy_responses_are_handled(name):
    env = envs.make(name)
    storm = "<think>" + "x" * 1_000_000 + "</think><answer>" + "||" * 200_000 + "</answer>"
    nested = "<think>" * 50_000 + "<answer>" * 50_000
    _play_hostile(env, [storm, nested, "\udcff" * 1000], seed=1)


@pytest.mark.parametrize("name", ALL_ENVS)
def test_valid_action_buried_in_a_storm_still_counts(name):
    env = envs.make(name)
    env.reset(seed=4)
    action = env.sample_action(np.random.default_rng(0))
    _, reward, _, _, info = env.step(format_response([action], think="🙂" * 1000))
    assert info["action_is_valid"] and info["actions_executed"] == [action.strip()]
