"""The rollout of the local engine: batched sampling, chat-template tokens and masks, the agent loop.

    from ragen2.rollout import RolloutConfig, rollout
    batch = rollout(model, tokenizer, env_factory, seeds, RolloutConfig(group_size=4), generator)
"""

from ragen2.rollout.agent_loop import evaluate, group_pass_rate, rollout
from ragen2.rollout.batch import RolloutBatch, RowRecord, TrajectoryRecord
from ragen2.rollout.chat import ChatFormat, ChatTemplateError, TokenTrajectory, reasoning_span
from ragen2.rollout.config import RolloutConfig, RolloutConfigError
from ragen2.rollout.generation import GenerationResult, generate, generate_one_at_a_time

__all__ = [
    "ChatFormat", "ChatTemplateError", "GenerationResult", "RolloutBatch", "RolloutConfig", "RolloutConfigError",
    "RowRecord", "TokenTrajectory", "TrajectoryRecord", "evaluate", "generate", "group_pass_rate", "generate_one_at_a_time",
    "reasoning_span", "rollout",
]
