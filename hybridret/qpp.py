"""Label-free, per-query signals of how far each retriever can be trusted (query performance
prediction), computed from the candidate union alone.

:func:`agreement` is the one the default ``hybrid`` method uses: a retriever whose top list shares
documents with the other retrievers' top lists is more likely right on that query than one that
agrees with nobody (the "wisdom of crowds" / reference-list idea of QPP, e.g. Shtok, Kurland and
Carmel, "Using statistical decision theory and relevance models for query-performance prediction",
SIGIR 2010; Diaz, "Performance prediction using spatial autocorrelation", SIGIR 2007). It needs
nothing but each retriever's exact scores and which candidates it listed, so a coordinator that
merges shards computes it once over the global union.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .errors import ConfigError

__all__ = ["agreement", "agreement_weights", "top_mask"]


def top_mask(scores: np.ndarray, listed: np.ndarray, k: int) -> np.ndarray:
    """``(nq, m)`` bool: the ``k`` best-scored candidates among those ``listed`` (ties by position)."""
    if k < 1:
        raise ConfigError(f"top_mask needs k >= 1, got {k}")
    s = np.where(listed, scores, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    keep = np.take_along_axis(listed, order, axis=1)
    out = np.zeros(listed.shape, dtype=bool)
    np.put_along_axis(out, order, keep, axis=1)
    return out


def agreement(exact: Mapping[str, np.ndarray], listed: Mapping[str, np.ndarray], names: Sequence[str],
              k: int = 10) -> dict[str, np.ndarray]:
    """Per retriever and query, the mean over the *other* retrievers ``s`` of
    ``|top_k(r) ∩ top_k(s)| / k``: 1 when every other retriever has the same top ``k``, 0 when none
    shares a document. With fewer than two retrievers there is nothing to agree with: all ones."""
    names = list(names)
    missing = [n for n in names if n not in exact or n not in listed]
    if missing:
        raise ConfigError(f"agreement needs exact scores and listed masks of {missing}")
    nq = next(iter(exact.values())).shape[0] if exact else 0
    if len(names) < 2:
        return {n: np.ones(nq) for n in names}
    tops = {n: top_mask(exact[n], listed[n], k) for n in names}
    return {r: np.mean([(tops[r] & tops[s]).sum(axis=1) / k for s in names if s != r], axis=0) for r in names}


def agreement_weights(base: Mapping[str, float], agree: Mapping[str, np.ndarray], floor: float = 0.05
                      ) -> dict[str, np.ndarray]:
    """Per-query weights ``base[r] * (agree[r] + floor)``, normalised to sum to 1 per query.

    ``floor`` keeps a retriever that agrees with nobody from vanishing (and gives equal weights when
    no retriever agrees with any other)."""
    if floor <= 0:
        raise ConfigError(f"agreement floor must be positive, got {floor}")
    raw = {r: abs(float(w)) * (np.asarray(agree[r], dtype=np.float64) + floor) for r, w in base.items()}
    total = sum(raw.values())
    total = np.where(total > 0, total, 1.0)  # type: ignore[call-overload]
    return {r: v / total for r, v in raw.items()}
