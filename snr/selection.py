"""SNR-aware group selection: score each prompt's group of rollouts, keep some.

A group is the G rollouts of one prompt. Its in-group reward spread bounds how
much task signal its policy gradient can carry (||g_task|| <= C * sqrt(Var(R|x))),
so :func:`select_groups` ranks groups by that spread (or by a score the caller
gives) and keeps the ones a strategy picks. An empty selection means "skip this
update": training on it would be regulariser noise only.

Semantics follow RAGEN-2's public ``ragen/trainer/rollout_filter.py``. Where we
deliberately differ, and why:

* Metric names say what they compute. RAGEN's ``reward_variance`` ranked by the
  standard deviation; here ``reward_variance`` is the variance and ``reward_std``
  is the standard deviation (RAGEN's behaviour, with ddof=1 like torch.std).
* Ties are broken by original group index (stable sort); RAGEN's torch.sort /
  topk left tie order unspecified. ``kept`` is returned ascending.
* Groups whose rewards are all equal (max - min <= ZERO_SPREAD_TOL) get a spread
  of exactly 0: float round-off otherwise leaves ~1e-34 "spread" on them. With
  include_zero=False such groups are dropped, also for metric "given" (RAGEN
  dropped groups whose *score* was 0; for a caller score such as entropy, "no
  reward spread" is the meaningful thing to drop).
* Linear top-p: groups with score <= 0 carry no mass and are passed over. RAGEN
  stopped at the first one, which is the same in ``largest`` order (they are all
  at the end) but in ``smallest`` order would empty the selection whenever one
  zero-spread group exists.
* Linear top-p's slack ``eps`` (RAGEN: 0.01) is in the units of the reward std, the
  score RAGEN summed. With metric ``reward_variance`` it is applied as the same share
  of the total: threshold = p * sum(var) - eps * sum(var) / sum(std). Taken as an
  absolute 0.01 on the variance it skipped every batch whose summed variance was
  <= 0.011, real spread (one group [0, 0, 0, 0.1]: variance 0.0025, std 0.05), where on
  the std it absorbs round-off and spreads below ~0.01 only. Now a batch is skipped on
  the variance exactly when it would be on the std (p * sum(std) <= eps).
* Softmax top-p: a cumulative mass within 1e-12 per group of p reaches p, so 10 tied
  groups at p = 0.9 keep 9 (RAGEN's float32 sum happens to round up to 0.90000004
  and keeps 9 as well; float64 rounds down to 0.8999999999999999).
* top_k: k = max(1, int(value * num_groups + 1e-9)) so that 0.29 * 100 keeps 29
  groups, not int(28.999999999999996) = 28.
* Statistics are computed in float64 on the CPU: the inputs are tiny (one number
  per rollout) and this keeps cumulative sums and ties reproducible on any device.
* The spread can be measured on the outcome instead of the reward (FilterConfig.signal;
  RAGEN filtered on the reward only): shaped rewards give a group spread that carries no
  task signal when its members differ only by format penalties.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .config import FilterConfig

ZERO_SPREAD_TOL = 1e-10  # a group whose rewards differ by no more than this has no spread
MIN_P_TOL = 1e-10  # RAGEN's slack so min_p keeps groups tied with the best despite round-off
_TOP_K_ROUNDING = 1e-9  # see module docstring: int(value * num_groups) without round-off loss
SOFTMAX_MASS_TOL = 1e-12  # per group: float64 round-off of a cumulative softmax mass


class FilterInputError(ValueError):
    """Rewards or scores passed to the filter are unusable; the message says why."""


@dataclass(frozen=True)
class Selection:
    """Which groups one filter step keeps.

    kept     int64 CPU tensor of group indices, ascending (original order).
    skip     True when nothing is kept: skip the update for this step.
    scores   float64 CPU tensor [num_groups]: the score each group was ranked by.
    metrics  plain floats for logging (see :func:`select_groups`).
    """

    kept: torch.Tensor
    skip: bool
    scores: torch.Tensor
    metrics: dict[str, float]

    @property
    def num_groups(self) -> int:
        return int(self.scores.numel())

    @property
    def kept_fraction(self) -> float:
        return self.kept.numel() / self.num_groups

    def group_mask(self) -> torch.Tensor:
        """Bool [num_groups]: True for kept groups."""
        mask = torch.zeros(self.num_groups, dtype=torch.bool)
        mask[self.kept] = True
        return mask

    def sample_mask(self, group_size: int) -> torch.Tensor:
        """Bool [num_groups * group_size] for a flat, group-major batch of rollouts."""
        if group_size < 1:
            raise FilterInputError(f"group_size must be >= 1; got {group_size}")
        return self.group_mask().repeat_interleave(group_size)


def _reward_matrix(rewards: Any) -> torch.Tensor:
    if not isinstance(rewards, torch.Tensor):
        try:
            rewards = torch.as_tensor(rewards)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise FilterInputError(f"rewards must be a tensor [num_groups, group_size]; got {type(rewards).__name__}") from exc
    if rewards.is_complex():
        raise FilterInputError(f"rewards must be real numbers; got dtype {rewards.dtype}")
    if rewards.dim() != 2:
        raise FilterInputError(
            f"rewards must be a 2-D tensor [num_groups, group_size] (one row per prompt); got shape "
            f"{tuple(rewards.shape)}. Reshape a flat batch with rewards.view(num_groups, group_size)"
        )
    num_groups, group_size = rewards.shape
    if num_groups == 0 or group_size == 0:
        raise FilterInputError(f"rewards must have at least one group and one rollout; got shape {tuple(rewards.shape)}")
    matrix = rewards.detach().to(device="cpu", dtype=torch.float64)
    bad = ~torch.isfinite(matrix)
    if bad.any():
        g, j = (int(i) for i in bad.nonzero()[0])
        raise FilterInputError(
            f"rewards contain {int(bad.sum())} NaN or infinite value(s), first at group {g}, rollout {j} "
            f"({matrix[g, j].item()}); fix the reward before filtering"
        )
    return matrix


def group_spread(rewards: Any, ddof: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """In-group reward spread: the one definition the filter, the batch metrics, the collapse
    watch, the gradient decomposition and the OpenRLHF engine share.

    `rewards` is a [num_groups, group_size] matrix (tensor, array or nested list) or a sequence
    of per-group reward lists whose lengths may differ (a batch whose groups lost members).
    Returns float64 CPU tensors ``(variance, std, zero_spread)``, each [num_groups]: the sample
    variance with `ddof` (1: divide by n - 1, torch.std's and RAGEN's; 0: by n), its square
    root, and whether all rewards in the group are equal (within ZERO_SPREAD_TOL; such a group
    gets exactly 0, not float round-off). A group of one rollout has spread 0 (none observed).
    """
    if isinstance(ddof, bool) or ddof not in (0, 1):
        raise FilterInputError(f"ddof must be 0 or 1; got {ddof!r}")
    if _is_ragged(rewards):
        parts = [group_spread([list(group)], ddof) for group in rewards]
        return tuple(torch.cat([part[i] for part in parts]) for i in range(3))  # type: ignore[return-value]
    matrix = _reward_matrix(rewards)
    group_size = matrix.shape[1]
    zero_spread = (matrix.amax(dim=1) - matrix.amin(dim=1)) <= ZERO_SPREAD_TOL
    if group_size == 1:
        variance = torch.zeros(matrix.shape[0], dtype=torch.float64)
    else:
        centred = matrix - matrix.mean(dim=1, keepdim=True)
        variance = centred.pow(2).sum(dim=1) / (group_size - ddof)
    variance = torch.where(zero_spread, torch.zeros_like(variance), variance)
    return variance, variance.sqrt(), zero_spread


def _is_ragged(rewards: Any) -> bool:
    """A list of per-group lists of different lengths (a matrix cannot hold it)."""
    if isinstance(rewards, (torch.Tensor, str, bytes)) or not isinstance(rewards, (list, tuple)) or not rewards:
        return False
    if not all(isinstance(group, (list, tuple)) for group in rewards):
        return False
    return len({len(group) for group in rewards}) > 1


def _given_scores(scores: Any, num_groups: int) -> torch.Tensor:
    if not isinstance(scores, torch.Tensor):
        scores = torch.as_tensor(scores)
    if scores.is_complex() or scores.dim() != 1 or scores.numel() != num_groups:
        raise FilterInputError(
            f"scores must be a real 1-D tensor with one score per group ({num_groups}); "
            f"got shape {tuple(scores.shape)}, dtype {scores.dtype}"
        )
    scores = scores.detach().to(device="cpu", dtype=torch.float64)
    bad = ~torch.isfinite(scores)
    if bad.any():
        g = int(bad.nonzero()[0, 0])
        raise FilterInputError(f"scores contain NaN or infinite value(s), first at group {g} ({scores[g].item()})")
    return scores


def _ranked(scores: torch.Tensor, order: str) -> torch.Tensor:
    """Positions of `scores` best-first; ties keep original order (stable sort)."""
    return torch.sort(scores, descending=(order == "largest"), stable=True).indices


_EMPTY = torch.zeros(0, dtype=torch.long)


def linear_top_p_slack(cfg: FilterConfig, scores: torch.Tensor, std: torch.Tensor) -> float:
    """Linear top-p's slack in the units of `scores` (the candidates' ranking scores).

    cfg.eps is RAGEN's slack on a sum of stds. For the variance it becomes the same share of
    the total (eps / sum(std) of it): an absolute eps on the variance, a quantity of another
    scale, would skip batches with real spread (see the module docstring). For reward_std and
    caller scores ("given") eps is taken as it is.
    """
    if cfg.metric != "reward_variance":
        return cfg.eps
    total_std = float(std.sum())
    return cfg.eps * float(scores.sum()) / total_std if total_std > 0 else 0.0


def _top_p_linear(s: torch.Tensor, cfg: FilterConfig, slack: float) -> torch.Tensor:
    # Shortest best-first run whose summed score reaches p * total - slack.
    threshold = cfg.value * float(s.sum()) - slack
    if threshold <= 0:
        # Nothing worth keeping (RAGEN: the running sum 0 already "reaches" the
        # threshold with no group taken, which it returns as empty).
        return _EMPTY
    ranked = _ranked(s, cfg.order)
    ranked = ranked[s[ranked] > 0]  # non-positive scores add no mass
    running = torch.cumsum(s[ranked], dim=0)
    first = int(torch.searchsorted(running, torch.tensor([threshold], dtype=running.dtype))[0])
    if first == ranked.numel():  # threshold never reached
        return _EMPTY
    return ranked[: first + 1]


def _top_p_softmax(s: torch.Tensor, cfg: FilterConfig) -> torch.Tensor:
    # Nucleus selection over softmax(score): keep until the mass reaches p; the
    # first group always enters, so this never comes back empty. A mass within
    # SOFTMAX_MASS_TOL per group of p counts as reaching it: 10 tied groups sum to
    # 0.8999999999999999 after 9 in float64 and would otherwise take a 10th.
    logits = s if cfg.order == "largest" else -s
    ranked = _ranked(s, cfg.order)
    mass = torch.cumsum(torch.softmax(logits, dim=0)[ranked], dim=0)
    target = cfg.value - SOFTMAX_MASS_TOL * s.numel()
    first = int(torch.searchsorted(mass, torch.tensor([target], dtype=mass.dtype))[0])
    return ranked[: min(first + 1, s.numel())]


def _pick(s: torch.Tensor, cfg: FilterConfig, num_groups: int, slack: float) -> torch.Tensor:
    """Positions in the candidate scores `s` that the strategy keeps (`slack`: linear top-p's)."""
    n = s.numel()
    if n == 0:
        return _EMPTY
    strategy = cfg.strategy
    if strategy == "none" or (strategy == "top_p" and cfg.value >= 1.0):
        # p = 1 keeps every candidate: RAGEN's documented "no filter" setting.
        return torch.arange(n)
    if strategy == "top_p":
        return _top_p_linear(s, cfg, slack) if cfg.top_p_mode == "linear" else _top_p_softmax(s, cfg)
    if strategy in ("top_k", "top_k_abs"):
        if strategy == "top_k":
            k = max(1, int(cfg.value * num_groups + _TOP_K_ROUNDING))
        else:
            k = int(cfg.value)
        return _ranked(s, cfg.order)[: min(k, n)]
    if strategy == "min_p":
        if cfg.order == "largest":
            keep = s >= cfg.value * s.max() - MIN_P_TOL
        elif cfg.value == 0:
            keep = torch.ones(n, dtype=torch.bool)
        else:
            # Mirror of `largest`: keep scores within a factor 1/value of the smallest.
            keep = s <= s.min() / cfg.value + MIN_P_TOL
        return keep.nonzero().flatten()
    raise AssertionError(f"unhandled strategy {strategy!r}")  # FilterConfig validated it


def _summary(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:  # nothing kept: 0.0 keeps the log numeric; read snr/skipped
        return {f"{prefix}_mean": 0.0, f"{prefix}_min": 0.0, f"{prefix}_max": 0.0}
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_min": float(values.min()),
        f"{prefix}_max": float(values.max()),
    }


def select_groups(rewards: Any, config: FilterConfig | None = None, scores: Any = None,
                  signal: Any = None) -> Selection:
    """Choose which groups of one batch to train on.

    rewards  float tensor [num_groups, group_size]: row i holds the G rollout
             rewards of prompt i. Any device; it is read, never modified.
    config   a :class:`FilterConfig` (default: keep every group; ``load_preset("snr-top-p")``
             is RAGEN-2's recommended filter).
    scores   with metric "given": one score per group (e.g. mean entropy or
             length) to rank by instead of the reward spread.
    signal   with config.signal other than "reward": that field's value for each rollout,
             [num_groups, group_size] like `rewards` (success: 1.0 / 0.0). The spread is
             measured on it: ranking, and the zero-spread groups include_zero=False drops.

    Metrics (plain floats): snr/groups_total, snr/groups_kept, snr/kept_fraction,
    snr/kept_reward_variance_share (kept / total in-group reward variance; 0.0 when
    the total is 0), snr/skipped (1.0 or 0.0), snr/zero_spread_groups (groups without
    spread in the signal), and the in-group reward std and variance before
    (snr/reward_std_mean|min|max, snr/reward_variance_mean|min|max) and after filtering
    (snr/kept_reward_...; 0.0 when nothing is kept). Under another signal the same
    spreads of it follow, named after it (snr/success_std_mean, snr/kept_success_std_mean,
    snr/kept_success_variance_share, ...), so a row says what the filter ranked; the
    snr/reward_... spreads stay the reward's (the stop rule and the collapse watch read
    them). Variance and std use config.ddof.
    """
    cfg = config if config is not None else FilterConfig()
    if not isinstance(cfg, FilterConfig):
        raise FilterInputError(f"config must be a FilterConfig (see snr.load_preset); got {type(cfg).__name__}")
    matrix = _reward_matrix(rewards)
    num_groups, group_size = matrix.shape
    variance, std, zero_spread = group_spread(matrix, cfg.ddof)
    signal_spread = _signal_spread(cfg, signal, matrix.shape)
    if signal_spread is not None:  # rank and drop by the signal's spread, report both
        reward_spread = (variance, std)
        variance, std, zero_spread = signal_spread

    if cfg.metric == "given":
        if scores is None:
            raise FilterInputError("metric 'given' ranks by caller scores: pass scores=<one value per group>")
        group_scores = _given_scores(scores, num_groups)
    else:
        if scores is not None:
            raise FilterInputError(
                f"scores were passed but metric is {cfg.metric!r}, which is computed from the rewards; "
                "use metric 'given' to rank by your own scores"
            )
        if group_size < 2 and cfg.strategy != "none":
            raise FilterInputError(
                f"group_size is {group_size}: a reward spread ({cfg.metric}) needs at least 2 rollouts "
                "per group; roll out each prompt G >= 2 times, or use strategy 'none' or metric 'given'"
            )
        group_scores = variance if cfg.metric == "reward_variance" else std

    candidates = torch.arange(num_groups)
    if not cfg.include_zero:
        candidates = candidates[~zero_spread]
    slack = linear_top_p_slack(cfg, group_scores[candidates], std[candidates])
    kept, _ = torch.sort(candidates[_pick(group_scores[candidates], cfg, num_groups, slack)])
    skip = kept.numel() == 0

    metrics: dict[str, float] = {
        "snr/groups_total": float(num_groups),
        "snr/groups_kept": float(kept.numel()),
        "snr/kept_fraction": kept.numel() / num_groups,
        "snr/skipped": 1.0 if skip else 0.0,
        "snr/zero_spread_groups": float(zero_spread.sum()),
    }
    if signal_spread is not None:
        metrics.update(_spread_metrics("reward", *reward_spread, kept))
    metrics.update(_spread_metrics(cfg.signal, variance, std, kept))
    return Selection(kept=kept, skip=skip, scores=group_scores, metrics=metrics)


def _spread_metrics(name: str, variance: torch.Tensor, std: torch.Tensor, kept: torch.Tensor) -> dict[str, float]:
    """snr/<name>_std|variance_mean|min|max before and after the filter, and the kept share."""
    total = float(variance.sum())
    out = {f"snr/kept_{name}_variance_share": float(variance[kept].sum()) / total if total > 0 else 0.0}
    out.update(_summary(f"snr/{name}_std", std))
    out.update(_summary(f"snr/{name}_variance", variance))
    out.update(_summary(f"snr/kept_{name}_std", std[kept]))
    out.update(_summary(f"snr/kept_{name}_variance", variance[kept]))
    return out


def _signal_spread(cfg: FilterConfig, signal: Any, shape: tuple[int, int]):
    """group_spread of the `signal` matrix under a signal other than the reward, else None."""
    if cfg.signal == "reward":
        if signal is not None:
            raise FilterInputError("signal values were passed but config.signal is 'reward'; set the "
                                   "FilterConfig's signal to the field they hold (e.g. signal='success')")
        return None
    if signal is None:
        raise FilterInputError(f"config.signal is {cfg.signal!r}: pass its value for each rollout as "
                               f"signal=<[num_groups, group_size] tensor>, in the layout of the rewards")
    try:
        matrix = _reward_matrix(signal)
    except FilterInputError as error:
        raise FilterInputError(f"signal {cfg.signal!r}: {error}".replace("rewards", "values")) from None
    if tuple(matrix.shape) != tuple(shape):
        raise FilterInputError(f"signal {cfg.signal!r} has shape {tuple(matrix.shape)}; the rewards have "
                               f"{tuple(shape)} (one value per rollout)")
    return group_spread(matrix, cfg.ddof)
