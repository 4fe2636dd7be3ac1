"""The rollout of the local engine: batched sampling, chat-template tokens and masks, the agent loop.

    from ragen2.rollout import RolloutConfig, rollout
    batch = rollout(model, tokenizer, env_factory, seeds, RolloutConfig(group_size=4), generator)
"""

from ragen2.rollout.config import RolloutConfig, RolloutConfigError

# The config is a section of the training config, which every command reads; the rest needs torch
# and transformers, so it loads on first use and `ragen2 --help` stays fast.
_LAZY = {
    "evaluate": "agent_loop", "group_pass_rate": "agent_loop", "rollout": "agent_loop",
    "rollout_in_chunks": "agent_loop",
    "RolloutBatch": "batch", "RowRecord": "batch", "TrajectoryRecord": "batch",
    "ChatFormat": "chat", "ChatTemplateError": "chat", "TokenTrajectory": "chat", "reasoning_span": "chat",
    "GenerationResult": "generation", "generate": "generation", "generate_one_at_a_time": "generation",
}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f"ragen2.rollout.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RolloutConfig", "RolloutConfigError", *_LAZY]
