"""SNR-aware group filtering: pure torch, usable without the ragen2 pipeline.

    import torch
    from snr import StopPolicy, available_presets, load_preset, select_groups

    rewards = torch.tensor([[0.0, 1.0, 1.0, 0.0],   # [num_groups, G]: G rollouts of each prompt
                            [1.0, 1.0, 1.0, 1.0],   # no spread: no task signal in this group
                            [0.0, 0.0, 0.5, 0.0]])
    selection = select_groups(rewards, load_preset("snr-top-p"))  # or any of available_presets()
    print(selection.kept.tolist(), selection.skip)  # kept groups; skip: no update this step
    decision = StopPolicy().observe(selection)      # stop after repeated skips / spread collapse

The presets (``none``, ``starpo-s``, ``snr-top-p``, ``ragen2-main``, ...) ship with this
package in ``snr/presets/``; ``load_preset`` also takes the path of a YAML file.
"""

from .config import (
    METRICS,
    ORDERS,
    PRESETS_DIR,
    STRATEGIES,
    TOP_P_MODES,
    FilterConfig,
    FilterConfigError,
    UnknownPresetError,
    available_presets,
    find_preset,
    load_preset,
    preset_key,
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
    if name == "Refill":  # DAPO's dynamic sampling (snr.refill), torch too
        from .refill import Refill

        return Refill
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FilterConfig",
    "FilterConfigError",
    "FilterInputError",
    "LOSS_SCALINGS",
    "METRICS",
    "ORDERS",
    "PRESETS_DIR",
    "Refill",
    "STRATEGIES",
    "Selection",
    "StopConfig",
    "StopDecision",
    "StopPolicy",
    "TOP_P_MODES",
    "UnknownPresetError",
    "ZERO_SPREAD_TOL",
    "available_presets",
    "find_preset",
    "group_spread",
    "kept_fraction_scale",
    "load_preset",
    "preset_key",
    "select_groups",
]
