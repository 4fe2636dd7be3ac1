"""The OpenRLHF agent file loaded by path, as OpenRLHF loads it (not registered in sys.modules).

Over a bare `openrlhf.utils.agent.AgentExecutorBase` when OpenRLHF is not installed (the agent only
subclasses it); the stand-in modules leave sys.modules as they found it.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

AGENT_FILE = Path(__file__).resolve().parents[1] / "ragen2/engines/openrlhf/agent.py"


def load_agent_module(module_name: str) -> types.ModuleType:
    try:
        import openrlhf.utils.agent  # noqa: F401  (the real base class when installed)
        stand_ins = {}
    except ImportError:
        names = ("openrlhf", "openrlhf.utils", "openrlhf.utils.agent")
        stand_ins = {name: types.ModuleType(name) for name in names if name not in sys.modules}
        stand_ins.setdefault("openrlhf.utils.agent", types.ModuleType("openrlhf.utils.agent"))
        stand_ins["openrlhf.utils.agent"].AgentExecutorBase = type("AgentExecutorBase", (), {})
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location(module_name, AGENT_FILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # as OpenRLHF does: not registered in sys.modules
        return module
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
