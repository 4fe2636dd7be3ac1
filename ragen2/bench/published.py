"""Published numbers a suite can print beside its own (success rate, percent).

Only the PPO rows of RAGEN-2's main table are here (Qwen2.5-3B-Instruct, without a filter and
with SNR top-p 0.9): the paper's other rows (DAPO, GRPO, Dr.GRPO) were not at hand when this
was written, so they are left out rather than recalled from memory; add them here, copied from
the paper's table, with its source.
"""

from __future__ import annotations

PUBLISHED = {
    "ragen2-main": {
        "source": "RAGEN-2 paper, main table, PPO rows, Qwen2.5-3B-Instruct",
        "metric": "success rate (%)",
        # (algo preset, env preset, treatment) -> success rate in percent
        "values": {
            ("ppo", "sokoban", "none"): 12.9, ("ppo", "sokoban", "snr-top-p"): 28.9,
            ("ppo", "frozen_lake", "none"): 67.0, ("ppo", "frozen_lake", "snr-top-p"): 77.9,
            ("ppo", "metamathqa", "none"): 92.6, ("ppo", "metamathqa", "snr-top-p"): 93.2,
            ("ppo", "countdown", "none"): 97.9, ("ppo", "countdown", "snr-top-p"): 97.9,
        },
    },
}


def published_value(setting: str | None, algo: str, env: str, treatment: str) -> float | None:
    if setting is None:
        return None
    return PUBLISHED[setting]["values"].get((algo, env, treatment))
