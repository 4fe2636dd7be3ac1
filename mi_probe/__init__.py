"""Template-collapse diagnostics: cross-scoring, MI estimators, EMA z-score, collapse alerts.

Imports nothing from ``ragen2``: another trainer can use this package alone.
"""

import importlib

from .collapse import Alert, CollapseDetector, CollapseDetectorConfig

# The estimators need torch; they load on first use, so importing the collapse detector's config
# (a section of the training config) stays light.
_LAZY = {"CrossScores": "cross_scoring", "cross_score": "cross_scoring", "cross_score_naive": "cross_scoring",
         "sample_trajectory_turns": "cross_scoring", "ZScoreEMA": "ema", "DEFAULT_KS": "estimators",
         "DEFAULT_STD_EPS": "estimators", "mi_metrics": "estimators", "mi_metrics_both": "estimators",
         "prompt_identities": "estimators"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Alert",
    "CollapseDetector",
    "CollapseDetectorConfig",
    "CrossScores",
    "DEFAULT_KS",
    "DEFAULT_STD_EPS",
    "ZScoreEMA",
    "cross_score",
    "cross_score_naive",
    "mi_metrics",
    "mi_metrics_both",
    "prompt_identities",
    "sample_trajectory_turns",
]
