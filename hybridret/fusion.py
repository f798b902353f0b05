"""Score fusion over a candidate union: small pure functions on ``(nq, m)`` arrays.

Invalid entries (padding) are marked by ``valid=False`` and never influence statistics.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .errors import ConfigError

__all__ = ["NORMALISATIONS", "candidate_union", "linear_fusion", "normalise", "rrf_fusion"]

NORMALISATIONS = ("none", "minmax", "zscore")


def candidate_union(*row_sets: np.ndarray) -> np.ndarray:
    """Per query, the distinct rows (``>= 0``) of several ``(nq, k_i)`` arrays; ``-1`` padded."""
    if not row_sets:
        raise ConfigError("candidate_union needs at least one row set")
    stacked = np.concatenate([np.asarray(r, dtype=np.int64) for r in row_sets], axis=1)
    out = []
    for row in stacked:
        seen = dict.fromkeys(int(x) for x in row if x >= 0)  # keeps first-seen order
        out.append(list(seen))
    width = max((len(x) for x in out), default=0)
    union = np.full((len(out), max(width, 1)), -1, dtype=np.int64)
    for i, rows in enumerate(out):
        union[i, : len(rows)] = rows
    return union


def normalise(scores: np.ndarray, valid: np.ndarray, method: str = "minmax") -> np.ndarray:
    """Normalise each query's valid scores; invalid entries become 0.

    ``minmax`` maps to [0, 1] (all-equal scores -> 0); ``zscore`` subtracts the mean and divides by
    the standard deviation (0 when constant); ``none`` leaves scores as they are.
    """
    if method not in NORMALISATIONS:
        raise ConfigError(f"unknown normalisation {method!r}; expected one of {', '.join(NORMALISATIONS)}")
    s = np.where(valid, scores, 0.0).astype(np.float64)
    if method == "none":
        return s
    count = valid.sum(axis=1, keepdims=True)
    if method == "minmax":
        lo = np.where(valid, scores, np.inf).min(axis=1, keepdims=True)
        hi = np.where(valid, scores, -np.inf).max(axis=1, keepdims=True)
        span = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(span > 0, (s - lo) / np.where(span > 0, span, 1.0), 0.0)
    else:
        mean = s.sum(axis=1, keepdims=True) / np.maximum(count, 1)
        var = (np.where(valid, (s - mean) ** 2, 0.0)).sum(axis=1, keepdims=True) / np.maximum(count, 1)
        std = np.sqrt(var)
        out = np.where(std > 0, (s - mean) / np.where(std > 0, std, 1.0), 0.0)
    return np.where(valid, out, 0.0)


def linear_fusion(
    scores: Mapping[str, np.ndarray],
    valid: np.ndarray,
    weights: Mapping[str, float] | None = None,
    normalisation: str = "minmax",
) -> np.ndarray:
    """``sum_r w_r * normalise(s_r)`` over retrievers; equal weights by default."""
    if not scores:
        raise ConfigError("linear_fusion needs at least one retriever's scores")
    weights = weights or {name: 1.0 / len(scores) for name in scores}
    unknown = set(weights) - set(scores)
    if unknown:
        raise ConfigError(f"weights given for retrievers without scores: {sorted(unknown)}")
    fused = np.zeros(valid.shape, dtype=np.float64)
    for name, s in scores.items():
        fused += float(weights.get(name, 0.0)) * normalise(s, valid, normalisation)
    return np.where(valid, fused, -np.inf)


def _ranks(scores: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """1-based rank of each entry within its query (descending score, ties by position)."""
    s = np.where(valid, scores, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(1, s.shape[1] + 1)[None, :].repeat(s.shape[0], 0), axis=1)
    return ranks


def rrf_fusion(
    scores: Mapping[str, np.ndarray],
    valid: Mapping[str, np.ndarray] | np.ndarray,
    k: float = 60.0,
    weights: Mapping[str, float] | None = None,
) -> np.ndarray:
    """Reciprocal rank fusion: ``sum_r w_r / (k + rank_r(d))`` over the retrievers that ranked ``d``.

    ``valid`` says, per retriever, which candidates that retriever actually returned (its own
    top list): a document outside a retriever's list gets nothing from it.
    """
    if k < 0:
        raise ConfigError(f"RRF k must be non-negative, got {k}")
    fused: np.ndarray | None = None
    any_valid: np.ndarray | None = None
    for name, s in scores.items():
        v = valid[name] if isinstance(valid, Mapping) else valid
        contrib = np.where(v, float((weights or {}).get(name, 1.0)) / (k + _ranks(s, v)), 0.0)
        fused = contrib if fused is None else fused + contrib
        any_valid = v if any_valid is None else (any_valid | v)
    if fused is None or any_valid is None:
        raise ConfigError("rrf_fusion needs at least one retriever's scores")
    return np.where(any_valid, fused, -np.inf)

