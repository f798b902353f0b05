"""Exact learned-sparse top-k: hybridret's tantivy design against brute force and an in-memory
inverted index, on real SPLADE vectors.

    python benchmarks/sparse_exact.py [--index indexes/bench-msmarco-dl19-pool] [--bits 4 6 8 10]

Documents: the forward store of an index built by benchmarks/core.py. Queries: every query of every
collection in ../shared/data (real query texts; most are out of domain for the corpus, which makes
flatter score distributions and so a harder case for the proof). Reports, per approach, whether the
top-k equals brute force and queries/s on one thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, SHARED, Timer, machine, table, write_json  # noqa: E402

from hybridret import HybridRetriever  # noqa: E402
from hybridret.encoders import SpladeEncoder  # noqa: E402
from hybridret.index.sparse import SparseIndex, SparseSearchStats  # noqa: E402


def brute_topk(Q: sp.csr_matrix, D: sp.csr_matrix, k: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    DT = D.T.tocsr()
    rows = np.zeros((Q.shape[0], k), dtype=np.int64)
    scores = np.zeros((Q.shape[0], k), dtype=np.float32)
    for s in range(0, Q.shape[0], batch):
        S = (Q[s : s + batch] @ DT).toarray()
        top = np.argpartition(-S, k - 1, axis=1)[:, :k]
        part = np.take_along_axis(S, top, axis=1)
        order = np.argsort(-part, axis=1, kind="stable")
        rows[s : s + batch] = np.take_along_axis(top, order, axis=1)
        scores[s : s + batch] = np.take_along_axis(part, order, axis=1)
    return rows, scores


class NumpyInverted:
    """Posting arrays per term; scores accumulated with np.bincount (the reference's fastest exact)."""

    def __init__(self, D: sp.csr_matrix) -> None:
        C = D.tocsc()
        self.indptr, self.docs, self.w, self.n = C.indptr, C.indices, C.data, D.shape[0]

    def search(self, Q: sp.csr_matrix, k: int) -> tuple[np.ndarray, np.ndarray]:
        rows = np.zeros((Q.shape[0], k), dtype=np.int64)
        scores = np.zeros((Q.shape[0], k), dtype=np.float32)
        for i in range(Q.shape[0]):
            q = Q[i]
            parts_d, parts_w = [], []
            for t, v in zip(q.indices, q.data):
                lo, hi = self.indptr[t], self.indptr[t + 1]
                parts_d.append(self.docs[lo:hi])
                parts_w.append(self.w[lo:hi] * v)
            if not parts_d:
                continue
            acc = np.bincount(np.concatenate(parts_d), weights=np.concatenate(parts_w), minlength=self.n)
            top = np.argpartition(-acc, k - 1)[:k]
            top = top[np.argsort(-acc[top], kind="stable")]
            rows[i], scores[i] = top, acc[top]
        return rows, scores


def exact_fraction(scores: np.ndarray, ref: np.ndarray) -> float:
    ok = [np.allclose(np.where(np.isfinite(a), a, 0), np.where(b > 0, b, 0), rtol=1e-4, atol=1e-5) for a, b in zip(scores, ref)]
    return float(np.mean(ok))


def _postings(index: SparseIndex) -> float:
    """Tokens indexed per stored (doc, term) entry: 1 for buckets, the mean popcount for planes."""
    if index.scheme == "buckets":
        return 1.0
    data = np.asarray(index.forward.data)
    step = float(index.meta["step"])
    levels = np.clip(np.ceil(data / step), 1, 2**index.slots - 1).astype(np.uint32)
    return float(np.mean([bin(int(x)).count("1") for x in levels[:: max(1, len(levels) // 20000)]]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=Path, default=ROOT / "indexes" / "bench-msmarco-dl19-pool")
    ap.add_argument("--configs", nargs="+", default=["planes:4", "planes:5", "planes:6", "planes:8", "buckets:16",
                                                      "buckets:32"],
                    help="SCHEME:SLOTS (planes: bit planes; buckets: geometric weight buckets)")
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--max-queries", type=int, default=1000)
    args = ap.parse_args(argv)
    live = HybridRetriever.load(args.index).sparse  # the index's (one-segment) sparse part
    D = sp.csr_matrix(live.forward, copy=True)
    texts = []
    for folder in sorted(SHARED.iterdir()):
        qf = folder / "queries.jsonl"
        if qf.is_file():
            texts += [json.loads(line)["text"] for line in qf.open(encoding="utf-8")]
    rng = np.random.default_rng(0)
    texts = [texts[i] for i in sorted(rng.choice(len(texts), min(len(texts), args.max_queries), replace=False))]
    Q = SpladeEncoder().encode_queries(texts, batch_size=64).sparse
    nq, k = Q.shape[0], args.k
    print(f"{D.shape[0]} docs ({D.nnz / D.shape[0]:.0f} terms/doc), {nq} queries ({Q.nnz / nq:.1f} terms/query), k={k}")
    rows_out = []
    with Timer() as t:
        ref_rows, ref = brute_topk(Q, D, k, 1)
    rows_out.append({"approach": "scipy Q @ D.T, one query at a time", "exact": 1.0, "q/s": nq / t.seconds})
    with Timer() as t:
        brute_topk(Q, D, k, 64)
    rows_out.append({"approach": "scipy Q @ D.T, batches of 64", "exact": 1.0, "q/s": nq / t.seconds})
    inv = NumpyInverted(D)
    with Timer() as t:
        _, s = inv.search(Q, k)
    rows_out.append({"approach": "numpy inverted index + bincount", "exact": exact_fraction(s, ref), "q/s": nq / t.seconds})
    for spec in args.configs:
        scheme, slots = spec.split(":")
        if scheme == live.scheme and int(slots) == live.slots:
            index = live
        else:
            tmp = Path(tempfile.mkdtemp())
            kw = {"bits": int(slots)} if scheme == "planes" else {"buckets": int(slots)}
            b = SparseIndex.create(tmp / "s", D.shape[1], scheme=scheme, bm25=False, **kw)
            for s0 in range(0, D.shape[0], 5000):
                b.add(D[s0 : s0 + 5000])
            b.close()
            index = SparseIndex(tmp / "s")
        index.search(Q[:20], k, threads=1)
        st = SparseSearchStats()
        with Timer() as t:
            _, s = index.search(Q, k, threads=1, stats=st)
        with Timer() as t2:
            index.search(Q, k)
        rows_out.append({
            "approach": f"hybridret tantivy, {slots} {'bit planes' if scheme == 'planes' else 'buckets'}",
            "exact": exact_fraction(s, ref), "postings/doc-term": _postings(index),
            "q/s": nq / t.seconds, "q/s all threads": nq / t2.seconds,
            "mean depth": float(np.mean(st.fetched)), "1 round": float(np.mean(np.array(st.rounds) == 1)),
            "tantivy queries/query": float(np.mean(st.rounds)),
            "brute-force fallbacks": st.brute_force,
        })
    cols = ["approach", "exact", "q/s", "q/s all threads", "postings/doc-term", "mean depth", "1 round",
            "tantivy queries/query", "brute-force fallbacks"]
    print(table(rows_out, cols))
    write_json(RESULTS / "sparse-exact.json", {"machine": machine(), "docs": D.shape[0], "queries": nq, "k": k,
                                               "results": rows_out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
