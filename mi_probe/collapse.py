"""Collapse alerts from logged training series, fed one step at a time.

Four alarms, each firing once per excursion (it re-arms only after the series
is back on the healthy side of its threshold):

* ``template_collapse``: MI-ZScore-EMA stays below ``mi_ratio`` x its early
  level (mean of the first ``mi_baseline`` probes) for ``mi_patience``
  probes in a row *while entropy has not fallen with it* (entropy still at or
  above ``entropy_ratio`` x its early level, the mean of its first
  ``mi_baseline`` values). Low MI with low entropy is
  ordinary entropy collapse; low MI with entropy intact is reasoning that no
  longer depends on the input. If no entropy was ever given, the entropy side
  cannot be judged and the alert fires on MI alone (it says so).
  No alert is possible when the early MI level is <= 0: there was no input
  dependence to lose.
* ``reward_std_cliff`` (RAGEN v1 early warning): reward std below
  ``reward_std_ratio`` x its reference for ``reward_std_patience`` steps,
  the reference being the running max of earlier values ("max") or the mean of
  the first ``reward_std_baseline`` values ("early"). Checked once the first
  ``reward_std_baseline`` values are in.
* ``grad_norm_spike`` (RAGEN v1 early warning): gradient norm above
  ``grad_norm_ratio`` x the median of the previous ``grad_norm_window``
  values (once ``grad_norm_min_history`` are in). A non-finite norm is a spike
  too (and does not enter the history).
* ``degeneration``: the share of degenerate replies (mi_probe.degeneration: a character,
  token or short n-gram repeated over most of a reply, or a loop cut by the token budget)
  at or above ``degenerate_share`` for ``degenerate_patience`` steps in a row. An absolute
  threshold, not a ratio of an early level: a healthy policy writes almost none (docs/
  degeneration.md), so there is no baseline to wait for.

Field names follow one vocabulary (snr.StopConfig uses it too): ``<series>_baseline``
is how many first values make the early level, ``<series>_ratio`` the threshold as a
ratio of the reference, ``<series>_patience`` how many in a row.

Series may arrive at different cadences (MI every N steps, the others every
step); each ``update`` call passes whichever values that step has.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Alert", "CollapseDetector", "CollapseDetectorConfig"]


@dataclass(frozen=True)
class Alert:
    kind: str  # "template_collapse" | "reward_std_cliff" | "grad_norm_spike" | "degeneration"
    step: int
    message: str
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CollapseDetectorConfig:
    """Thresholds of the alarms (see the module doc).

    mi_baseline            probes whose mean MI-ZScore-EMA (and entropy) is the early level.
    mi_ratio               template collapse: MI below mi_ratio x its early level, in (0, 1) ...
    mi_patience            ... for this many probes in a row ...
    entropy_ratio          ... while entropy is still >= entropy_ratio x its early level.
    reward_std_baseline    steps before the reward-std cliff is checked (and the "early" reference).
    reward_std_ratio       cliff: reward std below reward_std_ratio x the reference ...
    reward_std_patience    ... for this many steps in a row.
    reward_std_reference   max: the running max of earlier values; early: the baseline mean.
    grad_norm_ratio        spike: gradient norm above grad_norm_ratio x the running median (> 1).
    grad_norm_window       values in that running median.
    grad_norm_min_history  values needed before spikes are checked.
    degenerate_share       degeneration: share of degenerate replies at or above this, in (0, 1] ...
    degenerate_patience    ... for this many steps in a row.
    """

    mi_baseline: int = 3
    mi_ratio: float = 0.5
    mi_patience: int = 3
    entropy_ratio: float = 0.7
    reward_std_baseline: int = 3
    reward_std_ratio: float = 0.25
    reward_std_patience: int = 1
    reward_std_reference: Literal["max", "early"] = "max"
    grad_norm_ratio: float = 5.0
    grad_norm_window: int = 50
    grad_norm_min_history: int = 5
    degenerate_share: float = 0.25
    degenerate_patience: int = 2

    def __post_init__(self) -> None:
        for name in ("mi_baseline", "mi_patience", "reward_std_baseline", "reward_std_patience", "grad_norm_window",
                     "grad_norm_min_history", "degenerate_patience"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("mi_ratio", "entropy_ratio", "reward_std_ratio"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 < value < 1.0):
                raise ValueError(f"{name} must be a fraction in (0, 1), got {value!r}")
        if not (isinstance(self.grad_norm_ratio, (int, float)) and self.grad_norm_ratio > 1.0
                and math.isfinite(self.grad_norm_ratio)):
            raise ValueError(f"grad_norm_ratio must be a finite number > 1, got {self.grad_norm_ratio!r}")
        share = self.degenerate_share
        if isinstance(share, bool) or not (isinstance(share, (int, float)) and 0.0 < share <= 1.0):
            raise ValueError(f"degenerate_share must be a fraction in (0, 1], got {share!r}")
        if self.reward_std_reference not in ("max", "early"):
            raise ValueError(f"reward_std_reference must be 'max' or 'early', got {self.reward_std_reference!r}")
        if self.grad_norm_min_history > self.grad_norm_window:
            raise ValueError(
                f"grad_norm_min_history ({self.grad_norm_min_history}) cannot exceed "
                f"grad_norm_window ({self.grad_norm_window})"
            )


def _finite(name: str, value: Any, *, non_negative: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {number}")
    if non_negative and number < 0:
        raise ValueError(f"{name} must be >= 0, got {number}")
    return number


class CollapseDetector:
    """Stateful alarm over MI-ZScore-EMA, entropy, reward std, gradient norm and degenerate replies."""

    def __init__(self, config: CollapseDetectorConfig | None = None) -> None:
        self.config = config if config is not None else CollapseDetectorConfig()
        self.last_step: int | None = None
        self.alerts: list[Alert] = []
        # template collapse
        self._mi_early: list[float] = []
        self._mi_run = 0
        self._mi_armed = True
        self._entropy_early: list[float] = []
        self._entropy_latest: float | None = None
        # reward std cliff
        self._rstd_early: list[float] = []
        self._rstd_max: float | None = None
        self._rstd_run = 0
        self._rstd_armed = True
        # grad norm spike
        self._grad_window: deque[float] = deque(maxlen=self.config.grad_norm_window)
        self._grad_armed = True
        # degeneration
        self._degen_run = 0
        self._degen_armed = True

    def update(
        self,
        step: int,
        *,
        mi_zscore_ema: float | None = None,
        entropy: float | None = None,
        reward_std: float | None = None,
        grad_norm: float | None = None,
        degenerate_fraction: float | None = None,
    ) -> list[Alert]:
        """Feed the values logged at ``step`` (any subset); return the alerts it raises."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        if self.last_step is not None and step < self.last_step:
            raise ValueError(f"steps must not go backwards: got {step} after {self.last_step}")
        self.last_step = step
        raised: list[Alert] = []
        # Entropy first, so a probe that logs both judges MI against this step's entropy.
        if entropy is not None:
            self._observe_entropy(_finite("entropy", entropy))
        if mi_zscore_ema is not None:
            raised += self._observe_mi(step, _finite("mi_zscore_ema", mi_zscore_ema))
        if reward_std is not None:
            raised += self._observe_reward_std(step, _finite("reward_std", reward_std, non_negative=True))
        if grad_norm is not None:
            raised += self._observe_grad_norm(step, grad_norm)
        if degenerate_fraction is not None:
            raised += self._observe_degeneration(
                step, _finite("degenerate_fraction", degenerate_fraction, non_negative=True))
        self.alerts.extend(raised)
        return raised

    # -- template collapse -------------------------------------------------
    def _observe_entropy(self, value: float) -> None:
        if len(self._entropy_early) < self.config.mi_baseline:
            self._entropy_early.append(value)
        self._entropy_latest = value

    def _observe_mi(self, step: int, value: float) -> list[Alert]:
        cfg = self.config
        if len(self._mi_early) < cfg.mi_baseline:
            self._mi_early.append(value)
            return []  # the early level is still being measured
        early = statistics.fmean(self._mi_early)
        if early <= 0:
            return []
        threshold = cfg.mi_ratio * early
        if value >= threshold:
            self._mi_run, self._mi_armed = 0, True
            return []
        self._mi_run += 1
        if self._mi_run < cfg.mi_patience or not self._mi_armed:
            return []
        numbers = {"mi_zscore_ema": value, "mi_early_level": early, "mi_threshold": threshold,
                   "consecutive_probes": float(self._mi_run)}
        if self._entropy_latest is None:
            entropy_note = "entropy unknown (never logged)"
        else:
            entropy_early = statistics.fmean(self._entropy_early)
            numbers.update(entropy=self._entropy_latest, entropy_early_level=entropy_early)
            if self._entropy_latest < cfg.entropy_ratio * entropy_early:
                return []  # entropy fell with MI: entropy collapse, not template collapse; stay armed
            entropy_note = (f"entropy {self._entropy_latest:.4g} still >= {cfg.entropy_ratio:g} x "
                            f"early {entropy_early:.4g}")
        self._mi_armed = False
        message = (f"template collapse: MI-ZScore-EMA {value:.4g} < {cfg.mi_ratio:g} x early level {early:.4g} "
                   f"for {self._mi_run} probes; {entropy_note}")
        return [Alert("template_collapse", step, message, numbers)]

    # -- reward std cliff --------------------------------------------------
    def _observe_reward_std(self, step: int, value: float) -> list[Alert]:
        cfg = self.config
        previous_max = self._rstd_max
        self._rstd_max = value if previous_max is None else max(previous_max, value)
        if len(self._rstd_early) < cfg.reward_std_baseline:
            self._rstd_early.append(value)
            return []
        reference = previous_max if cfg.reward_std_reference == "max" else statistics.fmean(self._rstd_early)
        if reference is None or reference <= 0:
            return []
        threshold = cfg.reward_std_ratio * reference
        if value >= threshold:
            self._rstd_run, self._rstd_armed = 0, True
            return []
        self._rstd_run += 1
        if self._rstd_run < cfg.reward_std_patience or not self._rstd_armed:
            return []
        self._rstd_armed = False
        message = (f"reward-std cliff: {value:.4g} < {cfg.reward_std_ratio:g} x {cfg.reward_std_reference} "
                   f"reference {reference:.4g} for {self._rstd_run} steps")
        numbers = {"reward_std": value, "reference": reference, "threshold": threshold,
                   "consecutive_steps": float(self._rstd_run)}
        return [Alert("reward_std_cliff", step, message, numbers)]

    # -- gradient norm spike -----------------------------------------------
    def _observe_grad_norm(self, step: int, raw: Any) -> list[Alert]:
        cfg = self.config
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) and not hasattr(raw, "__float__"):
            raise TypeError(f"grad_norm must be a number, got {type(raw).__name__}")
        value = float(raw)
        if not math.isnan(value) and value < 0:
            raise ValueError(f"grad_norm must be >= 0, got {value}")
        if not math.isfinite(value):
            # An overflowed/NaN gradient is the strongest spike there is; keep it out of the median.
            if not self._grad_armed:
                return []
            self._grad_armed = False
            return [Alert("grad_norm_spike", step, f"gradient norm is non-finite ({value})",
                          {"grad_norm": value})]
        alerts: list[Alert] = []
        if len(self._grad_window) >= cfg.grad_norm_min_history:
            median = statistics.median(self._grad_window)
            threshold = cfg.grad_norm_ratio * median
            if value > threshold:
                if self._grad_armed:
                    self._grad_armed = False
                    message = (f"gradient-norm spike: {value:.4g} > {cfg.grad_norm_ratio:g} x running "
                               f"median {median:.4g}")
                    alerts.append(Alert("grad_norm_spike", step, message,
                                        {"grad_norm": value, "running_median": median, "threshold": threshold}))
            else:
                self._grad_armed = True
        else:
            self._grad_armed = True
        self._grad_window.append(value)
        return alerts

    # -- degeneration ------------------------------------------------------
    def _observe_degeneration(self, step: int, value: float) -> list[Alert]:
        cfg = self.config
        if value < cfg.degenerate_share:
            self._degen_run, self._degen_armed = 0, True
            return []
        self._degen_run += 1
        if self._degen_run < cfg.degenerate_patience or not self._degen_armed:
            return []
        self._degen_armed = False
        message = (f"degeneration: {value:.3g} of the replies repeat a character, token or short n-gram "
                   f"(>= {cfg.degenerate_share:g}) for {self._degen_run} steps")
        return [Alert("degeneration", step, message, {"degenerate_fraction": value,
                                                      "threshold": cfg.degenerate_share,
                                                      "consecutive_steps": float(self._degen_run)})]

    # -- persistence -------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (the config is not included: thresholds may change on resume)."""
        return {
            "last_step": self.last_step,
            "alerts": [asdict(alert) for alert in self.alerts],
            "mi": {"early": list(self._mi_early), "run": self._mi_run, "armed": self._mi_armed},
            "entropy": {"early": list(self._entropy_early), "latest": self._entropy_latest},
            "reward_std": {"early": list(self._rstd_early), "max": self._rstd_max, "run": self._rstd_run,
                           "armed": self._rstd_armed},
            "grad_norm": {"window": list(self._grad_window), "armed": self._grad_armed},
            "degeneration": {"run": self._degen_run, "armed": self._degen_armed},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            last_step = None if state["last_step"] is None else int(state["last_step"])
            alerts = [Alert(str(a["kind"]), int(a["step"]), str(a["message"]),
                            {str(k): float(v) for k, v in dict(a["numbers"]).items()})
                      for a in state["alerts"]]
            mi, ent, rstd, grad = state["mi"], state["entropy"], state["reward_std"], state["grad_norm"]
            mi_early = [float(v) for v in mi["early"]]
            mi_run, mi_armed = int(mi["run"]), bool(mi["armed"])
            ent_early = [float(v) for v in ent["early"]]
            ent_latest = None if ent["latest"] is None else float(ent["latest"])
            rstd_early = [float(v) for v in rstd["early"]]
            rstd_max = None if rstd["max"] is None else float(rstd["max"])
            rstd_run, rstd_armed = int(rstd["run"]), bool(rstd["armed"])
            grad_window = [float(v) for v in grad["window"]]
            grad_armed = bool(grad["armed"])
            # absent from the states of runs checkpointed before this alarm existed
            degen = state.get("degeneration", {"run": 0, "armed": True})
            degen_run, degen_armed = int(degen["run"]), bool(degen["armed"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a CollapseDetector state dict: {err!r}") from None
        self.last_step, self.alerts = last_step, alerts
        self._mi_early, self._mi_run, self._mi_armed = mi_early, mi_run, mi_armed
        self._entropy_early, self._entropy_latest = ent_early, ent_latest
        self._rstd_early, self._rstd_max = rstd_early, rstd_max
        self._rstd_run, self._rstd_armed = rstd_run, rstd_armed
        self._grad_window = deque(grad_window, maxlen=self.config.grad_norm_window)
        self._grad_armed = grad_armed
        self._degen_run, self._degen_armed = degen_run, degen_armed
