"""Template-collapse diagnostics: cross-scoring, MI estimators, EMA z-score, collapse alerts.

Imports nothing from ``ragen2``: another trainer can use this package alone.
"""

from .collapse import Alert, CollapseDetector, CollapseDetectorConfig
from .cross_scoring import CrossScores, cross_score, cross_score_naive, sample_trajectory_turns
from .ema import ZScoreEMA
from .estimators import DEFAULT_KS, DEFAULT_STD_EPS, mi_metrics, mi_metrics_both, prompt_identities

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
