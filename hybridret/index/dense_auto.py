"""Which FAISS index a dense segment gets (the size rule), and how deep its search goes (the tuning).

**The size rule** (``factory="auto"``, the default): a segment of fewer than ``min_rows`` vectors
(:data:`AUTO_MIN_ROWS` unless the index settings say otherwise) is searched exactly with ``Flat``;
a larger one gets :func:`compressed_factory`: an inverted file over 1-bit RaBitQ codes scanned with
FAISS's fast-scan kernels (``IVF{nlist},RaBitQfs``, about 90 bytes a vector in memory against
1,536 for float32 at 384 dimensions). Its candidates are re-scored exactly from the float vectors
on disk (``vectors.npy``, memory-mapped), so every dense score a search returns is the exact float
score, as with ``Flat``; only which documents make the list is approximate.

**The tuning** (:func:`tune`, at build time, on the segment's own vectors): ``TUNE_QUERIES`` stored
vectors, each moved away from itself by noise (:func:`proxy_queries`), serve as queries (each one's
own row left out of its answers), their exact top-10 comes
from brute force over the float vectors, and the cheapest (``nprobe``, ``candidates``) pair of a
ladder whose recall@10 reaches :data:`TARGET_RECALL` is kept in the part's ``meta.json`` with the
recall it measured. ``hybridret info --dense-recall`` measures it again on real queries.

The stand-ins are **in-domain** queries: on a 1M-passage MS MARCO resample the tuned index finds
0.98-1.0 of the exact top-10 of the TREC DL19 queries. Queries with no document near them (the other
collections' queries against MS MARCO passages: nearest passage at cosine ~0.4) have a top-10 that
is a near-tie spread over many IVF lists; for them recall@10 is 0.6-0.8 at the tuned depth and needs
nprobe 512 of 4,096 for 0.96 (docs/benchmarks.md, "Dense at size"). A Gaussian fitted to the vectors
imitates such queries; tuning on it was measured and not adopted (every query would pay nprobe 512).

Pure functions over arrays and FAISS indexes; nothing here reads or writes files.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["AUTO", "AUTO_MIN_ROWS", "TARGET_RECALL", "Tuning", "best_of", "compressed_factory", "exact_topk", "is_auto",
           "recall_at", "resolve_factory", "similarity", "tune"]

logger = logging.getLogger(__name__)

AUTO = "auto"
AUTO_MIN_ROWS = 100_000  # below this a segment is searched with Flat (see docs/benchmarks.md, "Dense at size")
# more lists make each probe cheaper but training (k-means) and adding (every vector against every
# centroid) cost ~n * nlist: 4096 keeps an 8.8M-vector build's assignment near 3e13 flops
MAX_LISTS = 4096
# recall@10 the tuning asks of its stand-in queries: they run ~0.01 above real in-domain queries
# (1M MS MARCO resample: stand-ins 0.993 where the DL19 queries got 0.984), hence the margin
TARGET_RECALL = 0.995
TUNE_QUERIES = 256
TUNE_K = 10
PROXY_COSINE = 0.7  # how far the in-domain stand-in queries sit from the stored vectors they are made from
_NPROBES = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
_CANDIDATES = (40, 60, 100, 150, 200, 300)
# relative cost of one code scanned by fast-scan and of one candidate re-scored from the float
# vectors (a random 1.5 KB read and a dot product), per the one-core measurements of
# benchmarks/dense_ann.py
_COST_CODE = 1.0
_COST_RESCORE = 40.0
_BLOCK_SCORES = 1 << 24  # score entries per block of an exhaustive search (64 MB of float32)


def is_auto(factory: str) -> bool:
    return factory.strip().lower() == AUTO


def compressed_factory(n: int) -> str:
    """The compressed index of a segment of ``n`` vectors: IVF with about ``4 * sqrt(n)`` lists (a
    power of two, at most :data:`MAX_LISTS`, at least 39 vectors a list to train on) over 1-bit RaBitQ
    fast-scan codes."""
    nlist = min(MAX_LISTS, 2 ** round(math.log2(max(1.0, 4.0 * math.sqrt(max(n, 1))))))
    while nlist > 1 and n < 39 * nlist:
        nlist //= 2
    return f"IVF{nlist},RaBitQfs"


def resolve_factory(factory: str, n: int, min_rows: int = AUTO_MIN_ROWS) -> str:
    """The factory a segment of ``n`` vectors is built with: ``factory`` itself unless it is ``"auto"``."""
    if not is_auto(factory):
        return factory
    if n < min_rows:
        return "Flat"
    import faiss

    if not hasattr(faiss, "IndexIVFRaBitQFastScan"):
        raise ConfigError(f"a dense segment of {n:,} vectors is compressed by the size rule (faiss_factory='auto'), "
                          f"which needs FAISS with RaBitQ fast-scan (faiss-cpu >= 1.15); this FAISS is "
                          f"{getattr(faiss, '__version__', '?')}: upgrade it, or pass faiss_factory='Flat'")
    return compressed_factory(n)


def similarity(queries: np.ndarray, block: np.ndarray, metric: str = "ip") -> np.ndarray:
    """Scores of ``queries`` against a block of rows: inner product, or negative squared L2 computed
    as a difference (exact: no cancellation for vectors far from the origin)."""
    if metric == "l2":
        diff = block[None, :, :] - queries[:, None, :]
        return -np.einsum("qnd,qnd->qn", diff, diff).astype(np.float32, copy=False)
    return (queries @ block.T).astype(np.float32, copy=False)


def best_of(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's ``k`` best (score descending, ties by row), ``-1`` / ``-inf`` padded."""
    nq, m = scores.shape
    if m > k:
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        scores, rows = np.take_along_axis(scores, top, 1), np.take_along_axis(rows, top, 1)
    order = np.lexsort((rows, -scores), axis=1)
    scores, rows = np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)
    if m < k:
        scores = np.pad(scores, ((0, 0), (0, k - m)), constant_values=-np.inf)
        rows = np.pad(rows, ((0, 0), (0, k - m)), constant_values=-1)
    rows = np.where(np.isfinite(scores), rows, -1)
    return rows, scores


def exact_topk(vectors: Any, queries: np.ndarray, k: int, *, exclude: np.ndarray | None = None,
               rows: np.ndarray | None = None, metric: str = "ip") -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` of ``queries`` over ``vectors`` (any array-like of float32 rows, a memory map
    too; inner product, or negative squared L2 with ``metric="l2"``), read in blocks sized so that a
    block's scores stay near 64 MB: ``(nq, k)`` rows and scores, best first, ties by row, ``-1`` /
    ``-inf`` padded. ``rows``: only these rows are candidates (sorted row numbers). ``exclude``: per
    query, one row left out (``-1``: none)."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    nq = len(q)
    cand = np.arange(len(vectors), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    step = max(256, _BLOCK_SCORES // max(1, nq) // (q.shape[1] if metric == "l2" else 1))
    best_i = np.full((nq, 0), -1, dtype=np.int64)
    best_s = np.full((nq, 0), -np.inf, dtype=np.float32)
    for a in range(0, len(cand), step):
        idx = cand[a:a + step]
        block = np.asarray(vectors[idx[0]:idx[-1] + 1] if rows is None else vectors[idx], dtype=np.float32)
        s = similarity(q, block, metric)
        if exclude is not None:
            s[exclude[:, None] == idx[None, :]] = -np.inf
        blk_i, blk_s = best_of(s, np.broadcast_to(idx, s.shape), min(k, s.shape[1]))
        best_i, best_s = best_of(np.concatenate([best_s, blk_s], 1), np.concatenate([best_i, blk_i], 1),
                               min(k, best_s.shape[1] + blk_s.shape[1]))
    return best_of(best_s, best_i, k)


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of each query's true rows (``truth``, ``-1`` padded) that ``found`` holds."""
    hit = tot = 0
    for f, t in zip(found.tolist(), truth.tolist()):
        want = {x for x in t if x >= 0}
        hit += len(want & set(f))
        tot += len(want)
    return hit / tot if tot else 1.0


@dataclass(frozen=True)
class Tuning:
    """What :func:`tune` chose for a compressed segment, and the recall it measured."""

    nprobe: int
    candidates: int
    recall: float
    queries: int

    def to_meta(self) -> dict[str, Any]:
        return {"nprobe": self.nprobe, "candidates": self.candidates, "tuned_recall_at_10": round(self.recall, 4),
                "tuned_on": f"{self.queries} stored vectors moved to cosine {PROXY_COSINE} as queries "
                            "(their own rows left out)"}


def _ladder(nlist: int, n: int) -> list[tuple[int, int]]:
    per_list = n / max(nlist, 1)
    probes = sorted({min(p, nlist) for p in _NPROBES})  # a small index: every list at most
    pairs = [(p, c) for p in probes for c in _CANDIDATES]
    return sorted(pairs, key=lambda pc: pc[0] * per_list * _COST_CODE + pc[1] * _COST_RESCORE)


def ann_candidates(index: Any, queries: np.ndarray, depth: int, nprobe: int) -> np.ndarray:
    """Row numbers of the ``depth`` best candidates an IVF index finds with ``nprobe`` lists."""
    import faiss

    params = faiss.SearchParametersIVF(nprobe=int(nprobe))
    _, rows = index.search(np.ascontiguousarray(queries, dtype=np.float32), int(depth), params=params)
    return rows.astype(np.int64)


def exact_scores(vectors: Any, queries: np.ndarray, rows: np.ndarray, metric: str = "ip") -> np.ndarray:
    """Exact scores (inner product, or negative squared L2) of each query with its candidate ``rows``
    (``(nq, c)``, ``-1`` padded: ``-inf``), reading each query's rows from ``vectors`` in row order
    (a memory map reads forward)."""
    out = np.full(rows.shape, -np.inf, dtype=np.float32)
    for i in range(len(rows)):
        ok = np.flatnonzero(rows[i] >= 0)
        if len(ok):
            r = rows[i, ok]
            order = np.argsort(r, kind="stable")
            out[i, ok[order]] = similarity(queries[i:i + 1], np.asarray(vectors[r[order]], dtype=np.float32),
                                           metric)[0]
    return out


def proxy_queries(vectors: np.ndarray, rng: np.random.Generator, cosine: float = PROXY_COSINE) -> np.ndarray:
    """Stand-ins for in-domain queries made from stored vectors: each moved by isotropic noise until
    its cosine with the vector it came from is about ``cosine`` (its norm kept). A stored vector
    itself is an easy query (its neighbourhood is tight around it); a query sits farther from every
    document, where the compressed codes' errors weigh more."""
    if cosine >= 1.0:
        return vectors
    d = vectors.shape[1]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    sigma = math.sqrt(1.0 / (cosine * cosine) - 1.0)  # |noise| / |v| giving that cosine on average
    noise = rng.standard_normal(vectors.shape).astype(np.float32) * (sigma / math.sqrt(d))
    moved = vectors / np.maximum(norms, 1e-12) + noise
    return (moved / np.linalg.norm(moved, axis=1, keepdims=True) * norms).astype(np.float32)


def tune(index: Any, vectors: Any, *, metric: str = "ip", target: float = TARGET_RECALL,
         queries: int = TUNE_QUERIES, seed: int = 0, ladder: Sequence[tuple[int, int]] | None = None) -> Tuning:
    """The cheapest (nprobe, candidates) of the ladder whose recall@10 on sampled stored vectors
    reaches ``target`` (the deepest pair when none does: the recall it measured is kept and logged).
    Each nprobe is searched once at the ladder's deepest candidate list; shallower lists are its
    prefixes (FAISS returns candidates best first by their approximate score)."""
    import faiss

    n = len(vectors)
    ivf = faiss.extract_index_ivf(index)
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(n, size=min(queries, n), replace=False)).astype(np.int64)
    q = proxy_queries(np.asarray(vectors[picked], dtype=np.float32), rng)
    truth, _ = exact_topk(vectors, q, TUNE_K, exclude=picked, metric=metric)
    pairs = list(ladder) if ladder is not None else _ladder(int(ivf.nlist), n)
    deepest = max(c for _, c in pairs) + 1  # + the query's own row, left out below
    runs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    best: Tuning | None = None
    for nprobe, cand in pairs:
        if nprobe not in runs:
            rows = ann_candidates(index, q, deepest, nprobe)
            rows[rows == picked[:, None]] = -1
            runs[nprobe] = (rows, exact_scores(vectors, q, rows, metric))
        rows, scores = runs[nprobe]
        s = scores[:, :cand + 1]
        top = np.argsort(-s, axis=1, kind="stable")[:, :TUNE_K]
        found = np.where(np.isfinite(np.take_along_axis(s, top, 1)), np.take_along_axis(rows[:, :cand + 1], top, 1), -1)
        rec = recall_at(found, truth)
        if best is None or rec > best.recall:
            best = Tuning(nprobe, cand, rec, len(picked))
        if rec >= target:
            return Tuning(nprobe, cand, rec, len(picked))
    if best is None:
        raise ValueError("dense tuning needs a non-empty ladder")
    logger.warning("dense tuning: recall@10 %.3f at the deepest setting tried (nprobe %d, %d candidates), "
                   "below the target %.2f", best.recall, best.nprobe, best.candidates, target)
    return best
