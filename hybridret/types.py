"""Result types: array-shaped :class:`Hits` with a per-hit view; the :class:`SearchBackend`
protocol every search-shaped object satisfies."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import scipy.sparse as sp

__all__ = ["Group", "Hit", "Hits", "MatchedTerm", "SearchBackend", "SearchResults", "Snippet", "result_json"]


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
class Snippet:
    """A window of a hit's text (:func:`hybridret.search.snippets.make_snippets`): ``text`` =
    ``hit.text[start:end]``; ``highlights`` are the ``(start, end)`` spans of its matched words,
    relative to ``text``."""

    text: str
    start: int
    end: int
    highlights: tuple[tuple[int, int], ...] = ()

    def marked(self, open: str = "**", close: str = "**") -> str:
        """The snippet with every matched word wrapped in ``open`` / ``close``."""
        out, at = [], 0
        for a, b in self.highlights:
            out += [self.text[at:a], open, self.text[a:b], close]
            at = b
        out.append(self.text[at:])
        return "".join(out)

    @property
    def words(self) -> list[str]:
        """The matched words, in order."""
        return [self.text[a:b] for a, b in self.highlights]

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "start": self.start, "end": self.end,
                "highlights": [list(h) for h in self.highlights]}


@dataclass(frozen=True)
class Hit:
    """One search result, with the score of each retriever that took part (and ``"rerank"``, the
    reranker's, when one ran). ``snippets``: the best window(s) of the text with the matched words'
    spans (:class:`~hybridret.search.snippets.Snippet`). In grouped results ``group`` is the key of the
    hit's group (the value of the ``group_by`` field, or the id of a document without it) and
    ``rank`` is its group's rank; otherwise ``rank`` counts from ``offset + 1``. ``relevance``: the
    calibrated probability that the hit is relevant, in [0, 1] (``search(..., relevance=True)``,
    see :mod:`hybridret.search.relevance`), else ``None``."""

    id: str
    rank: int
    score: float
    scores: dict[str, float]
    title: str
    text: str
    matched_terms: list[MatchedTerm] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    snippets: list[Snippet] = field(default_factory=list)
    group: Any = None
    relevance: float | None = None

    def to_dict(self, *, with_text: bool = True) -> dict[str, Any]:
        """JSON-ready: scores that are absent for this hit (NaN) are left out, never written as NaN;
        ``"relevance"`` only when it was asked for."""
        out: dict[str, Any] = {"id": self.id, "rank": self.rank, "score": _finite(self.score),
                               "scores": {k: v for k, v in self.scores.items() if v == v}}
        if self.relevance is not None:
            out["relevance"] = _finite(self.relevance)
        if with_text:
            out["title"] = self.title
            out["text"] = self.text
        out["metadata"] = dict(self.metadata)
        if self.matched_terms:
            total = sum(m.contribution for m in self.matched_terms)  # the hit's learned-sparse score
            out["matched_terms"] = [
                {"term": m.term, "query_weight": m.query_weight, "doc_weight": m.doc_weight,
                 "contribution": m.contribution, "expansion": m.expansion,
                 "share": m.contribution / total if total > 0 else 0.0}
                for m in self.matched_terms
            ]
        if self.snippets:
            out["snippets"] = [s.to_dict() for s in self.snippets]
        if self.group is not None:
            out["group"] = self.group
        return out


@dataclass(frozen=True)
class Group:
    """One group of a grouped search: its ``key`` (the ``group_by`` value, or the id of a
    document without one), ``rank`` (from ``offset + 1``), ``score`` (its best chunk's score) and
    its best chunks, best first."""

    key: Any
    rank: int
    score: float
    hits: list[Hit]

    def to_dict(self, *, with_text: bool = True) -> dict[str, Any]:
        return {"key": self.key, "rank": self.rank, "score": _finite(self.score),
                "hits": [h.to_dict(with_text=with_text) for h in self.hits]}


def _finite(x: float) -> float | None:
    return x if x == x and x not in (float("inf"), float("-inf")) else None


@dataclass
class Hits:
    """Results for ``nq`` queries, ``k`` each.

    ``ids`` (object array of str, ``""`` padding), ``rows`` (internal row numbers, ``-1`` padding)
    and ``scores`` (``-inf`` padding) all have shape ``(nq, k)``, ``k`` cut to the live documents
    searched (a ``k`` beyond the index costs nothing). ``components`` maps each
    retriever that took part (``"dense"``, ``"sparse"``, ``"bm25"``) to its exact scores of the same
    hits. ``hits[i]`` gives query ``i``'s results as :class:`Hit` objects, read from the index
    snapshot the search ran on (texts and metadata are never from a later commit). Pickling
    materialises every hit view, so unpickled Hits need no index.

    Grouped (``search(..., group_by=...)``): ``group_by`` names the field, ``group_size`` is
    ``g``, ``group_keys`` ``(nq, k)`` (``None`` padding) and ``group_scores`` ``(nq, k)``
    (``-inf`` padding) describe the groups, and ``ids`` / ``rows`` / ``scores`` / ``components``
    have shape ``(nq, k * g)``: group ``j``'s chunks at columns ``j * g .. j * g + g - 1``
    (padded where a group has fewer). ``hits[i]`` lists the chunks in that order and
    ``hits.groups(i)`` the :class:`Group` objects. ``offset``: how many hits (groups) the page
    skipped.

    With ``search(..., relevance=True)``: ``relevance`` ``(nq, k)`` (NaN padding) and
    ``answerability`` ``(nq,)``: per query, the calibrated probability that the index holds any
    relevant document for it (NaN for a blank query; ``None`` without an answerability model;
    :mod:`hybridret.search.relevance`, docs/relevance.md).
    """

    queries: list[str]
    method: str
    ids: np.ndarray
    rows: np.ndarray
    scores: np.ndarray
    components: dict[str, np.ndarray] = field(default_factory=dict)
    query_sparse: sp.csr_matrix | None = None
    offset: int = 0
    group_by: str | None = None
    group_size: int = 0
    group_keys: np.ndarray | None = None
    group_scores: np.ndarray | None = None
    relevance: np.ndarray | None = None
    answerability: np.ndarray | None = None
    _source: Any = field(default=None, repr=False)  # HitSource: the snapshot + encoder behind hit views
    _views: list[list[Hit]] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def __getitem__(self, i: int) -> list[Hit]:
        return self._view(i, details=True)

    def plain(self, i: int) -> list[Hit]:
        """Query ``i``'s results as ``hits[i]`` gives them, without ``matched_terms`` and
        ``snippets`` (working those out is most of what a hit view costs, about a millisecond a
        hit); for callers that show neither, such as the LlamaIndex adapters."""
        return self._view(i, details=False)

    def _view(self, i: int, *, details: bool) -> list[Hit]:
        if self._views is not None:
            return self._views[i]
        if self._source is None:
            raise RuntimeError("these Hits are not attached to an index")
        if not -len(self) <= i < len(self):
            raise IndexError(f"query {i} out of range for {len(self)} queries")
        i = i % len(self)
        return self._placed(i, self._source.view(self, i, details=details))

    def _placed(self, i: int, view: list[Hit]) -> list[Hit]:
        """Ranks from ``offset + 1`` (grouped: the group's rank) and each hit's group key."""
        if not self.offset and self.group_keys is None:
            return view
        from dataclasses import replace

        cols = [j for j, r in enumerate(self.rows[i]) if r >= 0]
        if self.group_keys is None:
            return [replace(h, rank=self.offset + j + 1) for h, j in zip(view, cols)]
        g = max(self.group_size, 1)
        return [replace(h, rank=self.offset + j // g + 1, group=self.group_keys[i, j // g])
                for h, j in zip(view, cols)]

    def groups(self, i: int) -> list[Group]:
        """Query ``i``'s groups, best first (grouped searches only)."""
        if self.group_keys is None:
            raise ValueError("these hits are not grouped: search with group_by=...")

        hits = self[i]
        out: list[Group] = []
        at = 0
        for j, key in enumerate(self.group_keys[i]):
            if key is None:
                continue
            n = int((self.rows[i, j * self.group_size:(j + 1) * self.group_size] >= 0).sum())
            out.append(Group(key=key, rank=self.offset + j + 1, score=float(self.group_scores[i, j]),
                             hits=hits[at:at + n]))
            at += n
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self._views is None and self._source is not None:
            state["_views"] = [self[i] for i in range(len(self))]
        state["_source"] = None
        return state

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(len(self)):
            yield self[i]


class SearchResults(Protocol):
    """What a search returns, in process (:class:`Hits`) or from a server
    (:class:`hybridret.client.RemoteHits`): ``queries``, the resolved ``method``, ``ids`` and
    ``scores`` of shape ``(nq, k)``, per-retriever ``components``, and ``results[i]`` -> the
    :class:`Hit` list of query ``i``."""

    queries: list[str]
    method: str
    ids: np.ndarray
    scores: np.ndarray
    components: dict[str, np.ndarray]

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> list[Hit]: ...

    def __iter__(self) -> Iterator[list[Hit]]: ...


@runtime_checkable
class SearchBackend(Protocol):
    """Anything that searches like a :class:`~hybridret.search.searcher.Searcher` and returns stored
    documents by id: ``Searcher``, ``HybridRetriever``, ``ShardedSearcher``,
    ``hybridret.client.Client`` and the server's ``LocalBackend`` / ``ShardedBackend``. The CLI,
    the server and the framework adapters take any of them.

    ``search(queries, k, **options)``: ``queries`` a string, a list of them or a
    :class:`~hybridret.search.request.SearchRequest`; ``k`` (``None``: 10, or the request's);
    ``options`` the request's fields (``method=``, ``filter=``, ``fusion=``, ``candidates=``, ``offset=``,
    ...; typed ``Any`` here so that this module needs none of them), each checked by the request.
    Implementations may add keyword-only parameters with defaults (``partial=``, ``with_text=``).
    ``isinstance(x, SearchBackend)`` checks that both methods exist.
    """

    def search(self, queries: Any, k: int | None = None, **options: Any) -> SearchResults: ...

    def get(self, ids: str | Sequence[str]) -> list[dict[str, Any] | None]: ...


def result_json(hits: Any, i: int, *, with_text: bool = True) -> dict[str, Any]:
    """Query ``i``'s result as JSON (the CLI's ``--json`` and the server's): ``"hits"`` (each with
    its ``"snippets"``; grouped: with its ``"group"``, ranked by group, in group order) and, when
    grouped, ``"groups"``: each group's key, rank, score and ``size`` (how many of the hits, which
    follow in that order, are the group's); with relevance, ``"answerability"`` (the probability
    that the index holds a relevant document for the query)."""
    out: dict[str, Any] = {"hits": [h.to_dict(with_text=with_text) for h in hits[i]]}
    answer = getattr(hits, "answerability", None)
    if answer is not None:  # searched with relevance (and an answerability model)
        out["answerability"] = _finite(float(answer[i]))
    if getattr(hits, "group_keys", None) is not None:
        out["groups"] = [{"key": g.key, "rank": g.rank, "score": _finite(g.score), "size": len(g.hits)}
                         for g in hits.groups(i)]
    return out
