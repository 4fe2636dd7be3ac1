"""MI, entropy and retrieval estimates from a cross-scoring matrix.

``L[i, j]`` is the log-probability of reasoning ``z_i`` teacher-forced after
prompt ``x_j`` (token mean, or the sequence sum for ``L_sum``); ``owner[i]`` is
the column of the prompt that really produced ``z_i``. Under the batch's own
prompt distribution (uniform over the N columns):

* ``matched_i  = L[i, owner_i]``                       -- log p(z_i | x_i)
* ``marginal_i = logsumexp_j L[i, j] - log N``        -- log p_mix(z_i)
* ``mi_estimate = mean(matched - marginal)``           -- I(X; Z), at most log N
* ``conditional_entropy_est = -mean(matched)``         -- H(Z | X)
* ``reasoning_entropy_est   = -mean(marginal)``        -- H(Z)
* ``mi_zscore = mean((matched - marginal) / (sigma + eps))`` with sigma the
  population std of ``marginal``: the gap measured in units of how much the
  marginal itself varies, so a global shift of all log-probs does not move it.

Retrieval (own prompt ranked within the top k) ranks *distinct prompts*, not
columns: columns whose prompt identity (``column_ids``) is equal are merged
and the merged prompt is scored by its best column. Without this a batch with
the same prompt in two columns could never retrieve "the" right column
reliably, and chance would no longer be k / (number of prompts).

Ties count as expected chance: if ``g`` other prompts score strictly higher
than the owner's and ``t`` others tie with it, the owner's rank is taken as
uniformly random among the ``t + 1`` tied places, so the row scores
``clip((k - g) / (t + 1), 0, 1)`` at k. This is deterministic, needs no
random tie-break, and gives exactly the chance level k / D when all D prompts
tie (reasoning independent of the prompt).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "DEFAULT_KS",
    "DEFAULT_STD_EPS",
    "mi_metrics",
    "mi_metrics_both",
    "prompt_identities",
]

DEFAULT_KS: tuple[int, ...] = (1, 2, 4, 8)
DEFAULT_STD_EPS = 1e-3
# Keys that describe the batch rather than a score; they carry no ``_seq`` suffix.
_COUNT_KEYS = ("num_rows", "num_prompts", "num_distinct_prompts")


def prompt_identities(column_ids: Sequence[Any]) -> list[int]:
    """Map each column's prompt identity to a dense id, in first-seen order.

    Identities are compared by value; lists, tuples, numpy arrays and tensors of
    token ids are compared as token tuples, so identical prompts share an id.
    """
    seen: dict[Hashable, int] = {}
    dense: list[int] = []
    for position, ident in enumerate(column_ids):
        key = _hashable_identity(ident, position)
        dense.append(seen.setdefault(key, len(seen)))
    return dense


def _hashable_identity(ident: Any, position: int) -> Hashable:
    if isinstance(ident, torch.Tensor):
        return ("tokens", tuple(int(t) for t in ident.reshape(-1).tolist()))
    if isinstance(ident, np.ndarray):
        return ("tokens", tuple(int(t) for t in ident.reshape(-1).tolist()))
    if isinstance(ident, (list, tuple)):
        return ("tokens", tuple(ident))
    try:
        hash(ident)
    except TypeError:
        raise TypeError(
            f"column_ids[{position}] of type {type(ident).__name__} is not hashable; "
            "pass an int, a string or a sequence of token ids"
        ) from None
    return ("id", ident)


def _as_matrix(L: Any, name: str) -> torch.Tensor:
    """Float64 copy of a 2-D score matrix, with the checks a probe needs."""
    if isinstance(L, torch.Tensor):
        mat = L.detach().to(device="cpu", dtype=torch.float64)
    else:
        try:
            mat = torch.as_tensor(np.asarray(L, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must be a 2-D array of numbers: {err}") from None
    if mat.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, prompts], got shape {tuple(mat.shape)}")
    rows, cols = mat.shape
    if rows == 0:
        raise ValueError(f"{name} has no rows (every reasoning was empty?); nothing to estimate")
    if cols == 0:
        raise ValueError(f"{name} has no prompt columns")
    if not torch.isfinite(mat).all():
        bad = (~torch.isfinite(mat)).nonzero()[0].tolist()
        raise ValueError(f"{name} has a non-finite entry at {tuple(bad)}: {mat[bad[0], bad[1]].item()}")
    return mat


def _as_owner(owner: Any, rows: int, cols: int) -> torch.Tensor:
    if isinstance(owner, torch.Tensor):
        arr = owner.detach().cpu().reshape(-1)
    else:
        arr = torch.as_tensor(np.asarray(owner).reshape(-1))
    if arr.numel() != rows:
        raise ValueError(f"owner has {arr.numel()} entries but L has {rows} rows")
    if arr.dtype.is_floating_point or arr.dtype == torch.bool:
        raise TypeError(f"owner must hold integer column indices, got dtype {arr.dtype}")
    arr = arr.to(torch.long)
    if rows and (arr.min() < 0 or arr.max() >= cols):
        raise ValueError(f"owner indices must lie in [0, {cols}), got min {arr.min().item()} max {arr.max().item()}")
    return arr


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    out = tuple(ks)
    if not out:
        raise ValueError("ks must name at least one k")
    for k in out:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"every k in ks must be an int >= 1, got {k!r}")
    return tuple(int(k) for k in out)


def _with_suffix(key: str, suffix: str) -> str:
    # "retrieval_accuracy@4" + "_seq" -> "retrieval_accuracy_seq@4"
    if not suffix or key in _COUNT_KEYS:
        return key
    head, at, tail = key.partition("@")
    return f"{head}{suffix}{at}{tail}"


def _retrieval(
    L: torch.Tensor,
    owner: torch.Tensor,
    ident: torch.Tensor,
    num_distinct: int,
    ks: tuple[int, ...],
    tie_tol: float,
) -> dict[str, float]:
    rows = L.shape[0]
    # Score each distinct prompt by its best column (identical prompts give
    # identical columns up to rounding, so max only absorbs the rounding).
    per_prompt = torch.full((rows, num_distinct), -math.inf, dtype=L.dtype)
    per_prompt.scatter_reduce_(1, ident.unsqueeze(0).expand(rows, -1), L, reduce="amax")
    own = per_prompt.gather(1, ident[owner].unsqueeze(1))  # [rows, 1]
    higher = (per_prompt > own + tie_tol).sum(dim=1)
    tied_others = (per_prompt >= own - tie_tol).sum(dim=1) - higher - 1
    out: dict[str, float] = {}
    for k in ks:
        hit = ((k - higher).to(L.dtype) / (tied_others + 1).to(L.dtype)).clamp(0.0, 1.0)
        accuracy = hit.mean().item()
        chance = min(1.0, k / num_distinct)
        out[f"retrieval_accuracy@{k}"] = accuracy
        out[f"retrieval_chance_level@{k}"] = chance
        out[f"retrieval_above_chance@{k}"] = accuracy - chance
    return out


def mi_metrics(
    L: Any,
    owner: Any,
    *,
    column_ids: Sequence[Any] | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    std_eps: float = DEFAULT_STD_EPS,
    tie_tol: float = 0.0,
    suffix: str = "",
) -> dict[str, float]:
    """Estimates from one cross-scoring matrix ``L`` [rows, N].

    Args:
        L: ``L[i, j]`` = log-prob of reasoning i after prompt j (tensor, array or nested list).
        owner: [rows] column index of each row's own prompt.
        column_ids: optional [N] prompt identity per column (ints, strings or token-id
            sequences); equal identities are one prompt for retrieval. Default: all distinct.
        ks: the k of retrieval accuracy@k.
        std_eps: added to sigma in the z-score (RAGEN uses 1e-3).
        tie_tol: scores within this distance of the owner's count as tied (default exact ties).
        suffix: appended to every score key ("_seq" for the sequence-sum matrix).

    Returns a flat dict of floats; see the module docstring for the formulas.
    """
    return _metrics(_as_matrix(L, "L"), owner, column_ids, ks, std_eps, tie_tol, suffix)


def _metrics(
    mat: torch.Tensor,
    owner: Any,
    column_ids: Sequence[Any] | None,
    ks: Sequence[int],
    std_eps: float,
    tie_tol: float,
    suffix: str,
) -> dict[str, float]:
    rows, cols = mat.shape
    own_col = _as_owner(owner, rows, cols)
    ks_checked = _check_ks(ks)
    if not (std_eps > 0 and math.isfinite(std_eps)):
        raise ValueError(f"std_eps must be a positive finite number, got {std_eps}")
    if not (tie_tol >= 0 and math.isfinite(tie_tol)):
        raise ValueError(f"tie_tol must be a finite number >= 0, got {tie_tol}")
    if column_ids is None:
        ident_list = list(range(cols))
    else:
        if len(column_ids) != cols:
            raise ValueError(f"column_ids has {len(column_ids)} entries but L has {cols} columns")
        ident_list = prompt_identities(column_ids)
    ident = torch.tensor(ident_list, dtype=torch.long)
    num_distinct = int(ident.max().item()) + 1

    matched = mat[torch.arange(rows), own_col]
    marginal = torch.logsumexp(mat, dim=1) - math.log(cols)
    gap = matched - marginal
    sigma = marginal.std(unbiased=False) if rows > 1 else torch.zeros((), dtype=mat.dtype)

    metrics: dict[str, float] = {
        "mi_estimate": gap.mean().item(),
        "mi_upper_bound": math.log(cols),
        "matched_log_prob_mean": matched.mean().item(),
        "marginal_log_prob_mean": marginal.mean().item(),
        "conditional_entropy_est": -matched.mean().item(),
        "reasoning_entropy_est": -marginal.mean().item(),
        "marginal_std": sigma.item(),
        "mi_zscore": (gap / (sigma + std_eps)).mean().item(),
    }
    metrics.update(_retrieval(mat, own_col, ident, num_distinct, ks_checked, tie_tol))
    out = {_with_suffix(key, suffix): value for key, value in metrics.items()}
    out.update({"num_rows": float(rows), "num_prompts": float(cols), "num_distinct_prompts": float(num_distinct)})
    return out


def mi_metrics_both(
    L: Any,
    L_sum: Any,
    owner: Any,
    *,
    column_ids: Sequence[Any] | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    std_eps: float = DEFAULT_STD_EPS,
    tie_tol: float = 0.0,
) -> dict[str, float]:
    """``mi_metrics`` on the token-mean matrix ``L`` and, with a ``_seq`` suffix, on ``L_sum``.

    Each ``L_sum`` row is its ``L`` row times the reasoning's token count, so retrieval
    ranks agree; the MI, entropies and z-score differ (sequence-level nats).
    """
    mat, mat_sum = _as_matrix(L, "L"), _as_matrix(L_sum, "L_sum")
    if mat.shape != mat_sum.shape:
        raise ValueError(f"L and L_sum must have the same shape, got {tuple(mat.shape)} and {tuple(mat_sum.shape)}")
    token = _metrics(mat, owner, column_ids, ks, std_eps, tie_tol, "")
    token.update(_metrics(mat_sum, owner, column_ids, ks, std_eps, tie_tol, "_seq"))
    return token
