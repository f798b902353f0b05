"""Exact learned-sparse top-k with pruning: impact-layered postings, MaxScore over layers, numba.

The part of a segment that holds its learned-sparse vectors (format ``hybridret-impact-v1``):

* ``forward.indptr.npy`` (int64, n + 1), ``forward.indices.npy`` (int32), ``forward.data.npy``
  (float32): the float forward store, one CSR row per document. Every score this part returns is
  the dot product computed from it by one routine (:func:`_row_score`: float32, in the row's term
  order), in search and in :meth:`ImpactIndex.score` alike;
* ``postings.docs.npy`` (int32) and ``postings.w.npy`` (float32): the inverted copy, every term's
  postings split into ``L`` **impact layers** by weight rank (by default its top 2 %, the next 8 %,
  the next 30 %, the rest; terms with fewer than 64 postings keep one layer), rows ascending
  within a layer; ``layers.ptr.npy`` (int64, ``V * L + 1``) where each (term, layer) run starts,
  ``layers.max.npy`` (float32, ``V * L``) the largest weight of each run.

**Exact search** (per query, one numba kernel): every (query term, layer) run is a list with the
upper bound ``q_t * max``; lists are taken in descending bound order and their postings added into
a dense accumulator (a term's layers come in order, so ``R``, the sum over query terms of the
bound of their highest layer not taken yet, bounds what any document can still gain). ``theta``, a
lower bound on the k-th best score, is the k-th best *exact* score of the documents with the best
partial sums, refreshed when the postings taken since the last refresh outnumber the documents
touched (so refreshing costs at most as much as accumulating). When ``R < theta``, no document not
touched yet can reach the top-k: the remaining lists are skipped, and only touched documents whose
partial sum plus ``R`` reaches ``theta`` are scored exactly from the forward store (or, when that
would cost more than the remaining postings, the remaining lists are taken too). The top-k of the
exact scores of that set is the exact top-k (scores > 0, ties by row); bounds carry a relative
slack of 1e-5 for float32 rounding. Filters and tombstones (``allowed``) skip postings of rows
outside the mask, so ``theta`` comes from allowed rows only; with a tight filter little is pruned
and the search approaches a full scan, which is still exact.

**Approximate search** (``mode="approx"``, opt-in): the same lists in the same order, stopping
once ``R < stop * theta`` and taking no remaining list, then only the ``depth`` best partial sums
are re-scored exactly instead of every survivor. ``stop = 1`` is the sound half of the proof (no
untouched document could enter the top-k); segments of :data:`APPROX_LARGE` rows or more stop at
``3`` (theta refreshed twice as often as the exact path refreshes it) and re-score 300 per 10
results (:data:`APPROX_BIG`), smaller ones stop at ``1`` and re-score 50 (:data:`APPROX_SMALL`). A
document with a small partial sum but a large remainder can be missed: measured recall@10 0.998
at 1.6x the exact path (6x the numpy inverted index) on 1M resampled passages, 0.999 on
the 30k pool (docs/benchmarks.md). Its recall against exact search on an index is measured by
:func:`approx_recall` (``hybridret info --sparse-approx`` reports it).

An opened part is read-only; each thread keeps its own scratch buffers (``threading.local``).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, IndexFormatError
from ._blocks import in_blocks
from .forward import ForwardScored, ForwardStoreBuilder, new_part_folder
from .storage import atomic_write_json, load_npy

__all__ = ["FORMAT", "ImpactIndex", "ImpactIndexBuilder", "ImpactSearchStats", "approx_recall"]

logger = logging.getLogger(__name__)

FORMAT = "hybridret-impact-v1"
FRACTIONS = (0.02, 0.10, 0.40, 1.0)  # cumulative share of a term's postings (by weight rank) per layer
MIN_LAYERED = 64  # terms with fewer postings keep one layer
# approx mode: stop taking lists once R < stop * theta (1.0: the sound stop), theta refreshed every n // div
# postings, then re-score the depth best partial sums (per k = 10; scaled with k). Large segments stop early
# (measured at 1M on a quiet core: recall@10 0.998 at 1.62x the exact path, against 0.981 at 1.0x for the sound
# stop); on small ones the accumulator scans an early stop saves are cheap and the deeper re-scoring is not, so
# they keep the sound stop.
APPROX_SMALL = (1.0, 50, 4)  # (stop, depth, div) for segments below APPROX_LARGE rows
APPROX_BIG = (3.0, 300, 2)
APPROX_LARGE = 250_000
MODES = ("exact", "approx")
RESCORE_COST = 1.0  # cost of re-scoring one forward-store entry, in postings taken (measured at 30k and 1M)


class ImpactSearchStats:
    """Work done by the last :meth:`ImpactIndex.search` call it was given to, per query:
    ``postings`` taken, ``total`` postings of the query's terms, ``rescored`` documents scored
    exactly from the forward store, ``certified`` whether the answer is the exact top-k (always
    for exact search; per query for the windowed part's approximate search)."""

    def __init__(self) -> None:
        self.postings = np.zeros(0, np.int64)
        self.total = np.zeros(0, np.int64)
        self.rescored = np.zeros(0, np.int64)
        self.certified = np.zeros(0, np.bool_)

    @property
    def share(self) -> float:
        """Share of the query terms' postings taken, over the batch."""
        return float(self.postings.sum()) / max(1, int(self.total.sum()))


class ImpactIndexBuilder(ForwardStoreBuilder):
    """Streams documents' learned-sparse weights into a new part folder; the layered postings are
    written at :meth:`close` (a counting sort over the forward store, through memory maps, so a
    build's memory stays near the size of one posting copy). Use :meth:`ImpactIndex.create`."""

    def __init__(self, root: Path, vocab_size: int, fractions: tuple[float, ...]) -> None:
        super().__init__(root, vocab_size)
        self.fractions = tuple(float(f) for f in fractions)

    def close(self) -> None:
        self.close_forward()
        fptr = load_npy(self.root / "forward.indptr.npy", mmap=False)
        fidx = load_npy(self.root / "forward.indices.npy")
        fdat = load_npy(self.root / "forward.data.npy")
        L = len(self.fractions)
        tptr = np.zeros(self.vocab_size + 1, dtype=np.int64)
        np.cumsum(self.df, out=tptr[1:])
        docs = np.lib.format.open_memmap(self.root / "postings.docs.npy", mode="w+", dtype=np.int32, shape=(self.nnz,))
        w = np.lib.format.open_memmap(self.root / "postings.w.npy", mode="w+", dtype=np.float32, shape=(self.nnz,))
        lptr = np.zeros(self.vocab_size * L + 1, dtype=np.int64)
        lmax = np.zeros(self.vocab_size * L, dtype=np.float32)
        if self.nnz:
            kern = _kernels()
            pos = tptr[:-1].copy()
            step = 1 << 20  # forward rows are read in chunks: the memory map pages stay few
            for r0 in range(0, self.rows, step):
                r1 = min(self.rows, r0 + step)
                lo, hi = int(fptr[r0]), int(fptr[r1])
                kern.fill(np.ascontiguousarray(fptr[r0:r1 + 1] - lo), np.asarray(fidx[lo:hi]), np.asarray(fdat[lo:hi]),
                          r0, pos, docs, w)
            kern.layer(tptr, docs, w, np.asarray(self.fractions, dtype=np.float64), MIN_LAYERED, lptr, lmax)
        lptr[-1] = self.nnz
        docs.flush()
        w.flush()
        del docs, w
        np.save(self.root / "layers.ptr.npy", lptr)
        np.save(self.root / "layers.max.npy", lmax)
        atomic_write_json(self.root / "meta.json", {
            "format": FORMAT, "num_docs": self.rows, "nnz": self.nnz, "vocab_size": self.vocab_size,
            "layers": L, "fractions": list(self.fractions), "min_layered": MIN_LAYERED,
            "max_weight": self.seen_max})

    def abort(self) -> None:
        super().abort()
        shutil.rmtree(self.root, ignore_errors=True)


class ImpactIndex(ForwardScored):
    """One segment's pruned learned-sparse part, opened read-only (arrays memory-mapped)."""

    def __init__(self, root: str | Path) -> None:
        n, nnz, V, L = self._open(root, FORMAT, ("num_docs", "nnz", "vocab_size", "layers"))
        self.layers = L
        forward_ok = self._open_forward(n, nnz, V)
        self.docs = np.asarray(load_npy(self.root / "postings.docs.npy")).view(np.ndarray)
        self.w = np.asarray(load_npy(self.root / "postings.w.npy")).view(np.ndarray)
        self.lptr = np.asarray(load_npy(self.root / "layers.ptr.npy", mmap=False))
        self.lmax = np.asarray(load_npy(self.root / "layers.max.npy", mmap=False))
        if (not forward_ok or self.docs.shape != (nnz,) or self.w.shape != (nnz,) or self.lptr.shape != (V * L + 1,)
                or self.lmax.shape != (V * L,) or int(self.lptr[-1]) != nnz):
            raise IndexFormatError(f"{self.root}: part files do not match meta.json (truncated write?)")
        self.df = self.lptr[L::L] - self.lptr[:-1:L]  # postings per term
        self._scratch = threading.local()

    @staticmethod
    def create(root: str | Path, vocab_size: int, *, fractions: tuple[float, ...] = FRACTIONS) -> ImpactIndexBuilder:
        """Start a new part in the empty or absent folder ``root``. ``fractions``: the cumulative
        share of each term's postings (by weight rank) that its impact layers end at (last 1.0)."""
        fr = tuple(float(f) for f in fractions)
        if not fr or fr[0] <= 0 or fr[-1] != 1.0 or any(not a < b for a, b in zip(fr, fr[1:])):
            raise ConfigError(f"fractions must increase strictly from above 0 to 1.0, got {fractions!r}")
        return ImpactIndexBuilder(new_part_folder(root), vocab_size, fr)

    def check(self) -> list[str]:
        """The values check of ``info --check``: weights finite and non-negative, postings equal to
        the forward store's entries (counts per term, and the same weight total)."""
        problems = []
        data = np.asarray(self._fdat)
        if not np.isfinite(data).all() or (data < 0).any():
            problems.append(f"{self.root}: learned weights that are negative, NaN or infinite")
        df = np.bincount(self._fidx, minlength=self.vocab_size) if len(self._fidx) else np.zeros(self.vocab_size)
        if not np.array_equal(df, self.df) or not np.isclose(float(self.w.sum(dtype=np.float64)),
                                                             float(data.sum(dtype=np.float64)), rtol=1e-9):
            problems.append(f"{self.root}: postings do not match the forward store")
        elif len(self.docs) and (int(self.docs.min()) < 0 or int(self.docs.max()) >= self.num_docs):
            problems.append(f"{self.root}: postings name rows outside the segment")
        return problems

    # -- queries ----------------------------------------------------------------------------------
    def _buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """This thread's scratch: the accumulator and the query buffer (both zeroed by the kernel on exit)."""
        local = self._scratch
        buf = getattr(local, "buf", None)
        local.buf = None  # taken (dropped if the kernel fails half-way)
        if buf is None:
            buf = (np.zeros(self.num_docs, np.float32), np.zeros(self.vocab_size, np.float32))
        return buf

    def search(self, queries: Any, k: int = 10, *, allowed: np.ndarray | None = None, threads: int | None = 1,
               mode: str = "exact", approx_depth: int | None = None, approx_stop: float | None = None,
               stats: ImpactSearchStats | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows ``(nq, k)`` (``-1`` / ``-inf`` padding) by dot product, scores > 0, ties by row,
        restricted to ``allowed`` rows when a mask is given. ``mode="exact"`` (default) is the exact
        top-k; ``"approx"`` stops early (see the module docstring): ``approx_stop`` (>= 1) and
        ``approx_depth`` override its stop factor and re-scoring depth (defaults by segment size:
        :data:`APPROX_SMALL`, :data:`APPROX_BIG`). ``threads``: worker threads over blocks of queries
        (``None``: every core)."""
        k, mask = self._search_args(k, mode, MODES, approx_depth, allowed)
        if approx_stop is not None and not (isinstance(approx_stop, (int, float)) and 1.0 <= approx_stop < np.inf):
            raise ConfigError(f"approx_stop must be a number >= 1, got {approx_stop!r}")
        ptr, terms, weights = self._queries(queries)
        nq = len(ptr) - 1
        rows = np.full((nq, k), -1, dtype=np.int64)
        scores = np.full((nq, k), -np.inf, dtype=np.float32)
        work = np.zeros((nq, 3), dtype=np.int64)
        if nq and len(terms) and self.num_docs:
            stop, per10, div = APPROX_BIG if self.num_docs >= APPROX_LARGE else APPROX_SMALL
            stop = float(approx_stop) if approx_stop is not None else stop
            depth = 0 if mode == "exact" else int(approx_depth or max(per10, per10 * k // 10))
            kern = _kernels().search
            workers = max(1, min(nq // 4, threads if threads is not None else (os.cpu_count() or 1)))

            def block(a: int, b: int) -> None:
                acc, qbuf = self._buffers()
                kern(ptr[a:b + 1] - ptr[a], terms[ptr[a]:ptr[b]], weights[ptr[a]:ptr[b]], self.lptr, self.lmax,
                     self.layers, self.docs, self.w, self._fptr, self._fidx, self._fdat, acc, qbuf,
                     mask, k, depth, RESCORE_COST, stop, div, rows[a:b], scores[a:b], work[a:b])
                self._scratch.buf = (acc, qbuf)

            in_blocks(nq, workers, block)
        if stats is not None:
            stats.postings, stats.total, stats.rescored = work[:, 0].copy(), work[:, 1].copy(), work[:, 2].copy()
            stats.certified = np.full(len(work), mode == "exact", dtype=np.bool_)
        return rows, scores


def approx_recall(part: ImpactIndex, queries: Any, k: int = 10, *, allowed: np.ndarray | None = None) -> float:
    """Recall@k of ``mode="approx"`` against the exact top-k on these queries (1.0 when no query
    has a match)."""
    exact, _ = part.search(queries, k, allowed=allowed)
    approx, _ = part.search(queries, k, allowed=allowed, mode="approx")
    hit = tot = 0
    for e, a in zip(exact, approx):
        e = set(e[e >= 0].tolist())
        hit += len(e & set(a[a >= 0].tolist()))
        tot += len(e)
    return hit / tot if tot else 1.0


def _kernels() -> Any:
    """The numba kernels (:mod:`._impact_kernels`), compiled or loaded from numba's cache on first use."""
    try:
        from . import _impact_kernels
    except ImportError as exc:  # numba is a core dependency; say so plainly if it is missing
        raise ConfigError(f"the learned-sparse part needs numba (pip install numba): {exc}") from exc
    return _impact_kernels
