"""Learned-sparse retrieval: exact top-k on tantivy with a proof per query (see index/learned.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..index.snapshot import Snapshot
from .base import QueryBatch, Retriever

__all__ = ["SparseRetriever"]


from ..index.learned import INVERTED_MAX as SMALL_SEGMENT  # scored exhaustively up to this size


class SparseRetriever(Retriever):
    """Exact learned-sparse top-k. Segments of up to :data:`SMALL_SEGMENT` documents (what adds
    make) are scored with one sparse matrix product for the whole query batch: exact, and without
    the fixed per-query cost of a tantivy search (about 0.5 ms per segment and query); larger ones
    go through tantivy with the per-query proof."""

    name = "sparse"
    needs = "sparse"
    part = "sparse"

    def search_segment(self, snap: Snapshot, i: int, q: QueryBatch, k: int, allowed: np.ndarray | None,
                       ctx: Any, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        part = snap.segments[i].part(self.part)
        if part.num_docs > SMALL_SEGMENT:
            return part.search(q.get(self.needs), k, allowed=allowed, threads=threads)
        return part.search_exhaustive(q.get(self.needs), k, allowed=allowed)  # one sparse product, one thread

    def score_segment(self, snap: Snapshot, i: int, q: QueryBatch, rows: np.ndarray, ctx: Any, *,
                      threads: int | None = None) -> np.ndarray:
        return snap.segments[i].part(self.part).score(q.get(self.needs), rows)  # numpy, one thread
