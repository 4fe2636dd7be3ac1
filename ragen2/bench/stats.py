"""Paired comparisons of two arms over seeds: mean difference, 95% CIs, sign-flip p-value.

Pure statistics (numpy and scipy, no torch): `ragen2 bench report` calls `paired_comparison`
with one number per seed for each arm (e.g. final validation success). Seeds pair the arms: the
same seed starts from the same weights and sees the same instances, so the per-seed difference
removes what the seeds share, and the tests below are on those differences.

  t interval         mean ± t(0.975, n−1) · sd / √n; needs n ≥ 2.
  bootstrap interval percentile interval of the mean over `resamples` resamplings of the
                     differences with replacement, from a seeded generator (reproducible). With
                     few seeds it is narrower than the t interval (it cannot see beyond the
                     observed differences): read both.
  sign-flip p-value  two-sided: the share of the 2^n sign assignments of the differences whose
                     mean is at least as far from 0 as the observed one (exact for n ≤
                     `max_exact`; beyond, a seeded Monte Carlo estimate (1 + hits) / (1 + draws)).
                     Under the null "the arms do not differ", each difference is as likely
                     positive as negative. The smallest p it can give is 2 / 2^n (n = 8: 0.0078).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

LEVEL = 0.95
RESAMPLES = 10_000
MAX_EXACT = 16  # 2^16 = 65,536 sign assignments
TIE_TOL = 1e-12  # a flipped mean equal to the observed one (up to round-off) counts as extreme


def paired(a: dict, b: dict) -> tuple[list, list[float]]:
    """Seeds present in both (sorted) and the differences b − a on them; None values are dropped."""
    seeds = sorted(s for s in a.keys() & b.keys() if a[s] is not None and b[s] is not None)
    return seeds, [float(b[s]) - float(a[s]) for s in seeds]


def t_interval(diffs: list[float], level: float = LEVEL) -> tuple[float, float] | None:
    n = len(diffs)
    if n < 2:
        return None
    from scipy.stats import t  # scipy is a dependency (ragen2 audit's Spearman); loaded when used

    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = float(t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def bootstrap_interval(diffs: list[float], level: float = LEVEL, resamples: int = RESAMPLES,
                       seed: int = 0) -> tuple[float, float] | None:
    if len(diffs) < 2:
        return None
    values = np.asarray(diffs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    low, high = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
    return float(low), float(high)


def sign_flip_p_value(diffs: list[float], max_exact: int = MAX_EXACT, resamples: int = 100_000,
                      seed: int = 0) -> tuple[float, bool] | None:
    """(two-sided p, exact?) of the paired sign-flip (permutation) test on the mean difference."""
    n = len(diffs)
    if n == 0:
        return None
    values = np.asarray(diffs, dtype=np.float64)
    observed = abs(values.mean())
    if n <= max_exact:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        flipped = np.abs(signs @ values) / n
        return float((flipped >= observed - TIE_TOL).mean()), True
    rng = np.random.default_rng(seed)
    signs = rng.choice((1.0, -1.0), size=(resamples, n))
    hits = int((np.abs(signs @ values) / n >= observed - TIE_TOL).sum())
    return (1 + hits) / (1 + resamples), False


def paired_comparison(a: dict, b: dict, level: float = LEVEL, seed: int = 0) -> dict:
    """b − a over the seeds both arms finished: n, seeds, mean, sd, t and bootstrap CIs, p-value."""
    seeds, diffs = paired(a, b)
    n = len(diffs)
    mean = sum(diffs) / n if n else None
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else None
    test = sign_flip_p_value(diffs, seed=seed)
    return {"n": n, "seeds": seeds, "differences": diffs, "mean": mean, "sd": sd, "level": level,
            "t_ci": t_interval(diffs, level), "bootstrap_ci": bootstrap_interval(diffs, level, seed=seed),
            "sign_flip_p": None if test is None else test[0], "p_exact": None if test is None else test[1]}


def least_squares_slope(x: np.ndarray, y: np.ndarray) -> float:
    x = x - x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


def cluster_bootstrap_slope(clusters: list[tuple[list[float], list[float]]], level: float = LEVEL,
                            resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Slope of y on x over every point, with a percentile CI from resampling whole clusters.

    Points of one cluster share what makes them dependent (in a training run: the policy and the
    batch of one step), so the clusters, not the points, are the independent draws."""
    arrays = [(np.asarray(cx, dtype=float), np.asarray(cy, dtype=float)) for cx, cy in clusters]
    x = np.concatenate([a[0] for a in arrays])
    y = np.concatenate([a[1] for a in arrays])
    estimate = least_squares_slope(x, y)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        picked = rng.integers(0, len(arrays), size=len(arrays))
        bx = np.concatenate([arrays[i][0] for i in picked])
        if np.ptp(bx) > 0:  # a resample whose x are all equal has no slope
            draws.append(least_squares_slope(bx, np.concatenate([arrays[i][1] for i in picked])))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return {"slope": estimate, "ci95": [float(low), float(high)], "points": int(x.size), "clusters": len(arrays)}
