"""Quantized impacts of a v2 BM25 store (``hybridret-bm25-v2``) and its pruned top-k.

A v2 store holds the v1 files (the exact tf data every score is computed from) and:

* ``postings.impact.npy`` (uint8, one per posting, aligned with ``postings.docs.npy``): the
  posting's tf factor ``tf / (tf + k1 (1 - b + b dl / avgdl0))`` times 255, rounded, under
  ``avgdl0`` = the segment's own average length when it was built (``meta.json`` ``impact_avgdl``);
* ``terms.max_impact.npy`` (uint8, one per term): the largest impact of each term;
* ``terms.kth_impact.npy`` (uint8, one per term): its :data:`KTH`-th largest (0 below that df): a
  search of ``k <= KTH`` without a row mask starts from ``theta = w * (kth - 0.5) / 255 * rmin``
  of its best term (``KTH`` rows hold at least that much of that term alone).

Impacts hold no idf: a query's term weights (``count * (1 + k1) * idf``) carry the live ``N`` and
``df``, so only ``avgdl`` drifts from what the impacts were computed under. The factor moves with
``avgdl`` by at most the ratio: with ``c(A) = k1 (1 - b + b dl / A)``, ``c`` shrinks by at most
``A0 / A`` when ``A > A0`` and grows by at most ``A0 / A`` when ``A < A0``, and
``tf / (tf + r c)`` lies between ``r`` and ``1 / r`` times ``tf / (tf + c)``; so under a live ``A``
every factor is within ``[f0 min(1, A / A0), f0 max(1, A / A0)]`` (:func:`drift`). The search
(:func:`._bm25_impact_kernels.topk_impacts`) bounds each row's score from both sides from its
impacts, prunes with those bounds and scores the rows that can still reach the top k exactly from
tf: what it returns is bit-identical to the exhaustive path under any statistics and segmentation.
The drift only loosens the bounds (more rows scored exactly); ``compact`` rewrites the impacts.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from .storage import atomic_write_npy, load_npy

__all__ = ["Impacts", "WINDOW_SHIFT", "drift", "kth_largest", "search_impacts", "write_impacts"]

logger = logging.getLogger(__name__)

KTH = 10  # the rank of terms.kth_impact.npy
GAMMA = 0.45  # share of what a row must reach that its essential terms must give (measured: docs/benchmarks.md)
WINDOW_SHIFT = 16  # rows per accumulator window: 2**16 float32 = 256 KiB, cache-resident (measured: docs/benchmarks.md)
_CHUNK = 1 << 24  # postings per chunk while impacts are computed (bounds the build's memory)


def _avgdl(avgdl: float) -> float:
    """The average length :func:`~hybridret.index.bm25.norm_table` uses (``1.0`` when not positive)."""
    return float(avgdl) if avgdl > 0 else 1.0


def drift(avgdl: float, avgdl0: float) -> tuple[float, float]:
    """``(rmin, rmax)``: every tf factor under ``avgdl`` is within these multiples of its value under ``avgdl0``."""
    r = _avgdl(avgdl) / _avgdl(avgdl0)
    return min(1.0, r), max(1.0, r)


def write_impacts(root: Path, indptr: np.ndarray, docs: np.ndarray, tfs: np.ndarray, fn: np.ndarray,
                  avgdl0: float, norm: np.ndarray) -> dict[str, Any]:
    """Write the impact files of a store's postings into ``root``; returns the keys for meta.json.
    ``norm``: the length normalisation per fieldnorm id under ``avgdl0`` (``bm25.norm_table``)."""
    imp = np.empty(len(docs), dtype=np.uint8)
    for lo in range(0, len(docs), _CHUNK):
        hi = min(len(docs), lo + _CHUNK)
        f = tfs[lo:hi].astype(np.float64)
        imp[lo:hi] = np.rint(f / (f + norm[fn[docs[lo:hi]]]) * 255.0)  # factors < 1: at most 255
    df = np.diff(indptr)
    tmax = np.zeros(len(df), dtype=np.uint8)
    has = df > 0
    if len(imp):
        tmax[has] = np.maximum.reduceat(imp, indptr[:-1][has])
    kth = kth_largest(imp, indptr)
    atomic_write_npy(root / "postings.impact.npy", imp)
    atomic_write_npy(root / "terms.max_impact.npy", tmax)
    atomic_write_npy(root / "terms.kth_impact.npy", kth)
    return {"impact_avgdl": float(avgdl0)}


def kth_largest(imp: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """Each term's :data:`KTH`-th largest u8 impact (0 below that many postings): a histogram of
    256 values per term."""
    df = np.diff(indptr)
    kth = np.zeros(len(df), dtype=np.uint8)
    for t in np.flatnonzero(df >= KTH):
        hist = np.bincount(imp[indptr[t]:indptr[t + 1]], minlength=256)[::-1].cumsum()
        kth[t] = 255 - int(np.searchsorted(hist, KTH))
    return kth


@dataclass(frozen=True, eq=False)
class Impacts:
    """The impact files of an open v2 store (the postings' memory-mapped, read-only)."""

    avgdl0: float
    imp: np.ndarray
    tmax: np.ndarray
    kth: np.ndarray
    scale: np.ndarray  # the factor of one impact unit, per term (v2: 1 / 255 for every term)

    @classmethod
    def open(cls, root: Path, meta: dict[str, Any], nnz: int, num_terms: int) -> Impacts:
        try:
            avgdl0 = float(meta["impact_avgdl"])
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(f"{root}/meta.json: a v2 BM25 store without impact_avgdl ({exc})") from exc
        imp = np.asarray(load_npy(root / "postings.impact.npy"))
        tmax = np.asarray(load_npy(root / "terms.max_impact.npy", mmap=False))
        kth = np.asarray(load_npy(root / "terms.kth_impact.npy", mmap=False))
        if imp.shape != (nnz,) or tmax.shape != (num_terms,) or kth.shape != (num_terms,) or imp.dtype != np.uint8 \
                or tmax.dtype != np.uint8 or kth.dtype != np.uint8:
            raise IndexFormatError(f"{root}: BM25 impact files do not match meta.json (truncated write?)")
        return cls(avgdl0, imp, tmax, kth, np.full(num_terms, 1.0 / 255.0))

    def nbytes(self) -> int:
        return int(self.imp.nbytes + self.tmax.nbytes + self.kth.nbytes)


def search_impacts(store: Any, imps: Impacts, unit: float, scratch: threading.local, kern: Any, ptr: np.ndarray,
                   terms: np.ndarray, weights: np.ndarray, avgdl: float, norm: np.ndarray, k: int, mask: np.ndarray,
                   rows: np.ndarray, scores: np.ndarray, work: np.ndarray) -> None:
    """Queries ``ptr``/``terms``/``weights`` (part of a batch) through :func:`topk_impacts` over
    ``imps`` (a v2 store's :attr:`~.bm25.BM25Store.impacts`, ``unit`` 0.5; or a v3 store's impacts
    seen this way, ``unit`` 1: :mod:`.bm25_windows`); ``scratch``: the store's thread-local, holding
    this thread's accumulator window (``impact_bufs``); ``norm``: the length normalisation under
    the live ``avgdl`` (``bm25.norm_table``)."""
    bufs = getattr(scratch, "impact_bufs", None)
    scratch.impact_bufs = None  # taken (and dropped if the kernel fails half-way: acc must be zero)
    shift = WINDOW_SHIFT  # read per call (tests set smaller windows)
    if bufs is None or len(bufs[0]) != 1 << shift:
        bufs = (np.zeros(1 << shift, np.float32), np.empty(1 << shift, np.int32))
    rmin, rmax = drift(avgdl, imps.avgdl0)
    kth = imps.kth if k <= KTH and not len(mask) else np.zeros(0, np.uint8)  # a mask may hide those rows
    kern(ptr, terms, weights, store.indptr, store.docs, store.tfs, store.fn, norm, imps.imp, imps.tmax,
         kth, imps.scale, unit, rmin, rmax, shift, GAMMA, bufs[0], bufs[1], mask, k, rows, scores, work)
    scratch.impact_bufs = bufs
