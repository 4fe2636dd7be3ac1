"""The file `--train.agent_func_path` names (`flags.agent_path()`).

OpenRLHF runs it with `importlib.util.spec_from_file_location("agent_module", path)` and
`exec_module`, without registering it in `sys.modules` (openrlhf/trainer/ray/vllm_engine.py,
`_load_agent_executor`). Importing the executor from its installed module gives every worker the
one `AgentExecutor` class of `ragen2.engines.openrlhf.agent`, however that module is written.
"""
from ragen2.engines.openrlhf.agent import AgentExecutor

__all__ = ["AgentExecutor"]
