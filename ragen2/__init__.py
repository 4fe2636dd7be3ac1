"""ragen2: multi-turn RL for LLM agents (StarPO rollouts, PPO/GRPO, SNR filtering, collapse audits).

    import ragen2
    cfg = ragen2.load_config(env="bandit", algo="grpo", filter="snr-top-p", overrides=["trainer.total_steps=4"])
    summary = ragen2.train(cfg)  # as `ragen2 train`: a run directory with metrics, checkpoints, summary.json

The names load on first use, so `import ragen2` stays light.
"""

_LAZY = {"train": "ragen2.commands.train", "load_config": "ragen2.config", "Config": "ragen2.config",
         "ConfigError": "ragen2.config"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
