"""Score fusion over a candidate union: small pure functions on ``(nq, m)`` arrays.

Invalid entries (padding) are marked by ``valid=False`` and never influence statistics.
:class:`Candidates` holds a gathered union and :func:`select` takes the top-k of fused scores over
it; both live here so that every fusion method (:mod:`~hybridret.fusion.builtin`,
:mod:`~hybridret.fusion.gqr`, one registered from outside) builds on this module alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["NORMALISATIONS", "Candidates", "FusedRows", "candidate_union", "linear_fusion", "normalise",
           "rrf_fusion", "select"]

NORMALISATIONS = ("none", "minmax", "zscore")

FusedRows = tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]
"""What a fusion method returns: rows ``(nq, k)`` (``-1`` padded), fused scores ``(nq, k)`` float32
(``-inf`` padded) and each retriever's exact score of those rows (float32, ``nan`` padded)."""


@dataclass
class Candidates:
    """The union of the retrievers' top lists with every retriever's exact scores.

    ``vectors`` (optional) holds the stored dense vectors of the rows (zeros for ``-1``): with it,
    :func:`hybridret.fusion.config.fuse` needs no snapshot for any method but GQR's ``final="research"``,
    so a coordinator can fuse a union gathered from shards."""

    rows: np.ndarray  # (nq, m), -1 padded
    exact: dict[str, np.ndarray]  # retriever -> (nq, m) exact scores
    listed: dict[str, np.ndarray]  # retriever -> (nq, m) bool: candidate is in that retriever's own list
    vectors: np.ndarray | None = None  # (nq, m, dim) float32 dense vectors of the rows

    @property
    def valid(self) -> np.ndarray:
        return self.rows >= 0


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


def select(union: np.ndarray, fused: np.ndarray, exact: Mapping[str, np.ndarray], k: int) -> FusedRows:
    """Top-k of fused candidate scores (ties by position), carrying each retriever's exact score."""
    order = np.argsort(-np.where(union >= 0, fused, -np.inf), axis=1, kind="stable")[:, :k]
    rows = np.take_along_axis(union, order, axis=1)
    scores = np.take_along_axis(np.asarray(fused, dtype=np.float64), order, axis=1)
    comps = {name: np.take_along_axis(np.asarray(v, dtype=np.float64), order, axis=1) for name, v in exact.items()}
    if rows.shape[1] < k:
        pad = k - rows.shape[1]
        rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
        scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        comps = {n: np.pad(v, ((0, 0), (0, pad)), constant_values=np.nan) for n, v in comps.items()}
    invalid = rows < 0
    scores = np.where(invalid, -np.inf, scores)
    comps = {n: np.where(invalid, np.nan, v).astype(np.float32) for n, v in comps.items()}
    return rows, scores.astype(np.float32), comps
