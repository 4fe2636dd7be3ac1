"""Text environments for multi-turn LLM agents, behind one gymnasium-style API.

    import envs
    env = envs.make("sokoban", max_actions_per_turn=3)
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<think>…</think><answer>Up || Left</answer>")
    print(reward, info["actions_executed"], info["success"], [s.name for s in envs.specs()][:3])
    envs.check_env(lambda: envs.make("bandit"))  # the contract every env keeps (raises EnvCheckError)

An env of your own subclasses `TextEnv` (`instruction`, `_reset`, `_apply_action`, `render`,
`action_vocabulary`), is registered with `envs.register(name, cls, config, description)`, and
checked with `envs.check_env`; `envs.spec("mypkg.module:MyEnv")` imports it by reference
(docs/custom_env.md walks through one and trains on it).

This package imports nothing from `ragen2`: other trainers can take it alone.
"""

from envs.base import ActionOutcome, EnvConfig, EnvConfigError, EpisodeOverError, TextEnv
from envs.checker import EnvCheckError, check_env
from envs.parsing import ParsedResponse, format_response, parse_response
from envs.registry import EnvSpec, coerce_overrides, make, register, spec, specs

__all__ = [
    "ActionOutcome", "EnvCheckError", "EnvConfig", "EnvConfigError", "EnvSpec", "EpisodeOverError",
    "ParsedResponse", "TextEnv", "check_env", "coerce_overrides", "format_response", "make",
    "parse_response", "register", "spec", "specs",
]
