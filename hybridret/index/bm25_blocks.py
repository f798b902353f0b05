"""The row-block index of a BM25 store (``hybridret-bm25-v2``): quantized block-max impacts.

A v2 store's rows are cut into blocks of ``2**shift`` consecutive rows. For each term, each block
holding at least one of its postings has an *entry*: the block number (``blocks.id.npy``, int32),
the offset of the block's first posting in the term's list (``blocks.start.npy``, int32) and the
largest tf factor of those postings **quantized up** to 1/255 (``blocks.max.npy``, uint8), the
factor ``tf / (tf + k1 (1 - b + b dl / avgdl0))`` taken under ``avgdl0`` = the segment's own
average length when it was built (``meta.json`` ``impact_avgdl``). ``blocks.ptr.npy`` (int64,
V + 1): term ``t``'s entries are ``ptr[t] .. ptr[t + 1] - 1``. The v1 files stay as they are (the
exact tf data every score is computed from).

The factors are stored without idf: a query's term weights (``count * (1 + k1) * idf``) carry the
live ``N`` and ``df``, so only ``avgdl`` drifts from what the maxima were taken under. The factor
grows with ``avgdl`` by at most the ratio (``c = k1 (1 - b + b dl / A)`` shrinks by at most
``A0 / A`` when ``A > A0``, and ``tf / (tf + r c) <= tf / (r (tf + c))``), so under a live ``A``
every factor of a block is at most ``max / 255 * max(1, A / A0)``: :func:`bound_scale`, with a
relative slack for float rounding. A block whose bound (summed over the query's terms) is below
the k-th best exact score found so far holds no top-k row; every other block is scored exactly
from tf and the fieldnorm id (:mod:`._bm25_block_kernels`), so what is returned is bit-identical
to the exhaustive path under any statistics and any segmentation.
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

__all__ = ["BlockIndex", "DEFAULT_SHIFT", "bound_scale", "write_blocks"]

logger = logging.getLogger(__name__)

DEFAULT_SHIFT = 6  # 64-row blocks (measured: docs/benchmarks.md, "Scale")
SLACK = 1e-9  # relative slack of the bounds: float rounding (~1e-15) never drops a top-k row
_CHUNK = 1 << 24  # postings per chunk while the maxima are computed (bounds the build's memory)


def _avgdl(avgdl: float) -> float:
    """The average length :func:`~hybridret.index.bm25.norm_table` uses (``1.0`` when not positive)."""
    return float(avgdl) if avgdl > 0 else 1.0


def bound_scale(avgdl: float, avgdl0: float) -> float:
    """What a stored block maximum (1/255 units, under ``avgdl0``) is multiplied by to bound every
    tf factor of its block under ``avgdl``."""
    return max(1.0, _avgdl(avgdl) / _avgdl(avgdl0)) / 255.0 * (1.0 + SLACK)


def write_blocks(root: Path, indptr: np.ndarray, docs: np.ndarray, tfs: np.ndarray, fn: np.ndarray, avgdl0: float,
                 shift: int = DEFAULT_SHIFT) -> dict[str, Any]:
    """Write the block files of a store's postings into ``root``; returns the keys for meta.json."""
    from .bm25 import norm_table

    norm = norm_table(avgdl0)
    ids, starts, maxes = [], [], []
    counts = np.zeros(len(indptr) - 1, dtype=np.int64)
    t0 = 0
    while t0 < len(indptr) - 1:  # whole terms per chunk: an entry never spans two terms
        t1 = int(np.searchsorted(indptr, indptr[t0] + _CHUNK, side="right")) - 1
        t1 = max(t1, t0 + 1)
        lo, hi = int(indptr[t0]), int(indptr[t1])
        if hi > lo:
            d = docs[lo:hi].astype(np.int64)
            f = tfs[lo:hi].astype(np.float64)
            fac = f / (f + norm[fn[d]])
            blk = d >> shift
            term = np.repeat(np.arange(t0, t1), np.diff(indptr[t0:t1 + 1]))
            first = np.ones(hi - lo, dtype=bool)
            first[1:] = (blk[1:] != blk[:-1]) | (term[1:] != term[:-1])
            at = np.flatnonzero(first)
            q = np.ceil(np.maximum.reduceat(fac, at) * 255.0)
            q = np.where(q / 255.0 < np.maximum.reduceat(fac, at), q + 1, q)  # never below the maximum
            ids.append(blk[at].astype(np.int32))
            starts.append((at + lo - indptr[term[at]]).astype(np.int32))
            maxes.append(np.clip(q, 1, 255).astype(np.uint8))
            counts[t0:t1] = np.bincount(term[at] - t0, minlength=t1 - t0)
        t0 = t1
    bptr = np.zeros(len(indptr), dtype=np.int64)
    np.cumsum(counts, out=bptr[1:])
    atomic_write_npy(root / "blocks.ptr.npy", bptr)
    atomic_write_npy(root / "blocks.id.npy", np.concatenate(ids) if ids else np.zeros(0, np.int32))
    atomic_write_npy(root / "blocks.start.npy", np.concatenate(starts) if starts else np.zeros(0, np.int32))
    atomic_write_npy(root / "blocks.max.npy", np.concatenate(maxes) if maxes else np.zeros(0, np.uint8))
    return {"block_shift": int(shift), "impact_avgdl": float(avgdl0), "block_entries": int(bptr[-1])}


@dataclass(frozen=True, eq=False)
class BlockIndex:
    """The block files of an open v2 store (memory-mapped, read-only)."""

    shift: int
    avgdl0: float
    num_blocks: int
    ptr: np.ndarray
    ids: np.ndarray
    starts: np.ndarray
    maxes: np.ndarray

    @classmethod
    def open(cls, root: Path, meta: dict[str, Any], num_docs: int, num_terms: int) -> BlockIndex:
        try:
            shift, avgdl0 = int(meta["block_shift"]), float(meta["impact_avgdl"])
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(f"{root}/meta.json: a v2 BM25 store without its block keys ({exc})") from exc
        ptr = np.asarray(load_npy(root / "blocks.ptr.npy", mmap=False))
        ids = np.asarray(load_npy(root / "blocks.id.npy"))
        starts = np.asarray(load_npy(root / "blocks.start.npy"))
        maxes = np.asarray(load_npy(root / "blocks.max.npy"))
        n = int(meta.get("block_entries", -1))
        if not 0 <= shift <= 20 or len(ptr) != num_terms + 1 or not len(ids) == len(starts) == len(maxes) == n \
                or (len(ptr) and int(ptr[-1]) != n):
            raise IndexFormatError(f"{root}: BM25 block files do not match meta.json (truncated write?)")
        return cls(shift, avgdl0, (num_docs + (1 << shift) - 1) >> shift, ptr, ids, starts, maxes)

    def nbytes(self) -> int:
        return int(self.ptr.nbytes + self.ids.nbytes + self.starts.nbytes + self.maxes.nbytes)


class _Scratch(threading.local):
    """One set of search buffers per thread and store (never shared, so never raced)."""

    bufs: tuple[np.ndarray, ...] | None = None


def search_blocks(store: Any, blocks: BlockIndex, scratch: _Scratch, kern: Any, ptr: np.ndarray, terms: np.ndarray,
                  weights: np.ndarray, avgdl: float, k: int, mask: np.ndarray, rows: np.ndarray,
                  scores: np.ndarray, work: np.ndarray) -> None:
    """Queries ``ptr``/``terms``/``weights`` (one block of a batch) through :func:`topk_blockmax`."""
    from .bm25 import norm_table

    nb = blocks.num_blocks
    width = int(np.max(np.diff(ptr))) if len(ptr) > 1 else 0
    bufs = scratch.bufs
    scratch.bufs = None  # taken (and dropped if the kernel fails half-way: ub/acc must be zero)
    if bufs is None or len(bufs[3]) < width * nb:
        slot = np.full(max(8, width) * nb, -1, dtype=np.int32)
        if bufs is None:
            bufs = (np.zeros(nb), np.empty(nb, np.int32), np.empty(nb, np.int32), slot,
                    np.zeros(1 << blocks.shift))
        else:
            bufs = bufs[:3] + (slot,) + bufs[4:]
    ub, tb, order, slot, acc = bufs
    kern(ptr, terms, weights, store.indptr, store.docs, store.tfs, store.fn, norm_table(avgdl), blocks.ptr,
         blocks.ids, blocks.starts, blocks.maxes, bound_scale(avgdl, blocks.avgdl0), nb, blocks.shift, ub, tb, order,
         slot, acc, mask, k, rows, scores, work)
    scratch.bufs = bufs
