"""Dense retrieval: FAISS per segment, exact re-scoring from the stored vectors."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError
from ..index.snapshot import Snapshot
from .base import QueryBatch, Retriever

__all__ = ["DenseRetriever", "vectors_of"]


class DenseRetriever(Retriever):
    name = "dense"
    needs = "dense"
    part = "dense"
    positive_only = False

    def search_segment(self, snap: Snapshot, i: int, q: QueryBatch, k: int, allowed: np.ndarray | None,
                       ctx: Any, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        return snap.segments[i].part(self.part).search(q.get(self.needs), k, allowed=allowed, threads=threads)

    def score_segment(self, snap: Snapshot, i: int, q: QueryBatch, rows: np.ndarray, ctx: Any, *,
                      threads: int | None = None) -> np.ndarray:
        return snap.segments[i].part(self.part).score(q.get(self.needs), rows)  # numpy, one thread


def vectors_of(snap: Snapshot, rows: np.ndarray) -> np.ndarray:
    """Stored dense vectors of global ``rows`` (any shape) -> ``rows.shape + (dim,)``; ``-1`` rows
    give zeros (callers mask padding themselves)."""
    rows = np.asarray(rows, dtype=np.int64)
    segs = [s.part("dense") for s in snap.segments]
    if not segs or any(d is None for d in segs):
        raise ConfigError("this index has no dense component")
    dim = segs[0].dim
    out = np.zeros((*rows.shape, dim), dtype=np.float32)
    seg_of, local = snap.locate(rows)
    for i in np.unique(seg_of[seg_of >= 0]):
        mine = seg_of == i
        out[mine] = segs[int(i)].vectors_of(local[mine])
    return out
