"""Learned-sparse retrieval: exact top-k on tantivy with a proof per query (see index/sparse.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..index.snapshot import Snapshot
from .base import QueryBatch, Retriever

__all__ = ["SparseRetriever"]


from ..index.sparse import INVERTED_MAX as SMALL_SEGMENT  # scored exhaustively up to this size


class SparseRetriever(Retriever):
    """Exact learned-sparse top-k. Segments of up to :data:`SMALL_SEGMENT` documents (what adds
    make) are scored with one sparse matrix product for the whole query batch: exact, and without
    the fixed per-query cost of a tantivy search (about 0.5 ms per segment and query); larger ones
    go through tantivy with the per-query proof."""

    name = "sparse"
    needs = "sparse"

    def available(self, snap: Snapshot) -> bool:
        return bool(snap.segments) and all(s.sparse is not None and int(s.sparse.meta.get("vocab_size", 1)) > 1
                                           for s in snap.segments)

    def search_segment(self, snap: Snapshot, i: int, q: QueryBatch, k: int, allowed: np.ndarray | None,
                       ctx: Any) -> tuple[np.ndarray, np.ndarray]:
        part = snap.segments[i].sparse
        if part.num_docs > SMALL_SEGMENT:  # type: ignore[union-attr]
            return part.search(q.sparse, k, allowed=allowed)  # type: ignore[union-attr]
        return part.search_exhaustive(q.sparse, k, allowed=allowed)  # type: ignore[union-attr]

    def score_segment(self, snap: Snapshot, i: int, q: QueryBatch, rows: np.ndarray, ctx: Any) -> np.ndarray:
        return snap.segments[i].sparse.score(q.sparse, rows)  # type: ignore[union-attr]
