"""Exact and certified-approximate learned-sparse top-k over 8-bit impacts in document windows.

The part of a segment that holds its learned-sparse vectors (format ``hybridret-impact-v2``, the
default since issue #30; ``hybridret-impact-v1``, :mod:`.impact`, is still read):

* ``forward.indptr.npy`` / ``forward.indices.npy`` / ``forward.data.npy``: the float forward
  store, one CSR row per document, **on disk** (memory-mapped): the only source of the scores this
  part returns (:func:`~._impact_kernels.row_score`, as the v1 part), read for a few dozen rows
  per query;
* ``terms.max.npy`` (float32, ``V``): each term's largest weight; its 8-bit step is ``max / 255``;
* the postings, in **windows** of ``W = 65,536`` rows (row offsets fit 16 bits): for each (window,
  term) run either a **sparse run** of ``postings.offsets.npy`` (uint16) and
  ``postings.impacts.npy`` (uint8), rows ascending, or, when at least :data:`DENSE_SHARE` of the
  window's rows hold the term, a **dense run**: one byte per row of the window in
  ``dense.impacts.npy`` (a term in a quarter of the rows costs 4 bytes a posting that way against
  3, and is added with SIMD at a tenth of the time a posting);
  ``runs.ptr.npy`` (int64, ``windows * V + 1``) and ``runs.dense.npy`` (int32, ``windows * V``,
  ``-1`` or the dense row) say where each run is.

Impacts are each weight divided by its term's step, rounded to the nearest (at least 1, so every
row with a positive score is reached): a partial score ``Q`` (impacts times query weight times
step, summed) is within ``E`` of the float score, ``E`` one step per query term (plus float
slack). Resident while searching: 3 bytes a sparse posting, 1 byte a row of a dense run, and the
run directory (``bytes_per_posting`` states both figures for a part).

**Exact search** (per query, one numba kernel): window by window, every run of the query's terms is
added into a cache-resident accumulator of ``W`` floats, which is then read once: rows whose
``Q`` is within ``2E`` of the k-th best ``Q`` so far are kept. Every row of the exact top-k is
among them (its ``Q`` is at least its score less ``E``, the k-th score at least ``Q_k - E``); they
(a dozen or two per query) are scored exactly from the forward store, and the top-k of those
exact scores is returned: scores > 0, ties by row. Filters and tombstones (``allowed``) mask rows
at the read, so nothing about them slows the accumulation.

**Approximate search** (``mode="approx"``, opt-in; method ``sparse_approx``): the query terms with
the smallest bounds (query weight times the term's largest weight) are left out while their
bounds sum to at most ``1 - keep`` of the total, and only the ``depth`` best partial scores of the
rest are scored exactly. Each query's answer is **certified exact** when no row left out can
reach its k-th score (the best partial score not re-scored plus ``E`` plus the left-out terms'
bounds stays below it): :class:`~.impact.ImpactSearchStats` ``certified`` reports it per query,
and ``escalate=True`` re-runs the queries that are not certified exactly, so every answer is.
Segments of one window or less answer approximate searches exactly (the pass would save nothing).
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
from .impact import ImpactSearchStats
from .storage import atomic_write_json, load_npy

__all__ = ["FORMAT", "WindowImpactIndex", "WindowImpactIndexBuilder"]

logger = logging.getLogger(__name__)

FORMAT = "hybridret-impact-v2"
SHIFT = 16  # rows per window: 2 ** SHIFT (offsets are uint16)
DENSE_SHARE = 0.25  # a run holding at least this share of its window's rows is stored dense
# approximate mode (per k = 10, scaled with k): re-score this many best partial scores, and keep
# the query terms whose bounds make up this share of the query's total bound
APPROX_DEPTH = 100
APPROX_KEEP = 0.8
APPROX_MIN_ROWS = 1 << SHIFT  # smaller segments answer approximate searches exactly (nothing to save there)
MODES = ("exact", "approx")
_CHUNK = 1 << 20  # forward rows read per step of a build (the memory maps' pages stay few)


class WindowImpactIndexBuilder(ForwardStoreBuilder):
    """Streams documents' learned-sparse weights into a new part folder; the windows are written
    at :meth:`close` (three passes over the forward store through memory maps: term maxima, run
    sizes, runs). Use :meth:`WindowImpactIndex.create`."""

    def close(self) -> None:
        self.close_forward()
        kern = _kernels()
        V, n, W = self.vocab_size, self.rows, 1 << SHIFT
        fptr = load_npy(self.root / "forward.indptr.npy", mmap=False)
        fidx = load_npy(self.root / "forward.indices.npy")
        fdat = load_npy(self.root / "forward.data.npy")
        chunks = [(r0, min(n, r0 + _CHUNK)) for r0 in range(0, n, _CHUNK)]

        def rows(r0: int, r1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            lo, hi = int(fptr[r0]), int(fptr[r1])
            return np.ascontiguousarray(fptr[r0:r1 + 1] - lo), np.asarray(fidx[lo:hi]), np.asarray(fdat[lo:hi])

        tmax = np.zeros(V, np.float32)
        for r0, r1 in chunks:
            _, i, d = rows(r0, r1)
            kern.term_max(i, d, tmax)
        inv = np.where(tmax > 0, 255.0 / np.maximum(tmax, 1e-30), 0.0).astype(np.float64)
        nw = (n + W - 1) >> SHIFT
        cnt = np.zeros(nw * V, np.int64)
        for r0, r1 in chunks:
            p, i, d = rows(r0, r1)
            kern.count_runs(p, i, d, r0, inv, V, SHIFT, cnt)
        width = np.minimum(W, n - (np.arange(nw) << SHIFT)) if nw else np.zeros(0, np.int64)
        dense_run = cnt >= DENSE_SHARE * np.repeat(width, V)
        dense_id = np.full(nw * V, -1, np.int32)
        dense_id[dense_run] = np.arange(int(dense_run.sum()), dtype=np.int32)
        sparse_cnt = np.where(dense_run, 0, cnt)
        ptr = np.zeros(nw * V + 1, np.int64)
        np.cumsum(sparse_cnt, out=ptr[1:])
        m = int(ptr[-1])
        offs = np.lib.format.open_memmap(self.root / "postings.offsets.npy", mode="w+", dtype=np.uint16, shape=(m,))
        imps = np.lib.format.open_memmap(self.root / "postings.impacts.npy", mode="w+", dtype=np.uint8, shape=(m,))
        ndense = int(dense_run.sum())
        dense = np.lib.format.open_memmap(self.root / "dense.impacts.npy", mode="w+", dtype=np.uint8,
                                          shape=(ndense * W,))
        if ndense:
            dense[:] = 0
        pos = ptr[:-1].copy()
        for r0, r1 in chunks:
            p, i, d = rows(r0, r1)
            kern.fill_runs(p, i, d, r0, inv, V, SHIFT, pos, dense_id, offs, imps, dense)
        for a in (offs, imps, dense):
            a.flush()
        del offs, imps, dense
        np.save(self.root / "terms.max.npy", tmax)
        np.save(self.root / "terms.df.npy", self.df.astype(np.int64))
        np.save(self.root / "runs.ptr.npy", ptr)
        np.save(self.root / "runs.dense.npy", dense_id)
        resident = 3 * m + ndense * W + ptr.nbytes + dense_id.nbytes + tmax.nbytes + self.df.nbytes
        disk = sum(f.stat().st_size for f in self.root.iterdir() if f.is_file())
        nnz = max(1, self.nnz)
        atomic_write_json(self.root / "meta.json", {
            "format": FORMAT, "num_docs": n, "nnz": self.nnz, "vocab_size": V, "window_shift": SHIFT,
            "sparse_postings": m, "dense_runs": ndense, "dense_share": DENSE_SHARE, "impact_bits": 8,
            "max_weight": self.seen_max, "bytes_per_posting_resident": round(resident / nnz, 3),
            "bytes_per_posting_disk": round(disk / nnz, 3)})

    def abort(self) -> None:
        super().abort()
        shutil.rmtree(self.root, ignore_errors=True)


class WindowImpactIndex(ForwardScored):
    """One segment's learned-sparse part in windows of 8-bit impacts, opened read-only (arrays
    memory-mapped)."""

    def __init__(self, root: str | Path) -> None:
        n, nnz, V, shift, m, nd = self._open(root, FORMAT, ("num_docs", "nnz", "vocab_size", "window_shift",
                                                             "sparse_postings", "dense_runs"))
        if shift != SHIFT:
            raise IndexFormatError(f"{self.root}/meta.json: window_shift {shift}, this hybridret reads {SHIFT}")
        W = 1 << SHIFT
        nw = (n + W - 1) >> SHIFT
        forward_ok = self._open_forward(n, nnz, V)
        self.tmax = np.asarray(load_npy(self.root / "terms.max.npy", mmap=False))
        self.df = np.asarray(load_npy(self.root / "terms.df.npy", mmap=False))  # postings per term
        self.ptr = np.asarray(load_npy(self.root / "runs.ptr.npy", mmap=False))
        self.dense_id = np.asarray(load_npy(self.root / "runs.dense.npy", mmap=False))
        self.offs = np.asarray(load_npy(self.root / "postings.offsets.npy")).view(np.ndarray)
        self.imps = np.asarray(load_npy(self.root / "postings.impacts.npy")).view(np.ndarray)
        self.dense = np.asarray(load_npy(self.root / "dense.impacts.npy")).view(np.ndarray)
        if (not forward_ok or self.tmax.shape != (V,) or self.df.shape != (V,) or self.ptr.shape != (nw * V + 1,)
                or int(self.ptr[-1]) != m or self.dense_id.shape != (nw * V,) or self.offs.shape != (m,)
                or self.imps.shape != (m,) or self.dense.shape != (nd * W,)):
            raise IndexFormatError(f"{self.root}: part files do not match meta.json (truncated write?)")
        self._inv = np.where(self.tmax > 0, 255.0 / np.maximum(self.tmax, 1e-30), 0.0).astype(np.float64)
        self._scratch = threading.local()

    @staticmethod
    def create(root: str | Path, vocab_size: int) -> WindowImpactIndexBuilder:
        """Start a new part in the empty or absent folder ``root``."""
        return WindowImpactIndexBuilder(new_part_folder(root), vocab_size)

    @property
    def windows(self) -> int:
        return (self.num_docs + (1 << SHIFT) - 1) >> SHIFT

    def bytes_per_posting(self) -> dict[str, float]:
        """Bytes per learned posting, as the build measured them: ``resident`` (what a search reads
        every time: runs, their directory, term maxima and counts) and ``disk`` (every file, the
        float forward store included)."""
        return {"resident": float(self.meta["bytes_per_posting_resident"]),
                "disk": float(self.meta["bytes_per_posting_disk"])}

    def check(self) -> list[str]:
        """The values check of ``info --check``: weights finite and non-negative, every forward
        entry in exactly one run (counts per window and term), impacts within their term's range."""
        problems = []
        data = np.asarray(self._fdat)
        if not np.isfinite(data).all() or (data < 0).any():
            problems.append(f"{self.root}: learned weights that are negative, NaN or infinite")
            return problems
        V, W = self.vocab_size, 1 << SHIFT
        cnt = np.zeros(self.windows * V, np.int64)
        kern = _kernels()
        for r0 in range(0, self.num_docs, _CHUNK):
            r1 = min(self.num_docs, r0 + _CHUNK)
            lo, hi = int(self._fptr[r0]), int(self._fptr[r1])
            kern.count_runs(np.ascontiguousarray(self._fptr[r0:r1 + 1] - lo), np.asarray(self._fidx[lo:hi]),
                            np.asarray(self._fdat[lo:hi]), r0, self._inv, V, SHIFT, cnt)
        dense = self.dense_id >= 0
        have = np.diff(self.ptr)
        if dense.any():
            nonzero = np.count_nonzero(self.dense.reshape(-1, W), axis=1)
            have = have.copy()
            have[dense] = nonzero[self.dense_id[dense]]
        df = np.bincount(self._fidx, minlength=V) if len(self._fidx) else np.zeros(V, np.int64)
        if not np.array_equal(have, cnt) or not np.array_equal(df, self.df):
            problems.append(f"{self.root}: postings do not match the forward store")
        return problems

    # -- queries ----------------------------------------------------------------------------------
    def _buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """This thread's scratch: one window's accumulator and the query buffer (both zeroed by the
        kernel on exit)."""
        local = self._scratch
        buf = getattr(local, "buf", None)
        local.buf = None  # taken (dropped if the kernel fails half-way)
        if buf is None:
            buf = (np.zeros(1 << SHIFT, np.float32), np.zeros(self.vocab_size, np.float32))
        return buf

    def search(self, queries: Any, k: int = 10, *, allowed: np.ndarray | None = None, threads: int | None = 1,
               mode: str = "exact", approx_depth: int | None = None, approx_keep: float | None = None,
               escalate: bool = False, stats: ImpactSearchStats | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows ``(nq, k)`` (``-1`` / ``-inf`` padding) by dot product, scores > 0, ties by row,
        restricted to ``allowed`` rows when a mask is given. ``mode="exact"`` (default) is the exact
        top-k; ``"approx"`` leaves out the query terms with the smallest bounds (keeping
        ``approx_keep`` of the total bound, default :data:`APPROX_KEEP`) and re-scores the
        ``approx_depth`` best partial scores (default :data:`APPROX_DEPTH` per 10 results); each
        query's answer is certified exact or not (``stats.certified``), and ``escalate=True``
        re-runs those that are not exactly. Segments under :data:`APPROX_MIN_ROWS` rows (one
        window) answer ``"approx"`` exactly. ``threads``: worker threads over blocks of queries
        (``None``: every core)."""
        k, mask = self._search_args(k, mode, MODES, approx_depth, allowed)
        if self.num_docs < APPROX_MIN_ROWS:
            mode = "exact"  # one window: the approximate pass would save next to nothing
        if approx_keep is not None and not (isinstance(approx_keep, (int, float)) and 0.0 < approx_keep <= 1.0):
            raise ConfigError(f"approx_keep must be a share in (0, 1], got {approx_keep!r}")
        ptr, terms, weights = self._queries(queries)
        nq = len(ptr) - 1
        rows = np.full((nq, k), -1, dtype=np.int64)
        scores = np.full((nq, k), -np.inf, dtype=np.float32)
        work = np.zeros((nq, 3), dtype=np.int64)
        certified = np.ones(nq, dtype=np.bool_)
        if nq and len(terms) and self.num_docs:
            depth = 0 if mode == "exact" else max(k + 1, int(approx_depth or APPROX_DEPTH * max(1, k // 10)))
            keep = float(approx_keep or APPROX_KEEP)
            self._run(ptr, terms, weights, mask, k, depth, keep, rows, scores, work, certified, threads)
            if mode == "approx" and escalate and not certified.all():
                redo = np.flatnonzero(~certified)
                sub = np.concatenate([[0], np.cumsum(np.diff(ptr)[redo])])
                pick = np.concatenate([np.arange(ptr[i], ptr[i + 1]) for i in redo])
                r2, s2 = rows[redo], scores[redo]
                w2, c2 = np.zeros((len(redo), 3), np.int64), np.ones(len(redo), np.bool_)
                self._run(sub, terms[pick], weights[pick], mask, k, 0, 1.0, r2, s2, w2, c2, threads)
                rows[redo], scores[redo], certified[redo] = r2, s2, True
                work[redo] += w2
        if stats is not None:
            stats.postings, stats.rescored = work[:, 0].copy(), work[:, 2].copy()
            stats.total = np.array([int(self.df[terms[ptr[i]:ptr[i + 1]]].sum()) for i in range(nq)], np.int64)
            stats.certified = certified
        return rows, scores

    def _run(self, ptr: np.ndarray, terms: np.ndarray, weights: np.ndarray, mask: np.ndarray, k: int, depth: int,
             keep: float, rows: np.ndarray, scores: np.ndarray, work: np.ndarray, certified: np.ndarray,
             threads: int | None) -> None:
        kern = _kernels().search
        nq = len(ptr) - 1
        workers = max(1, min(nq // 4, threads if threads is not None else (os.cpu_count() or 1)))

        def block(a: int, b: int) -> None:
            acc, qbuf = self._buffers()
            kern(ptr[a:b + 1] - ptr[a], terms[ptr[a]:ptr[b]], weights[ptr[a]:ptr[b]], self._inv, self.tmax, self.ptr,
                 self.dense_id, self.offs, self.imps, self.dense, self.vocab_size, self.num_docs, SHIFT, self._fptr,
                 self._fidx, self._fdat, acc, qbuf, mask, k, depth, keep, rows[a:b], scores[a:b], work[a:b],
                 certified[a:b])
            self._scratch.buf = (acc, qbuf)

        in_blocks(nq, workers, block)


def _kernels() -> Any:
    """The numba kernels (:mod:`._window_kernels`), compiled or loaded from numba's cache on first use."""
    try:
        from . import _window_kernels
    except ImportError as exc:  # numba is a core dependency; say so plainly if it is missing
        raise ConfigError(f"the learned-sparse part needs numba (pip install numba): {exc}") from exc
    return _window_kernels
