"""BM25 of one segment from its own posting arrays, under any collection statistics.

tantivy scores BM25 with the statistics of one index, so segments (and shards) of one collection
would each score with their own. This store keeps what BM25 needs, analysed by the same analyzer
as the tantivy ``text`` field (``sparse._bm25_analyzer``), in plain files:

* ``vocab.json``: the segment's tokens (term id = position);
* ``postings.indptr.npy`` (int64, V + 1), ``postings.docs.npy`` (int32, rows ascending per term),
  ``postings.tf.npy`` (uint16, int32 if a tf exceeds it): the inverted index; df = ``diff(indptr)``;
* ``lengths.npy`` (int32, n): tokens per document, as tantivy counts them (stop words removed);
* v2 (``hybridret-bm25-v2``) adds the postings' quantized impacts (:mod:`.bm25_impacts`);
* v3 (``hybridret-bm25-v3``, the default) adds them in row windows instead (:mod:`.bm25_windows`).

Scores follow tantivy exactly (k1 = 1.2, b = 0.75): ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``,
the document length quantised through tantivy's fieldnorm table (:func:`fieldnorm_to_id`,
:func:`id_to_fieldnorm`), ``avgdl = total_len / N`` with the raw lengths, and a query token
repeated ``c`` times counts ``c`` times (tantivy: one clause per occurrence). Every path (top-k
with numba, pruned or exhaustive, or numpy; scoring of given rows) computes a document's score with
the same float64 operations in query-term order, so the same document gets bit-identical scores in
every path and under any segmentation with the same statistics. The pruned top-k (MaxScore over
terms, block-max bounds: ``_bm25_kernels.topk_pruned``) bounds with the tf factors' maxima per
term and per block of :data:`BLOCK` postings (:class:`TfFactors`, made with the factors).

A store is read-only once opened: searching writes nothing to it. What depends on the collection
statistics of a call (the tf factors of an ``avgdl``, live statistics under a set of tombstones) is
computed by the caller, and cached where it belongs (the BM25 retriever keeps them per snapshot,
``Snapshot.cache``); the one exception is a per-thread score buffer (see :meth:`BM25Store.search`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, IndexFormatError
from ._once import Once
from .storage import atomic_write_json, atomic_write_npy, load_npy, read_json

__all__ = ["B", "BLOCK", "BM25Store", "BM25StoreBuilder", "FIELDNORMS", "K1", "QueryTerms", "SegmentQueries",
           "TfFactors", "fieldnorm_to_id", "id_to_fieldnorm", "idf", "query_terms"]

logger = logging.getLogger(__name__)

FORMAT = "hybridret-bm25-v1"
FORMAT_V2 = "hybridret-bm25-v2"  # v1's files plus quantized impacts (bm25_impacts.py)
FORMAT_V3 = "hybridret-bm25-v3"  # v1's files plus quantized impacts in row windows (bm25_windows.py)
K1 = 1.2
B = 0.75
from ._blocks import BLOCK, in_blocks  # noqa: E402 - postings per block of a term's list, shared with the kernels


def _fieldnorm_table() -> np.ndarray:
    """tantivy's 256 fieldnorm values: 0..40 exactly, then blocks of 8 whose step doubles (2, 4, ...)."""
    vals = list(range(41))
    start, step = 42, 2
    while len(vals) < 256:
        vals.extend(start + i * step for i in range(8))
        start, step = start + 9 * step, step * 2
    return np.array(vals[:256], dtype=np.int64)


FIELDNORMS = _fieldnorm_table()  # a constant table, not state


def fieldnorm_to_id(length: np.ndarray | int) -> np.ndarray:
    """Largest id whose fieldnorm is <= ``length`` (tantivy rounds document lengths down)."""
    return (np.searchsorted(FIELDNORMS, np.asarray(length, dtype=np.int64), side="right") - 1).astype(np.uint8)


def id_to_fieldnorm(fid: np.ndarray | int) -> np.ndarray:
    return FIELDNORMS[np.asarray(fid, dtype=np.int64)]


def idf(df: np.ndarray | float, n: float) -> np.ndarray:
    """tantivy's idf: ``ln(1 + (N - df + 0.5) / (df + 0.5))``."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((n - df + 0.5) / (df + 0.5))


def norm_table(avgdl: float) -> np.ndarray:
    """``k1 (1 - b + b dl / avgdl)`` for each of the 256 fieldnorm ids."""
    avgdl = float(avgdl) if avgdl > 0 else 1.0
    return K1 * (1.0 - B + B * FIELDNORMS.astype(np.float64) / avgdl)


def query_terms(tokens: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """Distinct tokens in first-appearance order, and how often each occurs."""
    c = Counter(tokens)
    uniq = list(c)
    return uniq, np.array([c[t] for t in uniq], dtype=np.float64)


@dataclass(frozen=True)
class QueryTerms:
    """A batch of analysed queries over the batch's distinct tokens: entry ``j`` of query ``q``
    (``ptr[q] <= j < ptr[q + 1]``, first-appearance order) is token ``tokens[tok[j]]``, ``count[j]`` times."""

    tokens: list[str]
    ptr: np.ndarray
    tok: np.ndarray
    count: np.ndarray

    @classmethod
    def of(cls, queries: Sequence[Sequence[str]]) -> QueryTerms:
        index: dict[str, int] = {}
        tok: list[int] = []
        cnt: list[float] = []
        ptr = [0]
        for toks in queries:
            seen: dict[str, int] = {}
            for t in toks:
                j = seen.get(t)
                if j is None:
                    seen[t] = len(tok)
                    tok.append(index.setdefault(t, len(index)))
                    cnt.append(1.0)
                else:
                    cnt[j] += 1.0
            ptr.append(len(tok))
        return cls(list(index), np.array(ptr, dtype=np.int64), np.array(tok, dtype=np.int64),
                   np.array(cnt, dtype=np.float64))

    def __len__(self) -> int:
        return len(self.ptr) - 1

    def restrict(self, local: np.ndarray, weight: np.ndarray) -> SegmentQueries:
        """The entries one segment scores: its term id per distinct token (``local``, -1 = absent)
        and each entry's weight (``count * (1 + k1) * idf``); absent tokens and weights <= 0 dropped."""
        term = local[self.tok]
        keep = (term >= 0) & (weight > 0)
        kept = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(keep, out=kept[1:])
        return SegmentQueries(kept[self.ptr], term[keep], weight[keep])


@dataclass(frozen=True)
class SegmentQueries:
    """Queries in one segment's term ids: CSR ``ptr`` (nq + 1), ``term``, ``weight`` (> 0)."""

    ptr: np.ndarray
    term: np.ndarray
    weight: np.ndarray


@dataclass(frozen=True, eq=False)
class TfFactors:
    """What a top-k search needs of one ``avgdl`` (:meth:`BM25Store.tf_factors`): the tf factor
    ``tf / (tf + k1 (1 - b + b dl / avgdl))`` of every posting (float64), and their maxima per
    block of :data:`BLOCK` postings of a term's list (blocks numbered by
    :attr:`BM25Store.block_ptr`) and per term: the upper bounds the pruned search works with."""

    avgdl: float
    fac: np.ndarray
    block_max: np.ndarray
    term_max: np.ndarray

    @classmethod
    def of(cls, store: BM25Store, avgdl: float, fac: np.ndarray) -> TfFactors:
        """The maxima of ``fac`` (one pass over the postings, ~1/4 of computing ``fac``)."""
        bptr = store.block_ptr
        if not len(fac):
            return cls(avgdl, fac, np.zeros(0), np.zeros(len(bptr) - 1))
        # block g of term t starts at indptr[t] + BLOCK * (g - bptr[t])
        first = np.repeat(store.indptr[:-1] - BLOCK * bptr[:-1], np.diff(bptr))
        block_max = np.maximum.reduceat(fac, first + BLOCK * np.arange(bptr[-1]))
        has = store.df > 0
        term_max = np.zeros(len(bptr) - 1)
        term_max[has] = np.maximum.reduceat(block_max, bptr[:-1][has])
        return cls(avgdl, fac, block_max, term_max)


class BM25StoreBuilder:
    """Streams document texts into ``root`` (created); :meth:`close` writes the files: a store with
    quantized impacts when ``impacts`` (``version`` 3, the default: in row windows,
    :mod:`.bm25_windows`; 2: beside the rows, :mod:`.bm25_impacts`), else v1."""

    def __init__(self, root: Path, analyzer: Any, *, impacts: bool = False, version: int = 3) -> None:
        if version not in (2, 3):
            raise ConfigError(f"BM25 store impacts: version 2 or 3, got {version!r}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=False)
        self.analyzer = analyzer
        self.impacts = impacts
        self.version = version
        self.vocab: dict[str, int] = {}
        self.lengths: list[int] = []
        self.terms: list[np.ndarray] = []
        self.docs: list[np.ndarray] = []
        self.tfs: list[np.ndarray] = []

    def add(self, texts: Sequence[str]) -> None:
        vocab, analyze = self.vocab, self.analyzer.analyze
        base = len(self.lengths)
        t_ids: list[int] = []
        d_ids: list[int] = []
        tf: list[int] = []
        for i, text in enumerate(texts):
            toks = analyze(text) if text else []
            self.lengths.append(len(toks))
            for tok, c in Counter(toks).items():
                t_ids.append(vocab.setdefault(tok, len(vocab)))
                d_ids.append(base + i)
                tf.append(c)
        self.terms.append(np.array(t_ids, dtype=np.int64))
        self.docs.append(np.array(d_ids, dtype=np.int32))
        self.tfs.append(np.array(tf, dtype=np.int32))

    def close(self) -> None:
        terms = np.concatenate(self.terms) if self.terms else np.zeros(0, np.int64)
        docs = np.concatenate(self.docs) if self.docs else np.zeros(0, np.int32)
        tfs = np.concatenate(self.tfs) if self.tfs else np.zeros(0, np.int32)
        order = np.argsort(terms, kind="stable")  # rows stay ascending within each term
        indptr = np.zeros(len(self.vocab) + 1, dtype=np.int64)
        np.cumsum(np.bincount(terms, minlength=len(self.vocab)), out=indptr[1:])
        lengths = np.array(self.lengths, dtype=np.int32)
        docs = docs[order]
        atomic_write_npy(self.root / "postings.indptr.npy", indptr)
        atomic_write_npy(self.root / "postings.docs.npy", docs)
        tfs = tfs[order]  # uint16 unless some term occurs 65,536+ times in one document
        tfs = tfs.astype(np.uint16) if not len(tfs) or tfs.max() < 65536 else tfs
        atomic_write_npy(self.root / "postings.tf.npy", tfs)
        atomic_write_npy(self.root / "lengths.npy", lengths)
        atomic_write_json(self.root / "vocab.json", list(self.vocab))
        total = int(lengths.astype(np.int64).sum())
        meta: dict[str, Any] = {"format": FORMAT, "num_docs": len(lengths), "num_terms": len(self.vocab),
                                "nnz": int(len(docs)), "total_len": total, "k1": K1, "b": B}
        if self.impacts:
            avgdl0 = total / max(1, len(lengths))
            if self.version == 3:
                from .bm25_windows import write_windows

                meta.update(write_windows(self.root, indptr, docs, tfs, fieldnorm_to_id(lengths), avgdl0,
                                          norm_table(avgdl0)), format=FORMAT_V3)
            else:
                from .bm25_impacts import write_impacts

                meta.update(write_impacts(self.root, indptr, docs, tfs, fieldnorm_to_id(lengths), avgdl0,
                                          norm_table(avgdl0)), format=FORMAT_V2)
            disk = sum(f.stat().st_size for f in self.root.iterdir() if f.is_file())
            meta["bytes_per_posting_disk"] = round(disk / max(1, len(docs)), 3)
        atomic_write_json(self.root / "meta.json", meta)

    def abort(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class BM25Store:
    """One segment's BM25 store, opened read-only (arrays memory-mapped; thread-safe)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        meta = read_json(self.root / "meta.json")
        if not isinstance(meta, dict) or meta.get("format") not in (FORMAT, FORMAT_V2, FORMAT_V3):
            raise IndexFormatError(f"{self.root}: unsupported BM25 store format {meta.get('format')!r}")
        self.meta = meta
        self.num_docs = int(meta["num_docs"])
        self.indptr = np.asarray(load_npy(self.root / "postings.indptr.npy", mmap=False))
        self.docs = np.asarray(load_npy(self.root / "postings.docs.npy"))
        self.tfs = np.asarray(load_npy(self.root / "postings.tf.npy"))
        self.lengths = np.asarray(load_npy(self.root / "lengths.npy", mmap=False))
        try:
            words = json.loads((self.root / "vocab.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise IndexFormatError(f"{self.root}/vocab.json: cannot read the vocabulary: {exc}") from exc
        if (not isinstance(words, list) or len(words) + 1 != len(self.indptr) or self.lengths.shape != (self.num_docs,)
                or len(self.docs) != int(meta["nnz"]) or len(self.tfs) != len(self.docs)
                or int(self.indptr[-1]) != len(self.docs)):
            raise IndexFormatError(f"{self.root}: BM25 store files do not match meta.json (truncated write?)")
        self.vocab = {w: i for i, w in enumerate(words)}
        self.df = np.diff(self.indptr)
        # term t's postings in blocks of BLOCK: global block numbers block_ptr[t] .. block_ptr[t + 1] - 1
        self.block_ptr = np.zeros(len(self.df) + 1, dtype=np.int64)
        np.cumsum((self.df + BLOCK - 1) // BLOCK, out=self.block_ptr[1:])
        self._df_pad = np.append(self.df, 0)  # index -1 (a token absent here) reads 0
        self.fn = fieldnorm_to_id(self.lengths)
        from .bm25_impacts import Impacts
        from .bm25_windows import Windows

        # v2 / v3: the quantized impacts the pruned top-k of numba searches with
        self.impacts = Impacts.open(self.root, meta, len(self.docs), len(self.df)) if meta["format"] == FORMAT_V2 \
            else None
        self.windows = Windows.open(self.root, meta, len(self.docs), len(self.df), self.num_docs) \
            if meta["format"] == FORMAT_V3 else None
        self.total_len = int(self.lengths.astype(np.int64).sum())
        self.own_avgdl = self.total_len / max(1, self.num_docs)  # the segment's own statistics (tombstones in)
        from ._tantivy import bm25_analyzer

        self.analyzer = bm25_analyzer()  # how query texts are analysed for this store
        # made once on first use, never changed: the tf factors under the segment's own statistics
        # (what SparseIndex.search_bm25 and a lone segment without tombstones score with)
        self._own_fac: Once[TfFactors] = Once()
        # one score buffer pair per thread (see search; and the v2 impacts' accumulator window):
        # thread-local, so never shared or raced
        self._scratch = threading.local()

    # -- statistics -------------------------------------------------------------------------------
    def lookup(self, tokens: Sequence[str]) -> np.ndarray:
        """This segment's term id of each token (``-1``: no document here has it)."""
        get = self.vocab.get
        return np.fromiter((get(t, -1) for t in tokens), dtype=np.int64, count=len(tokens))

    def live_stats(self, dead: np.ndarray | None = None) -> tuple[int, int, np.ndarray]:
        """``(documents, total length, df per term id + a final 0)`` without the rows ``dead`` (the
        final 0 is what an absent token, id -1, reads). One pass over the postings per call when
        ``dead`` is not empty: callers keep the result (the BM25 retriever: once per snapshot)."""
        if dead is None or not len(dead):
            return self.num_docs, self.total_len, self._df_pad
        dead = np.asarray(dead, dtype=np.int64)
        is_dead = np.zeros(self.num_docs, dtype=np.int64)
        is_dead[dead] = 1
        dead_df = np.add.reduceat(is_dead[self.docs], self.indptr[:-1]) if len(self.docs) else np.zeros(0, np.int64)
        dead_df = np.where(self.df > 0, dead_df, 0)  # reduceat repeats a value for empty ranges
        return (self.num_docs - len(dead), self.total_len - int(self.lengths[dead].astype(np.int64).sum()),
                np.append(self.df - dead_df, 0))

    def stats(self, tokens: Sequence[str], dead: np.ndarray | None = None) -> tuple[int, int, dict[str, int]]:
        """``(documents, total length, df per token)`` of this segment, without the rows ``dead``."""
        n, total, df = self.live_stats(dead)
        return n, total, {t: int(c) for t, c in zip(tokens, df[self.lookup(tokens)]) if c > 0}

    def own_queries(self, tokens: Sequence[Sequence[str]], boosts: Sequence[dict[str, float] | None] | None = None
                    ) -> SegmentQueries:
        """Queries under this segment's own statistics (tombstones counted, as tantivy does), each
        entry times ``boosts[q][token]`` when given (a token missing from a map is left out)."""
        qt = QueryTerms.of(tokens)
        local = self.lookup(qt.tokens)
        df = self._df_pad[local]
        w = qt.count * (1.0 + K1) * idf(df, self.num_docs)[qt.tok] if len(qt.tok) else np.zeros(0)
        if boosts is not None:
            w = w * np.array([(boosts[q] or {}).get(qt.tokens[qt.tok[j]], 0.0) if boosts[q] is not None else 1.0
                              for q in range(len(qt)) for j in range(qt.ptr[q], qt.ptr[q + 1])], dtype=np.float64)
        return qt.restrict(local, w)

    # -- scoring ----------------------------------------------------------------------------------
    def tf_factors(self, avgdl: float) -> TfFactors:
        """The :class:`TfFactors` of ``avgdl``: one pass over the postings for the factors (about
        7 ms per million) and one for their block maxima, so callers keep them for as long as
        ``avgdl`` holds; for the store's own :attr:`own_avgdl` they are computed once and kept (they
        never change)."""
        if avgdl == self.own_avgdl:
            return self._own_fac.get(lambda: self._tf_factors(avgdl))
        return self._tf_factors(avgdl)

    def _tf_factors(self, avgdl: float) -> TfFactors:
        f = self.tfs.astype(np.float64)
        return TfFactors.of(self, avgdl, f / (f + norm_table(avgdl)[self.fn[self.docs]]))

    def _fac_array(self, avgdl: float, fac: TfFactors | np.ndarray | None) -> np.ndarray:
        """The factors of ``fac``, checked (``None``: :meth:`tf_factors`)."""
        if fac is None:
            return self.tf_factors(avgdl).fac
        arr = fac if isinstance(fac, np.ndarray) else fac.fac
        if arr.shape != self.docs.shape or (isinstance(fac, TfFactors) and fac.term_max.shape != self.df.shape):
            raise ConfigError(f"tf factors for {arr.shape} postings given, this store holds {len(self.docs)}")
        if isinstance(fac, TfFactors) and fac.avgdl != avgdl:
            raise ConfigError(f"tf factors of avgdl {fac.avgdl} given to score with avgdl {avgdl}")
        return arr

    def _factors(self, avgdl: float, fac: TfFactors | np.ndarray | None) -> TfFactors:
        """``fac`` checked (``None``: :meth:`tf_factors`); a bare array gets its maxima for this call."""
        if fac is None:
            return self.tf_factors(avgdl)
        arr = self._fac_array(avgdl, fac)
        return fac if isinstance(fac, TfFactors) else TfFactors.of(self, avgdl, arr)

    def score(self, queries: SegmentQueries, avgdl: float, rows: np.ndarray, *,
              fac: TfFactors | np.ndarray | None = None) -> np.ndarray:
        """Exact BM25 of local ``rows[q]`` (``-1`` -> 0) for each query: the same float operations as
        :meth:`search` (each posting's tf factor times the weight, added in query-term order), so a
        row gets the same score from both. ``fac``: :meth:`tf_factors` of ``avgdl``, when the
        caller keeps them (else computed for this call)."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        out = np.zeros(rows.shape, dtype=np.float64)
        ptr, terms, weights = queries.ptr, queries.term, queries.weight
        if not len(terms) or not rows.size:
            return out.astype(np.float32)
        if fac is None and not self.needs_factors():
            _numba("score_tf")(ptr, terms, weights, self.indptr, self.docs, self.tfs, self.fn, norm_table(avgdl),
                               rows, out)
            return out.astype(np.float32)
        fac = self._fac_array(avgdl, fac)
        kern = _numba("score", len(self.docs))
        if kern is not None:
            kern(ptr, terms, weights, self.indptr, self.docs, fac, rows, out)
            return out.astype(np.float32)
        for q in range(rows.shape[0]):
            if ptr[q] == ptr[q + 1]:
                continue
            valid = rows[q] >= 0
            r = rows[q, valid]
            if not len(r):
                continue
            s = np.zeros(len(r), dtype=np.float64)
            for j in range(ptr[q], ptr[q + 1]):
                lo, hi = self.indptr[terms[j]], self.indptr[terms[j] + 1]
                pos = np.minimum(np.searchsorted(self.docs[lo:hi], r), hi - lo - 1)
                s += np.where(self.docs[lo + pos] == r, weights[j] * fac[lo + pos], 0.0)
            out[q, valid] = s
        return out.astype(np.float32)

    def needs_factors(self) -> bool:
        """Whether :meth:`search` (pruned) and :meth:`score` read :meth:`tf_factors`: not for a v2
        or v3 store where numba runs (they compute each factor from tf, the impacts bound them)."""
        return (self.impacts is None and self.windows is None) or _numba("impacts", len(self.docs)) is None

    def search(self, queries: SegmentQueries, avgdl: float, k: int, *, allowed: np.ndarray | None = None,
               threads: int | None = 1, fac: TfFactors | np.ndarray | None = None, prune: bool = True
               ) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k local rows ``(nq, k)`` (``-1`` / ``-inf`` padding), scores > 0, ties by row,
        restricted to ``allowed`` rows when a mask is given. numba when installed, else numpy.
        ``threads``: worker threads over blocks of at least 8 queries (``None``: every core; ``1``:
        none, the calling thread does it all). ``fac``: :meth:`tf_factors` of ``avgdl``, when the
        caller keeps them (else computed for this call; bare factor arrays get their maxima computed).

        ``prune`` (numba): MaxScore over the query's terms with the block maxima of ``fac``
        (``_bm25_kernels.topk_pruned``), which skips the lists and postings that cannot reach the
        top k and returns what ``prune=False`` (every posting of every term) returns: the same
        rows, ties and float32 scores. A v2 store (:attr:`impacts`) prunes with its u8 impacts
        instead (:mod:`.bm25_impacts`), a v3 store (:attr:`windows`) reads its impact windows
        (:mod:`.bm25_windows`); ``fac`` is not read there, and the result is the same. The numpy
        path is exhaustive either way.

        The numba path accumulates into a dense score buffer (``8 + 4`` bytes per document); a fresh
        one per call costs page faults (+6-8 % of a one-query call on 30,000 documents, several ms
        on millions), so each thread keeps one buffer pair per store, zeroed by the kernel on exit
        (``threading.local``: never shared between threads; freed with the thread). Worker threads
        live for one call, so only the calling thread's buffer is reused across calls."""
        if k < 1:
            raise ConfigError(f"k must be positive, got {k}")
        ptr, terms, weights = queries.ptr, queries.term, queries.weight
        nq = len(ptr) - 1
        rows = np.full((nq, k), -1, dtype=np.int64)
        scores = np.full((nq, k), -np.inf, dtype=np.float64)
        if nq == 0 or not len(terms):
            return rows, scores.astype(np.float32)
        mask = np.zeros(0, dtype=np.bool_) if allowed is None else np.asarray(allowed, dtype=np.bool_)
        if prune and not self.needs_factors():
            return self._search_impacts(queries, avgdl, k, mask, threads, rows, scores)
        fac = self._factors(avgdl, fac)
        kern = _numba("topk_pruned" if prune else "topk", len(self.docs))
        if kern is None:
            for q in range(nq):
                _numpy_topk(self, terms[ptr[q]:ptr[q + 1]], weights[ptr[q]:ptr[q + 1]], fac.fac, mask, rows[q],
                            scores[q])
            return rows, scores.astype(np.float32)
        bounds = (self.block_ptr, fac.block_max, fac.term_max) if prune else ()
        workers = max(1, min(nq // 8, threads if threads is not None else (os.cpu_count() or 1)))

        def block(a: int, b: int) -> None:
            # this thread's buffers (dense scores, touched rows): the kernel leaves the scores zeroed
            local = self._scratch
            buf = getattr(local, "buf", None)
            local.buf = None  # taken (and dropped below if the kernel fails half-way)
            if buf is None:
                buf = (np.zeros(self.num_docs), np.empty(self.num_docs, np.int32))
            work = (np.zeros(3, np.int64),) if prune else ()  # the pruned kernel's counts (not kept)
            kern(ptr[a:b + 1] - ptr[a], terms[ptr[a]:ptr[b]], weights[ptr[a]:ptr[b]], self.indptr, self.docs,
                 fac.fac, *bounds, buf[0], buf[1], mask, k, rows[a:b], scores[a:b], *work)
            local.buf = buf

        in_blocks(nq, workers, block)
        return rows, scores.astype(np.float32)

    def _search_impacts(self, queries: SegmentQueries, avgdl: float, k: int, mask: np.ndarray, threads: int | None,
                        rows: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The top-k of a v2 or v3 store from its quantized impacts (v2: windowed MaxScore,
        :func:`._bm25_impact_kernels.topk_impacts`; v3: impact windows,
        :func:`._bm25_window_kernels.topk_windows`), exact scores of the rows that can still enter;
        the same rows, ties and scores as ``prune=False``."""
        from .bm25_impacts import search_impacts
        from .bm25_windows import search_windows

        ptr, terms, weights = queries.ptr, queries.term, queries.weight
        nq = len(ptr) - 1
        if self.windows is not None:
            kerns = (_numba("impacts"), _numba("windows"))

            def run(*a: Any) -> None:
                search_windows(self, self._scratch, kerns, *a)
        else:
            kern = _numba("impacts")

            def run(*a: Any) -> None:
                search_impacts(self, self.impacts, 0.5, self._scratch, kern, *a)
        norm = norm_table(avgdl)
        workers = max(1, min(nq // 8, threads if threads is not None else (os.cpu_count() or 1)))

        def block(a: int, b: int) -> None:
            run(ptr[a:b + 1] - ptr[a], terms[ptr[a]:ptr[b]], weights[ptr[a]:ptr[b]], avgdl, norm, k, mask,
                rows[a:b], scores[a:b], np.zeros(3, np.int64))

        in_blocks(nq, workers, block)
        return rows, scores.astype(np.float32)


def _numpy_topk(st: BM25Store, terms: np.ndarray, weights: np.ndarray, fac: np.ndarray, mask: np.ndarray,
                out_rows: np.ndarray, out_scores: np.ndarray) -> None:
    if not len(terms):
        return
    parts_d, parts_c = [], []
    for t, w in zip(terms, weights):
        lo, hi = st.indptr[t], st.indptr[t + 1]
        parts_d.append(st.docs[lo:hi])
        parts_c.append(w * fac[lo:hi])
    d = np.concatenate(parts_d)
    acc = np.bincount(d, weights=np.concatenate(parts_c), minlength=st.num_docs)  # adds in term order
    cand = np.unique(d)
    if len(mask):
        cand = cand[mask[cand]]
    s = acc[cand]
    cand, s = cand[s > 0], s[s > 0]
    k = len(out_rows)
    if len(cand) > k:
        edge = np.partition(-s, k - 1)[k - 1]
        keep = -s <= edge  # every row tied at the edge competes: ties by row
        cand, s = cand[keep], s[keep]
    order = np.lexsort((cand, -s))[:k]
    out_rows[:len(order)] = cand[order]
    out_scores[:len(order)] = s[order]


_KERNEL: dict[str, Any] = {}  # compiled code, the same for every store (not search state)
# Below this many postings, and while nothing in the process has loaded numba yet, numpy searches:
# importing numba and loading the kernels from its cache takes ~1 s, many times a small store's
# exhaustive numpy search (a BM25-only `hybridret search` on a small index then starts in ~0.5 s)
SMALL_POSTINGS = 200_000


def _numba(name: str, postings: int | None = None) -> Any:
    """A numba kernel of :mod:`._bm25_kernels` (``topk``, ``topk_pruned``, ``score``), compiled or
    loaded from numba's cache on first use; ``None`` without numba or with ``HYBRIDRET_NUMBA=0``
    (then numpy does the same arithmetic, exhaustively), and for a store of fewer than
    :data:`SMALL_POSTINGS` ``postings`` while numba is not loaded yet (``HYBRIDRET_NUMBA=1``: numba
    whatever the size). Both give the same rows, ties and scores."""
    choice = os.environ.get("HYBRIDRET_NUMBA")
    if choice == "0":
        return None
    if choice != "1" and postings is not None and postings < SMALL_POSTINGS and "numba" not in sys.modules:
        return None
    if name not in _KERNEL:
        try:
            from ._bm25_impact_kernels import score_tf, topk_impacts
            from ._bm25_kernels import score, topk_exhaustive, topk_pruned
            from ._bm25_window_kernels import topk_windows
        except ImportError:
            _KERNEL[name] = None
            return None
        _KERNEL[name] = {"topk": topk_exhaustive, "topk_pruned": topk_pruned, "score": score,
                         "impacts": topk_impacts, "score_tf": score_tf, "windows": topk_windows}[name]
    return _KERNEL[name]
