"""Dense vectors: a FAISS index from a factory string, beside an exact vector store.

``vectors.npy`` holds every document vector (float32, memory-mapped), so any candidate can be
re-scored exactly whatever the FAISS index type (HNSW, IVF-PQ, ...). For ``"Flat"`` the FAISS index
is rebuilt from the vectors on load instead of being stored twice.

An opened index is read-only: a search writes nothing to it (the one value made later, the CPU
copy of a GPU index, is made once on first need and never changed).

**Threads.** :meth:`DenseIndex.search` takes a thread budget. FAISS's CPU searches run on its
OpenMP threads; OpenMP's thread count is a per-thread setting (``omp_set_num_threads`` sets it for
the calling thread only, checked with FAISS's libgomp), so a budget is applied around each FAISS
call and restored after, without touching other threads' searches. torch (the batched exact
inner-product path) can only change its thread count process-wide (``torch.set_num_threads`` is
global, and races with other threads), so that path is taken only without a budget
(``threads=None``, or at least as many threads as cores); with a smaller budget, or without torch
installed, the batch goes to FAISS. Torch settings of the application (and of the query encoder) are never changed here.

**FAISS's BLAS threshold.** FAISS 1.15 scores a flat search with BLAS only when ``queries x dim``
reaches ``faiss.cvar.distance_compute_blas_threshold`` (128,000 by default: ~333 queries at 384
dimensions); below it, every query scans the whole vector store on its own, ~8x slower per query
at 1M vectors for the batches of 256 the hybrid's gather sends (benchmarks/scale_sparse.py). When
the first dense part is opened and the threshold is still FAISS's default, it is lowered to
:data:`BLAS_THRESHOLD` (the same results: both paths are exact inner products); a value the
application set itself is left alone.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, IndexFormatError
from ._once import Once
from .dense_auto import AUTO_MIN_ROWS, best_of, exact_scores, exact_topk, is_auto, resolve_factory, tune
from .storage import NpyAppender, atomic_write_json, load_npy, read_json

__all__ = ["DenseIndex", "DenseIndexBuilder", "faiss_threads", "gpu_available"]

logger = logging.getLogger(__name__)

FORMAT = "hybridret-dense-v1"
_METRICS = ("ip", "l2")
_TRAIN_SAMPLE = 262_144
_ADD_CHUNK = 65_536
GPU_MAX_K = 2048  # largest k FAISS GPU indexes can return
_MAX_EF = 4096  # most HNSW candidates a filtered search widens to
_MATMUL_MIN_QUERIES = 8  # below this FAISS's SIMD scan wins
FAISS_BLAS_DEFAULT = 128_000  # faiss.cvar.distance_compute_blas_threshold as FAISS ships it
BLAS_THRESHOLD = 4096  # queries x dim from which FAISS uses BLAS once a dense part is open (~10 queries at 384)
_MATMUL_BLOCK = 1 << 25  # score entries per block (128 MB of float32)
# a filtered search of a compressed segment reads the allowed rows' float vectors exhaustively when
# they hold at most this many values (~43,000 rows at 384 dimensions): exact, and cheaper than an
# IVF scan widened by the inverse share of allowed rows
EXACT_VALUES = 1 << 24
EXACT_SHARE = 0.25  # ... and are at most this share of the segment (a few tombstones keep the IVF path)
_RESCORE_QUERIES = 32  # queries whose candidates are re-scored and sorted at once


@functools.lru_cache(maxsize=1)
def _has_torch() -> bool:
    """Whether torch can be imported (the batched matmul path; without it FAISS searches the batch)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def gpu_available() -> bool:
    """True when the installed FAISS has GPU support and sees at least one GPU."""
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _metric(metric: str) -> int:
    import faiss

    if metric not in _METRICS:
        raise ConfigError(f"unknown metric {metric!r}; expected 'ip' (inner product) or 'l2'")
    return faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2


def _make_index(dim: int, factory: str, metric: str) -> Any:
    import faiss

    try:
        return faiss.index_factory(int(dim), factory, _metric(metric))
    except RuntimeError as exc:
        raise ConfigError(f"invalid FAISS factory string {factory!r}: {str(exc).strip().splitlines()[-1]}") from exc


def _min_train(index: Any) -> int:
    """Vectors a FAISS index needs to be trained well: 39 per IVF list, and 256 for PQ/SQ codebooks
    (RaBitQ codes are a random rotation and signs: nothing of theirs is trained)."""
    import faiss

    try:
        ivf = faiss.extract_index_ivf(index)
        nlist = int(ivf.nlist)
    except (RuntimeError, AttributeError):
        ivf, nlist = None, 0
    rabitq = (faiss.IndexIVFRaBitQ, faiss.IndexIVFRaBitQFastScan)
    codebook = not (isinstance(index, rabitq) or isinstance(faiss.downcast_index(ivf) if ivf is not None else None,
                                                            rabitq))
    return max(256 if codebook else 1, 39 * nlist)


def _positive(meta: dict[str, Any], key: str, root: Path) -> int | None:
    """An optional positive integer of a part's ``meta.json`` (damage is an error, never a default)."""
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise IndexFormatError(f"{root}/meta.json: {key!r} must be a positive integer, got {value!r}")
    return value


SAMPLE_ROWS = 64  # vectors a load checks for NaN / infinity (first, last and evenly between)


class DenseIndexBuilder:
    """Streams vectors to disk; :meth:`close` builds the FAISS index. Use :meth:`DenseIndex.create`."""

    def __init__(self, root: Path, dim: int, factory: str, metric: str, seed: int,
                 min_rows: int = AUTO_MIN_ROWS) -> None:
        if not is_auto(factory):
            _make_index(dim, factory, metric)  # fail fast on a bad factory string
        else:
            _metric(metric)
        self.root = root
        self.dim = int(dim)
        self.factory = factory
        self.metric = metric
        self.seed = seed
        self.min_rows = int(min_rows)
        self.vectors = NpyAppender(root / "vectors.npy", np.float32, (self.dim,))

    def add(self, vectors: np.ndarray) -> None:
        v = np.asarray(vectors, dtype=np.float32)
        if v.ndim != 2 or v.shape[1] != self.dim:
            raise ConfigError(f"expected vectors of shape (n, {self.dim}), got {v.shape}")
        if not np.isfinite(v).all():
            raise ConfigError("dense vectors contain NaN or infinity")
        self.vectors.append(v)

    def close(self) -> None:
        import faiss

        self.vectors.close()
        vectors = load_npy(self.root / "vectors.npy")
        n = vectors.shape[0]
        factory = resolve_factory(self.factory, n, self.min_rows)
        extra: dict[str, Any] = {"min_rows": self.min_rows} if is_auto(self.factory) else {}
        if factory != "Flat":
            index = _make_index(self.dim, factory, self.metric)
            if not index.is_trained and n < _min_train(index):
                # a small segment (an add of a few documents) is searched exactly; compaction
                # rebuilds the merged segment with the requested factory
                logger.info("FAISS %s needs training: %d vectors are searched with Flat in this segment", factory, n)
                factory = "Flat"
        if factory != "Flat":
            if not index.is_trained:
                rng = np.random.default_rng(self.seed)
                sample = np.sort(rng.choice(n, size=min(n, _TRAIN_SAMPLE), replace=False))
                logger.info("training FAISS %s on %d vectors", factory, len(sample))
                try:
                    index.train(np.ascontiguousarray(vectors[sample]))
                except RuntimeError as exc:
                    raise ConfigError(
                        f"FAISS {factory!r} could not be trained on {len(sample)} vectors "
                        f"(IVF needs ~39 vectors per list): {str(exc).strip().splitlines()[-1]}"
                    ) from exc
            for start in range(0, n, _ADD_CHUNK):
                index.add(np.ascontiguousarray(vectors[start : start + _ADD_CHUNK]))
            if is_auto(self.factory):  # the search depth that keeps recall@10 at the target, measured here
                tuning = tune(index, vectors, metric=self.metric, seed=self.seed)
                logger.info("dense %s: nprobe %d, %d candidates re-scored (recall@10 %.3f on %d sampled vectors)",
                            factory, tuning.nprobe, tuning.candidates, tuning.recall, tuning.queries)
                extra.update(tuning.to_meta())
            faiss.write_index(index, str(self.root / "index.faiss"))
        atomic_write_json(self.root / "meta.json", {
            "format": FORMAT, "num_docs": int(n), "dim": self.dim, "factory": factory, "metric": self.metric,
            "requested_factory": self.factory, **extra,
        })

    def abort(self) -> None:
        self.vectors.abort()


@contextmanager
def faiss_threads(threads: int | None) -> Iterator[None]:
    """FAISS's OpenMP threads limited to ``threads`` on the calling thread for the block (``None``:
    as they are). OpenMP keeps the count per thread, so other threads' searches are unaffected."""
    if threads is None:
        yield
        return
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(int(threads))
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _add_file(index: Any, path: Path, mapped: np.ndarray) -> None:
    """Add the vectors of ``path`` to ``index`` with ordinary file reads, chunk by chunk.

    Reading through the memory map would leave every page of the file resident in this process
    next to FAISS's own copy (twice the RSS for a Flat index); plain reads go through the page
    cache only. Falls back to the map when the layout is not plain little-endian float32."""
    n, dim = mapped.shape
    offset = getattr(mapped, "offset", None)
    if offset is None or mapped.dtype != np.dtype("<f4") or not mapped.flags.c_contiguous:
        for start in range(0, n, _ADD_CHUNK):
            index.add(np.ascontiguousarray(mapped[start : start + _ADD_CHUNK], dtype=np.float32))
        return
    with open(path, "rb") as f:
        f.seek(offset)
        for start in range(0, n, _ADD_CHUNK):
            m = min(_ADD_CHUNK, n - start)
            buf = f.read(m * dim * 4)
            if len(buf) != m * dim * 4:
                raise IndexFormatError(f"{path} is shorter than its header says (truncated write?)")
            index.add(np.frombuffer(buf, dtype=np.float32).reshape(m, dim))


class DenseIndex:
    """FAISS search plus exact re-scoring from the stored vectors."""

    def __init__(self, root: str | Path, *, device: str | None = None, search_params: str | None = None) -> None:
        import faiss

        self.root = Path(root)
        meta = read_json(self.root / "meta.json")
        if meta.get("format") != FORMAT:
            raise IndexFormatError(f"{self.root}: unsupported dense index format {meta.get('format')!r}")
        self.meta = meta
        self.factory = str(meta["factory"])
        self.metric = str(meta["metric"])
        # a tuned compressed segment (factory "auto"): the IVF lists probed and the candidates
        # re-scored exactly per query for a top-10 (dense_auto.tune); None for every other part
        self.nprobe: int | None = _positive(meta, "nprobe", self.root)
        self.candidates: int | None = _positive(meta, "candidates", self.root)
        if (self.nprobe is None) != (self.candidates is None) or (self.candidates is not None and
                                                                    self.factory == "Flat"):
            raise IndexFormatError(f"{self.root}/meta.json: 'nprobe' and 'candidates' go together, on a compressed "
                                   f"(IVF) part; got nprobe {self.nprobe!r}, candidates {self.candidates!r} for "
                                   f"factory {self.factory!r}")
        self.vectors = load_npy(self.root / "vectors.npy")
        if self.vectors.shape != (int(meta["num_docs"]), int(meta["dim"])):
            raise IndexFormatError(f"{self.root}: vectors.npy has shape {self.vectors.shape}, meta.json says "
                                   f"({meta['num_docs']}, {meta['dim']})")
        if faiss.cvar.distance_compute_blas_threshold == FAISS_BLAS_DEFAULT:  # see the module docstring
            faiss.cvar.distance_compute_blas_threshold = BLAS_THRESHOLD
        if self.factory == "Flat":
            index = _make_index(self.dim, "Flat", self.metric)
            _add_file(index, self.root / "vectors.npy", self.vectors)
        else:
            path = self.root / "index.faiss"
            if not path.is_file():
                raise IndexFormatError(f"missing index file {path}")
            try:
                index = faiss.read_index(str(path))
            except RuntimeError as exc:
                raise IndexFormatError(f"corrupt FAISS index {path}: {exc}") from exc
            if index.ntotal != self.num_docs:
                raise IndexFormatError(f"{path} holds {index.ntotal} vectors, meta.json says {self.num_docs}")
        self.device = "cpu"
        # a tuned compressed part stays on the CPU: its search (tuned nprobe, exact re-scoring from the
        # vectors on disk) is the CPU path's, and RaBitQ fast-scan has no FAISS GPU index
        if device != "cpu" and self.candidates is None and gpu_available():
            try:
                self._gpu_res = faiss.StandardGpuResources()
                gpu = int(str(device).split(":")[1]) if device and str(device).startswith("cuda:") else 0
                index = faiss.index_cpu_to_gpu(self._gpu_res, gpu, index)
                self.device = "cuda"
            except RuntimeError as exc:  # e.g. HNSW has no GPU implementation
                logger.info("FAISS %s stays on the CPU: %s", self.factory, str(exc).strip().splitlines()[-1])
        elif device not in (None, "auto", "cpu"):
            raise ConfigError(f"device {device!r} requested but FAISS has no usable GPU")
        self.index = index
        self.nlist = int(faiss.extract_index_ivf(index).nlist) if self.candidates is not None else 0
        # GPU only: a CPU copy for k above GPU_MAX_K or a filtered search, made on first need (a
        # second copy of the index in memory: not made at open), once, and never changed after
        self._cpu_copy: Once[Any] = Once()
        # exact inner product on the CPU: for batches, a torch matmul + top-k over FAISS's own copy
        # of the vectors is 1.5-3.5x faster than IndexFlatIP.search (benchmarks/beir.py)
        self._xb: np.ndarray | None = None
        if self.device == "cpu" and self.factory == "Flat" and self.metric == "ip" and self.num_docs:
            self._xb = faiss.rev_swig_ptr(index.get_xb(), self.num_docs * self.dim).reshape(self.num_docs, self.dim)
        if search_params:
            self.set_search_params(search_params)

    @staticmethod
    def create(root: str | Path, dim: int, *, factory: str = "Flat", metric: str = "ip", seed: int = 0,
               min_rows: int = AUTO_MIN_ROWS) -> DenseIndexBuilder:
        """A builder for a new part. ``factory``: a FAISS factory string, or ``"auto"`` (``Flat``
        below ``min_rows`` vectors, a tuned compressed index above: :mod:`.dense_auto`)."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        return DenseIndexBuilder(root, dim, factory, metric, seed, min_rows)

    @property
    def num_docs(self) -> int:
        return int(self.vectors.shape[0])

    def sample_check(self, rows: int | None = None) -> None:
        """What a load checks of the vectors: a few of them, spread over the file, are finite (a
        file damaged throughout is refused; :meth:`check` reads every vector)."""
        n = self.num_docs
        if not n:
            return
        at = np.unique(np.linspace(0, n - 1, num=min(rows or SAMPLE_ROWS, n)).astype(np.int64))
        bad = ~np.isfinite(np.asarray(self.vectors[at])).all(axis=1)
        if bad.any():
            raise IndexFormatError(f"{self.root}/vectors.npy: vector {int(at[bad][0])} holds NaN or infinity "
                                   "(damaged; hybridret info --check counts them all)")

    def check(self) -> list[str]:
        """The values check of ``info --check``: every stored vector finite."""
        bad = int(sum(int((~np.isfinite(np.asarray(self.vectors[a:a + 65536]))).any(axis=1).sum())
                      for a in range(0, self.num_docs, 65536)))
        return [f"{self.root}/vectors.npy: {bad} vectors hold NaN or infinity"] if bad else []

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def set_search_params(self, params: str) -> None:
        """FAISS run-time parameters, e.g. ``"nprobe=32"`` or ``"efSearch=128"``."""
        import faiss

        try:
            if self.device == "cuda":
                faiss.GpuParameterSpace().set_index_parameters(self.index, params)
            else:
                faiss.ParameterSpace().set_index_parameters(self.index, params)
        except RuntimeError as exc:
            raise ConfigError(f"invalid FAISS search parameters {params!r} for {self.factory}: {exc}") from exc

    def _check(self, queries: np.ndarray) -> np.ndarray:
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ConfigError(f"expected query vectors of shape (n, {self.dim}), got {q.shape}")
        return q

    def vectors_of(self, rows: np.ndarray) -> np.ndarray:
        """Stored vectors of ``rows`` (any shape), shape ``rows.shape + (dim,)``; ``-1`` gives row 0's
        vector, so callers mask padding themselves."""
        rows = np.asarray(rows, dtype=np.int64)
        return np.asarray(self.vectors[np.maximum(rows, 0).ravel()]).reshape(*rows.shape, self.dim)

    def score(self, queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Exact scores (inner product, or negative squared L2) of queries with documents ``rows``."""
        q = self._check(queries)
        rows = np.asarray(rows, dtype=np.int64)
        docs = self.vectors_of(rows)
        if self.metric == "ip":
            out = np.einsum("nd,nkd->nk", q, docs)
        else:
            out = -((docs - q[:, None, :]) ** 2).sum(-1)
        return np.where(rows >= 0, out, -np.inf).astype(np.float32)

    def _matmul_search(self, xb: np.ndarray, q: np.ndarray, k: int, kk: int, allowed: np.ndarray | None
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Exact inner-product top-k of a query batch over ``xb`` (FAISS's Flat storage), in blocks;
        rows outside ``allowed`` score ``-inf`` and are never returned."""
        import torch

        Q = torch.from_numpy(q)
        step = max(4096, _MATMUL_BLOCK // len(q))  # bounds the (queries, documents) score block
        best_s = best_i = None
        for start in range(0, self.num_docs, step):
            S = Q @ torch.from_numpy(xb[start : start + step]).T
            if allowed is not None:
                S[:, ~torch.from_numpy(allowed[start : start + step])] = -torch.inf
            s, i = torch.topk(S, min(kk, S.shape[1]), dim=1)
            i += start
            if best_s is not None:
                s, j = torch.topk(torch.cat([best_s, s], 1), min(kk, best_s.shape[1] + s.shape[1]), dim=1)
                i = torch.gather(torch.cat([best_i, i], 1), 1, j)
            best_s, best_i = s, i
        rows = best_i.numpy().astype(np.int64)
        scores = best_s.numpy().astype(np.float32)
        rows = np.where(np.isfinite(scores), rows, -1)
        return _pad(rows, scores, k)

    def _cpu_index(self) -> Any:
        if self.device != "cuda":
            return self.index
        import faiss

        return self._cpu_copy.get(lambda: faiss.index_gpu_to_cpu(self.index))  # rare path: large k, a filter

    def _search_params(self, index: Any, allowed: np.ndarray) -> Any:
        """FAISS search parameters restricting the search to ``allowed`` rows, keeping the index's
        own run-time settings (nprobe, efSearch)."""
        import faiss

        bits = np.packbits(allowed, bitorder="little")  # FAISS reads it by pointer: keep it alive (below)
        sel = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))  # its size in bytes
        # a filter hides part of what the graph / the probed lists hold: widen the search by the
        # inverse share of allowed rows so that about as many allowed candidates are visited
        share = max(float(np.count_nonzero(allowed)) / max(1, len(allowed)), 1e-6)
        try:
            ivf = faiss.extract_index_ivf(index)
        except (RuntimeError, AttributeError):
            ivf = None
        if ivf is not None:
            nprobe = int(min(ivf.nlist, np.ceil(ivf.nprobe / share)))
            params = faiss.SearchParametersIVF(sel=sel, nprobe=nprobe)
        elif hasattr(index, "hnsw"):
            ef = int(min(_MAX_EF, np.ceil(index.hnsw.efSearch / share)))
            params = faiss.SearchParametersHNSW(sel=sel, efSearch=ef)
        else:
            params = faiss.SearchParameters(sel=sel)
        params._keep = (sel, bits)  # the selector and its bitmap must outlive the call
        return params

    @property
    def compressed(self) -> bool:
        """Whether this segment is searched through a tuned compressed index (candidates re-scored
        exactly) rather than exactly."""
        return self.candidates is not None

    def depth(self, k: int) -> int:
        """Candidates a tuned compressed segment re-scores for a top-``k``: the tuned depth for a
        top-10, scaled with ``k`` (a top-100 re-scores ten times as many)."""
        per_ten = self.candidates or 10
        return min(self.num_docs, max(k, -(-per_ten * k // 10)))

    def exact_search(self, queries: np.ndarray, k: int = 10, *, allowed: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``k`` from the float vectors (on disk), whatever the index type: the reference a
        compressed segment's recall is measured against, and its path for selective filters."""
        if k < 1:
            raise ConfigError(f"k must be positive, got {k}")
        q = self._check(queries)
        if allowed is not None and np.shape(allowed) != (self.num_docs,):
            raise ConfigError(f"allowed mask has shape {np.shape(allowed)}, expected ({self.num_docs},)")
        rows = None if allowed is None else np.flatnonzero(np.asarray(allowed, dtype=bool))
        got_rows, got_scores = exact_topk(self.vectors, q, max(1, min(k, self.num_docs)), rows=rows,
                                          metric=self.metric)
        return _pad(got_rows, got_scores, k)

    def _compressed_search(self, q: np.ndarray, k: int, allowed: np.ndarray | None, n_allowed: int,
                           threads: int | None) -> tuple[np.ndarray, np.ndarray]:
        """A tuned compressed segment: candidates from the IVF index, re-scored exactly from the
        float vectors; exhaustive over the allowed rows when a filter leaves few of them, and for any
        query that the IVF pass leaves short of ``min(k, allowed rows)``."""
        import faiss

        share = 1.0 if allowed is None else max(n_allowed / max(1, self.num_docs), 1e-6)
        if allowed is not None and n_allowed * self.dim <= EXACT_VALUES and share <= EXACT_SHARE:
            return self.exact_search(q, k, allowed=allowed)
        params = faiss.SearchParametersIVF(nprobe=int(min(self.nlist, np.ceil((self.nprobe or 1) / share))))
        if allowed is not None:
            bits = np.packbits(allowed, bitorder="little")
            sel = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))  # its size in bytes
            params.sel = sel
            params._keep = (sel, bits)  # the selector and its bitmap must outlive the call
        depth = self.depth(k)
        with faiss_threads(threads):
            _, cand = self.index.search(q, depth, params=params)
        cand = cand.astype(np.int64)
        rows = np.full((len(q), k), -1, dtype=np.int64)
        scores = np.full((len(q), k), -np.inf, dtype=np.float32)
        for a in range(0, len(q), _RESCORE_QUERIES):
            c = cand[a:a + _RESCORE_QUERIES]
            s = exact_scores(self.vectors, q[a:a + _RESCORE_QUERIES], c, self.metric)
            rows[a:a + len(c)], scores[a:a + len(c)] = best_of(s, c, k)  # by exact score, ties by row
        short = np.flatnonzero((rows >= 0).sum(axis=1) < min(k, n_allowed))
        if len(short):  # the probed lists held too few (allowed) rows: never a silently shorter list
            rows[short], scores[short] = self.exact_search(q[short], k, allowed=allowed)
        return rows, scores

    def search(self, queries: np.ndarray, k: int = 10, *, rescore: bool = True, allowed: np.ndarray | None = None,
               threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows and scores ``(nq, k)``, ``-1``/``-inf`` padded. With ``rescore`` (default) the
        FAISS candidates are re-scored exactly and re-sorted (matters for PQ and other lossy codes).
        ``allowed`` (a boolean mask over rows) restricts the search before top-k: through FAISS's
        ID selector for FAISS indexes (exact for Flat; HNSW and IVF return the allowed rows they
        visit), and by masking scores in the batched matmul path. ``threads``: the CPU threads it
        may use (``None``: every core; ``1``: only the calling thread; see the module docstring)."""
        if k < 1:
            raise ConfigError(f"k must be positive, got {k}")
        q = self._check(queries)
        if len(q) == 0:
            return np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.float32)
        if allowed is not None:
            allowed = np.asarray(allowed, dtype=bool)
            if allowed.shape != (self.num_docs,):
                raise ConfigError(f"allowed mask has shape {allowed.shape}, expected ({self.num_docs},)")
            if not allowed.any():
                return _pad(np.zeros((len(q), 0), np.int64), np.zeros((len(q), 0), np.float32), k)
        n_allowed = self.num_docs if allowed is None else int(allowed.sum())
        kk = min(k, max(1, n_allowed))
        if threads is not None and threads >= (os.cpu_count() or 1):
            threads = None  # the whole machine: what the libraries use anyway
        if self.compressed and self.device == "cpu":
            return self._compressed_search(q, k, allowed, n_allowed, threads)
        if self._xb is not None and len(q) >= _MATMUL_MIN_QUERIES and threads is None and _has_torch():
            return self._matmul_search(self._xb, q, k, kk, allowed)
        index = self.index
        params = None
        if self.device == "cuda" and (kk > GPU_MAX_K or allowed is not None):
            index = self._cpu_index()  # GPU kernels select at most 2048 and take no ID selector
        if allowed is not None:
            params = self._search_params(index, allowed)
        with faiss_threads(threads):
            scores, rows = index.search(q, kk, params=params) if params is not None else index.search(q, kk)
        rows = rows.astype(np.int64)
        if rescore and self.factory != "Flat":
            scores = self.score(q, rows)
            order = np.argsort(-scores, axis=1, kind="stable")
            rows = np.take_along_axis(rows, order, axis=1)
            scores = np.take_along_axis(scores, order, axis=1)
        elif self.metric == "l2":
            scores = -scores
        scores = np.where(rows >= 0, scores, -np.inf)  # FAISS pads with -1 when it finds fewer than k
        return _pad(rows, scores.astype(np.float32, copy=False), k)


def _pad(rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    if rows.shape[1] < k:
        pad = k - rows.shape[1]
        rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
        scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
    return rows, scores.astype(np.float32, copy=False)
