"""Published numbers a suite can print beside its own (success rate, percent).

Only numbers written down in the design guide (/work/shared/DESIGN.md, "Main table") are here:
RAGEN-2's main table for PPO on Qwen2.5-3B-Instruct, without a filter and with SNR top-p 0.9.
The paper's other rows (DAPO, GRPO, Dr.GRPO) are not in the guide, so they are left out rather
than recalled from memory; add them here, with their source, when they are at hand.
"""

from __future__ import annotations

PUBLISHED = {
    "ragen2-main": {
        "source": "RAGEN-2 main table, Qwen2.5-3B-Instruct (as quoted in DESIGN.md)",
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
