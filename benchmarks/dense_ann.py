"""The compressed dense part against exact search, on real MiniLM vectors and corpora resampled from
them, one core (issue #31's design measurements; scale_sparse.py times the part inside the engine).

    python benchmarks/dense_ann.py --index /work/bench/bench-msmarco-dl19-pool --sizes 30k,1M
    python benchmarks/dense_ann.py --smoke        # 3,000 vectors, a few queries (CI: tests/test_scale_benchmark.py)

Per size: the dense vectors (the real pool's for ``30k``; resampled as in ``_resample.py`` for any
other size) written to a dense part by :class:`hybridret.index.dense.DenseIndex` with ``factory="auto"``
(the size rule, ``--min-rows 0`` so that every size is compressed) and, beside it, FAISS ``Flat``;
real query texts encoded by the index's encoder (cached beside the index, shared with
scale_sparse.py). Reported, every query path pinned to one core:

* the tuning the build chose (nprobe, candidates), the recall it measured on its stand-in queries,
  and the **recall@10 of real queries** against exact search (the same float vectors): all of them,
  the 43 MS MARCO DL19 queries (in-domain) and the other collections' (off-domain: their nearest
  MS MARCO passage has cosine ~0.4, so their exact top-10 is a near-tie spread over the collection);
* a grid of (nprobe, candidates) around it, with its recall@10 and ms/query, one query at a time;
* ms/query one query at a time for the part, FAISS ``IndexFlatIP``, and the ratio;
* bytes per vector: the FAISS index in memory (what a search keeps resident) against float32;
* build seconds (training, adding, tuning) and the stand-in queries' recall at other distances
  (``--proxy-cosines``), to calibrate :data:`hybridret.index.dense_auto.PROXY_COSINE`.

Writes ``benchmarks/results/dense-ann.json`` (``--out``).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _resample as rs  # noqa: E402
from _common import RESULTS, ROOT, SHARED, machine, table, write_json  # noqa: E402

logger = logging.getLogger("bench")
POOL = SHARED / "msmarco-dl19-pool"


def pin_one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import faiss

    faiss.omp_set_num_threads(1)


def vectors_of_size(src: Any, n: int, seed: int) -> np.ndarray:
    if n == src.n:
        return np.ascontiguousarray(src.dense, dtype=np.float32)
    res = rs.Resampler.__new__(rs.Resampler)  # dense only: the texts' word tables are not needed
    res.src, res.seed = src, seed
    out = np.empty((n, src.dense.shape[1]), dtype=np.float32)
    for c in range((n + rs.CHUNK - 1) // rs.CHUNK):
        lo, hi = c * rs.CHUNK, min(n, (c + 1) * rs.CHUNK)
        rng = np.random.default_rng([seed, n, c])
        a, b = res.pairs(rng, hi - lo)
        out[lo:hi] = res.dense(a, b, rng)
    return out


def timed_single(fn: Any, queries: np.ndarray, repeats: int) -> tuple[float, np.ndarray]:
    """Best-of-``repeats`` ms/query, one query at a time, and the rows of the last round."""
    fn(queries[:1])
    best, rows = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        rows = np.vstack([fn(queries[i:i + 1]) for i in range(len(queries))])
        best = min(best, (time.perf_counter() - t) * 1e3 / len(queries))
    return best, rows


def run_size(n: int, X: np.ndarray, qd: np.ndarray, ms: np.ndarray, args: argparse.Namespace, work: Path
             ) -> dict[str, Any]:
    import faiss

    from hybridret.index.dense import DenseIndex
    from hybridret.index.dense_auto import ann_candidates, exact_scores, exact_topk, proxy_queries, recall_at

    k = 10
    out: dict[str, Any] = {"size": n, "dim": int(X.shape[1]), "queries": len(qd)}
    root = work / f"dense-{n}"
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    b = DenseIndex.create(root, X.shape[1], factory="auto", min_rows=args.min_rows)
    for a in range(0, n, 65536):
        b.add(X[a:a + 65536])
    t1 = time.perf_counter()
    b.close()
    out["build_s"] = {"write_vectors": t1 - t0, "train_add_tune": time.perf_counter() - t1}
    part = DenseIndex(root)
    out["factory"], out["nprobe"], out["candidates"] = part.factory, part.nprobe, part.candidates
    out["tuned_recall_proxy"] = part.meta.get("tuned_recall_at_10")
    out["index_bytes_per_vector"] = faiss.serialize_index(part.index).nbytes / n
    out["float32_bytes_per_vector"] = 4 * X.shape[1]
    truth, _ = exact_topk(part.vectors, qd, k)
    flat = faiss.IndexFlatIP(X.shape[1])
    flat.add(X)
    single = qd[:args.single]
    ms_flat, _ = timed_single(lambda q: flat.search(q, k)[1], single, args.repeats)
    ms_part, rows = timed_single(lambda q: part.search(q, k, threads=1)[0], single, args.repeats)
    batch_rows, _ = part.search(qd, k, threads=1)
    out["recall_real"] = recall_at(batch_rows, truth)
    out["recall_msmarco"] = recall_at(batch_rows[ms], truth[ms]) if ms.any() else None
    out["recall_other"] = recall_at(batch_rows[~ms], truth[~ms]) if (~ms).any() else None
    out["ms_flat_single"], out["ms_part_single"] = ms_flat, ms_part
    out["x_flat"] = ms_flat / ms_part
    del flat
    # the grid around the tuned setting
    grid = []
    for nprobe in args.nprobes:
        if nprobe > faiss.extract_index_ivf(part.index).nlist:
            continue
        cand_rows = ann_candidates(part.index, qd, max(args.candidates), nprobe)
        scores = exact_scores(part.vectors, qd, cand_rows)
        for c in args.candidates:
            s = scores[:, :c]
            top = np.argsort(-s, axis=1, kind="stable")[:, :k]
            found = np.take_along_axis(cand_rows[:, :c], top, 1)
            part.nprobe, part.candidates = nprobe, c
            ms_q, _ = timed_single(lambda q: part.search(q, k, threads=1)[0], single[:args.grid_single], 1)
            grid.append({"nprobe": nprobe, "candidates": c, "recall": recall_at(found, truth),
                         "recall_msmarco": recall_at(found[ms], truth[ms]) if ms.any() else None,
                         "recall_other": recall_at(found[~ms], truth[~ms]) if (~ms).any() else None, "ms": ms_q})
    out["grid"] = grid
    # stand-in queries at other distances: the recall each would report for the tuned setting
    part.nprobe, part.candidates = out["nprobe"], out["candidates"]
    rng = np.random.default_rng(0)
    picked = np.sort(rng.choice(n, size=min(256, n), replace=False))
    proxies = {}
    for cos in args.proxy_cosines:
        q = proxy_queries(np.asarray(part.vectors[picked]), np.random.default_rng(1), cos)
        t, _ = exact_topk(part.vectors, q, k, exclude=picked)
        cand = ann_candidates(part.index, q, out["candidates"] + 1, out["nprobe"])
        cand[cand == picked[:, None]] = -1
        s = exact_scores(part.vectors, q, cand)
        top = np.argsort(-s, axis=1, kind="stable")[:, :k]
        proxies[str(cos)] = recall_at(np.take_along_axis(cand, top, 1), t)
    out["proxy_recall_at_tuned"] = proxies
    # a top-100 (the hybrid's depth per retriever): recall@100 by the candidates re-scored
    truth100, _ = exact_topk(part.vectors, qd, 100)
    deep = []
    cand100 = ann_candidates(part.index, qd, 1000, out["nprobe"])
    s100 = exact_scores(part.vectors, qd, cand100)
    for depth in (100, 200, 400, 1000):
        top = np.argsort(-s100[:, :depth], axis=1, kind="stable")[:, :100]
        deep.append({"k": 100, "candidates": depth,
                     "recall": recall_at(np.take_along_axis(cand100[:, :depth], top, 1), truth100)})
    out["top100"] = deep
    shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=Path, default=None,
                    help="source index of real passages (default indexes/bench-msmarco-dl19-pool[-smoke200]; "
                         "built if absent)")
    ap.add_argument("--sizes", default="30k,1M")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--single", type=int, default=200, help="queries timed one at a time")
    ap.add_argument("--grid-single", type=int, default=100, help="queries timed per grid point")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-rows", type=int, default=0, help="the size rule's threshold (0: compress every size)")
    ap.add_argument("--nprobes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32, 64, 128])
    ap.add_argument("--candidates", type=lambda s: [int(x) for x in s.split(",")], default=[40, 100, 200, 300])
    ap.add_argument("--proxy-cosines", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 0.8, 0.7, 0.6])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.smoke:
        args.sizes, args.queries, args.single, args.grid_single, args.repeats = "3000", 40, 10, 5, 1
        args.nprobes, args.candidates, args.proxy_cosines = [4, 8], [40, 100], [1.0, 0.7]
    args.index = args.index or ROOT / "indexes" / ("bench-msmarco-dl19-pool" + ("-smoke200" if args.smoke else ""))
    pin_one_core()
    built = None
    if not (args.index / "manifest.json").is_file():
        corpus = POOL if (POOL / "corpus.jsonl").is_file() else ROOT / "hybridret" / "resources" / "sample"
        built = rs.build_source(args.index, corpus, 200 if args.smoke else None)
    src = rs.load_source(args.index)
    texts, qd, _, how = rs.encoded_queries(args.index, rs.query_texts(SHARED, POOL if (POOL / "queries.jsonl").is_file()
                                                                     else ROOT / "hybridret" / "resources" / "sample",
                                                                     args.queries), built)
    pool_q = set(rs.query_texts(SHARED, POOL, 10**9)[:43]) if (POOL / "queries.jsonl").is_file() else set()
    ms = np.array([t in pool_q for t in texts], dtype=bool)  # the in-domain subset: MS MARCO DL19 queries
    sizes = []
    for tok in args.sizes.split(","):
        t = tok.strip().lower()
        sizes.append(src.n if t in ("30k", "real") else int(float(t.rstrip("km")) * (1000 if t.endswith("k") else
                                                                                   1_000_000 if t.endswith("m") else 1)))
    work = Path(tempfile.mkdtemp(prefix="dense-ann-", dir=args.workdir))
    results = []
    try:
        for n in sizes:
            X = vectors_of_size(src, n, args.seed)
            print(f"size {n:,}: {X.nbytes / 1e9:.2f} GB of float32 vectors; {len(qd)} queries ({how})", flush=True)
            res = run_size(n, X, qd, ms, args, work)
            del X
            results.append(res)
            print(table([res], ["size", "factory", "nprobe", "candidates", "tuned_recall_proxy", "recall_real",
                                "recall_msmarco", "recall_other", "ms_part_single", "ms_flat_single", "x_flat",
                                "index_bytes_per_vector"]))
            print(table(res["grid"], ["nprobe", "candidates", "recall", "recall_msmarco", "recall_other", "ms"]))
            print("stand-in queries' recall at the tuned setting, by cosine:", res["proxy_recall_at_tuned"], flush=True)
            print(table(res["top100"], ["k", "candidates", "recall"]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = args.out or (Path(tempfile.gettempdir()) / "dense-ann-smoke.json" if args.smoke else RESULTS / "dense-ann.json")
    write_json(out, {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
