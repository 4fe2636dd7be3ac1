"""One-pull envs whose reward ignores the text, and a real tiny training run on them.

A random tiny model almost never writes a valid answer, so on a real env every reward would be
the format penalty and every group flat. A one-pull env counts every reply as its one valid action
and draws the reward from its own seeded generators, so a test can recompute a step's rewards
without the model (`reward_of`) and check what the trainer did with them. Registered for a test
module only (`registered`), trained in-process through `ragen2.cli.main` (`train`), observed by
`record_steps`.
"""

from __future__ import annotations

import contextlib

import numpy as np

import envs
from envs import registry
from envs.base import ActionOutcome, EnvConfig, TextEnv
from envs.parsing import ParsedResponse
from ragen2.cli import main
from ragen2.engines.local import dynamic_sampling, trainer
from ragen2.run_dir import read_metrics


class OnePullEnv(TextEnv):
    """One pull; subclasses say what it pays (`_apply_action`) and may draw per-instance state in
    `_reset`. Every reply is the valid action: no format penalty flattens a group."""

    config_cls = EnvConfig

    @property
    def instruction(self) -> str:
        return "Say anything; the reward is random."

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        return ("pull",)

    def parse(self, response: str) -> ParsedResponse:
        return ParsedResponse(format_ok=True, answer="pull", actions=("pull",))

    def _reset(self, rng: np.random.Generator) -> dict:
        return {}

    def _apply_action(self, action: str) -> ActionOutcome:
        raise NotImplementedError

    def render(self) -> str:
        return "A coin machine. Pull it."


@contextlib.contextmanager
def registered(*envs_by_name: tuple[str, type[TextEnv]]):
    """Register test envs for the block, then remove them so later tests see only the real envs."""
    registry.spec("bandit")  # the built-ins first, so they are not loaded into the cleanup window
    for name, cls in envs_by_name:
        registry.register(name, cls, EnvConfig(max_actions_per_traj=1), "test-only: one pull")
    try:
        yield
    finally:
        with registry._LOCK:  # no public unregister
            for name, _ in envs_by_name:
                registry._SPECS.pop(name, None)
                registry._KEYS.pop(registry._normalise(name), None)


def reward_of(env_name: str, seed: int, member: int) -> float:
    """One rollout's reward, from the env alone (the instance seed and the rollout index)."""
    env = envs.make(env_name)
    env.reset(seed=seed, options={"rollout_index": member})
    return env.step("whatever")[1]


def train(model_dir, out, *args: str) -> list[dict]:
    """`ragen2 train --quiet` on the tiny model into out/r; its metrics rows."""
    code = main(["train", "--quiet", "--model", str(model_dir), "--out", str(out), "trainer.run_name=r", *args])
    assert code == 0
    return read_metrics(out / "r")


def record_steps(monkeypatch) -> dict:
    """Every training rollout (each round's) and the batch each update trained on, in call order."""
    seen = {"rollouts": [], "updated": []}
    real_rollout, real_update_on = dynamic_sampling.rollout, trainer.update_on

    def rollout(*args, **kwargs):
        seen["rollouts"].append(real_rollout(*args, **kwargs))
        return seen["rollouts"][-1]

    def update_on(run, batch, selection, timer):
        seen["updated"].append(batch)
        return real_update_on(run, batch, selection, timer)

    monkeypatch.setattr(dynamic_sampling, "rollout", rollout)
    monkeypatch.setattr(trainer, "update_on", update_on)
    return seen
