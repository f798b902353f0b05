"""BM25 on tantivy, with collection statistics of the whole index across segments.

Each segment is its own tantivy index, and tantivy computes idf from one index's counts. With
several segments, each query term's clause is boosted by ``idf_global / idf_segment`` (document
frequencies and document counts summed over segments, tantivy's own idf formula), so every
segment scores with the idf of the whole collection. The length normalisation still uses each
segment's own average length, and tombstoned documents still count (as in Lucene until a merge):
``compact`` makes BM25 identical to a fresh build (docs/index-format.md measures the difference).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..index.snapshot import Snapshot
from .base import QueryBatch, Retriever

__all__ = ["BM25Retriever"]


def _idf(df: int, n: int) -> float:
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


class BM25Retriever(Retriever):
    name = "bm25"
    needs = "text"
    # exact BM25 of given rows is a term-set query (3.6 ms/query at 1,464 rows on the 30k pool,
    # benchmarks/living.py), a filtered deep fetch is far cheaper until very few rows are allowed
    exhaustive_max = 128

    def available(self, snap: Snapshot) -> bool:
        return bool(snap.segments) and all(s.sparse is not None and s.sparse.meta.get("bm25")
                                           for s in snap.segments)

    def prepare(self, snap: Snapshot, q: QueryBatch) -> Any:
        """``(tokens per query, boosts per segment per query)``; no boosts with one segment."""
        parts = [s.sparse for s in snap.segments]
        if not parts:
            return None
        tokens = [parts[0].bm25_tokens(t) for t in q.texts]  # type: ignore[union-attr]
        if len(parts) == 1:
            return tokens, None
        n_seg = [p.searcher.num_docs for p in parts]  # type: ignore[union-attr]
        n_all = sum(n_seg)
        boosts: list[list[dict[str, float]]] = [[] for _ in parts]
        for toks in tokens:
            uniq = dict.fromkeys(toks)
            df = {t: [p.doc_freq(t) for p in parts] for t in uniq}  # type: ignore[union-attr]
            for s in range(len(parts)):
                boosts[s].append({t: _idf(sum(d), n_all) / _idf(d[s], n_seg[s]) for t, d in df.items() if d[s] > 0})
        return tokens, boosts

    def search_segment(self, snap: Snapshot, i: int, q: QueryBatch, k: int, allowed: np.ndarray | None,
                       ctx: Any) -> tuple[np.ndarray, np.ndarray]:
        tokens, boosts = ctx
        return snap.segments[i].sparse.search_bm25(  # type: ignore[union-attr]
            q.texts, k, allowed=allowed, tokens=tokens, boosts=None if boosts is None else boosts[i])

    def score_segment(self, snap: Snapshot, i: int, q: QueryBatch, rows: np.ndarray, ctx: Any) -> np.ndarray:
        tokens, boosts = ctx
        return snap.segments[i].sparse.score_bm25(  # type: ignore[union-attr]
            q.texts, rows, tokens=tokens, boosts=None if boosts is None else boosts[i])
