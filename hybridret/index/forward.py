"""The float forward store of a learned-sparse part (one CSR row of term weights per document),
streamed to ``forward.indptr.npy`` (int64), ``forward.indices.npy`` (int32) and
``forward.data.npy`` (float32), and the checks document and query vectors pass before they are
stored or searched; :class:`ForwardScored`, what a part answers from it alone, and the opening of a
part folder. Shared by the impact parts (``impact.py``, ``impact_windows.py``) and the tf-grid part
(``learned.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import ConfigError, IndexFormatError
from .storage import NpyAppender, load_npy, read_json

__all__ = ["ForwardScored", "ForwardStoreBuilder", "check_queries", "new_part_folder"]


def new_part_folder(root: str | Path) -> Path:
    """``root`` created if absent; a :class:`ConfigError` when it holds anything already."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise ConfigError(f"{root} is not empty")
    return root


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


class ForwardScored:
    """What a part with a float forward store answers from it alone: exact scores of given rows
    (:meth:`score`) and the exact top-k by scoring every matching row (:meth:`search_exhaustive`).
    A subclass sets ``vocab_size``, ``df`` (postings per term), ``_fptr``/``_fidx``/``_fdat`` and
    ``forward`` (the same arrays as a CSR matrix)."""

    vocab_size: int
    df: np.ndarray
    forward: sp.csr_matrix
    _fptr: np.ndarray
    _fidx: np.ndarray
    _fdat: np.ndarray

    @property
    def num_docs(self) -> int:
        return int(self.forward.shape[0])

    def _open(self, root: str | Path, fmt: str, keys: tuple[str, ...]) -> list[int]:
        """Read ``root/meta.json`` (its ``format`` must be ``fmt``) into ``self.root`` and
        ``self.meta``; returns the integer fields ``keys``."""
        self.root = Path(root)
        meta = read_json(self.root / "meta.json")
        if not isinstance(meta, dict) or meta.get("format") != fmt:
            raise IndexFormatError(f"{self.root}: unsupported learned-sparse part format {meta.get('format')!r}")
        self.meta = meta
        try:
            return [int(meta[key]) for key in keys]
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(f"{self.root}/meta.json: missing or bad field {exc}") from exc

    def _open_forward(self, n: int, nnz: int, vocab_size: int) -> bool:
        """Open the forward files (indices and data memory-mapped) as ``forward`` over ``n`` rows
        and ``vocab_size`` terms; whether their shapes match ``n`` and ``nnz`` (the caller raises,
        with its own files' checks)."""
        fptr = np.asarray(load_npy(self.root / "forward.indptr.npy", mmap=False))
        fidx = np.asarray(load_npy(self.root / "forward.indices.npy")).view(np.ndarray)
        fdat = np.asarray(load_npy(self.root / "forward.data.npy")).view(np.ndarray)
        ok = (fptr.shape == (n + 1,) and fidx.shape == (nnz,) and fdat.shape == (nnz,) and int(fptr[-1]) == nnz)
        self.vocab_size = vocab_size
        self._fptr, self._fidx, self._fdat = fptr, fidx, fdat
        if ok:
            self.forward = sp.csr_matrix((fdat, fidx, fptr), shape=(n, vocab_size), copy=False)
        return ok

    def _queries(self, queries: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSR of the batch over terms some document has, weights > 0, terms ascending."""
        q = check_queries(queries, self.vocab_size)
        q.sort_indices()
        keep = (q.data > 0) & (self.df[q.indices] > 0)
        owner = np.repeat(np.arange(q.shape[0]), np.diff(q.indptr))
        ptr = np.zeros(q.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(owner[keep], minlength=q.shape[0]), out=ptr[1:])
        return ptr, q.indices[keep].astype(np.int64), q.data[keep].astype(np.float32)

    def _search_args(self, k: Any, mode: str, modes: tuple[str, ...], approx_depth: Any,
                     allowed: np.ndarray | None) -> tuple[int, np.ndarray]:
        """The checks every pruned part's ``search`` makes: ``k``, the mode, ``approx_depth``, and
        the ``allowed`` mask (returned as a contiguous bool array; empty for none)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ConfigError(f"k must be a positive integer, got {k!r}")
        if mode not in modes:
            raise ConfigError(f"sparse mode must be one of {', '.join(modes)}, got {mode!r}")
        if approx_depth is not None and (isinstance(approx_depth, bool) or not isinstance(approx_depth, (int, np.integer))
                                         or approx_depth < 1):
            raise ConfigError(f"approx_depth must be a positive integer, got {approx_depth!r}")
        mask = np.zeros(0, dtype=np.bool_)
        if allowed is not None:
            mask = np.ascontiguousarray(allowed, dtype=np.bool_)
            if mask.shape != (self.num_docs,):
                raise ConfigError(f"allowed mask has shape {mask.shape}, expected ({self.num_docs},)")
        return int(k), mask

    def score(self, queries: Any, rows: np.ndarray, *, threads: int | None = 1) -> np.ndarray:
        """Exact dot products of each query with the rows ``rows[i]`` (``-1`` -> 0), from the forward store."""
        from . import _impact_kernels

        ptr, terms, weights = self._queries(queries)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if rows.ndim != 2 or rows.shape[0] != len(ptr) - 1:
            raise ConfigError(f"rows must have shape ({len(ptr) - 1}, m), got {rows.shape}")
        if rows.size and int(rows.max()) >= self.num_docs:
            raise ConfigError(f"row {int(rows.max())} is outside this segment of {self.num_docs} documents")
        out = np.zeros(rows.shape, dtype=np.float32)
        qbuf = np.zeros(self.vocab_size, np.float32)
        _impact_kernels.score(ptr, terms, weights, self._fptr, self._fidx, self._fdat, qbuf, rows, out)
        return out

    def search_exhaustive(self, queries: Any, k: int, *, allowed: np.ndarray | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
        """The exact top-k by scoring every matching row (rows found with one scipy product,
        scored by :meth:`score`), for checks and benchmarks."""
        ptr, terms, weights = self._queries(queries)
        q = sp.csr_matrix((weights, terms, ptr), shape=(len(ptr) - 1, self.vocab_size))
        hit = (self.forward @ q.T).T.tocsr()  # (nq, n): the rows each query matches
        rows = np.full((q.shape[0], k), -1, dtype=np.int64)
        out = np.full((q.shape[0], k), -np.inf, dtype=np.float32)
        for i in range(q.shape[0]):
            cand = hit.indices[hit.indptr[i]:hit.indptr[i + 1]].astype(np.int64)
            if allowed is not None:
                cand = cand[np.asarray(allowed, dtype=bool)[cand]]
            exact = self.score(q[i], cand[None, :])[0]
            cand, exact = cand[exact > 0], exact[exact > 0]
            order = np.lexsort((cand, -exact))[:k]
            rows[i, :len(order)], out[i, :len(order)] = cand[order], exact[order]
        return rows, out
