"""BM25 of a format-1 segment written before the BM25 posting store: tantivy's ``text`` field.

tantivy scores with its own statistics (its tombstones included), so the BM25 retriever boosts each
query term's clause by ``idf_global / idf_segment`` and uses the length normalisation tantivy has.
Everything this view needs is read once, at open; searching writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["TantivyBM25"]


class TantivyBM25:
    """The ``"bm25"`` part of a format-1 segment without a posting store (see the module docstring)."""

    def __init__(self, sparse: Any) -> None:
        self.sparse = sparse  # the segment's legacy SparseIndex (format 1)
        self.meta = {"format": "hybridret-sparse-v1 (tantivy text field)", "num_docs": sparse.num_docs}
        self.analyzer = sparse.analyzer
        self.tantivy_docs = int(sparse.searcher.num_docs)  # N as tantivy counts it (deleted rows included)
        self.avgdl = _avgdl(sparse)

    @property
    def num_docs(self) -> int:
        return int(self.sparse.num_docs)

    def doc_freq(self, token: str) -> int:
        return self.sparse.doc_freq(token)

    def search(self, texts: Sequence[str], k: int, *, allowed: np.ndarray | None, tokens: Sequence[Sequence[str]],
               boosts: Sequence[dict[str, float]] | None, threads: int | None) -> tuple[np.ndarray, np.ndarray]:
        return self.sparse.search_bm25(texts, k, allowed=allowed, tokens=tokens, boosts=boosts, threads=threads)

    def score(self, texts: Sequence[str], rows: np.ndarray, *, tokens: Sequence[Sequence[str]],
              boosts: Sequence[dict[str, float]] | None) -> np.ndarray:
        return self.sparse.score_bm25(texts, rows, tokens=tokens, boosts=boosts)


def _avgdl(sparse: Any) -> float:
    """tantivy's average text length of the segment, read from one explanation."""
    top = sparse.searcher.terms_with_prefix("text", "", limit=1)
    if not top:
        return 0.0
    query = sparse._bm25_query([top[0][0]])
    hits = sparse.searcher.search(query, 1, count=False).hits
    if not hits:
        return 0.0

    def walk(node: dict[str, Any]) -> float | None:
        if str(node.get("description", "")).startswith("avgdl"):
            return float(node["value"])
        for child in node.get("details", []) or []:
            v = walk(child)
            if v is not None:
                return v
        return None

    return walk(json.loads(query.explain(sparse.searcher, hits[0][1]).to_json())) or 0.0
