"""Impact windows of a v3 BM25 store (``hybridret-bm25-v3``, the default) and its exact top-k.

A v3 store holds the v1 files (the exact tf data every score is computed from, read for a few
dozen rows per query) and, aligned with ``postings.docs.npy`` (each term's rows ascending):

* ``postings.offsets.npy`` (uint16): the posting's row within its window of ``2**16`` rows;
* ``postings.impacts.npy`` (uint8): its tf factor ``tf / (tf + k1 (1 - b + b dl / avgdl0))``
  under ``avgdl0`` (the segment's own average length when built, ``meta.json`` ``impact_avgdl``)
  over its term's step (``terms.max.npy``, float32: the term's largest factor; the step is that
  over 255), nearest, at least 1;
* ``terms.long_row.npy`` (int32, one per term) and ``terms.long_bounds.npy`` (uint32, one row of
  ``windows + 1`` per term of at least :data:`LONG_DF` postings): where each window's run starts in
  a long term's list. A short term's runs are found by walking its rows;
* ``terms.kth_impact.npy`` (uint8, one per term): its 10th largest impact (the MaxScore kernel's
  starting bar, as in v2).

Search: each query takes one of two exact kernels over these impacts. A query whose longest list
holds at least :data:`MAXSCORE_SHARE` of its postings runs MaxScore
(:func:`._bm25_impact_kernels.topk_impacts`, rows from ``postings.docs.npy``, the impacts in their
terms' steps, ``terms.kth_impact.npy`` for a starting bar), which leaves that long list out while
its bound is small; every other query runs :func:`._bm25_window_kernels.topk_windows`: window by
window, its runs are added into a cache-resident accumulator (3 bytes read per posting, no
branch), the window is read once in chunks, and the rows whose partial score can still reach the
k-th are scored exactly from tf. Impacts hold no idf (a query's weights carry the live ``N`` and
``df``), and a live ``avgdl`` moves every factor by at most the ratio to ``avgdl0``
(:func:`.bm25_impacts.drift`), so the bar for a row is ``rho (Q_k - E) - E`` (``rho = rmin / rmax``,
``E`` the quantization error, one step per term): what is returned is bit-identical to the
exhaustive path under any statistics and segmentation, whichever kernel answers. The drift only
lowers the bar (more rows scored exactly); ``compact`` rewrites the impacts.

Measured against v2 (u8 impacts beside int32 rows, windowed MaxScore) and bm25s: docs/benchmarks.md.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from .bm25_impacts import KTH, Impacts, drift, kth_largest, search_impacts
from .storage import atomic_write_npy, load_npy

__all__ = ["LONG_DF", "MAXSCORE_SHARE", "SHIFT", "Windows", "search_windows", "write_windows"]

SHIFT = 16  # rows per window: 2 ** SHIFT (offsets are uint16; the accumulator, 256 KiB, stays in L2)
LONG_DF = 256
# a query whose longest list holds at least this share of its postings takes the MaxScore kernel
# (which leaves that list out while its bound is small against the k-th score); the others read
# every run once, without branches: measured per query on MS MARCO DL19 and the other collections'
# queries at 1M passages (docs/benchmarks.md, "BM25 in windows")
MAXSCORE_SHARE = 0.6  # terms with at least this many postings keep their window bounds (short ones are walked)
_CHUNK = 1 << 24  # postings per step while impacts are computed (bounds the build's memory)


def write_windows(root: Path, indptr: np.ndarray, docs: np.ndarray, tfs: np.ndarray, fn: np.ndarray,
                  avgdl0: float, norm: np.ndarray, shift: int | None = None) -> dict[str, Any]:
    """Write the window files of a store's postings into ``root``; returns the keys for meta.json.
    ``norm``: the length normalisation per fieldnorm id under ``avgdl0`` (``bm25.norm_table``);
    ``shift``: rows per window as a power of two (default :data:`SHIFT`, read per call)."""
    from . import _bm25_window_kernels as kern

    shift = SHIFT if shift is None else int(shift)

    nnz, V = len(docs), len(indptr) - 1
    n = len(fn)
    df = np.diff(indptr)
    tmax = np.zeros(V, np.float32)
    has = df > 0
    fac = np.empty(nnz, np.float32)
    for lo in range(0, nnz, _CHUNK):
        hi = min(nnz, lo + _CHUNK)
        f = tfs[lo:hi].astype(np.float64)
        fac[lo:hi] = f / (f + norm[fn[docs[lo:hi]]])
    if nnz:
        tmax[has] = np.maximum.reduceat(fac, indptr[:-1][has])
    step = np.where(tmax > 0, tmax.astype(np.float64) / 255.0, 1.0)
    imps = np.empty(nnz, np.uint8)
    for lo in range(0, nnz, _CHUNK):
        hi = min(nnz, lo + _CHUNK)
        t0, t1 = int(np.searchsorted(indptr, lo, "right")) - 1, int(np.searchsorted(indptr, hi, "left"))
        span = np.minimum(indptr[t0 + 1:t1 + 1], hi) - np.maximum(indptr[t0:t1], lo)  # postings of each term here
        imps[lo:hi] = np.clip(np.floor(fac[lo:hi] / np.repeat(step[t0:t1], span) + 0.5), 1, 255)
    del fac
    offs = (docs & ((1 << shift) - 1)).astype(np.uint16)
    nw = (n + (1 << shift) - 1) >> shift
    longs = np.flatnonzero(df >= LONG_DF)
    long_row = np.full(V, -1, np.int32)
    long_row[longs] = np.arange(len(longs), dtype=np.int32)
    bounds = np.zeros((len(longs), nw + 1), np.uint32)
    if len(longs):
        kern.long_bounds(indptr, docs, longs, shift, nw, bounds)
    atomic_write_npy(root / "postings.offsets.npy", offs)
    atomic_write_npy(root / "postings.impacts.npy", imps)
    atomic_write_npy(root / "terms.max.npy", tmax)
    atomic_write_npy(root / "terms.long_row.npy", long_row)
    atomic_write_npy(root / "terms.long_bounds.npy", bounds.reshape(-1))
    atomic_write_npy(root / "terms.kth_impact.npy", kth_largest(imps, indptr))
    resident = 3 * nnz + tmax.nbytes + long_row.nbytes + bounds.nbytes + int(df[df < LONG_DF].sum()) * 4
    return {"impact_avgdl": float(avgdl0), "window_shift": shift, "long_df": LONG_DF, "long_terms": len(longs),
            "bytes_per_posting_resident": round(resident / max(1, nnz), 3)}


@dataclass(frozen=True, eq=False)
class Windows:
    """The window files of an open v3 store (postings memory-mapped, read-only)."""

    avgdl0: float
    shift: int
    offs: np.ndarray
    imps: np.ndarray
    tmax: np.ndarray
    step: np.ndarray
    long_row: np.ndarray
    bounds: np.ndarray
    as_impacts: Impacts  # the same impacts, aligned with the rows, for the MaxScore kernel

    @classmethod
    def open(cls, root: Path, meta: dict[str, Any], nnz: int, num_terms: int, num_docs: int) -> Windows:
        try:
            avgdl0, shift, nlong = float(meta["impact_avgdl"]), int(meta["window_shift"]), int(meta["long_terms"])
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(f"{root}/meta.json: a v3 BM25 store without its window keys ({exc})") from exc
        offs = np.asarray(load_npy(root / "postings.offsets.npy")).view(np.ndarray)
        imps = np.asarray(load_npy(root / "postings.impacts.npy")).view(np.ndarray)
        tmax = np.asarray(load_npy(root / "terms.max.npy", mmap=False))
        long_row = np.asarray(load_npy(root / "terms.long_row.npy", mmap=False))
        bounds = np.asarray(load_npy(root / "terms.long_bounds.npy", mmap=False))
        kth = np.asarray(load_npy(root / "terms.kth_impact.npy", mmap=False))
        nw = (num_docs + (1 << shift) - 1) >> shift
        if (not 1 <= shift <= 16 or offs.shape != (nnz,) or imps.shape != (nnz,) or offs.dtype != np.uint16
                or imps.dtype != np.uint8 or tmax.shape != (num_terms,) or long_row.shape != (num_terms,)
                or bounds.shape != (nlong * (nw + 1),) or int((long_row >= 0).sum()) != nlong
                or kth.shape != (num_terms,) or kth.dtype != np.uint8):
            raise IndexFormatError(f"{root}: BM25 window files do not match meta.json (truncated write?)")
        step = np.where(tmax > 0, tmax.astype(np.float64) / 255.0, 1.0)
        top = np.where(tmax > 0, 255, 0).astype(np.uint8)  # every term's largest impact is 255 (its step's definition)
        return cls(avgdl0, shift, offs, imps, tmax, step, long_row, bounds, Impacts(avgdl0, imps, top, kth, step))

    def nbytes(self) -> int:
        return int(self.offs.nbytes + self.imps.nbytes + self.tmax.nbytes + self.long_row.nbytes + self.bounds.nbytes
                   + self.as_impacts.kth.nbytes)


def search_windows(store: Any, scratch: threading.local, kerns: tuple[Any, Any], ptr: np.ndarray, terms: np.ndarray,
                   weights: np.ndarray, avgdl: float, norm: np.ndarray, k: int, mask: np.ndarray, rows: np.ndarray,
                   scores: np.ndarray, work: np.ndarray) -> None:
    """Queries ``ptr``/``terms``/``weights`` (part of a batch) of a v3 store: those whose longest
    list holds at least :data:`MAXSCORE_SHARE` of their postings through the MaxScore kernel over the same impacts
    (:func:`._bm25_impact_kernels.topk_impacts`, via :func:`.bm25_impacts.search_impacts`), the
    others through :func:`._bm25_window_kernels.topk_windows` (``kerns``: the two, in that order).
    ``scratch``: the store's thread-local (each kernel's accumulator window); ``norm``: the length
    normalisation under the live ``avgdl`` (``bm25.norm_table``)."""
    win: Windows = store.windows
    nterms = np.diff(ptr)
    df = np.append(store.df[terms], 0)  # padded: an empty last query reads the 0
    total, longest = np.add.reduceat(df, ptr[:-1]), np.maximum.reduceat(df, ptr[:-1])  # empty queries: not read
    short = (nterms == 0) | (longest >= MAXSCORE_SHARE * np.maximum(total, 1))
    for pick, run in ((np.flatnonzero(short), _maxscore), (np.flatnonzero(~short), _windows)):
        if not len(pick):
            continue
        if len(pick) == len(nterms):
            run(store, win, scratch, kerns, ptr, terms, weights, avgdl, norm, k, mask, rows, scores, work)
            continue
        sub = np.zeros(len(pick) + 1, np.int64)
        np.cumsum(nterms[pick], out=sub[1:])
        at = np.concatenate([np.arange(ptr[i], ptr[i + 1]) for i in pick])
        r, s_ = rows[pick], scores[pick]
        run(store, win, scratch, kerns, sub, terms[at], weights[at], avgdl, norm, k, mask, r, s_, work)
        rows[pick], scores[pick] = r, s_


def _maxscore(store: Any, win: Windows, scratch: threading.local, kerns: tuple[Any, Any], ptr: np.ndarray,
              terms: np.ndarray, weights: np.ndarray, avgdl: float, norm: np.ndarray, k: int, mask: np.ndarray,
              rows: np.ndarray, scores: np.ndarray, work: np.ndarray) -> None:
    search_impacts(store, win.as_impacts, 1.0, scratch, kerns[0], ptr, terms, weights, avgdl, norm, k, mask, rows,
                   scores, work)


def _windows(store: Any, win: Windows, scratch: threading.local, kerns: tuple[Any, Any], ptr: np.ndarray,
             terms: np.ndarray, weights: np.ndarray, avgdl: float, norm: np.ndarray, k: int, mask: np.ndarray,
             rows: np.ndarray, scores: np.ndarray, work: np.ndarray) -> None:
    acc = getattr(scratch, "window_acc", None)
    scratch.window_acc = None  # taken (and dropped if the kernel fails half-way: acc must be zero)
    if acc is None or len(acc) != 1 << win.shift:
        acc = np.zeros(1 << win.shift, np.float32)
    rmin, rmax = drift(avgdl, win.avgdl0)
    kerns[1](ptr, terms, weights, store.indptr, store.docs, store.tfs, store.fn, norm, win.offs, win.imps, win.step,
             win.long_row, win.bounds, rmin, rmax, win.shift, store.num_docs, acc, mask, k, rows, scores, work)
    scratch.window_acc = acc
