"""Peers measured in the same run as hybridret: bm25s, FAISS called directly, sentence-transformers
``semantic_search`` and ranx fusion (pyserini lives in ``pyserini_peer.py``).

Every peer gets the same corpus, the same query texts and, for dense search, the very vectors
hybridret indexed, so quality differences come from the method and speed ratios from the engine.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

Run = dict[str, dict[str, float]]
TIMING = {"min_seconds": 0.5, "rounds": 3}  # benchmarks' --quick lowers these for smoke runs


# --------------------------------------------------------------------------- measurement helpers

def rss() -> int:
    """Resident memory of this process in bytes (0 without psutil)."""
    try:
        import psutil
    except ImportError:
        return 0
    return int(psutil.Process().memory_info().rss)


@contextmanager
def peak_rss(interval: float = 0.02) -> Iterator[dict[str, int]]:
    """Samples this process's RSS every ``interval`` seconds; yields a dict that gets ``peak_delta``
    (bytes above the RSS at entry) on exit. Shared by every benchmark that reports peak memory."""
    out = {"before": rss(), "peak_delta": 0}
    stop = threading.Event()
    peak = [out["before"]]

    def sample() -> None:
        while not stop.wait(interval):
            peak[0] = max(peak[0], rss())

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()
        out["peak_delta"] = max(peak[0], rss()) - out["before"]


def rate(fn: Callable[[], Any], n: int, *, min_seconds: float | None = None, rounds: int | None = None) -> float:
    """Items per second of ``fn`` (which handles ``n`` items): best of ``rounds``, each repeated
    until it has run ``min_seconds`` (defaults from :data:`TIMING`)."""
    min_seconds = TIMING["min_seconds"] if min_seconds is None else min_seconds
    rounds = int(TIMING["rounds"]) if rounds is None else min(rounds, int(TIMING["rounds"]))
    fn()  # warm-up
    best = float("inf")
    for _ in range(rounds):
        reps, start = 0, time.perf_counter()
        while True:
            fn()
            reps += 1
            took = time.perf_counter() - start
            if took >= min_seconds:
                break
        best = min(best, took / reps)
    return n / best


@contextmanager
def threads(n: int | None) -> Iterator[None]:
    """Limit FAISS and torch to ``n`` threads (``None`` = all cores) inside the block."""
    import faiss
    import torch

    cores = os.cpu_count() or 1
    old_t = torch.get_num_threads()
    faiss.omp_set_num_threads(n or cores)
    torch.set_num_threads(n or cores)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(cores)
        torch.set_num_threads(old_t)


def to_run(ids: Sequence[Sequence[Any]], scores: Sequence[Sequence[float]], qids: Sequence[str],
           doc_ids: Sequence[str] | np.ndarray | None = None) -> Run:
    """A ``{qid: {docid: score}}`` run from per-query id and score lists (ids mapped through ``doc_ids``)."""
    run: Run = {}
    for q, row_ids, row_scores in zip(qids, ids, scores):
        run[q] = {str(doc_ids[i] if doc_ids is not None else i): float(s)
                  for i, s in zip(row_ids, row_scores) if not (isinstance(i, (int, np.integer)) and i < 0)}
    return run


# --------------------------------------------------------------------------- bm25s

class Bm25s:
    """bm25s with the settings of the reference run: Lucene BM25, k1 1.2, b 0.75, English
    stop words, Snowball stemmer (PyStemmer), numba backend when numba is installed."""

    name = "bm25s"

    def __init__(self) -> None:
        import bm25s

        self.bm25s = bm25s
        try:
            import Stemmer

            self.stemmer = Stemmer.Stemmer("english")
        except ImportError:  # pragma: no cover - bench extra installs it
            self.stemmer = None
        try:
            import numba  # noqa: F401

            self.backend = "numba"
        except ImportError:  # pragma: no cover
            self.backend = "numpy"
        self.model: Any = None

    def _tok(self, texts: Sequence[str]) -> Any:
        return self.bm25s.tokenize(list(texts), stopwords="en", stemmer=self.stemmer, show_progress=False)

    def build(self, texts: Sequence[str]) -> None:
        self.model = self.bm25s.BM25(method="lucene", k1=1.2, b=0.75, backend=self.backend)
        self.model.index(self._tok(texts), show_progress=False)

    def nbytes(self) -> int:
        s = self.model.scores
        return int(sum(v.nbytes for v in s.values() if isinstance(v, np.ndarray)))

    def search(self, queries: Sequence[str], k: int, n_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, int(self.model.scores["num_docs"]))
        res, scores = self.model.retrieve(self._tok(queries), k=k, n_threads=n_threads, show_progress=False)
        return res, scores

    @property
    def notes(self) -> str:
        return f"bm25s {self.bm25s.__version__}, lucene, k1 1.2, b 0.75, stop words en, snowball stemmer, {self.backend}"


# --------------------------------------------------------------------------- dense peers

class FaissFlat:
    """FAISS ``IndexFlatIP`` called directly on hybridret's own document vectors."""

    name = "FAISS IndexFlatIP (direct)"

    def __init__(self, vectors: np.ndarray) -> None:
        import faiss

        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, ids = self.index.search(np.ascontiguousarray(q, dtype=np.float32), min(k, self.index.ntotal))
        return ids, scores


class StSemanticSearch:
    """sentence-transformers ``util.semantic_search`` (torch matmul + top-k) on the same vectors,
    with dot-product scoring (the vectors are L2-normalised, so this equals cosine)."""

    name = "sentence-transformers semantic_search"

    def __init__(self, vectors: np.ndarray) -> None:
        import torch
        from sentence_transformers import util

        self.util = util
        self.torch = torch
        self.corpus = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))

    def search(self, q: np.ndarray, k: int) -> tuple[list[list[int]], list[list[float]]]:
        hits = self.util.semantic_search(self.torch.from_numpy(q), self.corpus, top_k=min(k, len(self.corpus)),
                                         score_function=self.util.dot_score)
        return [[h["corpus_id"] for h in row] for row in hits], [[h["score"] for h in row] for row in hits]


def st_encoder(model_path: str) -> Any:
    """A ``SentenceTransformer`` over the same local model folder hybridret uses."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_path, device="cpu")


# --------------------------------------------------------------------------- ranx fusion

def ranx_fuse(runs: dict[str, Run], method: str) -> Run:
    """Fuse with ranx: ``"rrf"`` (k=60) or ``"minmax"`` (min-max norm, equal-weight sum)."""
    from ranx import Run as RanxRun
    from ranx import fuse

    rs = [RanxRun(r, name=n) for n, r in runs.items()]
    if method == "rrf":
        fused = fuse(rs, norm=None, method="rrf", params={"k": 60})
    else:
        fused = fuse(rs, norm="min-max", method="wsum", params={"weights": [1.0 / len(rs)] * len(rs)})
    return {q: dict(d) for q, d in fused.to_dict().items()}
