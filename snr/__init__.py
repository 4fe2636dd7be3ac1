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
from .stopping import StopConfig, StopDecision, StopPolicy

# The selection needs torch; it loads on first use, so importing the configs (which the training
# config's sections are) stays light.
_SELECTION = ("ZERO_SPREAD_TOL", "FilterInputError", "Selection", "group_spread", "select_groups")


def __getattr__(name: str):
    if name in _SELECTION:
        from . import selection

        return getattr(selection, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
