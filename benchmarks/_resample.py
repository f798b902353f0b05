"""Corpora of any size resampled from real encoded passages, and the real queries (for scale_sparse.py).

The source is an index built from real passages (by default the 30,005 MS MARCO passages of the
TREC DL19 pool, MiniLM dense + SPLADE-tiny learned-sparse vectors), read through hybridret's own
API (``open_snapshot``, ``Segment.part("sparse").forward``, ``.part("dense").vectors``), so index
formats 2 and 3 both work. Synthetic passage ``i`` mixes two distinct random real passages A and
B (seeded): each of A's (term, weight) entries is kept with probability 0.7 and each of B's with
0.3 (a term in both keeps the larger weight); dense = normalise(0.7 dA + 0.3 dB + noise), noise
N(0, (NOISE / sqrt(d))^2) per component (norm ~NOISE); text = A's words kept with p 0.7 then B's
kept with p 0.3, each in order. Real term weights, lengths and posting skew survive (df grows with
N), and the mixtures make new combinations, so a top-10 is not copies of one passage.

Corpora are written as chunk files (``chunk-00000.*``, ``CHUNK`` rows each) so that no step holds
more than a chunk of generated data at once; the builds and searches read them back.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import scipy.sparse as sp

logger = logging.getLogger("bench")

CHUNK = 100_000
P_A, P_B = 0.7, 0.3
NOISE = 0.05
METHOD = (f"resampled from real encoded passages: a synthetic passage mixes two distinct random real passages "
          f"A, B (seeded): learned-sparse keeps each of A's entries with p {P_A} and each of B's with p {P_B} (a "
          f"term in both: the larger weight); dense = normalise({P_A} dA + {P_B} dB + N(0, ({NOISE}/sqrt(d))^2) "
          f"noise); text = A's words kept with p {P_A} then B's with p {P_B}, in order. The size equal to the "
          f"source is the real corpus itself.")


@dataclass
class Source:
    """The real passages an index holds: learned-sparse rows, dense rows, full texts and ids."""

    sparse: sp.csr_matrix
    dense: np.ndarray
    texts: list[str]
    ids: list[str]
    encoder: dict[str, Any]
    index: Path

    @property
    def n(self) -> int:
        return self.sparse.shape[0]


def load_source(index: Path) -> Source:
    """Every live passage of ``index`` (any number of segments) with its vectors and text."""
    from hybridret.index.snapshot import open_snapshot

    snap = open_snapshot(index)
    try:
        sparse, dense, texts, ids = [], [], [], []
        for seg, live in zip(snap.segments, snap.live):
            rows = np.arange(seg.num_docs) if live is None else np.flatnonzero(live)
            if seg.part("sparse") is None or seg.part("dense") is None:
                raise SystemExit(f"{index}: segment {seg.name} lacks a dense or a learned-sparse part")
            sparse.append(sp.csr_matrix(seg.part("sparse").forward[rows], dtype=np.float32))
            dense.append(np.asarray(seg.part("dense").vectors[rows], dtype=np.float32))
            for r in rows:
                title, text = seg.docs.get(int(r))
                texts.append(f"{title.strip()} {text.strip()}".strip() if title.strip() else text.strip())
            ids += [str(x) for x in seg.docs.ids[rows]]
        return Source(sp.vstack(sparse, format="csr"), np.vstack(dense), texts, ids,
                      dict(snap.manifest.get("encoder") or {}), index)
    finally:
        snap.close()


def build_source(index: Path, corpus: Path, limit: int | None = None) -> Any:
    """Encode ``corpus`` (a BEIR folder; its first ``limit`` passages) into ``index`` with the
    default models (about 10 minutes for the 30k pool on 2 cores). Returns the retriever."""
    from hybridret import CorpusReader, HybridRetriever

    docs: Any = CorpusReader(corpus)
    if limit:
        docs = list(itertools.islice(iter(docs), limit))
    logger.info("encoding %s passages of %s into %s (once; later runs reuse it)", limit or "all", corpus, index)
    r = HybridRetriever.from_models()
    r.index(docs, batch_size=32, workdir=index)
    r.save(index, overwrite=True)
    return r


class Resampler:
    """Synthetic passages mixed from the source's real ones (see the module docstring)."""

    def __init__(self, src: Source, seed: int) -> None:
        self.src, self.seed = src, seed
        self.V = src.sparse.shape[1]
        words = [t.split() for t in src.texts]
        self.wlen = np.array([len(w) for w in words], dtype=np.int64)
        self.woff = np.concatenate([[0], np.cumsum(self.wlen)])
        self.words = np.array(list(itertools.chain.from_iterable(words)), dtype=object)

    def pairs(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
        n = self.src.n
        a = rng.integers(n, size=m)
        b = (a + 1 + rng.integers(max(1, n - 1), size=m)) % n  # never A itself
        return a, b

    def _entries(self, rows: np.ndarray, p: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        sub = self.src.sparse[rows]
        owner = np.repeat(np.arange(len(rows), dtype=np.int64), np.diff(sub.indptr))
        keep = rng.random(sub.nnz) < p
        return owner[keep] * self.V + sub.indices[keep], sub.data[keep]

    def sparse(self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> sp.csr_matrix:
        ka, va = self._entries(a, P_A, rng)
        kb, vb = self._entries(b, P_B, rng)
        key, val = np.concatenate([ka, kb]), np.concatenate([va, vb])
        order = np.lexsort((-val, key))  # by (row, term), the larger weight first
        key, val = key[order], val[order]
        first = np.ones(len(key), dtype=bool)
        first[1:] = key[1:] != key[:-1]
        key, val = key[first], val[first]
        row, col = np.divmod(key, self.V)
        indptr = np.searchsorted(row, np.arange(len(a) + 1))
        return sp.csr_matrix((val.astype(np.float32), col.astype(np.int32), indptr), shape=(len(a), self.V))

    def dense(self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        X = self.src.dense
        d = X.shape[1]
        x = P_A * X[a] + P_B * X[b] + rng.standard_normal((len(a), d), dtype=np.float32) * (NOISE / np.sqrt(d))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def texts(self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> list[str]:
        m = len(a)
        # word positions of A's words then B's words, per synthetic passage, in order
        la, lb = self.wlen[a], self.wlen[b]
        total = la + lb
        start = np.concatenate([[0], np.cumsum(total)])
        owner = np.repeat(np.arange(m), total)
        within = np.arange(int(start[-1])) - start[owner]
        from_a = within < la[owner]
        pos = np.where(from_a, self.woff[a][owner] + within, self.woff[b][owner] + within - la[owner])
        keep = rng.random(len(pos)) < np.where(from_a, P_A, P_B)
        blank = (np.bincount(owner[keep], minlength=m) == 0) & (total > 0)
        keep[start[:-1][blank]] = True  # never a blank passage: keep its first word
        kept = self.words[pos[keep]]
        cut = np.concatenate([[0], np.cumsum(np.bincount(owner[keep], minlength=m))])
        return [" ".join(kept[cut[i]:cut[i + 1]]) for i in range(m)]

    def chunk(self, size: int, c: int) -> tuple[np.ndarray, sp.csr_matrix, list[str], list[str]]:
        """Chunk ``c`` (rows ``c * CHUNK ...``) of the ``size``-passage corpus: dense, sparse, texts, ids."""
        lo, hi = c * CHUNK, min(size, (c + 1) * CHUNK)
        if size == self.src.n:  # the real corpus itself
            r = np.arange(lo, hi)
            return self.src.dense[r], self.src.sparse[r], self.src.texts[lo:hi], self.src.ids[lo:hi]
        rng = np.random.default_rng([self.seed, size, c])
        a, b = self.pairs(rng, hi - lo)
        return (self.dense(a, b, rng), self.sparse(a, b, rng), self.texts(a, b, rng),
                [f"r{i}" for i in range(lo, hi)])


# --------------------------------------------------------------------------- chunk files
def write_corpus(res: Resampler, size: int, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    nnz = 0
    for c in range((size + CHUNK - 1) // CHUNK):
        dense, sparse, texts, ids = res.chunk(size, c)
        stem = out / f"chunk-{c:05d}"
        np.save(f"{stem}.dense.npy", dense)
        for name in ("data", "indices", "indptr"):
            np.save(f"{stem}.sparse.{name}.npy", getattr(sparse, name))
        Path(f"{stem}.json").write_text(json.dumps({"ids": ids, "texts": texts, "vocab": sparse.shape[1]}))
        nnz += sparse.nnz
    return {"passages": size, "terms_per_passage": nnz / size}


def chunk_stems(data: Path) -> list[Path]:
    return sorted(p.with_suffix("") for p in data.glob("chunk-*.json"))


def read_chunk(stem: Path, mmap: bool = True) -> tuple[np.ndarray, sp.csr_matrix, list[str], list[str]]:
    meta = json.loads(Path(f"{stem}.json").read_text())
    mode = "r" if mmap else None
    dense = np.load(f"{stem}.dense.npy", mmap_mode=mode)
    parts = [np.load(f"{stem}.sparse.{n}.npy", mmap_mode=mode) for n in ("data", "indices", "indptr")]
    sparse = sp.csr_matrix(tuple(parts), shape=(len(parts[2]) - 1, int(meta["vocab"])), copy=False)
    return dense, sparse, meta["texts"], meta["ids"]


def iter_chunks(data: Path, mmap: bool = True) -> Iterator[tuple[np.ndarray, sp.csr_matrix, list[str], list[str]]]:
    for stem in chunk_stems(data):
        yield read_chunk(stem, mmap)


def read_sparse(data: Path) -> sp.csr_matrix:
    """The corpus's learned-sparse rows, in memory."""
    return sp.vstack([sp.csr_matrix(s, copy=True) for _, s, _, _ in iter_chunks(data)], format="csr")


def read_texts(data: Path) -> list[str]:
    return [t for _, _, texts, _ in iter_chunks(data) for t in texts]


# --------------------------------------------------------------------------- queries
def query_texts(shared: Path, own: Path | None, limit: int) -> list[str]:
    """The corpus's own queries first, then every other ``shared/*/queries.jsonl`` text (sorted by
    folder), up to ``limit``: the same list benchmarks/query_path.py encodes."""
    from hybridret import load_queries

    texts = list(load_queries(own / "queries.jsonl").values()) if own and (own / "queries.jsonl").is_file() else []
    if len(texts) < limit:
        for folder in sorted(shared.iterdir()) if shared.is_dir() else []:
            if folder != own and (folder / "queries.jsonl").is_file():
                texts += list(load_queries(folder / "queries.jsonl").values())
    return texts[:limit]


def encoded_queries(index: Path, texts: list[str], retriever: Any = None) -> tuple[list[str], np.ndarray, sp.csr_matrix, str]:
    """``texts`` encoded by the index's own encoder, cached beside the index in query_path.py's file
    (``<index>.query-path.npz``), reused when it starts with these texts. Returns texts, dense,
    sparse and where they came from."""
    cache = index.with_name(index.name + ".query-path.npz")
    if cache.is_file():
        z = np.load(cache)
        have = [str(t) for t in z["texts"]]
        if have[:len(texts)] == texts:
            q = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(z["shape"]))
            return texts, np.asarray(z["dense"][:len(texts)], np.float32), q[:len(texts)], f"cached {cache}"
    if retriever is None:
        from hybridret import HybridRetriever

        retriever = HybridRetriever.load(index)
    qb = retriever.encode_queries(texts, {"dense", "sparse"})
    dense = np.asarray(qb.dense, dtype=np.float32)
    q = sp.csr_matrix(qb.sparse, dtype=np.float32)
    np.savez(cache, texts=np.array(texts, dtype=object).astype(str), dense=dense, data=q.data, indices=q.indices,
             indptr=q.indptr, shape=np.array(q.shape))
    return texts, dense, q, f"encoded now (cached in {cache})"
