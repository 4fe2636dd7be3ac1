"""RAGEN-2's template-collapse probe on a TRL GRPO batch (pure torch; no TRL import).

Every `every` steps, on the batch before filtering, the policy cross-scores the batch's
completions under its prompts (`mi_probe.cross_score`): rows are completions (all the tokens the
policy sampled: the local engine's `segment: reply`), subsampled to `num_samples` without
replacement from the probe's own RNG keyed by the step; one column per distinct prompt among the
sampled rows (RAGEN-2: a group with no sampled row has no column). The estimates
(`mi_probe.mi_metrics_both`), MI-ZScore-EMA (`mi_probe.ZScoreEMA`) and the collapse detector
(`mi_probe.CollapseDetector`) are mi_probe's own; keys are logged as the local engine logs them
(`probe/...`, `alert/...`).

Precision, as the local engine's `probe.dtype`: by default the policy's compute dtype, the one
TRL's own forward runs in (accelerate's bf16/fp16 autocast where `bf16`/`fp16` is on, else the
weights' dtype), as RAGEN-2 scores with the actor's forward; `dtype="float32"` scores in fp32 for
MI compared across machines. Logits are upcast before the log-softmax either way (mi_probe). TRL
averages its log values as numbers, so a row records its dtype as `probe/dtype/<name>: 1.0`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import mi_probe
from mi_probe import Alert, CollapseDetectorConfig
from ragen2 import metric_names as names
from ragen2 import seeding
from ragen2.instruments.probe import EARLY_WARNINGS, usable_scores


DTYPE_CHOICES = ("policy", "float32")
MIXED_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}  # accelerate's names


def scoring_dtype(model, requested: str = "policy", mixed_precision: str | None = None) -> torch.dtype:
    """What the probe scores `model` in: under "policy", the dtype TRL's forward computes in
    (accelerate's `mixed_precision` autocast, else the weights' own); under "float32", fp32."""
    weights = next(model.parameters()).dtype
    if requested == "float32":
        if weights != torch.float32:
            raise ValueError(f"MIProbeArgs(dtype='float32') needs fp32 weights; the model's are {weights} "
                             "(load it in float32 with bf16=True for mixed precision, or use dtype='policy')")
        return torch.float32
    return MIXED_PRECISION.get(mixed_precision or "no", weights)


def scoring_context(model, dtype: torch.dtype):
    """Autocast to `dtype` where the weights differ from it, else none (not even a caller's)."""
    param = next(model.parameters())
    if dtype == param.dtype:
        return torch.autocast(param.device.type, enabled=False)
    return torch.autocast(param.device.type, dtype=dtype)


def dtype_key(dtype: torch.dtype) -> str:
    """The numeric log key that says a row scored in `dtype`: probe/dtype/bfloat16."""
    return f"{names.PROBE_DTYPE}/{str(dtype).removeprefix('torch.')}"


@dataclass(frozen=True)
class MIProbeArgs:
    """What `RAGEN2GRPOTrainer(mi_probe=...)` probes with.

    every                  probe every this many optimizer steps (at steps 0, every, 2 every, ...).
    num_samples            completions cross-scored per probe (all of them when fewer).
    micro_batch_size       completions per forward under one prompt's KV cache.
    ks                     retrieval accuracy@k for these k (chance is k / distinct prompts).
    ema_decay              decay of MI-ZScore-EMA's spread (RAGEN: 0.9).
    collapse               the collapse detector's thresholds.
    stop_on_collapse       stop training on a template-collapse alert.
    stop_on_early_warning  stop on a reward-std cliff too.
    dtype                  what the scoring computes in: "policy" (TRL's mixed precision, else the
                           weights' dtype) or "float32" (needs fp32 weights).
    """

    every: int = 10
    num_samples: int = 64
    micro_batch_size: int = 16
    ks: tuple[int, ...] = (1, 2, 4, 8)
    ema_decay: float = 0.9
    collapse: CollapseDetectorConfig = field(default_factory=CollapseDetectorConfig)
    stop_on_collapse: bool = False
    stop_on_early_warning: bool = False
    dtype: str = "policy"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {DTYPE_CHOICES}; got {self.dtype!r}")
        for name in ("every", "num_samples", "micro_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1; got {value!r}")
        object.__setattr__(self, "ks", tuple(self.ks))
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1); got {self.ema_decay!r}")


def probe_pairs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                completion_mask: torch.Tensor, num_samples: int, step: int):
    """(prompts, completions, owners) for `mi_probe.cross_score` from TRL's padded batch tensors.

    Prompts are left-padded and completions right-padded; the masks say which tokens are real.
    Completions with no token are not candidates. Columns are the distinct prompts of the sampled
    rows, in first-seen order; `owners[i]` is row i's column.
    """
    rows = [i for i in range(completion_ids.shape[0]) if int(completion_mask[i].sum()) > 0]
    if len(rows) > num_samples:
        picked = seeding.probe_rng(step).choice(len(rows), size=num_samples, replace=False)
        rows = [rows[i] for i in sorted(picked.tolist())]
    columns: dict[tuple[int, ...], int] = {}
    completions, owners = [], []
    for i in rows:
        prompt = tuple(prompt_ids[i][prompt_mask[i].bool()].tolist())
        owners.append(columns.setdefault(prompt, len(columns)))
        completions.append(completion_ids[i][completion_mask[i].bool()].tolist())
    return [list(p) for p in columns], completions, owners


def metric_keys(ks: tuple[int, ...]) -> list[str]:
    """The keys `CollapseProbe.measure` returns, in a fixed order (processes average them by position)."""
    dummy = torch.zeros(2, 2)
    return [*mi_probe.mi_metrics_both(dummy, dummy, [0, 1], ks=ks), "num_empty_dropped", "num_nonfinite_dropped"]


class CollapseProbe:
    """The probe's state across a run: MI-ZScore-EMA's spread and the collapse detector."""

    def __init__(self, args: MIProbeArgs, pad_token_id: int = 0):
        self.args = args
        self.pad_token_id = int(pad_token_id)
        self.ema = mi_probe.ZScoreEMA(decay=args.ema_decay)
        self.detector = mi_probe.CollapseDetector(args.collapse)
        self.keys = metric_keys(args.ks)
        self.last_dtype: torch.dtype | None = None  # what the last measure scored in, for its log row

    def due(self, step: int) -> bool:
        return step % self.args.every == 0

    def measure(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, step: int,
                mixed_precision: str | None = None) -> dict | None:
        """mi_probe's estimates for one batch, or None when fewer than 2 prompts have a scored row.
        `mixed_precision`: accelerate's setting ("no", "bf16", "fp16"), what TRL's forward runs in."""
        self.last_dtype = None
        prompts, completions, owners = probe_pairs(prompt_ids, prompt_mask, completion_ids, completion_mask,
                                                   self.args.num_samples, step)
        if len(set(owners)) < 2:
            return None
        dtype = scoring_dtype(model, self.args.dtype, mixed_precision)
        with scoring_context(model, dtype):
            scores = mi_probe.cross_score(model, prompts, completions, owners,
                                          micro_batch_size=self.args.micro_batch_size, pad_token_id=self.pad_token_id)
        self.last_dtype = dtype
        L, L_sum, owner, column_ids, nonfinite = usable_scores(scores)
        if len(column_ids) < 2:  # the other rows scored NaN: a diagnostic never ends a run
            return None
        metrics = mi_probe.mi_metrics_both(L, L_sum, owner, column_ids=column_ids, ks=self.args.ks)
        metrics["num_empty_dropped"] = float(scores.num_empty_dropped)
        metrics["num_nonfinite_dropped"] = float(nonfinite)
        return metrics

    def observe(self, step: int, metrics: dict | None = None, *, entropy: float | None = None,
                reward_std: float | None = None) -> tuple[dict[str, float], list[Alert], Alert | None]:
        """Feed one step: the probe's metrics (None on steps without a probe), the policy entropy and
        the in-group reward std. Returns (what to log, the alerts raised, the alert to stop on)."""
        logged: dict[str, float] = {}
        mi_zscore_ema = None
        if metrics is not None:
            metrics = {**metrics, **self.ema.update(metrics)}
            mi_zscore_ema = metrics["mi_zscore_ema"]
            logged = {names.PROBE + key: float(value) for key, value in metrics.items()}
        alerts = self.detector.update(step, mi_zscore_ema=mi_zscore_ema, entropy=entropy, reward_std=reward_std)
        for alert in alerts:
            logged[f"alert/{alert.kind}"] = 1.0
        stopping = [a for a in alerts if (a.kind == "template_collapse" and self.args.stop_on_collapse)
                    or (a.kind in EARLY_WARNINGS and self.args.stop_on_early_warning)]
        return logged, alerts, stopping[0] if stopping else None

    def state_dict(self) -> dict:
        return {"ema": self.ema.state_dict(), "detector": self.detector.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state["ema"])
        self.detector.load_state_dict(state["detector"])
