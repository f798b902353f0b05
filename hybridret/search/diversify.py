"""Diversity: Maximal Marginal Relevance (MMR) over the first stage's pool of hits or groups.

``search(..., diversify=lam)`` (``lam`` = λ in ``[0, 1]``) reorders a pool of candidates so that the
hits returned are relevant *and* unlike each other (Carbonell and Goldstein, 1998). Greedily, the next
hit is the candidate ``d`` of the pool not yet chosen that maximises

    λ · rel(d) − (1 − λ) · max over chosen s of cos(d, s)

(the first hit: the most relevant one; ties: the pool's order). λ = 1 is pure relevance (the
first stage's order), λ = 0 pure novelty; 0.5-0.9 is the usual range for RAG prompts.

* **rel**: the pool's scores (the fused score, the retriever's score, or the reranker's when
  ``rerank`` is set), min-max normalised over each query's pool to ``[0, 1]`` so that they weigh
  against cosines whatever the scale of the method (RRF scores are ~0.016, GQR's z-scores ~3).
* **cos**: the exact cosine of the candidates' stored dense vectors (read from the index's dense
  part by row, on a sharded index from the owning shards); the index needs a dense part.
* **pool**: with a reranker, its ``rerank_depth`` reranked hits; a fused method, the fused ranking
  of its whole candidate union (per-retriever depth ``candidates``, else the fusion's depth);
  a single retriever, its top :data:`DIVERSIFY_POOL` (at least ``offset + k``).
* **grouped** (``group_by``): documents are diversified, not chunks. The pool is the first
  stage's first :data:`DIVERSIFY_POOL` groups (at least ``offset + k``): a single retriever's exact
  top groups; a fused method's groups of the fused ranking of its candidate union, deepened as the
  plain grouped search is (so that the fused scores, which depend on the union, are the plain
  search's); with a reranker, the groups of the reranked list. A group's relevance is its group
  score and its vector its best chunk's (the chunk that gives the group its score and is shown
  first: a mean of its chunks would blur a document's best passage with its weakest); each group
  keeps its chunks.
* **pages**: the MMR order is computed over the whole pool and then cut, so ``offset=k`` is the
  continuation of the same order (as long as ``offset + k`` stays within the pool, which then
  does not change with the page).

The hits keep their first-stage scores (so they are no longer sorted by score); the order is the
MMR order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["DIVERSIFY_POOL", "check_diversify", "mmr_order"]

DIVERSIFY_POOL = 100
"""Hits (grouped: groups) of a single retriever's first stage that MMR chooses from."""


def check_diversify(value: Any) -> float | None:
    """λ as a float in ``[0, 1]`` (``None``: no diversity stage). Booleans and strings are refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"diversify must be a number from 0 to 1 (MMR's lambda: 1 = pure relevance, "
                          f"0 = pure novelty), got {value!r}")
    lam = float(value)
    if not 0.0 <= lam <= 1.0:  # NaN fails too
        raise ConfigError(f"diversify must be from 0 to 1 (MMR's lambda: 1 = pure relevance, 0 = pure novelty), "
                          f"got {value!r}")
    return lam


def _unit(vectors: np.ndarray) -> np.ndarray:
    v = vectors.astype(np.float64)
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)


def mmr_order(scores: np.ndarray, vectors: np.ndarray, valid: np.ndarray, lam: float, n: int) -> np.ndarray:
    """Per query, the positions of the pool in MMR order, ``(nq, n)`` (``-1`` padded when a pool
    holds fewer than ``n`` valid entries). ``scores`` ``(nq, m)``: the relevance of each pool entry,
    ``vectors`` ``(nq, m, dim)`` their dense vectors, ``valid`` ``(nq, m)`` which entries exist.
    Relevance is min-max normalised over each query's valid entries; similarity is the cosine."""
    nq, m = scores.shape
    out = np.full((nq, n), -1, dtype=np.int64)
    for i in range(nq):
        cand = np.flatnonzero(valid[i])
        if not len(cand):
            continue
        rel = scores[i, cand].astype(np.float64)
        lo, hi = rel.min(), rel.max()
        rel = (rel - lo) / (hi - lo) if hi > lo else np.ones_like(rel)
        unit = _unit(vectors[i, cand])
        left = np.ones(len(cand), dtype=bool)
        closest = np.full(len(cand), -np.inf)  # max cosine to the chosen ones
        for j in range(min(n, len(cand))):
            gain = lam * rel - (1.0 - lam) * np.where(np.isfinite(closest), closest, 0.0) if j else rel.copy()
            gain[~left] = -np.inf
            pick = int(np.argmax(gain))  # the first of equal gains: the pool's order
            out[i, j] = cand[pick]
            left[pick] = False
            closest = np.maximum(closest, unit @ unit[pick])
    return out
