"""The retriever protocol, and the search and exact scoring of any retriever over a snapshot.

A retriever implements two things per segment: ``search_segment`` (top-k rows of one segment,
restricted to an ``allowed`` mask) and ``score_segment`` (exact scores of given rows). This module
turns them into search and scoring over a whole :class:`~hybridret.index.snapshot.Snapshot`: the
mask of each segment is its live rows (tombstones) and the filter's matches; a segment where few
rows are allowed is scored exhaustively instead (exact, and cheaper than deep fetching); the
per-segment top lists are merged by score, ties by global row.

**Threads.** :func:`search_rows` and :func:`score_rows` take the call's thread budget, ``threads``
(``None``: every core; ``1``: no worker thread is started, everything runs on the calling thread),
and pass it explicitly to the retriever's ``prepare`` / ``search_segment`` / ``score_segment``,
which pass it to the part (tantivy's per-query threads, the BM25 store's blocks, FAISS's OpenMP
threads). Segments are searched one after another, each with at most ``threads`` workers.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..encoders.base import ByName
from ..errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover

    from ..encoders.reps import Representation
    from ..filters import Filter
    from ..index.parts import PartType
    from ..index.snapshot import Snapshot

__all__ = ["EXHAUSTIVE_MAX", "QueryBatch", "Retriever", "allowed_mask", "check_threads", "prepare_context",
           "score_rows", "search_rows"]

EXHAUSTIVE_MAX = 2048  # a segment with at most this many allowed rows is scored exhaustively
_THREADED = ("prepare", "search_segment", "score_segment")  # the protocol methods given the thread budget


def check_threads(threads: Any) -> int | None:
    """A thread budget: ``None`` (every core) or a positive integer."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ConfigError(f"threads must be a positive integer or None (every core), got {threads!r}")
    return int(threads)


def _takes_threads(fn: Callable[..., Any]) -> bool:
    params = inspect.signature(fn).parameters.values()
    return any(p.name == "threads" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class QueryBatch(ByName):
    """Queries as the retrievers need them: their texts, and each representation by name.

    ``reps`` maps a representation name (an encoder head such as ``"dense"`` (float32 ``(n, d)``)
    or ``"sparse"`` (CSR ``(n, V)``), or a representation a registered retriever brings) to its
    values for the ``n`` queries: anything indexable by a row slice. ``dense=`` / ``sparse=`` are
    accepted as keywords, and ``q.dense`` / ``q.sparse`` read them (``None`` when absent).
    """

    def __init__(self, texts: list[str], reps: Mapping[str, Any] | None = None, **named: Any) -> None:
        super().__init__(reps, **named)
        self.texts = list(texts)

    def __len__(self) -> int:
        return len(self.texts)

    def with_(self, **reps: Any) -> QueryBatch:
        """A copy with some representations replaced (``None`` removes one)."""
        merged = dict(self.reps)
        merged.update(reps)
        return QueryBatch(self.texts, merged)

    def slice(self, a: int, b: int) -> QueryBatch:
        return QueryBatch(self.texts[a:b], {k: v[a:b] for k, v in self.reps.items()})

    def __repr__(self) -> str:
        return f"QueryBatch({len(self)} queries, reps={sorted(self.reps)})"


class Retriever(ABC):
    """One way of ranking documents (dense, learned sparse, BM25, ...). Stateless: everything a
    search needs is in the snapshot and the queries, so one instance serves every thread.

    ``needs`` is what the queries must carry: a representation name (``"dense"``, ``"sparse"``, or
    the retriever's own) or ``"text"``. ``part`` is the segment part it reads (default: its name).
    A retriever that brings a part format of its own sets ``part_type`` (every index built while it
    is registered then writes that part, from ``needs``), and one whose representation no encoder
    makes sets ``representation``; :func:`hybridret.retrievers.register` registers both.
    ``positive_only``: a score of 0 means "no match" and such rows are never returned.

    **Collection statistics.** A retriever whose scores depend on the whole collection (BM25's
    document count, average length and document frequencies) sets ``global_stats = True`` and
    implements :meth:`statistics`: this snapshot's share for a query batch, a value supporting
    ``+``. A sharded search sums every shard's value and hands the sum to each shard's
    :meth:`prepare` (``stats=``), so every shard scores as one index would; a single index passes
    ``stats=None`` (its snapshot is the whole collection). ``shardable = False`` marks a retriever
    that one such round cannot make exact (a sharded index then refuses it instead of returning
    different results).
    ``prepare``, ``search_segment`` and ``score_segment`` are given the call's thread budget as a
    ``threads`` keyword (``None``: every core; ``1``: start no thread) when they accept one; a
    retriever whose methods do not is called without it, and must then start no thread itself.
    Keep nothing from a search on the retriever or the part: what is worth keeping per commit goes
    in ``snap.cache`` (see :class:`~hybridret.index.snapshot.SnapshotCache`).
    """

    name: ClassVar[str]
    needs: ClassVar[str]
    part: ClassVar[str] = ""
    part_type: ClassVar[PartType | None] = None
    representation: ClassVar[Representation | None] = None
    positive_only: ClassVar[bool] = True
    # a segment with at most this many allowed rows is scored exhaustively (exact, and cheaper than
    # a deep fetch); retrievers whose exact scoring is expensive lower it
    exhaustive_max: ClassVar[int] = EXHAUSTIVE_MAX
    # collection statistics: see the class docstring and :meth:`statistics`
    global_stats: ClassVar[bool] = False
    shardable: ClassVar[bool] = True
    # which of _THREADED take ``threads`` (found once per class, when it is defined)
    takes_threads: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.takes_threads = frozenset(m for m in _THREADED if _takes_threads(getattr(cls, m)))

    def threads_kw(self, method: str, threads: int | None) -> dict[str, Any]:
        """``{"threads": threads}`` when ``method`` takes it, else ``{}``."""
        return {"threads": threads} if method in self.takes_threads else {}

    @property
    def part_name(self) -> str:
        """The segment part this retriever reads."""
        return self.part or self.name

    def available(self, snap: Snapshot) -> bool:
        """Whether every segment of the snapshot has the part this retriever reads."""
        return bool(snap.segments) and all(s.part(self.part_name) is not None for s in snap.segments)

    def statistics(self, snap: Snapshot, q: QueryBatch) -> Any:
        """This snapshot's collection statistics for the batch ``q`` (retrievers with
        ``global_stats``): a value whose ``+`` combines shards, e.g.
        :class:`~hybridret.retrievers.bm25.BM25Stats`. Default: ``None`` (none needed)."""
        return None

    def prepare(self, snap: Snapshot, q: QueryBatch, stats: Any = None, *, threads: int | None = None) -> Any:
        """Per-call context shared by all segments; default none. ``stats``: the sum of every
        shard's :meth:`statistics` for ``q`` (``None``: this snapshot is the whole collection)."""
        return None

    @abstractmethod
    def search_segment(self, snap: Snapshot, i: int, q: QueryBatch, k: int, allowed: np.ndarray | None,
                       ctx: Any, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows of segment ``i`` (rows local to it, ``-1`` padded) and their scores."""

    @abstractmethod
    def score_segment(self, snap: Snapshot, i: int, q: QueryBatch, rows: np.ndarray, ctx: Any, *,
                      threads: int | None = None) -> np.ndarray:
        """Exact scores of local rows ``rows`` (``(nq, m)``, ``-1`` = none) of segment ``i``."""


def prepare_context(r: Retriever, snap: Snapshot, q: QueryBatch, stats: Any = None, *,
                    threads: int | None = None) -> Any:
    """``r.prepare(snap, q, stats)``, given the thread budget when it takes one."""
    return r.prepare(snap, q, stats=stats, **r.threads_kw("prepare", threads))


def allowed_mask(snap: Snapshot, i: int, filt: Filter | None) -> np.ndarray | None:
    """Rows of segment ``i`` that may be returned: live, and matching the filter (``None`` = all)."""
    live = snap.live[i]
    if filt is None:
        return live
    match = filt.segment_mask(snap.segments[i])
    return match if live is None else (match & live)


def _exhaustive(r: Retriever, snap: Snapshot, i: int, q: QueryBatch, k: int, allowed: np.ndarray, ctx: Any,
                threads: int | None) -> tuple[np.ndarray, np.ndarray]:
    cand = np.flatnonzero(allowed)
    nq = len(q)
    rows = np.broadcast_to(cand, (nq, len(cand)))
    scores = r.score_segment(snap, i, q, rows, ctx, **r.threads_kw("score_segment", threads)).astype(np.float32)
    if r.positive_only:
        scores = np.where(scores > 0, scores, -np.inf)
    order = np.lexsort((np.broadcast_to(cand, scores.shape), -scores), axis=1)[:, :k]
    top_rows = np.take_along_axis(rows, order, axis=1)
    top = np.take_along_axis(scores, order, axis=1)
    top_rows = np.where(np.isfinite(top), top_rows, -1)
    if top_rows.shape[1] < k:
        pad = k - top_rows.shape[1]
        top_rows = np.pad(top_rows, ((0, 0), (0, pad)), constant_values=-1)
        top = np.pad(top, ((0, 0), (0, pad)), constant_values=-np.inf)
    return top_rows, top


def merge_topk(parts: list[tuple[np.ndarray, np.ndarray]], k: int, nq: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-segment top lists given in global rows: best score first, ties by row."""
    if not parts:
        return np.full((nq, k), -1, dtype=np.int64), np.full((nq, k), -np.inf, dtype=np.float32)
    if len(parts) == 1:
        return parts[0]
    rows = np.concatenate([p[0] for p in parts], axis=1)
    scores = np.concatenate([p[1] for p in parts], axis=1).astype(np.float32)
    scores = np.where(rows >= 0, scores, -np.inf)
    key_rows = np.where(rows >= 0, rows, np.iinfo(np.int64).max)
    order = np.lexsort((key_rows, -scores), axis=1)[:, :k]
    return np.take_along_axis(rows, order, axis=1), np.take_along_axis(scores, order, axis=1)


def search_rows(r: Retriever, snap: Snapshot, q: QueryBatch, k: int, filt: Filter | None = None,
                ctx: Any = None, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k global rows ``(nq, k)`` and scores of retriever ``r`` over the snapshot, pre-filtered.
    ``threads``: the call's thread budget (``None``: every core; ``1``: no worker thread)."""
    nq = len(q)
    threads = check_threads(threads)
    if ctx is None:
        ctx = prepare_context(r, snap, q, threads=threads)
    kw = r.threads_kw("search_segment", threads)
    parts = []
    for i, seg in enumerate(snap.segments):
        allowed = allowed_mask(snap, i, filt)
        n_allowed = seg.num_docs if allowed is None else int(np.count_nonzero(allowed))
        if n_allowed == 0 or nq == 0:
            continue
        if allowed is not None and n_allowed <= r.exhaustive_max:
            rows, scores = _exhaustive(r, snap, i, q, k, allowed, ctx, threads)
        else:
            rows, scores = r.search_segment(snap, i, q, k, allowed, ctx, **kw)
        base = int(snap.offsets[i])
        parts.append((np.where(rows >= 0, rows + base, -1), scores))
    return merge_topk(parts, k, nq)


def score_rows(r: Retriever, snap: Snapshot, q: QueryBatch, rows: np.ndarray, ctx: Any = None, *,
               threads: int | None = None) -> np.ndarray:
    """Exact scores of retriever ``r`` for global ``rows`` ``(nq, m)`` (``-1`` -> 0). ``threads``:
    the call's thread budget, as in :func:`search_rows`."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros(rows.shape, dtype=np.float32)
    if rows.size == 0:
        return out
    threads = check_threads(threads)
    if ctx is None:
        ctx = prepare_context(r, snap, q, threads=threads)
    kw = r.threads_kw("score_segment", threads)
    seg_of, local = snap.locate(rows)
    for i in np.unique(seg_of[seg_of >= 0]):
        mine = seg_of == i
        sub = np.where(mine, local, -1)
        keep = mine.any(axis=0)  # columns where some query has a row of this segment
        scores = r.score_segment(snap, int(i), q, sub[:, keep], ctx, **kw)
        block = out[:, keep]
        block[mine[:, keep]] = scores[mine[:, keep]]
        out[:, keep] = block
    return out
