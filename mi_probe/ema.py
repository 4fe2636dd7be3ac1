"""MI-ZScore-EMA: the MI z-score with the marginal's spread smoothed across probes.

A single probe's sigma (population std of the marginal log-probs) is noisy, and
when reasoning collapses to a template sigma shrinks too, which can keep the
plain z-score high. Tracking sigma with an EMA (decay 0.9, started at the first
probe's sigma, as RAGEN does) divides every probe by a slowly moving scale, so
a collapsing MI shows as a falling z-score.

Because the EMA sigma is one number per probe,
``mean((matched - marginal) / (sigma_ema + eps)) == mi_estimate / (sigma_ema + eps)``,
so the tracker only needs the ``mi_estimate`` and ``marginal_std`` that
``mi_metrics`` already reports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .estimators import DEFAULT_STD_EPS

__all__ = ["ZScoreEMA"]

# Token-mean and sequence-sum variants are tracked separately.
_SUFFIXES = ("", "_seq")


class ZScoreEMA:
    """EMA of the marginal's std, one per metric suffix ("" and "_seq").

    ``update(metrics)`` takes the dict from ``mi_metrics``/``mi_metrics_both`` and
    returns ``marginal_std_ema`` and ``mi_zscore_ema`` (plus ``_seq`` variants
    when the sequence metrics are present).
    """

    def __init__(self, decay: float = 0.9, eps: float = DEFAULT_STD_EPS) -> None:
        if not (0.0 <= decay < 1.0):
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if not (eps > 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be a positive finite number, got {eps}")
        self.decay = float(decay)
        self.eps = float(eps)
        self._sigma: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def sigma(self, suffix: str = "") -> float | None:
        """Current EMA sigma for a suffix, or None before its first update."""
        return self._sigma.get(suffix)

    def update_sigma(self, sigma: float, suffix: str = "") -> float:
        """Fold one probe's sigma into the EMA and return the new EMA value."""
        if suffix not in _SUFFIXES:
            raise ValueError(f"suffix must be one of {_SUFFIXES}, got {suffix!r}")
        value = float(sigma)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"marginal std must be a finite number >= 0, got {sigma}")
        previous = self._sigma.get(suffix)
        # The first probe initialises the EMA, so probe 1's EMA z-score equals its plain z-score.
        new = value if previous is None else self.decay * previous + (1.0 - self.decay) * value
        self._sigma[suffix] = new
        self._count[suffix] = self._count.get(suffix, 0) + 1
        return new

    def zscore(self, mi_estimate: float, suffix: str = "") -> float:
        """``mi_estimate / (sigma_ema + eps)`` with the current EMA (no update)."""
        current = self._sigma.get(suffix)
        if current is None:
            raise RuntimeError(f"no sigma tracked yet for suffix {suffix!r}; call update first")
        return float(mi_estimate) / (current + self.eps)

    def update(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Update from one probe's metrics; return the EMA sigma and MI-ZScore-EMA."""
        out: dict[str, float] = {}
        for suffix in _SUFFIXES:
            std_key, mi_key = f"marginal_std{suffix}", f"mi_estimate{suffix}"
            if std_key not in metrics and mi_key not in metrics:
                continue
            if std_key not in metrics or mi_key not in metrics:
                raise KeyError(f"metrics need both {std_key!r} and {mi_key!r}, got only one of them")
            sigma = self.update_sigma(metrics[std_key], suffix)
            out[f"marginal_std_ema{suffix}"] = sigma
            out[f"mi_zscore_ema{suffix}"] = self.zscore(metrics[mi_key], suffix)
        if not out:
            raise KeyError("metrics hold neither 'marginal_std'/'mi_estimate' nor their '_seq' variants")
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "decay": self.decay,
            "eps": self.eps,
            "sigma": dict(self._sigma),
            "num_updates": dict(self._count),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            decay, eps = float(state["decay"]), float(state["eps"])
            sigma = {str(k): float(v) for k, v in dict(state["sigma"]).items()}
            count = {str(k): int(v) for k, v in dict(state["num_updates"]).items()}
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a ZScoreEMA state dict: {err!r}") from None
        unknown = (set(sigma) | set(count)) - set(_SUFFIXES)
        if unknown:
            raise ValueError(f"ZScoreEMA state has unknown suffixes {sorted(unknown)}")
        if set(sigma) != set(count):
            raise ValueError("ZScoreEMA state: 'sigma' and 'num_updates' name different suffixes")
        # Validate through the constructor so a corrupt file cannot set decay >= 1.
        ZScoreEMA(decay, eps)
        self.decay, self.eps = decay, eps
        self._sigma, self._count = sigma, count

    def __repr__(self) -> str:
        return f"ZScoreEMA(decay={self.decay}, eps={self.eps}, sigma={self._sigma})"
