"""The float forward store of a learned-sparse part (one CSR row of term weights per document),
streamed to ``forward.indptr.npy`` (int64), ``forward.indices.npy`` (int32) and
``forward.data.npy`` (float32), and the checks document and query vectors pass before they are
stored or searched. Shared by the impact part (``impact.py``) and the tf-grid part (``learned.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import ConfigError
from .storage import NpyAppender

__all__ = ["ForwardStoreBuilder", "check_queries"]


class ForwardStoreBuilder:
    """Appends documents' weights to the forward files of ``root``; keeps the document frequency
    of every term (``df``), the row and entry counts and the largest weight seen (``seen_max``)."""

    def __init__(self, root: Path, vocab_size: int) -> None:
        self.root = root
        self.vocab_size = int(vocab_size)
        self.df = np.zeros(self.vocab_size, dtype=np.int64)
        self.indptr = NpyAppender(root / "forward.indptr.npy", np.int64)
        self.indptr.append(np.zeros(1, dtype=np.int64))
        self.indices = NpyAppender(root / "forward.indices.npy", np.int32)
        self.data = NpyAppender(root / "forward.data.npy", np.float32)
        self.rows = 0
        self.nnz = 0
        self.seen_max = 0.0

    def add(self, weights: sp.csr_matrix) -> None:
        """Add documents: one CSR row of non-negative, finite term weights each (a repeated
        column counts once, with its summed weight; zeros are dropped)."""
        w = sp.csr_matrix(weights, dtype=np.float32, copy=True)
        if w.shape[1] != self.vocab_size:
            raise ConfigError(f"sparse vectors have {w.shape[1]} columns, the index vocabulary has {self.vocab_size}")
        w.sum_duplicates()
        w.eliminate_zeros()
        w.sort_indices()
        if w.nnz and float(w.data.min()) < 0:
            raise ConfigError("document sparse weights must be non-negative")
        if w.nnz and not np.isfinite(w.data).all():
            raise ConfigError("document sparse weights must be finite")
        if w.nnz:
            self.seen_max = max(self.seen_max, float(w.data.max()))
        self.df += np.bincount(w.indices, minlength=self.vocab_size)
        self.indptr.append(w.indptr[1:].astype(np.int64) + self.nnz)
        self.indices.append(w.indices.astype(np.int32, copy=False))
        self.data.append(w.data)
        self.rows += w.shape[0]
        self.nnz += w.nnz

    def close_forward(self) -> None:
        """Finish the three forward files."""
        for f in (self.indptr, self.indices, self.data):
            f.close()

    def abort(self) -> None:
        for f in (self.indptr, self.indices, self.data):
            f.abort()


def check_queries(queries: sp.csr_matrix, vocab_size: int) -> sp.csr_matrix:
    """Query vectors as float32 CSR (a copy) with summed repeated columns; wrong width, negative
    or non-finite weights are a :class:`ConfigError`."""
    q = sp.csr_matrix(queries, dtype=np.float32, copy=True)
    if q.shape[1] != vocab_size:
        raise ConfigError(f"query vectors have {q.shape[1]} columns, the index vocabulary has {vocab_size}")
    q.sum_duplicates()  # a repeated column counts once, with its summed weight
    if q.nnz and float(q.data.min()) < 0:
        raise ConfigError("sparse query weights must be non-negative for an exact top-k")
    if q.nnz and not np.isfinite(q.data).all():
        raise ConfigError("sparse query weights must be finite")
    return q
