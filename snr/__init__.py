"""SNR-aware group filtering: pure torch, usable without the ragen2 pipeline.

    from snr import load_preset, select_groups, StopPolicy
    selection = select_groups(rewards, load_preset("snr-top-p"))  # rewards [num_groups, G]
    if selection.skip: ...                                     # no update this step
    decision = stop_policy.observe(selection)                   # stop after repeated skips / collapse
"""

from .config import (
    METRICS,
    ORDERS,
    PRESETS_DIR,
    STRATEGIES,
    TOP_P_MODES,
    FilterConfig,
    FilterConfigError,
    available_presets,
    load_preset,
)
from .scaling import LOSS_SCALINGS, kept_fraction_scale
from .selection import ZERO_SPREAD_TOL, FilterInputError, Selection, group_spread, select_groups
from .stopping import StopConfig, StopDecision, StopPolicy

__all__ = [
    "FilterConfig",
    "FilterConfigError",
    "FilterInputError",
    "LOSS_SCALINGS",
    "METRICS",
    "ORDERS",
    "PRESETS_DIR",
    "STRATEGIES",
    "Selection",
    "StopConfig",
    "StopDecision",
    "StopPolicy",
    "TOP_P_MODES",
    "ZERO_SPREAD_TOL",
    "available_presets",
    "group_spread",
    "kept_fraction_scale",
    "load_preset",
    "select_groups",
]
