"""Learned-sparse and BM25 retrieval on one tantivy index, with exact top-k.

tantivy-py scores only BM25, so learned weights are encoded so that a plain boolean query of
constant-score clauses computes a *quantised* dot product that is never below the exact one:

* every document weight ``w`` becomes an integer level ``L = ceil(w / step)`` (``bits`` bits);
* the document gets one token ``"{term}_{j}"`` per set bit ``j`` of ``L`` (bit-plane encoding);
* a query term of weight ``q`` becomes one clause per bit plane ``j`` present in the index for that
  term, worth ``q * step * 2**j``; the clauses a document matches add up to ``q * step * L >= q * w``.

So tantivy's score ``S(d)`` is an upper bound of the exact score ``s(d) = q . d``. Fetch tantivy's
top ``N``, re-score them exactly from the forward store (CSR rows on disk), and the exact top-k is
proven when the k-th exact score is at least ``S`` of the N-th hit: every document not fetched has
``s(d) <= S(d) <= S_N``. Otherwise ``N`` grows until the proof holds (or every match was fetched).
Per query term only the bit planes that exist are queried: ``bits`` clauses at most, instead of one
per weight bucket.

The same index holds a ``text`` field (English stemming, stop words) for plain BM25.
"""

from __future__ import annotations

import logging
import shutil
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ...errors import ConfigError, IndexFormatError
from .._tantivy import BM25_TOKENIZER, SparseSearchStats, run_queries
from .._tantivy import bm25_analyzer as _bm25_analyzer
from .._tantivy import open_tantivy as _open_tantivy
from ..bm25 import BM25Store, BM25StoreBuilder
from ..learned import LearnedIndex, check_weights, exhaustive_topk
from ..storage import NpyAppender, atomic_write_json, load_npy, read_json

__all__ = ["SparseIndex", "SparseIndexBuilder", "SparseSearchStats"]

logger = logging.getLogger(__name__)

FORMAT = "hybridret-sparse-v1"  # bit planes / buckets and BM25 text in one tantivy index (read and written)
FORMAT_V2 = "hybridret-sparse-v2"  # learned terms on a tf grid (index/learned.py) + BM25 posting store (index/bm25.py)
SCHEMES = ("tfgrid", "planes", "buckets")
INVERTED_MAX = 8192  # indexes up to this many documents keep an in-memory inverted copy
_REL_TOL = 1e-5  # float32 summation slack in tantivy's scores
_ABS_TOL = 1e-6


def _schema() -> Any:
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_unsigned_field("row", stored=False, indexed=True, fast=True)
    sb.add_text_field("sparse", stored=False, tokenizer_name="whitespace", index_option="basic")
    sb.add_text_field("text", stored=False, tokenizer_name=BM25_TOKENIZER, index_option="freq")
    return sb.build()


def _token_table(vocab_size: int, bits: int) -> np.ndarray:
    """Token string for (term, bit) at position ``term * bits + bit``."""
    return np.array([f"{t}_{j}" for t in range(vocab_size) for j in range(bits)], dtype=object)


class SparseIndexBuilder:
    """Streams documents into a new sparse index directory. Use :meth:`SparseIndex.create`."""

    def __init__(self, root: Path, vocab_size: int, *, scheme: str, bits: int, buckets: int, max_weight: float,
                 min_weight: float, bm25: bool, heap_size: int, threads: int | None) -> None:
        import tantivy

        self.root = root
        self.vocab_size = int(vocab_size)
        self.scheme = scheme
        self.bits = int(bits)
        self.step = float(max_weight) / (2**bits - 1)
        # buckets: geometric upper edges from min_weight to max_weight; the last bucket is open-ended
        self.edges = np.geomspace(min_weight, max_weight, int(buckets) - 1).astype(np.float32)
        self.slots = self.bits if scheme == "planes" else int(buckets)
        # upper-bound weight of each (term, slot) token; 0 = no document has that token
        self.slot_weight = np.zeros((self.vocab_size, self.slots), dtype=np.float32)
        self.bm25 = bm25
        (root / "tantivy").mkdir(parents=True, exist_ok=False)
        self.index = tantivy.Index(_schema(), path=str(root / "tantivy"))
        self.index.register_tokenizer(BM25_TOKENIZER, _bm25_analyzer())
        self.writer = self.index.writer(heap_size=heap_size, num_threads=threads or 0)
        self.tokens = _token_table(self.vocab_size, self.slots)
        self.overflow = np.zeros(self.vocab_size, dtype=np.float32)  # weight above the top level, per term
        self.df = np.zeros(self.vocab_size, dtype=np.int64)
        self.indptr = NpyAppender(root / "forward.indptr.npy", np.int64)
        self.indptr.append(np.zeros(1, dtype=np.int64))
        self.indices = NpyAppender(root / "forward.indices.npy", np.int32)
        self.data = NpyAppender(root / "forward.data.npy", np.float32)
        self.rows = 0
        self.nnz = 0
        self.bm25_store = BM25StoreBuilder(root / "bm25", _bm25_analyzer()) if bm25 else None  # index/bm25.py

    def add(self, weights: sp.csr_matrix, texts: Sequence[str] | None = None) -> None:
        """Add documents: one CSR row of term weights each, plus their text for BM25."""
        import tantivy

        w = sp.csr_matrix(weights, dtype=np.float32)
        if w.shape[1] != self.vocab_size:
            raise ConfigError(f"sparse vectors have {w.shape[1]} columns, the index vocabulary has {self.vocab_size}")
        if texts is not None and len(texts) != w.shape[0]:
            raise ConfigError(f"{w.shape[0]} sparse rows but {len(texts)} texts")
        w.sum_duplicates()
        w.eliminate_zeros()
        w.sort_indices()
        if w.nnz and float(w.data.min()) < 0:
            raise ConfigError("document sparse weights must be non-negative")
        flat = self.slot_weight.reshape(-1)
        if self.scheme == "planes":
            top = 2**self.bits - 1
            over = w.data - top * self.step
            if np.any(over > 0):
                np.maximum.at(self.overflow, w.indices[over > 0], over[over > 0])
            levels = np.clip(np.ceil(w.data / self.step), 1, top).astype(np.uint32)
            planes = (levels[:, None] >> np.arange(self.bits, dtype=np.uint32)) & 1  # (nnz, bits)
            entry, slot = np.nonzero(planes)
            token_ids = w.indices[entry].astype(np.int64) * self.slots + slot
            flat[token_ids] = self.step * (2.0 ** slot)
        else:
            entry = np.arange(w.nnz)
            slot = np.searchsorted(self.edges, w.data, side="left")
            token_ids = w.indices.astype(np.int64) * self.slots + slot
            np.maximum.at(flat, token_ids, w.data)
        self.df += np.bincount(w.indices, minlength=self.vocab_size)
        if self.bm25_store is not None:
            self.bm25_store.add(texts if texts is not None else [""] * w.shape[0])
        token_strs = self.tokens[token_ids]
        # bounds of each document's tokens in token_strs (entries are row-major, so rows stay contiguous)
        bounds = np.searchsorted(entry, w.indptr)
        for i in range(w.shape[0]):
            doc = tantivy.Document()
            doc.add_unsigned("row", self.rows + i)
            lo, hi = bounds[i], bounds[i + 1]
            if hi > lo:
                doc.add_text("sparse", " ".join(token_strs[lo:hi]))
            if self.bm25 and texts is not None:
                doc.add_text("text", texts[i])
            self.writer.add_document(doc)
        self.indptr.append(w.indptr[1:].astype(np.int64) + self.nnz)
        self.indices.append(w.indices)
        self.data.append(w.data)
        self.rows += w.shape[0]
        self.nnz += w.nnz

    def close(self) -> None:
        """Commit tantivy, finish the forward store and write ``meta.json``."""
        self.writer.commit()
        self.writer.wait_merging_threads()
        for f in (self.indptr, self.indices, self.data):
            f.close()
        np.save(self.root / "slot_weight.npy", self.slot_weight)
        np.save(self.root / "overflow.npy", self.overflow)
        np.save(self.root / "df.npy", self.df)
        if self.bm25_store is not None:
            self.bm25_store.close()
        atomic_write_json(self.root / "meta.json", {
            "format": FORMAT, "num_docs": self.rows, "nnz": self.nnz, "vocab_size": self.vocab_size,
            "scheme": self.scheme, "slots": self.slots, "bits": self.bits, "step": self.step,
            "edges": self.edges.tolist() if self.scheme == "buckets" else None, "bm25": self.bm25,
            "overflow_terms": int(np.count_nonzero(self.overflow)),
        })
        if np.any(self.overflow):
            logger.warning("%d terms had weights above the top quantisation level; exactness still holds but "
                           "searches may fetch deeper (raise max_weight)", int(np.count_nonzero(self.overflow)))

    def abort(self) -> None:
        for f in (self.indptr, self.indices, self.data):
            f.abort()
        if self.bm25_store is not None:
            self.bm25_store.abort()
        try:
            self.writer.rollback()
        except (ValueError, RuntimeError):
            pass
        del self.writer  # releases tantivy's worker threads, lock and files before the folder goes


class TfGridPartBuilder:
    """Writes a format-2 sparse part: ``learned/`` (learned weights on tantivy's tf grid, with the
    float forward store, see :mod:`.learned`) and ``bm25/`` (BM25 postings, see :mod:`.bm25`).
    Use :meth:`SparseIndex.create` with ``scheme="tfgrid"``."""

    def __init__(self, root: Path, vocab_size: int, *, bm25: bool, heap_size: int) -> None:
        self.root = root
        self.vocab_size = int(vocab_size)
        self.bm25 = bm25
        self.learned = LearnedIndex.create(root / "learned", self.vocab_size, heap_size=heap_size)
        self.bm25_store = BM25StoreBuilder(root / "bm25", _bm25_analyzer()) if bm25 else None
        self.rows = 0

    def add(self, weights: sp.csr_matrix, texts: Sequence[str] | None = None) -> None:
        """Add documents: one CSR row of term weights each, plus their text for BM25."""
        if texts is not None and len(texts) != weights.shape[0]:
            raise ConfigError(f"{weights.shape[0]} sparse rows but {len(texts)} texts")
        self.learned.add(weights)
        if self.bm25_store is not None:
            self.bm25_store.add(texts if texts is not None else [""] * weights.shape[0])
        self.rows += weights.shape[0]

    def close(self) -> None:
        self.learned.close()
        if self.bm25_store is not None:
            self.bm25_store.close()
        atomic_write_json(self.root / "meta.json", {
            "format": FORMAT_V2, "scheme": "tfgrid", "num_docs": self.rows, "nnz": self.learned.nnz,
            "vocab_size": self.vocab_size, "bm25": self.bm25})

    def abort(self) -> None:
        self.learned.abort()
        if self.bm25_store is not None:
            self.bm25_store.abort()


class SparseIndex:
    """Exact learned-sparse top-k and BM25 over one directory (see the module docstring): format 2
    (``scheme="tfgrid"``, the default) or format 1 (bit planes / buckets, still read and written)."""

    def __init__(self, root: str | Path) -> None:

        self.root = Path(root)
        meta = read_json(self.root / "meta.json")
        self.learned: LearnedIndex | None = None
        if meta.get("format") == FORMAT_V2:
            self._open_v2(meta)
            return
        if meta.get("format") != FORMAT:
            raise IndexFormatError(f"{self.root}: unsupported sparse index format {meta.get('format')!r}")
        self.meta = meta
        self.scheme = str(meta.get("scheme", "planes"))
        self.slots = int(meta.get("slots", meta.get("bits", 0)))
        self.vocab_size = int(meta["vocab_size"])
        indptr = load_npy(self.root / "forward.indptr.npy")
        indices = load_npy(self.root / "forward.indices.npy")
        data = load_npy(self.root / "forward.data.npy")
        n = int(meta["num_docs"])
        if indptr.shape[0] != n + 1 or indices.shape[0] != int(meta["nnz"]) or data.shape[0] != indices.shape[0]:
            raise IndexFormatError(f"{self.root}: forward store does not match meta.json (truncated write?)")
        self.forward = sp.csr_matrix((data, indices, indptr), shape=(n, self.vocab_size), copy=False)
        # small indexes (what adds make) also keep an in-memory inverted copy for exhaustive scoring
        self.inverted = self.forward.T.tocsr() if n <= INVERTED_MAX else None
        if (self.root / "slot_weight.npy").is_file():
            self.slot_weight = load_npy(self.root / "slot_weight.npy", mmap=False)
        else:  # early v1 indexes stored only the bitmask of populated planes per term
            planes = load_npy(self.root / "planes.npy", mmap=False).astype(np.int64)
            bits = np.arange(self.slots)
            self.slot_weight = (((planes[:, None] >> bits) & 1) * (float(meta["step"]) * 2.0**bits)).astype(np.float32)
        if self.slot_weight.shape != (self.vocab_size, self.slots):
            raise IndexFormatError(f"{self.root}: slot_weight.npy does not match meta.json")
        self.tokens = _token_table(self.vocab_size, self.slots)
        self.overflow = load_npy(self.root / "overflow.npy", mmap=False)
        self.df = load_npy(self.root / "df.npy", mmap=False)
        self.index, view = _open_tantivy(self.root / "tantivy")
        weakref.finalize(self, shutil.rmtree, str(view), True)
        self.index.register_tokenizer(BM25_TOKENIZER, _bm25_analyzer())
        self.schema = self.index.schema
        self.searcher = self.index.searcher()
        if self.searcher.num_docs != n:
            raise IndexFormatError(f"{self.root}: tantivy holds {self.searcher.num_docs} documents, meta.json says {n}")
        self.analyzer = _bm25_analyzer()
        # BM25 posting store (index/bm25.py); absent in segments written before it: tantivy's path
        self.bm25_store = BM25Store(self.root / "bm25") if (self.root / "bm25").is_dir() else None
        if self.bm25_store is not None and self.bm25_store.num_docs != n:
            raise IndexFormatError(f"{self.root}/bm25 holds {self.bm25_store.num_docs} documents, meta.json says {n}")

    def _open_v2(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.scheme = "tfgrid"
        self.vocab_size = int(meta["vocab_size"])
        n = int(meta["num_docs"])
        self.learned = LearnedIndex(self.root / "learned")
        if self.learned.num_docs != n:
            raise IndexFormatError(f"{self.root}/learned holds {self.learned.num_docs} documents, meta.json says {n}")
        self.forward, self.inverted = self.learned.forward, self.learned.inverted
        self.bm25_store = BM25Store(self.root / "bm25") if meta.get("bm25") else None
        if self.bm25_store is not None and self.bm25_store.num_docs != n:
            raise IndexFormatError(f"{self.root}/bm25 holds {self.bm25_store.num_docs} documents, meta.json says {n}")
        self.index = self.searcher = self.schema = None  # no tantivy text index: BM25 comes from the store
        self.analyzer = _bm25_analyzer()

    # -- construction -------------------------------------------------------------------------
    @staticmethod
    def create(root: str | Path, vocab_size: int, *, scheme: str = "tfgrid", bits: int = 6, buckets: int = 16,
               max_weight: float = 5.0, min_weight: float = 0.02, bm25: bool = True,
               heap_size: int = 256_000_000, threads: int | None = None) -> SparseIndexBuilder | TfGridPartBuilder:
        """Start a new index in the empty or absent directory ``root``.

        ``scheme="tfgrid"`` (default, format 2) stores learned weights on tantivy's own BM25 tf curve
        and BM25 as a posting store (:mod:`.learned`, :mod:`.bm25`; ``bits``, ``buckets``,
        ``max_weight``, ``min_weight`` and ``threads`` do not apply). Format 1 schemes:
        ``scheme="planes"`` indexes ``bits`` bit planes of ``ceil(w / step)``;
        ``scheme="buckets"`` indexes one token per term in one of ``buckets`` geometric weight
        buckets (between ``min_weight`` and ``max_weight``), each queried with the largest weight
        it holds for that term. All give exact top-k; they trade postings against clauses.
        """
        if scheme not in SCHEMES:
            raise ConfigError(f"unknown sparse scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
        if not 2 <= bits <= 16:
            raise ConfigError(f"bits must be between 2 and 16, got {bits}")
        if not 2 <= buckets <= 64:
            raise ConfigError(f"buckets must be between 2 and 64, got {buckets}")
        if not 0 < min_weight < max_weight:
            raise ConfigError(f"need 0 < min_weight < max_weight, got {min_weight} and {max_weight}")
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        if scheme == "tfgrid":
            return TfGridPartBuilder(root, vocab_size, bm25=bm25, heap_size=heap_size)
        return SparseIndexBuilder(root, vocab_size, scheme=scheme, bits=bits, buckets=buckets, max_weight=max_weight,
                                  min_weight=min_weight, bm25=bm25, heap_size=heap_size, threads=threads)

    @property
    def num_docs(self) -> int:
        return int(self.forward.shape[0])

    def check(self) -> list[str]:
        """The values check of ``info --check``: learned weights finite and non-negative."""
        return check_weights(self.root, self.forward)

    # -- learned sparse -------------------------------------------------------------------------
    def score(self, queries: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
        """Exact dot products of each query with the documents ``rows[i]`` (``-1`` = none -> 0)."""
        if self.learned is not None:
            return self.learned.score(queries, rows)
        q = sp.csr_matrix(queries, dtype=np.float32)
        rows = np.asarray(rows, dtype=np.int64)
        out = np.zeros(rows.shape, dtype=np.float32)
        for i in range(rows.shape[0]):
            valid = rows[i] >= 0
            if valid.any():
                out[i, valid] = (self.forward[rows[i, valid]] @ q[i].T).toarray().ravel()
        return out

    def _clauses(self, q_idx: np.ndarray, q_val: np.ndarray) -> tuple[Any, float]:
        """One constant-score clause per (query term, populated slot): ``q * slot_weight``."""
        import tantivy

        Query, Should = tantivy.Query, tantivy.Occur.Should
        table = self.slot_weight[q_idx]  # (terms, slots)
        ti, slot = np.nonzero(table)
        scores = (q_val[ti] * table[ti, slot]).tolist()
        tokens = self.tokens[q_idx[ti].astype(np.int64) * self.slots + slot]
        schema = self.schema
        clauses = [(Should, Query.const_score_query(Query.term_query(schema, "sparse", tok, index_option="basic"), sc))
                   for tok, sc in zip(tokens, scores)]
        slack = float(np.dot(q_val, self.overflow[q_idx])) if len(q_idx) else 0.0
        return (Query.boolean_query(clauses) if clauses else None), slack

    def _search_one(self, q: sp.csr_matrix, k: int, depth: int, max_depth: int, allowed: np.ndarray | None
                    ) -> tuple[np.ndarray, np.ndarray, int, int, bool]:
        q_idx, q_val = q.indices, q.data.astype(np.float64)
        keep = q_val > 0
        q_idx, q_val = q_idx[keep], q_val[keep]
        empty = (np.full(k, -1, dtype=np.int64), np.full(k, -np.inf, dtype=np.float32), 0, 0, False)
        if not len(q_idx):
            return empty
        dense_q = np.zeros(self.vocab_size, dtype=np.float32)
        dense_q[q_idx] = q_val
        query, slack = self._clauses(q_idx, q_val)
        if query is None:  # no document has any of the query's terms
            return empty
        rounds = 0
        while True:
            rounds += 1
            hits = self.searcher.search(query, depth, count=False).hits
            if not hits:
                return empty[0], empty[1], 0, rounds, False
            rows = np.asarray(self.searcher.fast_field_values("row", [a for _, a in hits]), dtype=np.int64)
            complete = len(hits) < depth  # every document matching any query term was fetched
            bound = hits[-1][0] * (1 + _REL_TOL) + slack + _ABS_TOL
            if allowed is not None:  # pre-filter: only allowed rows compete for the top-k
                rows = rows[allowed[rows]]
            exact = self.forward[rows] @ dense_q
            order = np.lexsort((rows, -exact))[:k]
            # every document not fetched scores at most the last hit's upper bound
            proven = complete or (len(order) >= k and bool(exact[order[k - 1]] >= bound))
            if proven:
                out_rows = np.full(k, -1, dtype=np.int64)
                out_scores = np.full(k, -np.inf, dtype=np.float32)
                pos = exact[order] > 0
                n = int(pos.sum())
                out_rows[:n] = rows[order][pos]
                out_scores[:n] = exact[order][pos]
                return out_rows, out_scores, depth, rounds, False
            if depth >= max_depth:
                return (*self._brute_force(dense_q, k, allowed), depth, rounds, True)
            depth = min(depth * 4, max_depth)

    def _brute_force(self, dense_q: np.ndarray, k: int, allowed: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        scores = np.asarray(self.forward @ dense_q).ravel()
        if allowed is not None:
            scores = np.where(allowed, scores, 0.0)
        top = np.argsort(-scores, kind="stable")[:k]  # stable: ties by row, as tantivy's path
        top = top[scores[top] > 0]
        out_rows = np.full(k, -1, dtype=np.int64)
        out_scores = np.full(k, -np.inf, dtype=np.float32)
        out_rows[: len(top)] = top
        out_scores[: len(top)] = scores[top]
        return out_rows, out_scores

    def search(self, queries: sp.csr_matrix, k: int = 10, *, depth: int | None = None,
               max_depth: int = 10_000, threads: int | None = None, allowed: np.ndarray | None = None,
               stats: SparseSearchStats | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k by dot product. Returns ``rows (nq, k)`` (``-1`` padding) and ``scores``.

        ``depth`` is the first tantivy depth tried (default ``2k + 10``, divided by the share of
        ``allowed`` rows when a mask is given); a query whose top-k is not proven by ``max_depth``
        is scored against every (allowed) document instead. Documents with score 0 are never
        returned. Ties are broken by row (insertion order). ``allowed`` (boolean mask over rows)
        restricts the top-k to those rows, exactly. ``stats``, if given, is filled with the work done.
        """
        if self.learned is not None:
            return self.learned.search(queries, k, depth=depth, max_depth=max_depth, threads=threads, allowed=allowed,
                                       stats=stats)
        if k < 1:
            raise ConfigError(f"k must be positive, got {k}")
        q = sp.csr_matrix(queries, dtype=np.float32, copy=True)
        if q.shape[1] != self.vocab_size:
            raise ConfigError(f"query vectors have {q.shape[1]} columns, the index vocabulary has {self.vocab_size}")
        q.sum_duplicates()  # a repeated column must count once, with its summed weight
        if q.nnz and float(q.data.min()) < 0:
            raise ConfigError("sparse query weights must be non-negative for an exact top-k")
        first = depth or (2 * k + 10)
        if allowed is not None:
            share = max(float(np.count_nonzero(allowed)) / max(1, self.num_docs), 1e-6)
            first = int(min(max_depth, np.ceil(first / share)))
        max_depth = max(max_depth, first)
        n = q.shape[0]
        rows = np.full((n, k), -1, dtype=np.int64)
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        st = stats if stats is not None else SparseSearchStats()
        st.queries, st.fetched, st.rounds, st.brute_force = n, [0] * n, [0] * n, 0

        def one(i: int) -> None:
            r, s, d, rd, bf = self._search_one(q[i], k, first, max_depth, allowed)
            rows[i], scores[i] = r, s
            st.fetched[i], st.rounds[i] = d, rd
            if bf:
                st.brute_force += 1

        run_queries(one, n, threads)
        return rows, scores

    def search_exhaustive(self, queries: sp.csr_matrix, k: int, *, allowed: np.ndarray | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
        """The same exact top-k as :meth:`search` (score > 0, ties by row), by scoring every
        document with one sparse product for the batch: the fast path for small indexes."""
        if self.learned is not None:
            return self.learned.search_exhaustive(queries, k, allowed=allowed)
        return exhaustive_topk(self.forward, self.inverted, queries, k, allowed)

    # -- BM25 ---------------------------------------------------------------------------------
    def bm25_tokens(self, text: str) -> list[str]:
        """The analysed tokens of a query (English stemming and stop words, as the text field)."""
        return list(self.analyzer.analyze(text))

    def doc_freq(self, token: str) -> int:
        """Documents of this segment (tombstones included) whose text has ``token``."""
        self._bm25_check()
        if self.bm25_store is not None:
            return int(self.bm25_store.stats([token])[2].get(token, 0))
        return int(self.searcher.doc_freq("text", token))

    def _bm25_query(self, tokens: Sequence[str], boosts: dict[str, float] | None = None) -> Any:
        import tantivy

        Query, Should = tantivy.Query, tantivy.Occur.Should
        clauses = []
        for tok in tokens:
            clause = Query.term_query(self.schema, "text", tok, index_option="freq")
            if boosts is not None:
                b = boosts.get(tok)
                if b is None:  # no document of this index has the term
                    continue
                if b != 1.0:
                    clause = Query.boost_query(clause, b)
            clauses.append((Should, clause))
        return Query.boolean_query(clauses) if clauses else None

    def _bm25_check(self, k: int | None = None) -> None:
        if not self.meta.get("bm25", True):
            raise ConfigError(f"{self.root}: this index was built without BM25 text")
        if k is not None and k < 1:
            raise ConfigError(f"k must be positive, got {k}")

    def search_bm25(self, texts: Sequence[str], k: int = 10, *, threads: int | None = None,
                    allowed: np.ndarray | None = None, tokens: Sequence[Sequence[str]] | None = None,
                    boosts: Sequence[dict[str, float] | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """BM25 (tantivy: k1 = 1.2, b = 0.75) over the ``text`` field; same shapes as :meth:`search`.

        ``allowed`` restricts the top-k to those rows (fetching deeper until ``k`` allowed rows are
        found or every match was seen: exact). ``tokens`` (analysed queries) and ``boosts`` (per
        query, token -> clause boost, e.g. global idf / this index's idf) come from a caller that
        searches several indexes as one; a token missing from a boost map is left out."""
        self._bm25_check(k)
        if self.bm25_store is not None:
            toks = tokens if tokens is not None else [self.bm25_tokens(t) for t in texts]
            return self.bm25_store.search(self.bm25_store.own_queries(toks, boosts), self.bm25_store.total_len /
                                          max(1, self.num_docs), k, allowed=allowed, threads=threads)
        n = len(texts)
        rows = np.full((n, k), -1, dtype=np.int64)
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        first = k
        if allowed is not None:
            share = max(float(np.count_nonzero(allowed)) / max(1, self.num_docs), 1e-6)
            first = int(min(self.num_docs + 1, np.ceil((k + 10) / share)))

        def one(i: int) -> None:
            query = self._bm25_query(tokens[i] if tokens is not None else self.bm25_tokens(texts[i]),
                                     boosts[i] if boosts is not None else None)
            if query is None:
                return
            depth = first + k + 10  # a margin, so that ties at the k-th score are broken by row
            while True:
                hits = self.searcher.search(query, depth, count=False).hits
                got = np.asarray(self.searcher.fast_field_values("row", [a for _, a in hits]), dtype=np.int64)
                sc = np.asarray([s for s, _ in hits], dtype=np.float32)
                if allowed is not None and len(got):
                    keep = allowed[got]
                    got, sc = got[keep], sc[keep]
                if len(got) >= k or len(hits) < depth:
                    order = np.lexsort((got, -sc))[:k]  # best score first, ties by row (insertion order)
                    m = len(order)
                    rows[i, :m], scores[i, :m] = got[order], sc[order]
                    return
                depth *= 4

        run_queries(one, n, threads)
        return rows, scores

    def score_bm25(self, texts: Sequence[str], rows: np.ndarray, *, tokens: Sequence[Sequence[str]] | None = None,
                   boosts: Sequence[dict[str, float] | None] | None = None) -> np.ndarray:
        """Exact BM25 scores of given documents (0 where no query term matches); ``tokens`` and
        ``boosts`` as in :meth:`search_bm25`."""
        import tantivy

        self._bm25_check()
        Query, Occur = tantivy.Query, tantivy.Occur
        rows = np.asarray(rows, dtype=np.int64)
        if self.bm25_store is not None:
            toks = tokens if tokens is not None else [self.bm25_tokens(t) for t in texts]
            return self.bm25_store.score(self.bm25_store.own_queries(toks, boosts), self.bm25_store.total_len /
                                         max(1, self.num_docs), rows)
        out = np.zeros(rows.shape, dtype=np.float32)
        for i, text in enumerate(texts):
            bm25 = self._bm25_query(tokens[i] if tokens is not None else self.bm25_tokens(text),
                                    boosts[i] if boosts is not None else None)
            cand = [int(r) for r in rows[i] if r >= 0]
            if bm25 is None or not cand:
                continue
            only = Query.const_score_query(Query.term_set_query(self.schema, "row", cand), 0.0)
            query = Query.boolean_query([(Occur.Must, only), (Occur.Should, bm25)])
            hits = self.searcher.search(query, len(cand), count=False).hits
            got = dict(zip(self.searcher.fast_field_values("row", [a for _, a in hits]), (s for s, _ in hits)))
            out[i] = [got.get(int(r), 0.0) if r >= 0 else 0.0 for r in rows[i]]
        return out
