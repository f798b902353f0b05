"""Builds for scale_sparse.py: a real hybridret index from resampled vectors, and standalone parts.

The index is written by :class:`hybridret.IndexWriter` (default settings, so the same parts as
``hybridret build``) with a :class:`ChunkEncoder`: a
:class:`~hybridret.distributed.encoding.PrecomputedEncoder` (the writer-side encoder of shards and
distributed builds, carrying the source index's real encoder config) that answers from the corpus's
chunk files a slice at a time instead of a per-document table. Seconds per part come from timing
wrappers around each registered part format's builder (through ``register_part_type``, in this
process only).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from _resample import chunk_stems, iter_chunks, read_chunk
from _scale_paths import impact_class, peak_rss_mb

from hybridret.distributed.encoding import PrecomputedEncoder
from hybridret.encoders import EncodedBatch

SLICE = 16_384  # rows the encoder holds at once (two slices at most)
FORMAT_CLASS = {"hybridret-dense-v1": "DenseIndex", "hybridret-learned-v1": "LearnedIndex",
                "hybridret-bm25-v1": "BM25Store", "hybridret-bm25-v2": "BM25Store", "hybridret-bm25-v3": "BM25Store", "hybridret-impact-v1": "ImpactIndex",
                "hybridret-impact-v2": "WindowImpactIndex",
                "hybridret-sparse-v1": "SparseIndex (format 1)"}


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


class ChunkEncoder(PrecomputedEncoder):
    """Answers ``encode_documents`` from the slice of the corpus being written (and the one before),
    by text, first come first served (a text may repeat)."""

    def __init__(self, shape: Mapping[str, Any]) -> None:
        super().__init__(shape, what="scale benchmark")
        self.blocks: dict[int, tuple[np.ndarray, sp.csr_matrix, list[str]]] = {}
        self.where: dict[str, collections.deque[tuple[int, int]]] = {}
        self.lookup_s = 0.0

    def _enter(self, bid: int, dense: np.ndarray, sparse: sp.csr_matrix, texts: list[str]) -> None:
        self.blocks[bid] = (dense, sparse, texts)
        for i, t in enumerate(texts):
            self.where.setdefault(t, collections.deque()).append((bid, i))
        old = self.blocks.pop(bid - 2, None)
        if old is not None:  # drop what the writer never asked for (blank texts)
            for t in old[2]:
                q = self.where.get(t)
                while q and q[0][0] == bid - 2:
                    q.popleft()
                if q is not None and not q:
                    del self.where[t]

    def documents(self, data: Path) -> Iterator[dict[str, str]]:
        bid = 0
        for dense, sparse, texts, ids in iter_chunks(data):
            for lo in range(0, len(texts), SLICE):
                hi = min(len(texts), lo + SLICE)
                self._enter(bid, np.array(dense[lo:hi]), sp.csr_matrix(sparse[lo:hi], copy=True), texts[lo:hi])
                bid += 1
                for i in range(lo, hi):
                    yield {"id": ids[i], "text": texts[i]}

    def encode_documents(self, texts: Sequence[str], *, batch_size: int | None = None,
                         show_progress: bool | None = None) -> EncodedBatch:
        t0 = time.perf_counter()
        got = []
        for t in texts:
            q = self.where[t]
            got.append(q.popleft())
            if not q:
                del self.where[t]
        dense, sparse = [], []
        i = 0
        while i < len(got):  # runs of one block, in order
            j = i
            while j < len(got) and got[j][0] == got[i][0]:
                j += 1
            rows = np.array([r for _, r in got[i:j]])
            d, s, _ = self.blocks[got[i][0]]
            dense.append(d[rows])
            sparse.append(s[rows])
            i = j
        out = EncodedBatch(dense=np.vstack(dense), sparse=sp.vstack(sparse, format="csr"))
        self.lookup_s += time.perf_counter() - t0
        return out


class _Timed:
    def __init__(self, name: str, spent: dict[str, float], make: Any) -> None:
        self.name, self.spent = name, spent
        t0 = time.perf_counter()
        self.inner = make()
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

    def _run(self, fn: Any, *a: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a)
        finally:
            self.spent[self.name] += time.perf_counter() - t0

    def add(self, values: Any) -> None:
        self._run(self.inner.add, values)

    def close(self) -> None:
        self._run(self.inner.close)

    def abort(self) -> None:
        self.inner.abort()


def time_parts() -> dict[str, float]:
    """Wrap every registered part format's builder so the seconds spent in it (create, add, close)
    add up by part folder name into the returned dict."""
    from hybridret.index import formats  # noqa: F401 - registers the built-in formats
    from hybridret.index.parts import PART_TYPES, register_part_type

    impact_class()  # a format registered on import must be wrapped too
    spent: dict[str, float] = {}
    for pt in list(PART_TYPES.values()):
        def create(root: Path, dim: int | None, opts: Mapping[str, Any], _make: Any = pt.create) -> Any:
            return _Timed(Path(root).name, spent, lambda: _make(root, dim, opts))

        register_part_type(dataclasses.replace(pt, create=create), replace=True)
    return spent


def shape_of(src_index: Path, vocab: int, dim: int) -> dict[str, Any]:
    m = json.loads((src_index / "manifest.json").read_text())
    reps = m.get("representations") or {"dense": {"kind": "dense", "dim": dim}, "sparse": {"kind": "sparse", "dim": vocab}}
    return {"config": m.get("encoder") or {}, "representations": reps}


def build_index(spec: dict[str, Any]) -> dict[str, Any]:
    """The real hybridret index of the corpus (default settings unless ``spec["settings"]``):
    seconds in total and per part, peak RSS of this process, bytes on disk per part."""
    from hybridret import IndexWriter

    data, root = Path(spec["data"]), Path(spec["index"])
    d0, s0, _, _ = read_chunk(chunk_stems(data)[0])
    enc = ChunkEncoder(shape_of(Path(spec["source_index"]), s0.shape[1], d0.shape[1]))
    del d0, s0
    spent = time_parts()
    t0 = time.perf_counter()
    with IndexWriter(root, encoder=enc, settings=spec.get("settings")) as w:
        result = w.write(enc.documents(data), mode="build", show_progress=False)
    total = time.perf_counter() - t0
    manifest = json.loads((root / "manifest.json").read_text())
    seg = root / manifest["segments"][0]["name"]
    listed = json.loads((seg / "segment.json").read_text()).get("parts") or {}
    parts = {}
    for name, fmt in listed.items():
        parts[name] = {"format": fmt, "class": FORMAT_CLASS.get(fmt, fmt), "dir": str(seg / name),
                       "build_s": spent.get(name), "disk_bytes": disk_bytes(seg / name)}
    other = disk_bytes(seg) - sum(p["disk_bytes"] for p in parts.values())
    return {"docs": result.added, "build_s": total, "encoder_lookup_s": enc.lookup_s,
            "docstore_and_rest_s": total - sum(p["build_s"] or 0 for p in parts.values()) - enc.lookup_s,
            "parts": parts, "docstore_disk_bytes": other, "disk_bytes": disk_bytes(root),
            "peak_rss_MB": peak_rss_mb(), "settings": manifest.get("settings")}


def build_part(spec: dict[str, Any]) -> dict[str, Any]:
    """The pruned learned-sparse part built alone from the chunk files (for an index whose default
    learned-sparse part is another one)."""
    root = Path(spec["dir"])
    Impact = impact_class()
    b = None
    t0 = time.perf_counter()
    for _, sparse, _, _ in iter_chunks(Path(spec["data"])):
        if b is None:
            b = Impact.create(root, sparse.shape[1])
        for lo in range(0, sparse.shape[0], SLICE):
            b.add(sp.csr_matrix(sparse[lo:lo + SLICE], copy=True))
    b.close()
    return {"build_s": time.perf_counter() - t0, "disk_bytes": disk_bytes(root), "peak_rss_MB": peak_rss_mb(),
            "dir": str(root), "standalone": True}
