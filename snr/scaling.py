"""Optional scaling of advantages (equivalently the policy loss) by the kept fraction.

Aggressive filtering can keep a small share of the groups; the update then rests
on few prompts. RAGEN offers to damp it by the kept fraction f = kept / total:
``none`` (x1, its default), ``linear`` (x f) or ``sqrt`` (x sqrt(f)). RAGEN
multiplies the advantages after computing them; multiplying the loss is the same
for the policy-gradient term.
"""

from __future__ import annotations

import math

LOSS_SCALINGS = ("none", "linear", "sqrt")


def kept_fraction_scale(kept_fraction: float, mode: str = "none") -> float:
    """The factor to multiply advantages by for a step that kept `kept_fraction` of its groups."""
    if mode not in LOSS_SCALINGS:
        raise ValueError(f"loss scaling mode must be one of {', '.join(LOSS_SCALINGS)}; got {mode!r}")
    f = kept_fraction
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0.0 <= f <= 1.0:
        raise ValueError(f"kept_fraction must be a number in [0, 1]; got {kept_fraction!r}")
    if mode == "linear":
        return float(f)
    if mode == "sqrt":
        return math.sqrt(f)
    return 1.0
