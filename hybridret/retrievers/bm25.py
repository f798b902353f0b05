"""BM25 over a snapshot, every segment scored with one set of collection statistics.

Each segment's BM25 store (``index/bm25.py``: posting arrays, tantivy's document lengths) scores
under *given* statistics (``BM25Stats``: documents, total length, df per token). By default they
are the snapshot's own, over its **live** documents: tombstoned rows are subtracted exactly (their
lengths and postings are in the store), so BM25 after deletes, adds and any segmentation equals a
fresh one-segment build of the live documents, ids and scores. BM25 declares ``global_stats``
(:class:`~hybridret.retrievers.base.Retriever`): a coordinator of shards sums every shard's
:meth:`BM25Retriever.statistics` (:func:`collection_stats` of the batch's tokens) and passes the
sum to each shard's :meth:`BM25Retriever.prepare`, so that every shard scores as one index.

Format-1 segments written before the store existed (their ``"bm25"`` part is a
:class:`~hybridret.index.legacy.tantivy_bm25.TantivyBM25`) are searched through tantivy, as
before: each query term's clause is boosted by ``idf_global / idf_segment``, the length
normalisation is the segment's own and its tombstones still count. ``compact`` (or the merge
policy) rewrites them with the store.

What a search derives from the snapshot is kept on it (``Snapshot.cache``), never on the shared
store: each segment's live statistics under the snapshot's tombstones (:func:`live_stats`, once per
snapshot) and its tf factors with their block maxima (the pruned top-k's bounds) for the ``avgdl``
searched with (:func:`tf_factors`, computed once per ``avgdl``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..index.bm25 import K1, BM25Store, QueryTerms, SegmentQueries, TfFactors, idf
from ..index.snapshot import Snapshot
from .base import QueryBatch, Retriever

__all__ = ["BM25Retriever", "BM25Stats", "bm25_tokens", "collection_stats", "live_stats", "tf_factors"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BM25Stats:
    """Collection statistics of BM25: documents counted, the sum of their field lengths (as
    tantivy counts them) and the document frequency of each token. ``a + b`` combines shards."""

    num_docs: int
    total_len: int
    df: Mapping[str, int] = field(default_factory=dict)

    def __add__(self, other: BM25Stats) -> BM25Stats:
        if not isinstance(other, BM25Stats):
            return NotImplemented
        df = dict(self.df)
        for t, c in other.df.items():
            df[t] = df.get(t, 0) + int(c)
        return BM25Stats(self.num_docs + other.num_docs, self.total_len + other.total_len, df)

    @property
    def avgdl(self) -> float:
        return self.total_len / self.num_docs if self.num_docs else 0.0


def _analyzer(snap: Snapshot) -> Any:
    for seg in snap.segments:
        part = seg.part("bm25")
        if part is not None:
            return part.analyzer
    from ..index._tantivy import bm25_analyzer

    return bm25_analyzer()


def bm25_tokens(snap: Snapshot, texts: Sequence[str]) -> list[list[str]]:
    """The analysed tokens of each query text (the ``text`` field's analyzer: stop words, stemmer)."""
    analyzer = _analyzer(snap)
    return [list(analyzer.analyze(t)) if t else [] for t in texts]


def live_stats(snap: Snapshot, i: int, part: str = "bm25") -> tuple[int, int, np.ndarray]:
    """``(documents, total length, df per term id + a final 0)`` of the live rows of segment
    ``i``'s BM25 store (:meth:`BM25Store.live_stats` under the snapshot's tombstones), computed once
    per snapshot and kept in ``snap.cache``."""
    store = snap.segments[i].part(part)
    dead = snap.deleted[i]
    if not len(dead):
        return store.live_stats(None)  # the store's own counts: nothing to compute
    return snap.cache.get(("bm25.live", part, i), lambda: store.live_stats(dead))


class _TfSlot:
    """One segment's tf factors (with their block maxima) in one snapshot, by ``avgdl``: the
    snapshot's own statistics give one value; statistics from outside (a coordinator's sum over
    shards) change with other shards' commits, so the latest :data:`_TF_KEEP` values are kept. Made
    under a lock, so each once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_avgdl: dict[float, TfFactors] = {}

    def get(self, store: BM25Store, avgdl: float) -> TfFactors:
        fac = self._by_avgdl.get(avgdl)
        if fac is not None:
            return fac
        with self._lock:
            fac = self._by_avgdl.get(avgdl)
            if fac is None:
                fac = store.tf_factors(avgdl)
                latest = list(self._by_avgdl.items())[len(self._by_avgdl) - _TF_KEEP + 1:]
                self._by_avgdl = {**dict(latest), avgdl: fac}  # replaced whole: lock-free readers see one or the other
            return fac


_TF_KEEP = 2  # tf factors (8 bytes per posting, 1/16 more for the block maxima) kept per segment and snapshot


def tf_factors(snap: Snapshot, i: int, avgdl: float, part: str = "bm25") -> TfFactors | None:
    """The tf factors and their maxima (:meth:`BM25Store.tf_factors`) of segment ``i``'s store under
    ``avgdl``: the store's own once-made ones when ``avgdl`` is its own (one segment, no
    tombstones), else kept on the snapshot; ``None`` for a store that searches and scores without
    them (v2 with numba: :meth:`BM25Store.needs_factors`)."""
    store = snap.segments[i].part(part)
    if not store.needs_factors():
        return None
    if avgdl == store.own_avgdl:
        return store.tf_factors(avgdl)
    return snap.cache.get(("bm25.tf", part, i), _TfSlot).get(store, avgdl)


def _segment_counts(snap: Snapshot, i: int, tokens: Sequence[str], local: np.ndarray | None
                    ) -> tuple[int, int, np.ndarray]:
    """(documents, total length, df of each token) of segment ``i``: live rows from the store, or
    tantivy's counts (tombstones included) for a format-1 segment without it."""
    part = snap.segments[i].part("bm25")
    if isinstance(part, BM25Store):
        n, total, df_all = live_stats(snap, i)
        return n, total, df_all[part.lookup(tokens) if local is None else local]
    n = part.tantivy_docs
    df = np.array([part.doc_freq(t) for t in tokens], dtype=np.int64)
    return n, int(round(part.avgdl * n)), df


def collection_stats(snap: Snapshot, tokens: Iterable[str]) -> BM25Stats:
    """Statistics of the snapshot's live documents for ``tokens`` (summed over its segments; a
    segment without the BM25 store counts its tombstoned rows, as tantivy does)."""
    uniq = list(dict.fromkeys(tokens))
    n, total, df = _sum_counts(snap, uniq, None)
    return BM25Stats(n, total, {t: int(c) for t, c in zip(uniq, df) if c > 0})


def _sum_counts(snap: Snapshot, uniq: list[str], local: list[np.ndarray | None] | None) -> tuple[int, int, np.ndarray]:
    n, total, df = 0, 0, np.zeros(len(uniq), dtype=np.int64)
    for i, seg in enumerate(snap.segments):
        if seg.part("bm25") is None:
            continue
        a, b, c = _segment_counts(snap, i, uniq, None if local is None else local[i])
        n, total, df = n + a, total + b, df + c
    return n, total, df


@dataclass
class _Context:
    tokens: list[list[str]]
    avgdl: float
    queries: dict[int, SegmentQueries]  # per segment with the store: its term ids and global weights
    boosts: dict[int, list[dict[str, float]]]  # tantivy clause boosts, for segments without the store


class BM25Retriever(Retriever):
    name = "bm25"
    needs = "text"
    part = "bm25"
    # segments without the store score given rows with a term-set query (3.6 ms/query at 1,464 rows):
    # a filtered deep fetch stays cheaper there until very few rows are allowed
    exhaustive_max = 128
    global_stats = True  # document count, total length and df: summed over shards (statistics)

    def __init__(self, threads: int | None = None) -> None:
        # this instance's thread budget when a call gives none (None: every core, batches of >= 16)
        self.threads = threads

    def statistics(self, snap: Snapshot, q: QueryBatch) -> BM25Stats:
        """This snapshot's :func:`collection_stats` for the analysed tokens of the batch's texts."""
        return collection_stats(snap, (t for toks in bm25_tokens(snap, q.texts) for t in toks))

    def _budget(self, threads: int | None) -> int | None:
        return threads if threads is not None else self.threads

    def prepare(self, snap: Snapshot, q: QueryBatch, stats: BM25Stats | None = None, *,
                threads: int | None = None) -> Any:
        """Tokens and global term weights of the batch. ``stats`` (e.g. summed over shards) replaces
        the snapshot's own statistics; it must cover the queries' tokens (absent = no document).
        Starts no thread (``threads`` is accepted for the protocol)."""
        if not snap.segments:
            return None
        return self.context(snap, bm25_tokens(snap, q.texts), stats)

    def context(self, snap: Snapshot, tokens: list[list[str]], stats: BM25Stats | None = None) -> Any:
        """:meth:`prepare` for queries already analysed (:func:`bm25_tokens`)."""
        qt = QueryTerms.of(tokens)
        parts = [s.part(self.part) for s in snap.segments]
        local: list[np.ndarray | None] = [p.lookup(qt.tokens) if isinstance(p, BM25Store) else None for p in parts]
        if stats is None:
            n, total, df = _sum_counts(snap, qt.tokens, local)
            avgdl = total / n if n else 0.0
        else:
            n, avgdl = stats.num_docs, stats.avgdl
            df = np.array([int(stats.df.get(t, 0)) for t in qt.tokens], dtype=np.int64)
        idf_g = np.where(df > 0, idf(np.maximum(df, 1), n), 0.0) if len(df) else np.zeros(0)
        weight = qt.count * (1.0 + K1) * idf_g[qt.tok] if len(qt.tok) else np.zeros(0)
        queries = {i: qt.restrict(loc, weight) for i, loc in enumerate(local) if loc is not None}
        boosts: dict[int, list[dict[str, float]]] = {}
        for i, part in enumerate(parts):
            if part is None or local[i] is not None or (len(snap.segments) == 1 and stats is None):
                continue  # one segment on its own statistics: tantivy's own scores
            n_s = part.tantivy_docs
            idf_s = {t: idf(d, n_s) for t in qt.tokens if (d := part.doc_freq(t)) > 0}
            idf_by = dict(zip(qt.tokens, idf_g))
            boosts[i] = [{t: float(idf_by[t] / idf_s[t]) for t in dict.fromkeys(toks) if t in idf_s and idf_by[t] > 0}
                         for toks in tokens]
        return _Context(tokens, avgdl, queries, boosts)

    def search_segment(self, snap: Snapshot, i: int, q: QueryBatch, k: int, allowed: np.ndarray | None,
                       ctx: Any, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        part = snap.segments[i].part(self.part)
        if i in ctx.queries:
            return part.search(ctx.queries[i], ctx.avgdl, k, allowed=allowed, threads=self._budget(threads),
                               fac=tf_factors(snap, i, ctx.avgdl, self.part))
        return part.search(q.texts, k, allowed=allowed, tokens=ctx.tokens, boosts=ctx.boosts.get(i),
                           threads=self._budget(threads))

    def score_segment(self, snap: Snapshot, i: int, q: QueryBatch, rows: np.ndarray, ctx: Any, *,
                      threads: int | None = None) -> np.ndarray:
        part = snap.segments[i].part(self.part)
        if i in ctx.queries:  # one thread whatever the budget: a binary search per row and term
            return part.score(ctx.queries[i], ctx.avgdl, rows, fac=tf_factors(snap, i, ctx.avgdl, self.part))
        return part.score(q.texts, rows, tokens=ctx.tokens, boosts=ctx.boosts.get(i))
