"""Result types: array-shaped :class:`Hits` with a per-hit view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import scipy.sparse as sp

__all__ = ["Hit", "Hits", "MatchedTerm"]


@dataclass(frozen=True)
class MatchedTerm:
    """A sparse term shared by the query and the document vectors."""

    term: str
    query_weight: float
    doc_weight: float
    expansion: bool  # True when the term does not occur in the document's own text

    @property
    def contribution(self) -> float:
        return self.query_weight * self.doc_weight


@dataclass(frozen=True)
class Hit:
    """One search result, with the score of each retriever that took part."""

    id: str
    rank: int
    score: float
    scores: dict[str, float]
    title: str
    text: str
    matched_terms: list[MatchedTerm] = field(default_factory=list)

    def to_dict(self, *, with_text: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "rank": self.rank, "score": self.score, "scores": dict(self.scores)}
        if with_text:
            out["title"] = self.title
            out["text"] = self.text
        if self.matched_terms:
            out["matched_terms"] = [
                {"term": m.term, "query_weight": m.query_weight, "doc_weight": m.doc_weight,
                 "contribution": m.contribution, "expansion": m.expansion}
                for m in self.matched_terms
            ]
        return out


@dataclass
class Hits:
    """Results for ``nq`` queries, ``k`` each.

    ``ids`` (object array of str, ``""`` padding), ``rows`` (internal row numbers, ``-1`` padding)
    and ``scores`` (``-inf`` padding) all have shape ``(nq, k)``. ``components`` maps each
    retriever that took part (``"dense"``, ``"sparse"``, ``"bm25"``) to its exact scores of the same
    hits. ``hits[i]`` gives query ``i``'s results as :class:`Hit` objects.
    """

    queries: list[str]
    method: str
    ids: np.ndarray
    rows: np.ndarray
    scores: np.ndarray
    components: dict[str, np.ndarray] = field(default_factory=dict)
    query_sparse: sp.csr_matrix | None = None
    _viewer: Any = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def __getitem__(self, i: int) -> list[Hit]:
        if self._viewer is None:
            raise RuntimeError("these Hits are not attached to a retriever")
        return self._viewer(self, i)

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(len(self)):
            yield self[i]
