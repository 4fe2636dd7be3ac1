"""ragen2 from TRL (pinned: `pip install "ragen2[trl]"`; docs/trl.md).

    from ragen2.integrations.trl import RAGEN2GRPOTrainer, SNRFilterArgs, MIProbeArgs, EnvReward

* `RAGEN2GRPOTrainer`: TRL's GRPOTrainer with RAGEN-2's SNR filter (`snr_filter=`) and
  template-collapse probe (`mi_probe=`), logged through TRL's own logs.
* `EnvReward`: any registered ragen2 env as a prompt dataset and a reward function (one turn).
* `EnvRollout`: multi-turn episodes of a registered env as TRL's `rollout_func`.

Only the trainer imports TRL, and only when it is asked for: the configs and the env adapters load
without it.
"""

import importlib

_LAZY = {
    "RAGEN2GRPOTrainer": "trainer",
    "SNRFilterArgs": "filtering", "GroupFilter": "filtering",
    "MIProbeArgs": "probe", "CollapseProbe": "probe",
    "EnvReward": "env_reward", "env_dataset": "env_reward",
    "EnvRollout": "env_rollout",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
