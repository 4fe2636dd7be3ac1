"""Filter configuration and the named presets in ``snr/presets/``.

A :class:`FilterConfig` says how :func:`snr.select_groups` ranks the groups of one
training batch and which of them it keeps. Every field is validated when the
config is built, so a bad YAML preset fails at load time with a message that
names the field and the accepted values, not halfway through a training step.

The presets are package data of ``snr`` (they install with it, from a wheel too), and
:func:`find_preset` is the one name lookup: ragen2's config reads its env and algo
presets with it as well, so every preset name matches the same way.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, Mapping, get_args

Strategy = Literal["top_p", "top_k", "top_k_abs", "min_p", "none"]
Metric = Literal["reward_variance", "reward_std", "given"]
Order = Literal["largest", "smallest"]
TopPMode = Literal["linear", "softmax"]
Ddof = Literal[0, 1]
STRATEGIES = get_args(Strategy)
METRICS = get_args(Metric)
ORDERS = get_args(Order)
TOP_P_MODES = get_args(TopPMode)
DDOFS = get_args(Ddof)

# RAGEN's filter metrics that are not reward spreads; the caller computes them and
# passes them as `scores` with metric "given".
_CALLER_SCORED = ("reward", "reward_sum", "entropy", "entropy_variance", "entropy_std", "length")

# The strategies that filter; "none" keeps every group and reads no field but ddof (the metrics').
FILTERING = ("top_p", "top_k", "top_k_abs", "min_p")
# A signal names a per-rollout field, and appears in metric names (snr/<signal>_std_mean), where
# a name starting kept_ would overwrite the kept groups' spreads (snr/kept_<signal>_...).
_SIGNAL_NAME = re.compile(r"(?!kept_)[a-z_][a-z0-9_]*")

# Package data (pyproject's package-data), so a wheel carries them beside the code.
PRESETS_DIR = Path(__file__).resolve().parent / "presets"


class FilterConfigError(ValueError):
    """A filter config or preset is invalid; the message names the field."""


class UnknownPresetError(FilterConfigError):
    """A preset name that names no file; the message lists the real presets."""


def _choice(field: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise FilterConfigError(f"{field} must be one of {', '.join(valid)}; got {value!r}")


def _number(field: str, value: Any) -> float:
    # bool is an int subclass; `value: true` in YAML is a typo, not 1.0.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FilterConfigError(f"{field} must be a number; got {value!r}")
    if not math.isfinite(value):
        raise FilterConfigError(f"{field} must be finite; got {value!r}")
    return float(value)


@dataclass(frozen=True)
class FilterConfig:
    """How to score, rank and keep groups (one group = the G rollouts of one prompt).

    strategy      top_p | top_k | top_k_abs | min_p | none (keep every group).
    value         top_p: the share p in (0, 1]; p = 1 keeps every candidate (RAGEN's
                  "no filter" setting). top_k: the fraction of groups in (0, 1].
                  top_k_abs: a whole number of groups >= 1. min_p: the fraction of the
                  best score in [0, 1].
    metric        reward_variance: the in-group sample variance of the rewards with
                  `ddof`; reward_std: its square root; given: a per-group score the
                  caller passes (entropy, length, ...).
    order         largest keeps high scores, smallest keeps low scores.
    top_p_mode    linear: accumulate the scores themselves; softmax: accumulate
                  softmax(score) probabilities (never comes back empty).
    include_zero  False drops groups without spread (all rewards, or all values of the
                  signal, equal) before ranking.
    eps           slack of the linear top-p threshold p * total - eps (RAGEN: 0.01), in
                  the units of the reward std; with metric reward_variance it is the
                  same share of the total, eps * sum(var) / sum(std) (see snr.selection).
    ddof          1 (default) divides by G - 1: the unbiased estimate of Var(R|x),
                  and what torch.std (RAGEN's std) computes; 0 divides by G.
    signal        what the spread is measured on. reward (RAGEN-2's): the reward as
                  trained, format penalties included. success: the outcome (1 or 0), so a
                  group whose rewards differ only by format penalties has no spread. Another
                  name: that per-episode field (the local engine: reward, success,
                  context_truncated; a library caller passes the values to select_groups as
                  `signal=`). The spread metrics are named after it (snr/success_std_mean).
    max_rounds    rounds of generation per step. 1 (RAGEN-2's): filter the batch as sampled.
                  n > 1: DAPO's dynamic sampling (arXiv 2503.14476; veRL's
                  algorithm.filter_groups.max_num_gen_batches): while fewer groups with spread
                  (in the signal) than the batch's group count were found, sample that many
                  groups again, up to n rounds in all; the first groups with spread, up to the
                  count, are then filtered. Read only with include_zero false (the groups it
                  refills are those include_zero false drops). The caller samples: the local
                  engine does; snr.Refill is the bookkeeping.

    A field set to a value other than its default that the strategy does not read is refused
    (strategy none with value 0.5 would otherwise keep every group without a word): value,
    metric, order, include_zero and signal are read by every strategy but none; top_p_mode
    by top_p; eps by top_p in linear mode; signal not by metric given with include_zero true
    (the caller's scores rank); max_rounds only with include_zero false. ddof is read by every
    strategy (the metrics too).

    The default keeps every group (no filter: the training config's default too).
    RAGEN-2's recommended filter, linear top-p 0.9 on the reward variance with
    zero-spread groups dropped, is the ``snr-top-p`` preset.
    """

    strategy: Strategy = "none"
    value: float = 1.0
    metric: Metric = "reward_variance"
    order: Order = "largest"
    top_p_mode: TopPMode = "linear"
    include_zero: bool = True
    eps: float = 0.01
    ddof: Ddof = 1
    signal: str = "reward"
    max_rounds: int = 1

    def __post_init__(self) -> None:
        if self.metric in _CALLER_SCORED:
            raise FilterConfigError(
                f"metric {self.metric!r} is not computed here: compute the per-group score "
                f"yourself and pass it as `scores` with metric 'given' "
                f"(valid metrics: {', '.join(METRICS)})"
            )
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("metric", self.metric, METRICS)
        _choice("order", self.order, ORDERS)
        _choice("top_p_mode", self.top_p_mode, TOP_P_MODES)
        if not isinstance(self.include_zero, bool):
            raise FilterConfigError(f"include_zero must be true or false; got {self.include_zero!r}")
        if isinstance(self.ddof, bool) or self.ddof not in DDOFS:
            raise FilterConfigError(f"ddof must be 0 or 1; got {self.ddof!r}")
        if not isinstance(self.signal, str) or not _SIGNAL_NAME.fullmatch(self.signal):
            raise FilterConfigError(f"signal must be reward, success or the name of a per-episode field "
                                    f"(lower case letters, digits, _; not starting kept_); got {self.signal!r}")
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise FilterConfigError(f"max_rounds must be a whole number >= 1 (1: no dynamic sampling); "
                                    f"got {self.max_rounds!r}")
        eps = _number("eps", self.eps)
        if eps < 0:
            raise FilterConfigError(f"eps must be >= 0; got {eps}")
        value = _number("value", self.value)
        self._check_value_range(value)
        # Store plain floats so equal configs compare and print equal (0.9 vs 9e-1 from YAML).
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "eps", eps)
        ignored = self._ignored_settings()
        if ignored:
            raise FilterConfigError("; ".join(ignored))

    def _reader(self, name: str) -> tuple[str, str] | None:
        """(what ignores field `name` here, what would read it) when this config does not read
        it, else None."""
        chosen = {"none": "strategy none, which keeps every group"}.get(self.strategy, f"strategy {self.strategy}")
        if self.strategy == "top_p":
            chosen += f" with top_p_mode {self.top_p_mode}"
        if name in ("value", "metric", "order", "include_zero", "signal") and self.strategy == "none":
            return chosen, f"strategy {', '.join(FILTERING[:-1])} or {FILTERING[-1]}"
        if name == "top_p_mode" and self.strategy != "top_p":
            return chosen, "strategy top_p"
        if name == "eps" and (self.strategy != "top_p" or self.top_p_mode != "linear"):
            return chosen, "strategy top_p with top_p_mode linear"
        if name == "max_rounds" and self.include_zero:
            # dynamic sampling refills the zero-spread groups include_zero false drops
            return (chosen if self.strategy == "none" else "include_zero true"), \
                "include_zero false (with strategy top_p value 1.0: DAPO's dynamic sampling, the dapo-dynamic preset)"
        if name == "signal" and self.metric == "given" and self.include_zero:
            # caller scores rank the groups; the signal's spread would only decide the zero-spread drop
            return "metric given with include_zero true", "metric reward_variance or reward_std, or include_zero false"
        return None

    def _ignored_settings(self) -> list[str]:
        """One clause per field set away from its default that this config does not read."""
        out = []
        for f in fields(self):
            value, reader = getattr(self, f.name), self._reader(f.name)
            if reader is not None and value != f.default:
                out.append(f"{f.name}={_show(value)} is ignored by {reader[0]}; it is read by {reader[1]}")
        if not self.include_zero and self.strategy == "none":
            out.append("to drop only zero-spread groups use strategy top_p with value 1.0 and include_zero false")
        return out

    def _check_value_range(self, value: float) -> None:
        s = self.strategy
        if s in ("top_p", "top_k") and not 0.0 < value <= 1.0:
            raise FilterConfigError(f"value for strategy {s} must be in (0, 1]; got {value}")
        if s == "top_k_abs" and (value < 1 or value != int(value)):
            raise FilterConfigError(f"value for strategy top_k_abs must be a whole number >= 1; got {value}")
        if s == "min_p" and not 0.0 <= value <= 1.0:
            raise FilterConfigError(f"value for strategy min_p must be in [0, 1]; got {value}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FilterConfig":
        if not isinstance(data, Mapping):
            raise FilterConfigError(f"a filter config must be a mapping of fields; got {type(data).__name__}")
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(valid))
        if unknown:
            raise FilterConfigError(f"unknown filter config field(s) {unknown}; valid fields: {', '.join(valid)}")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def deciding_fields(self) -> dict[str, Any]:
        """The fields that decide what this strategy keeps: strategy none keeps every group
        whatever the rest say; top_p_mode and eps matter to top_p only (eps to linear top_p)."""
        if self.strategy == "none":
            return {"strategy": self.strategy}
        return {key: value for key, value in self.to_dict().items() if self._reader(key) is None}


def _show(value: Any) -> str:
    """A value as YAML and the command line write it (false, 0.5, softmax)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def preset_key(name: str) -> str:
    """Preset names match as the libraries match names: case, `_` and `-` do not matter."""
    return name.lower().replace("_", "-")


def available_presets(presets_dir: str | Path | None = None) -> list[str]:
    """Names of the presets (YAML files) in `presets_dir` (default snr/presets/)."""
    directory = Path(presets_dir) if presets_dir is not None else PRESETS_DIR
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.glob("*.yaml"))


def _is_path(name_or_path: str | Path) -> bool:
    return isinstance(name_or_path, Path) or Path(name_or_path).suffix in (".yaml", ".yml") or \
        Path(name_or_path).is_file()


def find_preset(name_or_path: str | Path, presets_dir: str | Path | None = None, kind: str = "filter") -> Path:
    """The YAML file of a preset: a name in `presets_dir` (default snr/presets/; case, `_` and `-`
    ignored) or a path. An unknown name raises :class:`UnknownPresetError` with a "did you mean"
    and the names that exist; `kind` names the presets in that message."""
    import difflib

    if _is_path(name_or_path):
        path = Path(name_or_path)
        if not path.is_file():
            raise FilterConfigError(f"{kind} preset file {path} does not exist")
        return path
    directory = Path(presets_dir) if presets_dir is not None else PRESETS_DIR
    by_key = {preset_key(name): directory / f"{name}.yaml" for name in available_presets(directory)}
    found = by_key.get(preset_key(str(name_or_path)))
    if found is not None:
        return found
    close = difflib.get_close_matches(preset_key(str(name_or_path)), list(by_key), n=1)
    hint = f" (did you mean {by_key[close[0]].stem}?)" if close else ""
    listed = ", ".join(p.stem for p in by_key.values()) if by_key else f"none ({directory} holds no presets)"
    raise UnknownPresetError(f"unknown {kind} preset '{name_or_path}'{hint}; available: {listed}")


def load_preset(name_or_path: str | Path, presets_dir: str | Path | None = None) -> FilterConfig:
    """Load and validate a filter preset.

    `name_or_path` is a preset name (``snr-top-p``; case, ``_`` and ``-`` ignored)
    looked up in `presets_dir` (default: the presets shipped in ``snr/presets/``), or
    the path of a YAML file.
    """
    import yaml  # only the loader needs it; selection itself is pure torch

    path = find_preset(name_or_path, presets_dir)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise FilterConfigError(f"filter preset {path} is not valid YAML: {exc}") from exc
    if data is None:
        raise FilterConfigError(f"filter preset {path} is empty; give at least the strategy")
    try:
        return FilterConfig.from_dict(data)
    except FilterConfigError as exc:
        raise FilterConfigError(f"filter preset {path}: {exc}") from exc
