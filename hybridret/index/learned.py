"""Exact learned-sparse top-k on tantivy's own BM25 tf curve ("tf-grid impacts").

tantivy-py scores a term query with BM25 only: ``boost * idf * (1 + k1) * tf / (tf + K_d)`` with
``K_d = k1 * (1 - b + b * dl / avgdl)``. This index makes ``K_d`` one constant ``K`` and defines the
stored weights *on* that curve, so one boosted term query per query term computes a dot product:

* every real document gets exactly ``P`` tokens in the ``w`` field (``P`` a value of tantivy's
  fieldnorm table, so ``dl = P`` is stored losslessly): ``tf`` copies of the token ``"{term}"`` per
  term, then ``"p"`` fillers up to ``P``;
* ``r * n`` empty filler documents follow (same commit, after the real documents), so ``avgdl = P / (1 + r)`` and
  ``K = 1.2 * (0.25 + 0.75 * (1 + r))`` whatever ``n`` is (segments are immutable: fillers are never
  maintained);
* the grid: ``g(tf) = tf / (tf + K)`` (float32, as tantivy computes it), ``w(tf) = W * g(tf) / g(T)``
  for ``tf = 1..T`` (``W`` = the segment's largest weight unless given); a weight ``w`` is stored as
  the smallest ``tf`` with ``w(tf) >= w`` (``rounding="up"``), so tantivy's score bounds the exact one;
* a query term of weight ``q`` becomes ``boost_query(term_query("{term}"), q * W / (g(T) * idf * 2.2))``
  with ``idf`` computed by tantivy's formula from this index's ``df`` and ``N = n * (1 + r)``; the
  tantivy score is then ``sum q * w(tf)`` (float32 rounding aside, ~1e-7 relative).

Exact search fetches tantivy's top ``N``, re-scores it from the float CSR forward store and stops
when the k-th exact score is at least the N-th tantivy score (times ``1 + 1e-5``, plus the slack of
weights the grid could not bound from above); otherwise it fetches 4x deeper, or past ``max_depth``
scores every document. ``exact=False`` returns tantivy's top-k on the grid as is.

An opened index is read-only: everything it needs is computed at open, and a search writes nothing
to it. Term queries are built per query (about 0.26 us a term, under 1 % of a query: cheaper than
keeping 30,000 of them), and so is the dense query buffer (1-2 us for 30,522 terms).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import ConfigError, IndexFormatError
from ._tantivy import SparseSearchStats, run_queries
from ._tantivy import open_tantivy as _open_tantivy
from .forward import ForwardStoreBuilder, check_queries, new_part_folder
from .storage import atomic_write_json, load_npy, read_json

__all__ = ["LearnedIndex", "LearnedIndexBuilder", "SparseSearchStats", "fieldnorm_table"]

logger = logging.getLogger(__name__)

FORMAT = "hybridret-learned-v1"
FIELD = "w"
PAD = "p"
K1 = np.float32(1.2)
B = np.float32(0.75)
INVERTED_MAX = 8192  # segments up to this many documents keep an in-memory inverted copy
_REL_TOL = 1e-5  # float32 arithmetic in tantivy's scores
_ABS_TOL = 1e-6
_CHUNK = 2048  # documents per block while writing tantivy
MAX_TANTIVY_DOCS = 2**31 - 2  # tantivy doc ids stay below 2^31 - 1 (its terminator)


def fieldnorm_table() -> np.ndarray:
    """The 256 document lengths tantivy's one-byte fieldnorm code decodes to (Lucene's SmallFloat
    ``byte4ToInt``: 0..23 exact, then 4-bit mantissa / exponent steps)."""
    out = np.zeros(256, dtype=np.int64)
    for i in range(256):
        if i < 24:
            out[i] = i
            continue
        j = i - 24
        bits, shift = j & 7, (j >> 3) - 1
        out[i] = 24 + (bits if shift == -1 else (bits | 8) << shift)
    return out


def _grid(K: np.float32, levels: int, W: float) -> np.ndarray:
    """Weight of each tf level 0..T: ``W * g(tf) / g(T)``, ``g`` in float32 as tantivy's tf factor."""
    tf = np.arange(levels + 1, dtype=np.float32)
    g = tf / (tf + np.float32(K))
    w = np.float64(W) * g.astype(np.float64) / np.float64(g[levels])
    w[levels] = W
    return w


def _idf(df: np.ndarray, total_docs: int) -> np.ndarray:
    """tantivy's ``ln(1 + (N - df + 0.5) / (df + 0.5))``, float32."""
    df32 = df.astype(np.float32)
    x = (np.float32(total_docs) - df32 + np.float32(0.5)) / (df32 + np.float32(0.5))
    return np.log(np.float32(1) + x).astype(np.float32)


class _Layout:
    """The numbers that fix the tf curve of one segment (see the module docstring)."""

    def __init__(self, n: int, P: int, fillers_per_doc: int) -> None:
        self.n, self.P, self.r = int(n), int(P), int(fillers_per_doc)
        self.filler_docs = self.n * self.r
        self.total_docs = self.n + self.filler_docs
        avgdl = np.float32(self.n * self.P) / np.float32(self.total_docs) if self.total_docs else np.float32(self.P)
        self.K = np.float32(K1 * ((np.float32(1) - B) + (B * np.float32(self.P)) / avgdl))


def _levels_of(w: np.ndarray, grid: np.ndarray, rounding: str) -> tuple[np.ndarray, np.ndarray]:
    """tf level of each weight and the weight the level leaves unbounded above (``w - w(tf)``, >= 0)."""
    T = len(grid) - 1
    tf = np.searchsorted(grid, w, side="left")  # smallest tf with grid[tf] >= w
    tf = np.clip(tf, 1, T)
    if rounding == "nearest":
        lower = np.maximum(tf - 1, 1)
        closer = np.abs(grid[lower] - w) < np.abs(grid[tf] - w)
        tf = np.where(closer, lower, tf)
    excess = np.maximum(w - grid[tf], 0.0)
    return tf.astype(np.int64), excess


class LearnedIndexBuilder(ForwardStoreBuilder):
    """Streams documents' learned-sparse weights into a new index directory; the tantivy part is
    written at :meth:`close`, when the segment's largest weight and longest document are known.
    Use :meth:`LearnedIndex.create`."""

    def __init__(self, root: Path, vocab_size: int, *, levels: int, fillers_per_doc: int, rounding: str,
                 max_weight: float | None, heap_size: int) -> None:
        super().__init__(root, vocab_size)
        self.levels, self.r, self.rounding = int(levels), int(fillers_per_doc), rounding
        self.max_weight = max_weight
        self.heap_size = int(heap_size)
        self.build_seconds: dict[str, float] = {}

    def _plan(self, indptr: np.ndarray, data: np.ndarray, W: float) -> tuple[_Layout, np.ndarray]:
        """Fix P (smallest fieldnorm value holding every document's tokens) and the grid on it."""
        table = fieldnorm_table()
        P = 1
        for _ in range(8):  # K hardly depends on P (float32 rounding only): converges at once
            lay = _Layout(self.rows, P, self.r)
            grid = _grid(lay.K, self.levels, W)
            need = 1
            for s0 in range(0, self.rows, 16 * _CHUNK):
                s1 = min(self.rows, s0 + 16 * _CHUNK)
                lo, hi = int(indptr[s0]), int(indptr[s1])
                tf, _ = _levels_of(np.asarray(data[lo:hi], dtype=np.float64), grid, self.rounding)
                owner = np.repeat(np.arange(s1 - s0), np.diff(indptr[s0 : s1 + 1]))
                if len(tf):
                    need = max(need, int(np.bincount(owner, weights=tf).max()))
            P_new = int(table[np.searchsorted(table, need)])
            if P_new == P:
                return lay, grid
            P = P_new
        raise IndexFormatError("tf-grid layout did not converge")  # pragma: no cover

    def close(self) -> None:
        """Finish the forward store, write tantivy (real documents, then fillers) and ``meta.json``."""
        import tantivy

        self.close_forward()
        t0 = time.perf_counter()
        indptr = load_npy(self.root / "forward.indptr.npy", mmap=False)
        indices = load_npy(self.root / "forward.indices.npy")
        data = load_npy(self.root / "forward.data.npy")
        if self.nnz == 0:  # no learned terms (a BM25-only index): nothing to shape a curve for
            self.r = 0
        # tantivy doc ids must stay below 2^31 - 1 (its end marker): big segments get fewer fillers
        # (a smaller K, a coarser grid: still exact, the proof may fetch deeper)
        fit = MAX_TANTIVY_DOCS // max(1, self.rows) - 1
        if fit < 0:
            raise ConfigError(f"a segment of {self.rows} documents exceeds tantivy's 2^31 documents; write smaller segments")
        if self.r > fit:
            logger.info("segment of %d documents: %d filler documents per document instead of %d (tantivy's 2^31 "
                        "document limit)", self.rows, fit, self.r)
            self.r = fit
        W = float(self.max_weight) if self.max_weight is not None else (self.seen_max or 1.0)
        lay, grid = self._plan(indptr, data, W)
        slack = np.zeros(self.vocab_size, dtype=np.float32)
        (self.root / "tantivy").mkdir()
        index = tantivy.Index(_schema(), path=str(self.root / "tantivy"))
        writer = index.writer(heap_size=self.heap_size, num_threads=1)  # one thread: rows stay in order
        tokens = [f"{t} " for t in range(self.vocab_size)]
        pad = PAD + " "
        try:
            for s0 in range(0, self.rows, _CHUNK):
                s1 = min(self.rows, s0 + _CHUNK)
                lo, hi = int(indptr[s0]), int(indptr[s1])
                idx = np.asarray(indices[lo:hi])
                tf, excess = _levels_of(np.asarray(data[lo:hi], dtype=np.float64), grid, self.rounding)
                if np.any(excess > 0):
                    np.maximum.at(slack, idx[excess > 0], excess[excess > 0].astype(np.float32))
                tf_l, idx_l = tf.tolist(), idx.tolist()
                bounds = (indptr[s0 : s1 + 1] - lo).tolist()
                for i in range(s1 - s0):
                    a, b = bounds[i], bounds[i + 1]
                    parts = [tokens[t] * c for t, c in zip(idx_l[a:b], tf_l[a:b])]
                    used = sum(tf_l[a:b])
                    doc = tantivy.Document()
                    doc.add_unsigned("row", s0 + i)
                    doc.add_text(FIELD, "".join(parts) + pad * (lay.P - used))
                    writer.add_document(doc)
            # the fillers follow in the same commit: one tantivy segment when the writer never flushed,
            # so each query term costs one term lookup, not one per segment (~1 us a term)
            t1 = time.perf_counter()
            empty = tantivy.Document()
            for _ in range(lay.filler_docs):
                writer.add_document(empty)
            writer.commit()
            writer.wait_merging_threads()
        except BaseException:
            try:
                writer.rollback()
            except (ValueError, RuntimeError):
                pass
            raise
        self.build_seconds = {"real": t1 - t0, "fillers": time.perf_counter() - t1}
        np.save(self.root / "df.npy", self.df)
        np.save(self.root / "slack.npy", slack)
        atomic_write_json(self.root / "meta.json", {
            "format": FORMAT, "num_docs": self.rows, "nnz": self.nnz, "vocab_size": self.vocab_size,
            "levels": self.levels, "fillers_per_doc": self.r, "filler_docs": lay.filler_docs,
            "total_docs": lay.total_docs, "doc_length": lay.P, "K": float(lay.K), "max_weight": W,
            "rounding": self.rounding, "slack_terms": int(np.count_nonzero(slack)),
        })
        if self.rounding == "up" and np.any(slack):
            logger.warning("%d terms have weights above max_weight=%g; exactness holds but searches may fetch deeper",
                           int(np.count_nonzero(slack)), W)


def _schema() -> Any:
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_unsigned_field("row", stored=False, indexed=False, fast=True)
    sb.add_text_field(FIELD, stored=False, tokenizer_name="whitespace", index_option="freq")
    return sb.build()


class LearnedIndex:
    """Exact learned-sparse top-k over one tf-grid directory (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        import tantivy

        self.root = Path(root)
        meta = read_json(self.root / "meta.json")
        if meta.get("format") != FORMAT:
            raise IndexFormatError(f"{self.root}: unsupported learned-sparse index format {meta.get('format')!r}")
        self.meta = meta
        self.vocab_size = int(meta["vocab_size"])
        n = int(meta["num_docs"])
        indptr = load_npy(self.root / "forward.indptr.npy")
        indices = load_npy(self.root / "forward.indices.npy")
        data = load_npy(self.root / "forward.data.npy")
        if indptr.shape[0] != n + 1 or indices.shape[0] != int(meta["nnz"]) or data.shape[0] != indices.shape[0]:
            raise IndexFormatError(f"{self.root}: forward store does not match meta.json (truncated write?)")
        self.forward = sp.csr_matrix((data, indices, indptr), shape=(n, self.vocab_size), copy=False)
        # plain ndarray views of the maps: fancy indexing on np.memmap is slower
        self._indptr = np.asarray(indptr).view(np.ndarray)
        self._indices = np.asarray(indices).view(np.ndarray)
        self._data = np.asarray(data).view(np.ndarray)
        self.inverted = self.forward.T.tocsr() if n <= INVERTED_MAX else None
        self.df = load_npy(self.root / "df.npy", mmap=False)
        self.slack = load_npy(self.root / "slack.npy", mmap=False).astype(np.float64)
        if self.df.shape != (self.vocab_size,) or self.slack.shape != (self.vocab_size,):
            raise IndexFormatError(f"{self.root}: df.npy / slack.npy do not match meta.json")
        self.layout = _Layout(n, int(meta["doc_length"]), int(meta["fillers_per_doc"]))
        self.levels = int(meta["levels"])
        self.max_weight = float(meta["max_weight"])
        self.grid = _grid(self.layout.K, self.levels, self.max_weight)
        g_top = np.float32(self.levels) / (np.float32(self.levels) + self.layout.K)
        idf = _idf(self.df, self.layout.total_docs)
        with np.errstate(divide="ignore"):
            coef = self.max_weight / (np.float64(g_top) * idf.astype(np.float64) * np.float64(np.float32(1) + K1))
        self.coef = np.where(self.df > 0, coef, 0.0)  # query weight -> clause boost, per term
        self.index, view = _open_tantivy(self.root / "tantivy")
        weakref.finalize(self, shutil.rmtree, str(view), True)
        self.schema = self.index.schema
        self.searcher = self.index.searcher()
        if self.searcher.num_docs != self.layout.total_docs:
            raise IndexFormatError(f"{self.root}: tantivy holds {self.searcher.num_docs} documents, "
                                   f"meta.json says {self.layout.total_docs} (real + fillers)")
        self._Query, self._Should = tantivy.Query, tantivy.Occur.Should
        self._check_curve()

    # -- construction -------------------------------------------------------------------------
    @staticmethod
    def create(root: str | Path, vocab_size: int, *, levels: int = 255, fillers_per_doc: int = 141,
               rounding: str = "up", max_weight: float | None = None,
               heap_size: int = 512_000_000) -> LearnedIndexBuilder:
        """Start a new index in the empty or absent directory ``root``.

        ``levels`` (T) tf levels per weight; ``fillers_per_doc`` (r) empty documents per real one,
        giving ``K = 1.2 * (0.25 + 0.75 * (1 + r))`` (141 -> ~128: a near-linear grid); ``rounding``
        ``"up"`` (tantivy's score bounds the float score: exact search) or ``"nearest"`` (tighter
        grid scores for ``exact=False``; exact search still holds through per-term slack, but fetches
        deeper); ``max_weight`` (W) the top level's weight (default: the segment's largest weight, so
        no weight is above the grid).
        """
        if rounding not in ("up", "nearest"):
            raise ConfigError(f"rounding must be 'up' or 'nearest', got {rounding!r}")
        if not 2 <= levels <= 4096:
            raise ConfigError(f"levels must be between 2 and 4096, got {levels}")
        if not 0 <= fillers_per_doc <= 10_000:
            raise ConfigError(f"fillers_per_doc must be between 0 and 10000, got {fillers_per_doc}")
        if max_weight is not None and not max_weight > 0:
            raise ConfigError(f"max_weight must be positive, got {max_weight}")
        return LearnedIndexBuilder(new_part_folder(root), vocab_size, levels=levels, fillers_per_doc=fillers_per_doc, rounding=rounding,
                                   max_weight=max_weight, heap_size=heap_size)

    def _check_curve(self) -> None:
        """Compare N, dl and avgdl in tantivy's own explanation of one hit with the layout."""
        terms = np.flatnonzero(self.df)
        if not len(terms):
            return
        q = self._term_query(int(terms[0]))
        hits = self.searcher.search(q, 1, count=False).hits
        if not hits:
            raise IndexFormatError(f"{self.root}: tantivy has no posting for term {int(terms[0])}")
        found: dict[str, float] = {}

        def walk(node: dict[str, Any]) -> None:
            desc = str(node.get("description", ""))
            for key in ("N, total number of docs", "dl, length of field", "avgdl, average length of field"):
                if desc.startswith(key):
                    found[key.split(",")[0]] = float(node["value"])
            for child in node.get("details", []) or []:
                walk(child)

        walk(json.loads(q.explain(self.searcher, hits[0][1]).to_json()))
        lay = self.layout
        if found.get("N") != lay.total_docs or found.get("dl") != lay.P:
            raise IndexFormatError(f"{self.root}: tantivy reports N={found.get('N')}, dl={found.get('dl')}; the "
                                   f"tf-grid needs N={lay.total_docs}, dl={lay.P}")
        avgdl = np.float32(lay.n * lay.P) / np.float32(lay.total_docs)
        if "avgdl" in found and abs(found["avgdl"] - float(avgdl)) > 1e-6 * float(avgdl):
            raise IndexFormatError(f"{self.root}: tantivy's avgdl {found['avgdl']} is not the tf-grid's {avgdl}")

    @property
    def num_docs(self) -> int:
        return int(self.forward.shape[0])

    def check(self) -> list[str]:
        """The values check of ``info --check``: learned weights finite and non-negative."""
        return check_weights(self.root, self.forward)

    # -- pieces -------------------------------------------------------------------------------
    def _term_query(self, t: int) -> Any:
        return self._Query.term_query(self.schema, FIELD, str(t), index_option="freq")

    def _boosted(self, terms: list[int], boosts: list[float]) -> Any:
        """One boosted term query per query term (built per call, see the module docstring)."""
        Query, Should, schema = self._Query, self._Should, self.schema
        term_query, boost_query = Query.term_query, Query.boost_query
        clauses = [(Should, boost_query(term_query(schema, FIELD, str(t), index_option="freq"), b))
                   for t, b in zip(terms, boosts)]
        return clauses[0][1] if len(clauses) == 1 else Query.boolean_query(clauses)

    def _query(self, q_idx: np.ndarray, q_val: np.ndarray) -> Any:
        """One boosted term query per query term: tantivy's score = sum q * w(tf)."""
        return self._boosted(q_idx.tolist(), (q_val * self.coef[q_idx]).tolist())

    def _hits(self, query: Any, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """tantivy's top ``depth``: rows (through the ``row`` fast field) and scores, best first.

        The fast field costs ~1 us per query more than reading rows off the doc ids (real documents
        are doc ids 0..n-1 of one tantivy segment when the writer flushed once), and stays right
        whatever tantivy's segments and merges do."""
        hits = self.searcher.search(query, depth, count=False).hits
        scores = np.fromiter((h[0] for h in hits), dtype=np.float64, count=len(hits))
        rows = np.asarray(self.searcher.fast_field_values("row", [h[1] for h in hits]), dtype=np.int64)
        return rows, scores

    def _buffer(self) -> np.ndarray:
        """A zeroed dense query buffer, fresh for each call (allocation: 1-2 us)."""
        return np.zeros(self.vocab_size, dtype=np.float32)

    def _exact(self, rows: np.ndarray, dense_q: np.ndarray) -> np.ndarray:
        """Exact dot products of ``dense_q`` with the forward rows ``rows`` (``take`` rather than fancy
        indexing: about twice as fast on these small gathers)."""
        start = self._indptr.take(rows)
        lens = self._indptr.take(rows + 1) - start
        out = np.zeros(len(rows), dtype=np.float32)
        ends = np.cumsum(lens)
        total = int(ends[-1]) if len(ends) else 0
        if total == 0:
            return out
        offs = ends - lens
        idx = np.repeat(start - offs, lens)
        idx += np.arange(total, dtype=np.int64)
        prod = dense_q.take(self._indices.take(idx))
        prod *= self._data.take(idx)
        nz = lens > 0
        if nz.all():
            return np.add.reduceat(prod, offs)
        out[nz] = np.add.reduceat(prod, offs[nz])
        return out

    def grid_forward(self) -> sp.csr_matrix:
        """The forward store with every weight replaced by its grid level's weight (what tantivy scores)."""
        tf, _ = _levels_of(np.asarray(self._data, dtype=np.float64), self.grid, str(self.meta["rounding"]))
        return sp.csr_matrix((self.grid[tf].astype(np.float32), self._indices, self._indptr), shape=self.forward.shape)

    # -- search -------------------------------------------------------------------------------
    def score(self, queries: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
        """Exact dot products of each query with the documents ``rows[i]`` (``-1`` = none -> 0)."""
        q = check_queries(queries, self.vocab_size)
        rows = np.asarray(rows, dtype=np.int64)
        out = np.zeros(rows.shape, dtype=np.float32)
        buf = self._buffer()  # this call's own
        for i in range(rows.shape[0]):
            valid = rows[i] >= 0
            lo, hi = q.indptr[i], q.indptr[i + 1]
            if not valid.any() or hi == lo:
                continue
            buf[q.indices[lo:hi]] = q.data[lo:hi]
            out[i, valid] = self._exact(rows[i, valid], buf)
            buf[q.indices[lo:hi]] = 0.0
        return out

    def _search_one(self, terms: list[int], boosts: list[float], q_idx: np.ndarray, q_val: np.ndarray, k: int,
                    depth: int, max_depth: int, allowed: np.ndarray | None, exact: bool
                    ) -> tuple[np.ndarray, np.ndarray, int, int, bool]:
        """One query (terms that some document has, weights > 0): tantivy, then the proof."""
        out_rows = np.full(k, -1, dtype=np.int64)
        out_scores = np.full(k, -np.inf, dtype=np.float32)
        if not terms:
            return out_rows, out_scores, 0, 0, False
        query = self._boosted(terms, boosts)
        buf = self._buffer()  # this query's own
        buf[q_idx] = q_val
        slack = float(np.dot(q_val, self.slack[q_idx]))
        rounds = 0
        while True:
            rounds += 1
            rows, bound_scores = self._hits(query, depth)
            complete = len(rows) < depth  # every document matching a query term was fetched
            last = bound_scores[-1] if len(rows) else 0.0
            if allowed is not None:  # pre-filter: only allowed rows compete for the top-k
                ok = allowed[rows]
                rows, bound_scores = rows[ok], bound_scores[ok]
            if exact:
                scores = self._exact(rows, buf)
                order = np.lexsort((rows, -scores))[:k]
                proven = complete or (len(order) >= k and
                                      bool(scores[order[k - 1]] >= last * (1 + _REL_TOL) + slack + _ABS_TOL))
            else:  # the grid's top-k: ties at the k-th score must all be in
                scores = bound_scores.astype(np.float32)
                order = np.lexsort((rows, -scores))[:k]
                proven = complete or (len(order) >= k and bool(scores[order[k - 1]] > last))
            if proven:
                pos = order[scores[order] > 0]
                out_rows[: len(pos)], out_scores[: len(pos)] = rows[pos], scores[pos]
                return out_rows, out_scores, depth, rounds, False
            if depth >= max_depth:
                scores = self._brute_force(buf, allowed) if exact else self._brute_force_grid(q_idx, q_val, allowed)
                r, s = _top(scores, k)
                return r, s, depth, rounds, True
            depth = min(depth * 4, max_depth)

    def _brute_force(self, dense_q: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
        scores = np.asarray(self.forward @ dense_q, dtype=np.float32).ravel()
        return np.where(allowed, scores, 0.0) if allowed is not None else scores

    def _brute_force_grid(self, q_idx: np.ndarray, q_val: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
        """Grid scores of every document (the quantised mode's fallback past ``max_depth``)."""
        cols = self.forward[:, q_idx].tocsc()
        tf, _ = _levels_of(cols.data.astype(np.float64), self.grid, str(self.meta["rounding"]))
        cols.data = self.grid[tf].astype(np.float32)
        scores = np.asarray(cols @ q_val.astype(np.float32), dtype=np.float32).ravel()
        return np.where(allowed, scores, 0.0) if allowed is not None else scores

    def search(self, queries: sp.csr_matrix, k: int = 10, *, depth: int | None = None, max_depth: int = 10_000,
               threads: int | None = None, allowed: np.ndarray | None = None, stats: SparseSearchStats | None = None,
               exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k by dot product. Returns ``rows (nq, k)`` (``-1`` padding) and ``scores``
        (``-inf`` padding).

        ``depth`` is the first tantivy depth tried (default ``k + 10``, divided by the share of
        ``allowed`` rows when a mask is given); a query whose top-k is not proven by ``max_depth``
        is scored against every (allowed) document instead. Documents with score 0 are never
        returned; ties are broken by row. ``allowed`` (boolean mask over rows) restricts the top-k
        to those rows, exactly. ``stats``, if given, is filled with the work done. ``exact=False``
        returns the top-k of the grid dot product (tantivy's scores) without re-scoring.
        """
        if k < 1:
            raise ConfigError(f"k must be positive, got {k}")
        q = check_queries(queries, self.vocab_size)
        if allowed is not None:
            allowed = np.asarray(allowed, dtype=bool)
            if allowed.shape != (self.num_docs,):
                raise ConfigError(f"allowed mask has shape {allowed.shape}, expected ({self.num_docs},)")
        first = depth or (k + 10)
        if allowed is not None:
            share = max(float(np.count_nonzero(allowed)) / max(1, self.num_docs), 1e-6)
            first = int(min(max_depth, np.ceil(first / share)))
        first = max(first, k)
        max_depth = max(max_depth, first)
        n = q.shape[0]
        rows = np.full((n, k), -1, dtype=np.int64)
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        st = stats if stats is not None else SparseSearchStats()
        st.queries, st.fetched, st.rounds, st.brute_force = n, [0] * n, [0] * n, 0
        # once per batch: drop weights <= 0 and terms no document has; every clause's boost
        keep = (q.data > 0) & (self.df[q.indices] > 0)
        indices, data = q.indices[keep], q.data[keep]
        owner = np.repeat(np.arange(n), np.diff(q.indptr))
        indptr = np.concatenate([[0], np.cumsum(np.bincount(owner[keep], minlength=n))])
        boosts = (data.astype(np.float64) * self.coef[indices]).tolist()
        terms = indices.tolist()
        bounds = indptr.tolist()

        brute = [False] * n  # per query, counted after: threads never add to one counter

        def one(i: int) -> None:
            lo, hi = bounds[i], bounds[i + 1]
            r, s, d, rd, bf = self._search_one(terms[lo:hi], boosts[lo:hi], indices[lo:hi], data[lo:hi], k, first,
                                               max_depth, allowed, exact)
            rows[i], scores[i] = r, s
            st.fetched[i], st.rounds[i], brute[i] = d, rd, bf

        run_queries(one, n, threads)
        st.brute_force = sum(brute)
        return rows, scores

    def search_exhaustive(self, queries: sp.csr_matrix, k: int, *, allowed: np.ndarray | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
        """The same exact top-k as :meth:`search` (score > 0, ties by row), by scoring every
        document with one sparse product for the batch: the fast path for small segments."""
        return exhaustive_topk(self.forward, self.inverted, queries, k, allowed)


def check_weights(root: Path, forward: sp.csr_matrix) -> list[str]:
    """Problems with a learned-sparse forward store's values: negative, NaN or infinite weights."""
    data = np.asarray(forward.data)
    if not np.isfinite(data).all() or (data < 0).any():
        return [f"{root}: learned weights that are negative, NaN or infinite"]
    return []


def exhaustive_topk(forward: sp.csr_matrix, inverted: sp.csr_matrix | None, queries: sp.csr_matrix, k: int,
                    allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of every document's dot product (score > 0, ties by row, ``-1`` / ``-inf``
    padding), with one sparse product for the batch: through ``inverted`` (term -> postings, touches
    only the query terms' postings) when given, else through the forward rows."""
    if k < 1:
        raise ConfigError(f"k must be positive, got {k}")
    q = check_queries(queries, forward.shape[1])
    if inverted is not None:
        scores = np.asarray((q @ inverted).todense(), dtype=np.float32)  # (nq, n)
    else:
        scores = np.ascontiguousarray(np.asarray((forward @ q.T).todense(), dtype=np.float32).T)
    if allowed is not None:
        scores[:, ~np.asarray(allowed, dtype=bool)] = 0.0
    rows = np.full((scores.shape[0], k), -1, dtype=np.int64)
    out = np.full((scores.shape[0], k), -np.inf, dtype=np.float32)
    for i in range(scores.shape[0]):
        rows[i], out[i] = _top(scores[i], k)
    return rows, out


def _top(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of one score vector: score > 0 only, ties by row, ``-1`` / ``-inf`` padding."""
    out_rows = np.full(k, -1, dtype=np.int64)
    out_scores = np.full(k, -np.inf, dtype=np.float32)
    n = len(scores)
    kk = min(k, n)
    if kk == 0:
        return out_rows, out_scores
    cand = np.argpartition(-scores, kk - 1)[:kk] if kk < n else np.arange(n)
    cand = np.flatnonzero(scores >= scores[cand].min())  # every row tied at the edge competes
    order = cand[np.lexsort((cand, -scores[cand]))][:k]
    order = order[scores[order] > 0]
    out_rows[: len(order)], out_scores[: len(order)] = order, scores[order]
    return out_rows, out_scores
