"""Learned-sparse retrieval: exact top-k from the segment's ``sparse`` part.

The default part (:mod:`hybridret.index.impact_windows`, 8-bit impacts in row windows; the
former default :mod:`hybridret.index.impact` prunes with impact layers) searches in numba; segments of
the tantivy tf-grid format (:mod:`hybridret.index.learned`) search through tantivy with a proof
per query, or with one sparse product when small. ``SparseApproxRetriever`` (method
``"sparse_approx"``) is the opt-in approximate search of those parts (``mode="approx"``); on
parts without one it is exact. On the windowed part each query's approximate answer is certified
exact or not, and the part's ``search(mode="approx", escalate=True)`` re-runs the uncertified ones
exactly (a search option for it waits for the one ``SearchRequest`` of issue #29)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..index.snapshot import Snapshot
from .base import QueryBatch, Retriever

__all__ = ["SparseApproxRetriever", "SparseRetriever"]


from ..index.learned import INVERTED_MAX as SMALL_SEGMENT  # tf-grid segments scored exhaustively up to this size


def _pruned(part: Any) -> bool:
    from ..index.impact import ImpactIndex
    from ..index.impact_windows import WindowImpactIndex

    return isinstance(part, (ImpactIndex, WindowImpactIndex))


class SparseRetriever(Retriever):
    """Exact learned-sparse top-k. Impact parts search with their pruned kernel at every size;
    tf-grid segments of up to :data:`SMALL_SEGMENT` documents (what adds made) are scored with
    one sparse matrix product for the whole batch, larger ones go through tantivy with the proof."""

    name = "sparse"
    needs = "sparse"
    part = "sparse"
    mode = "exact"

    def search_segment(self, snap: Snapshot, i: int, q: QueryBatch, k: int, allowed: np.ndarray | None,
                       ctx: Any, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        part = snap.segments[i].part(self.part)
        if _pruned(part):
            return part.search(q.get(self.needs), k, allowed=allowed, threads=threads, mode=self.mode)
        if part.num_docs > SMALL_SEGMENT:
            return part.search(q.get(self.needs), k, allowed=allowed, threads=threads)
        return part.search_exhaustive(q.get(self.needs), k, allowed=allowed)  # one sparse product, one thread

    def score_segment(self, snap: Snapshot, i: int, q: QueryBatch, rows: np.ndarray, ctx: Any, *,
                      threads: int | None = None) -> np.ndarray:
        return snap.segments[i].part(self.part).score(q.get(self.needs), rows)  # one thread


class SparseApproxRetriever(SparseRetriever):
    """Approximate learned-sparse top-k (opt-in, never a default): the impact part's top layers
    and exact re-scoring of the best partial sums; its recall against exact search is measured per
    index by ``hybridret info --sparse-approx``."""

    name = "sparse_approx"
    mode = "approx"
