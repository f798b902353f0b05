"""BM25 with RM3 pseudo-relevance feedback (``bm25+rm3``).

RM3 (Abdul-Jaleel et al., "UMass at TREC 2004", after Lavrenko and Croft's relevance models,
SIGIR 2001), with pyserini's ``bm25+rm3`` defaults (``fb_docs=10``, ``fb_terms=10``,
``original_query_weight=0.5``):

1. a first BM25 pass over the whole snapshot (every segment, the snapshot's exact live statistics)
   gives the top ``fb_docs`` documents ``d`` with scores ``s_d``;
2. the relevance model ``P(t|R) ∝ sum_d (s_d / sum s) * tf(t, d) / |d|`` (each document's maximum
   likelihood language model, weighted by its normalised first-pass score; documents analysed by
   the BM25 field's analyzer, so ``|d|`` is the store's length);
3. the ``fb_terms`` most likely terms are kept (ties by token) and renormalised to sum to 1;
4. the final query is ``w_t = lambda * P(t|q) + (1 - lambda) * P(t|R)``, ``P(t|q) = c(t, q) / |q|``,
   ``lambda = original_query_weight``;
5. it is searched, and given rows are scored, as a *weighted* BM25 query: each term contributes
   ``w_t * (1 + k1) * idf_t * tf factor`` (the BM25 store's queries carry a per-token weight), so
   search and exact scoring agree exactly, under any segmentation.

A query whose first pass finds nothing keeps its original terms (``P(t|q)``). Feedback ignores
search filters (the first pass runs over every live document), as pyserini's does.

Collection statistics: RM3 reads BM25's (``global_stats``; :meth:`RM3Retriever.statistics` gives
the batch's query tokens), but it is not ``shardable``: on shards the feedback documents would be
each shard's own top ``fb_docs`` and the expansion terms are only known after the first pass, so
one round of summed statistics cannot reproduce a single index; a sharded index refuses it.
The feedback documents' term frequencies come from their stored texts (the store's postings are
term -> documents only); ``fb_docs`` texts per query are analysed per call.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..index.bm25 import K1, BM25Store, QueryTerms, SegmentQueries, idf
from ..index.snapshot import Snapshot
from .base import QueryBatch, Retriever, search_rows
from .bm25 import BM25Retriever, BM25Stats, bm25_tokens, collection_stats, tf_factors

__all__ = ["RM3Retriever", "expansion", "relevance_model"]

logger = logging.getLogger(__name__)


def relevance_model(docs: Sequence[Sequence[str]], scores: Sequence[float], fb_terms: int) -> dict[str, float]:
    """``P(t|R)`` over the ``fb_terms`` most likely terms (renormalised to sum to 1) of feedback
    documents ``docs`` (analysed tokens) with first-pass ``scores`` (normalised to sum to 1)."""
    s = np.asarray(scores, dtype=np.float64)
    keep = [i for i in range(len(docs)) if len(docs[i]) and s[i] > 0]
    total = float(s[keep].sum()) if keep else 0.0
    if total <= 0:
        return {}
    acc: dict[str, float] = {}
    for i in keep:
        wd = s[i] / total / len(docs[i])
        for t, c in Counter(docs[i]).items():
            acc[t] = acc.get(t, 0.0) + float(wd * c)
    top = sorted(acc.items(), key=lambda kv: (-kv[1], kv[0]))[:fb_terms]
    z = sum(v for _, v in top)
    return {t: v / z for t, v in top} if z > 0 else {}


def expansion(query: Sequence[str], rm: Mapping[str, float], original_weight: float) -> dict[str, float]:
    """``lambda P(t|q) + (1 - lambda) P(t|R)``; without a relevance model, ``P(t|q)`` alone."""
    out: dict[str, float] = {}
    lam = original_weight if rm else 1.0
    for t, c in Counter(query).items():
        out[t] = lam * c / len(query)
    for t, p in rm.items():
        out[t] = out.get(t, 0.0) + (1.0 - original_weight) * p
    return {t: w for t, w in out.items() if w > 0}


@dataclass
class _Context:
    weights: list[dict[str, float]]  # the expanded query of each query: token -> w_t
    avgdl: float
    queries: dict[int, SegmentQueries]


class RM3Retriever(Retriever):
    name = "bm25+rm3"
    needs = "text"
    part = "bm25"
    global_stats = True
    shardable = False  # feedback needs the whole collection's top documents (module docstring)

    def __init__(self, fb_docs: int = 10, fb_terms: int = 10, original_query_weight: float = 0.5,
                 threads: int | None = None) -> None:
        if fb_docs < 1 or fb_terms < 1:
            raise ConfigError(f"RM3 needs fb_docs >= 1 and fb_terms >= 1, got {fb_docs}, {fb_terms}")
        if not 0.0 <= original_query_weight <= 1.0:
            raise ConfigError(f"RM3 original_query_weight must be in [0, 1], got {original_query_weight}")
        self.fb_docs, self.fb_terms, self.original_query_weight = fb_docs, fb_terms, original_query_weight
        self.threads = threads  # this instance's thread budget when a call gives none
        self._bm25 = BM25Retriever(threads=threads)

    def _budget(self, threads: int | None) -> int | None:
        return threads if threads is not None else self.threads

    def available(self, snap: Snapshot) -> bool:
        return bool(snap.segments) and all(isinstance(s.part(self.part), BM25Store) for s in snap.segments)

    def statistics(self, snap: Snapshot, q: QueryBatch) -> BM25Stats:
        """BM25's statistics of the batch's query tokens (the first pass's; see the module docstring)."""
        return self._bm25.statistics(snap, q)

    def prepare(self, snap: Snapshot, q: QueryBatch, stats: BM25Stats | None = None, *,
                threads: int | None = None) -> Any:
        """First pass, relevance model and the weighted second-pass queries of the batch.
        ``stats`` (e.g. summed over shards) replaces the snapshot's statistics in both passes; it
        must then cover the expansion terms too (a term it lacks counts as in no document).
        ``threads``: the first pass's thread budget."""
        if not snap.segments:
            return None
        if not self.available(snap):
            raise ConfigError("bm25+rm3 needs every segment's BM25 posting store: compact the index to write it")
        tokens = bm25_tokens(snap, q.texts)
        ctx1 = self._bm25.context(snap, tokens, stats)
        rows, scores = search_rows(self._bm25, snap, q, self.fb_docs, None, ctx1, threads=self._budget(threads))
        doc_tokens = self._doc_tokens(snap, rows)
        weights = []
        for i, toks in enumerate(tokens):
            fb = [r for r in rows[i] if r >= 0]
            rm = relevance_model([doc_tokens[int(r)] for r in fb], scores[i][: len(fb)], self.fb_terms)
            weights.append(expansion(toks, rm, self.original_query_weight))
        return self.context(snap, weights, stats)

    def _doc_tokens(self, snap: Snapshot, rows: np.ndarray) -> dict[int, list[str]]:
        """Analysed ``title + " " + text`` (what the store indexed) of each distinct row."""
        uniq = np.unique(rows[rows >= 0])
        if not len(uniq):
            return {}
        seg_of, local = snap.locate(uniq)
        texts = []
        for s, r in zip(seg_of.tolist(), local.tolist()):
            title, text = snap.segments[s].docs.get(r)
            title = title.strip()
            texts.append(f"{title} {text.strip()}".strip() if title else text.strip())
        if not any(texts):
            logger.warning("bm25+rm3: the index stores no document texts; feedback is empty")
        return dict(zip(uniq.tolist(), bm25_tokens(snap, texts)))

    def context(self, snap: Snapshot, weights: Sequence[Mapping[str, float]], stats: BM25Stats | None = None) -> _Context:
        """Weighted BM25 queries (``token -> w_t`` per query) for every segment's store."""
        index: dict[str, int] = {}
        tok: list[int] = []
        cnt: list[float] = []
        ptr = [0]
        for w in weights:
            for t, v in w.items():
                tok.append(index.setdefault(t, len(index)))
                cnt.append(float(v))
            ptr.append(len(tok))
        qt = QueryTerms(list(index), np.array(ptr, dtype=np.int64), np.array(tok, dtype=np.int64),
                        np.array(cnt, dtype=np.float64))
        if stats is None:
            stats = collection_stats(snap, qt.tokens)
        n, avgdl = stats.num_docs, stats.avgdl
        df = np.array([int(stats.df.get(t, 0)) for t in qt.tokens], dtype=np.int64)
        idf_g = np.where(df > 0, idf(np.maximum(df, 1), n), 0.0) if len(df) else np.zeros(0)
        weight = qt.count * (1.0 + K1) * idf_g[qt.tok] if len(qt.tok) else np.zeros(0)
        queries = {i: qt.restrict(s.part(self.part).lookup(qt.tokens), weight) for i, s in enumerate(snap.segments)}
        return _Context([dict(w) for w in weights], avgdl, queries)

    def search_segment(self, snap: Snapshot, i: int, q: QueryBatch, k: int, allowed: np.ndarray | None,
                       ctx: Any, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        return snap.segments[i].part(self.part).search(ctx.queries[i], ctx.avgdl, k, allowed=allowed,
                                                       threads=self._budget(threads),
                                                       fac=tf_factors(snap, i, ctx.avgdl, self.part))

    def score_segment(self, snap: Snapshot, i: int, q: QueryBatch, rows: np.ndarray, ctx: Any, *,
                      threads: int | None = None) -> np.ndarray:
        return snap.segments[i].part(self.part).score(ctx.queries[i], ctx.avgdl, rows,
                                                      fac=tf_factors(snap, i, ctx.avgdl, self.part))
