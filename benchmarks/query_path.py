"""The query path, pre-encoded, today's code beside an older revision and the peers, in one run.

    python benchmarks/query_path.py [--index DIR ...] [--baseline REV] [--baseline-index DIR ...]

For every index (default: the 30k MS MARCO pool and cranfield, built by benchmarks/fusion.py into
indexes/bench-<name>): queries are encoded once (cached beside the index), then each code version
runs in its own process on the same vectors, on one core (process pinned to one CPU, every
library at one thread) and on all cores:

* ``dense``, ``sparse``, ``bm25``: one retriever's exact top-10 through the retriever registry;
* ``hybrid``: the default ``method="hybrid"`` (candidate gathering with exact union scores, then fusion);
* peers in the same run: a numpy inverted index (posting arrays + ``np.bincount``) on the index's own
  learned-sparse vectors, and bm25s (numba and numpy backends) on the same texts, same settings;
  the BM25 ratio compares both from query text (hybridret analyses in its timed path; bm25s's
  tokenising is included), the JSON also has bm25s on pre-tokenised queries.

``--baseline REV`` checks REV out into a temporary git worktree and runs the same measurement with
that code (on ``--baseline-index``, default the same folders: an older revision may need an index
in the format it writes). Writes benchmarks/results/query-path.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, SHARED, machine, table, write_json  # noqa: E402

DEFAULT_INDEXES = ("indexes/bench-msmarco-dl19-pool", "indexes/bench-cranfield")
MIN_SECONDS = float(os.environ.get("HYBRIDRET_BENCH_SECONDS", "1.0"))


def _rate(fn: Any, n: int, rounds: int = 3) -> float:
    """Items per second: best of ``rounds`` timed rounds of at least ``MIN_SECONDS`` each (peers.rate)."""
    from peers import rate

    return rate(fn, n, min_seconds=MIN_SECONDS, rounds=rounds)


def _collection(index: Path) -> Path | None:
    name = index.name.removeprefix("bench-")
    return SHARED / name if (SHARED / name / "corpus.jsonl").is_file() else None


def query_texts(index: Path) -> list[str]:
    """The collection's own queries; for the MS MARCO pool (43 queries) every shared query text too."""
    from hybridret import load_queries

    own = _collection(index)
    texts = list(load_queries(own / "queries.jsonl").values()) if own else []
    if len(texts) < 500:
        for folder in sorted(SHARED.iterdir()) if SHARED.is_dir() else []:
            if folder != own and (folder / "queries.jsonl").is_file():
                texts += list(load_queries(folder / "queries.jsonl").values())
    return texts[:1000]


def encoded(index: Path) -> Path:
    """Encode the query texts once per index (npz beside it) so every version sees the same vectors."""
    out = index.with_name(index.name + ".query-path.npz")
    if out.is_file():
        return out
    from hybridret import HybridRetriever

    r = HybridRetriever.load(index)
    texts = query_texts(index)
    qb = r.encode_queries(texts, {"dense", "sparse"})
    dense = np.asarray(qb.dense, dtype=np.float32)
    q = sp.csr_matrix(qb.sparse, dtype=np.float32)
    np.savez(out, texts=np.array(texts, dtype=object).astype(str), dense=dense, data=q.data, indices=q.indices,
             indptr=q.indptr, shape=np.array(q.shape))
    return out


# --------------------------------------------------------------------------- child: one code version
def child(index: Path, queries: Path, cores: int) -> dict[str, Any]:
    if cores == 1:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        import faiss
        import torch

        faiss.omp_set_num_threads(1)
        torch.set_num_threads(1)
    from hybridret import HybridRetriever
    try:
        from hybridret.fusion.config import fuse
        from hybridret.fusion.gather import gather_candidates
        from hybridret.search.run import fused_search
    except ImportError:  # a baseline revision from before hybridret/search/ and hybridret/fusion/
        from hybridret.hybrid import fuse, gather_candidates
        try:
            from hybridret.plan import fused_search
        except ImportError:  # from before the search plan
            from hybridret.hybrid import fused_search
    from hybridret.retrievers import REGISTRY, QueryBatch, search_rows

    z = np.load(queries)
    texts = [str(t) for t in z["texts"]]
    q = QueryBatch(texts, dense=z["dense"], sparse=sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(z["shape"])))
    r = HybridRetriever.load(index)
    searcher = r.searcher if hasattr(r, "searcher") else r
    snap = searcher.snapshot
    n = len(texts)
    out: dict[str, Any] = {"queries": n, "segments": len(snap.segments), "docs": int(snap.num_docs)}
    for name in ("dense", "sparse", "bm25"):
        ret = REGISTRY[name]
        ctx = ret.prepare(snap, q)
        out[name] = _rate(lambda: search_rows(ret, snap, q, 10, None, ret.prepare(snap, q)), n)
        rows, _ = search_rows(ret, snap, q, 10, None, ctx)
        out[f"{name}_rows"] = rows.tolist()
    cfg = searcher.fusion_config("hybrid")
    sub = q.slice(0, min(n, 200))
    out["hybrid_ms"] = 1000.0 / _rate(lambda: fused_search(cfg, 10, snap, sub), len(sub), rounds=2)
    out["hybrid_config"] = cfg.to_dict()
    # where the default hybrid's time goes (ms/query): each retriever's top-depth, the candidate
    # union with every exact score, then the fusion step alone on those candidates
    stages: dict[str, float] = {}
    for name in cfg.union_retrievers:
        ret = REGISTRY[name]
        stages[f"{name} top-{cfg.depth}"] = 1000.0 / _rate(
            lambda: search_rows(ret, snap, sub, cfg.depth, None, ret.prepare(snap, sub)), len(sub), rounds=2)
    stages["gather (all top lists + exact union scores)"] = 1000.0 / _rate(
        lambda: gather_candidates(cfg.union_retrievers, cfg.depth, snap, sub), len(sub), rounds=2)
    cands = gather_candidates(cfg.union_retrievers, cfg.depth, snap, sub)
    stages["fuse"] = 1000.0 / _rate(lambda: fuse(cfg, cands, 10, snap, sub), len(sub), rounds=2)
    out["hybrid_stages_ms"] = stages
    return out


def run_child(code: Path, index: Path, queries: Path, cores: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(code), HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
    if cores == 1:
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(index), str(queries), str(cores),
                        f.name], check=True, env=env, cwd=str(code))
        return json.loads(Path(f.name).read_text())


# --------------------------------------------------------------------------- peers (current code reads the index)
def peers(index: Path, queries: Path) -> dict[str, Any]:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    from hybridret import HybridRetriever

    z = np.load(queries)
    texts = [str(t) for t in z["texts"]]
    q = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(z["shape"]))
    snap = HybridRetriever.load(index).searcher.snapshot
    forward = sp.vstack([s.sparse.forward for s in snap.segments]).tocsr()
    inv = forward.T.tocsr()  # term -> postings
    n_docs = forward.shape[0]

    def numpy_inverted() -> None:
        for i in range(q.shape[0]):
            lo, hi = q.indptr[i], q.indptr[i + 1]
            terms, w = q.indices[lo:hi], q.data[lo:hi]
            starts, ends = inv.indptr[terms], inv.indptr[terms + 1]
            idx = np.concatenate([inv.indices[a:b] for a, b in zip(starts, ends)]) if len(terms) else np.empty(0, int)
            val = np.concatenate([inv.data[a:b] * wt for a, b, wt in zip(starts, ends, w)]) if len(terms) else idx
            s = np.bincount(idx, weights=val, minlength=n_docs)
            top = np.argpartition(-s, 10)[:10]
            top[np.argsort(-s[top])]

    out: dict[str, Any] = {"numpy inverted index": _rate(numpy_inverted, q.shape[0])}
    corpus = _collection(index)
    try:
        import bm25s
        import Stemmer
    except ImportError as e:
        out["bm25s"] = f"not installed ({e.name}); pip install -e '.[bench]'"
        return out
    from hybridret import CorpusReader

    docs = [f"{d.title} {d.text}".strip() for d in CorpusReader(corpus)] if corpus else []
    stemmer = Stemmer.Stemmer("english")
    for backend in ("numba", "numpy"):
        model = bm25s.BM25(method="lucene", k1=1.2, b=0.75, backend=backend)
        model.index(bm25s.tokenize(docs, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
        qt = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False, return_ids=False)
        out[f"bm25s {backend}"] = _rate(lambda: model.retrieve(qt, k=10, show_progress=False, n_threads=1), len(qt))
        out[f"bm25s {backend} incl. tokenising"] = _rate(
            lambda: model.retrieve(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False,
                                                  return_ids=False), k=10, show_progress=False, n_threads=1), len(texts))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", nargs="*", type=Path, default=[ROOT / p for p in DEFAULT_INDEXES])
    ap.add_argument("--baseline", help="git revision to measure beside the working tree")
    ap.add_argument("--baseline-index", nargs="*", type=Path, help="indexes for the baseline (default: --index)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        idx, qs, cores, dest = args.child
        Path(dest).write_text(json.dumps(child(Path(idx), Path(qs), int(cores))))
        return 0
    args.index = [p.resolve() for p in args.index]  # children run in the code's folder
    args.baseline_index = [p.resolve() for p in args.baseline_index] if args.baseline_index else None
    versions: dict[str, tuple[Path, list[Path]]] = {"current": (ROOT, list(args.index))}
    tmp = None
    if args.baseline:
        tmp = Path(tempfile.mkdtemp(prefix="hybridret-baseline-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tmp), args.baseline], check=True,
                       capture_output=True)
        versions[f"baseline {args.baseline}"] = (tmp, list(args.baseline_index or args.index))
    results: dict[str, Any] = {"machine": machine(), "indexes": {}}
    rows: list[dict[str, Any]] = []
    stage_rows: list[dict[str, Any]] = []
    try:
        for i, index in enumerate(args.index):
            qfile = encoded(index)
            entry: dict[str, Any] = {"versions": {}}
            for label, (code, idxs) in versions.items():
                for cores in (1, 0):
                    res = run_child(code, idxs[i], qfile, cores or (os.cpu_count() or 1))
                    entry["versions"][f"{label}, {'1 core' if cores == 1 else 'all cores'}"] = res
            entry["peers, 1 core"] = peers(index, qfile)
            base = [v for k, v in entry["versions"].items() if k.startswith("baseline") and k.endswith("1 core")]
            cur = entry["versions"]["current, 1 core"]
            if base:  # the same top-10 ids as the older code, per retriever (float ties aside)
                entry["same top-10 as baseline"] = {
                    n: float(np.mean([a == b for a, b in zip(cur[f"{n}_rows"], base[0][f"{n}_rows"])]))
                    for n in ("dense", "sparse", "bm25")}
                print(f"{index.name}: share of queries with the same top-10 as the baseline:",
                      entry["same top-10 as baseline"])
            for label, res in entry["versions"].items():
                for n in ("dense", "sparse", "bm25"):
                    res.pop(f"{n}_rows", None)
                stage_rows.append({"index": index.name, "code": label, **res["hybrid_stages_ms"],
                                   "hybrid ms/query": res["hybrid_ms"]})
            results["indexes"][index.name] = entry
            pe = entry["peers, 1 core"]
            for label, res in entry["versions"].items():
                row = {"index": index.name, "code": label, "segments": res["segments"],
                       "dense q/s": res["dense"], "sparse q/s": res["sparse"], "bm25 q/s": res["bm25"],
                       "hybrid ms/query": res["hybrid_ms"]}
                if label.endswith("1 core"):
                    row["sparse ÷ numpy inverted"] = res["sparse"] / pe["numpy inverted index"]
                    if isinstance(pe.get("bm25s numba"), float):  # both from query text (tokenising included)
                        row["bm25 ÷ bm25s numba"] = res["bm25"] / pe["bm25s numba incl. tokenising"]
                rows.append(row)
            rows.append({"index": index.name, "code": "peers, 1 core",
                         "sparse q/s": pe["numpy inverted index"], "bm25 q/s": pe.get("bm25s numba incl. tokenising")})
    finally:
        if tmp is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp)], check=False,
                           capture_output=True)
    cols = ["index", "code", "segments", "dense q/s", "sparse q/s", "bm25 q/s", "hybrid ms/query",
            "sparse ÷ numpy inverted", "bm25 ÷ bm25s numba"]
    print(table(rows, cols))
    print("\nthe default hybrid, ms/query by stage (first 200 queries):")
    print(table(stage_rows, list(dict.fromkeys(c for r in stage_rows for c in r))))
    results["table"], results["columns"] = rows, cols
    results["hybrid_stages"] = stage_rows
    write_json(RESULTS / "query-path.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
