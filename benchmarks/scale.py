"""Latency and memory of the dense and learned-sparse indexes as the corpus grows, on SYNTHETIC vectors.

    python benchmarks/scale.py [--sizes 10000 100000 1000000] [--max-minutes 30] [--queries 200] [--seed 0]
    python benchmarks/scale.py --quick       # sizes 2000 5000, 50 queries, every code path (CI smoke test, ~15 s)

Encoding text at 1M documents is out of reach on CPU (~50 docs/s), so the vectors are synthetic, fitted on
the real index --fit (30k MS MARCO passages, MiniLM + SPLADE-tiny). Dense: the real mean and covariance,
split between 3000 random cluster centres (share --rho) and noise, L2-normalised; queries likewise. Sparse
documents: real non-zeros per document, P(term in doc) = real df / N, weights drawn from that term's real
weights. Sparse queries: real lengths and weights, terms ~ df**a, a fitted to the real queries' median term
df. Without --fit (e.g. CI) a parametric stand-in is used ("fitted_from": null). Every index is built, then
loaded and queried, in a fresh process, so RSS numbers are not polluted by earlier work. A larger size is
skipped when the previous size's time, scaled linearly, would overrun --max-minutes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
# _common first: it sets OMP_WAIT_POLICY before FAISS loads
from _common import RESULTS, ROOT, SHARED, Timer, machine, table, write_json  # noqa: E402, I001
from peers import peak_rss  # noqa: E402
import faiss  # noqa: E402
import psutil  # noqa: E402

from hybridret.index.dense import DenseIndex  # noqa: E402
from hybridret.index._tantivy import SparseSearchStats  # noqa: E402
from hybridret.index.learned import LearnedIndex  # noqa: E402

DIM, CENTRES, CHUNK, K = 384, 3000, 20_000, 10
CPUS = os.cpu_count() or 1
IN_PROCESS = False  # --quick: run the build / query jobs in this process (RSS numbers then not meaningful)


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def fit(path: Path, rng: np.random.Generator) -> dict:
    """Statistics of the real index at ``path`` (or a parametric stand-in when it is missing)."""
    if not (path / "manifest.json").is_file():
        print(f"note: {path} not found; using a parametric stand-in for the real statistics")
        V, df = 30522, np.zeros(30522, dtype=np.int64)
        df[rng.permutation(V)[:24000]] = np.ceil(16000 / np.arange(1, 24001) ** 0.9)
        A = np.diag(rng.gamma(0.5, 1, DIM) + 0.05)
        return {"fitted_from": None, "n": 30000, "V": V, "df": df, "doc_nnz": rng.poisson(130, 1000) + 1,
                "w_data": rng.exponential(0.6, df.sum()).clip(0.01, 4), "w_ptr": np.r_[0, np.cumsum(df)],
                "alpha": 1.0, "q_nnz": rng.poisson(17, 100) + 1, "q_w": rng.exponential(0.9, 1000).clip(0.01, 3),
                "mu": np.zeros(DIM, np.float32), "A": (A / np.sqrt((A**2).sum())).astype(np.float32)}
    from hybridret.encoders import encoder_from_config
    from hybridret.retriever import HybridRetriever

    r = HybridRetriever.load(path)
    F = sp.csr_matrix(r.sparse.forward, copy=True)
    n, V = F.shape
    C = F.tocsc()
    df = np.diff(C.indptr)
    texts = [json.loads(line)["text"] for line in (SHARED / "msmarco-dl19-pool" / "queries.jsonl").open()]
    if r.manifest["encoder"].get("type") == "paired":  # only the query side of SPLADE is needed
        Q = encoder_from_config(r.manifest["encoder"]["sparse"]).encode_queries(texts).sparse
    else:
        Q = r.encode_queries(texts, {"sparse"}).sparse
    real_qdf = float(np.median(df[Q.indices]))
    order = np.sort(df[df > 0])
    best = min(np.linspace(0, 2, 41), key=lambda a: abs(  # weighted median of df under p ~ df**a
        order[np.searchsorted(np.cumsum(order**a) / (order**a).sum(), 0.5)] - real_qdf))
    X = np.asarray(r.dense.vectors, dtype=np.float64)
    ev, U = np.linalg.eigh(np.cov(X, rowvar=False))  # A.T @ A = covariance
    return {"fitted_from": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path), "n": n, "V": V,
            "df": df, "doc_nnz": np.diff(F.indptr), "w_data": C.data, "w_ptr": C.indptr, "alpha": float(best),
            "real_query_median_df": real_qdf, "q_nnz": np.diff(Q.indptr), "q_w": Q.data.copy(),
            "mu": X.mean(0).astype(np.float32), "A": (np.sqrt(np.maximum(ev, 0))[:, None] * U.T).astype(np.float32)}


class Synth:
    """Documents and queries with the fitted statistics (cluster centres fixed by ``seed``)."""

    def __init__(self, st: dict, rho: float, seed: int) -> None:
        self.st, self.rho, self.V = st, rho, st["V"]
        f = np.minimum(st["df"] / st["n"], 0.999)
        p = -np.log1p(-f)  # draws with replacement ~ p; after de-duplication P(term in doc) = df / n
        self.over, self.cum = p.sum() / f.sum(), np.cumsum(p) / p.sum()
        self.centres = np.random.default_rng([seed, 9]).standard_normal((CENTRES, DIM), dtype=np.float32) @ st["A"]

    def dense(self, m: int, rng: np.random.Generator) -> np.ndarray:
        noise = rng.standard_normal((m, DIM), dtype=np.float32) @ self.st["A"]
        x = self.st["mu"] + np.sqrt(self.rho) * self.centres[rng.integers(CENTRES, size=m)] + np.sqrt(1 - self.rho) * noise
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def sparse_docs(self, m: int, rng: np.random.Generator) -> sp.csr_matrix:
        draws = np.maximum(1, np.round(rng.choice(self.st["doc_nnz"], m) * self.over)).astype(np.int64)
        doc = np.repeat(np.arange(m, dtype=np.int64), draws)
        term = np.minimum(np.searchsorted(self.cum, rng.random(doc.size), side="right"), self.V - 1)
        doc, term = np.divmod(np.unique(doc * self.V + term), self.V)
        pick = self.st["w_ptr"][term] + (rng.random(term.size) * self.st["df"][term]).astype(np.int64)
        return sp.csr_matrix((self.st["w_data"][pick].astype(np.float32), term, np.searchsorted(doc, np.arange(m + 1))),
                             shape=(m, self.V))

    def sparse_queries(self, m: int, rng: np.random.Generator) -> sp.csr_matrix:
        p = self.st["df"].astype(np.float64) ** self.st["alpha"] * (self.st["df"] > 0)
        rows = [np.sort(rng.choice(self.V, int(min(n, (p > 0).sum())), replace=False, p=p / p.sum()))
                for n in rng.choice(self.st["q_nnz"], m)]
        data = np.concatenate([rng.choice(self.st["q_w"], len(r)) for r in rows]).astype(np.float32)
        return sp.csr_matrix((data, np.concatenate(rows), np.r_[0, np.cumsum([len(r) for r in rows])]), shape=(m, self.V))


def latency(fn, n: int) -> dict:
    """One call per query on one thread: median / p95 ms."""
    fn(0)
    ms = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        ms.append((time.perf_counter() - t) * 1000)
    return {"ms_median": float(np.median(ms)), "ms_p95": float(np.percentile(ms, 95))}


def topk_scores(S: np.ndarray, k: int = K) -> np.ndarray:
    return -np.sort(-np.partition(S, S.shape[1] - k, axis=1)[:, -k:], axis=1)


def generate(st: dict, args: argparse.Namespace, n: int, data: Path) -> float:
    """Write the ``n`` synthetic documents as chunk files (so builds read, not generate, their input)."""
    syn, rd, rs = Synth(st, args.rho, args.seed), *(np.random.default_rng([args.seed, n, i]) for i in (0, 1))
    data.mkdir()
    with Timer() as t:
        for i, s in enumerate(range(0, n, CHUNK)):
            np.save(data / f"dense-{i:05d}.npy", syn.dense(min(CHUNK, n - s), rd))
            sp.save_npz(data / f"sparse-{i:05d}.npz", syn.sparse_docs(min(CHUNK, n - s), rs), compressed=False)
    return t.seconds


def job_build(kind: str, root: Path, data: Path, vocab: int, seed: int) -> dict:
    """(Fresh process.) Stream the chunk files into a new index; only add() and close() are timed."""
    b = (LearnedIndex.create(root, vocab) if kind == "sparse"
         else DenseIndex.create(root, DIM, factory=kind, seed=seed))
    adds = []
    with peak_rss() as pk:
        for f in sorted(data.glob("sparse-*.npz" if kind == "sparse" else "dense-*.npy")):
            x = sp.load_npz(f) if kind == "sparse" else np.load(f)
            with Timer() as t:
                b.add(x)
            adds.append((t.seconds, x.shape[0]))
        with Timer() as t:
            b.close()
    n, secs, per10k = sum(m for _, m in adds), sum(a for a, _ in adds) + t.seconds, [a * 10_000 / m for a, m in adds]
    out = {"build_s": secs, "docs/s": n / secs, "close_s": t.seconds, "build_peak_MB": pk["peak_delta"] / 2**20,
           "disk_MB": sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 2**20}
    if kind == "sparse":  # tantivy: seconds per 10k docs in add(), first / median / last chunk
        out["add_s_per_10k_first_median_last"] = [per10k[0], float(np.median(per10k)), per10k[-1]]
    return out


def job_query(kind: str, root: Path, qd: np.ndarray, qs: sp.csr_matrix, params: list, nb: int) -> list:
    """(Fresh process.) Load an index, then time the queries: [(metrics, top-k rows, top-k scores)] per param."""
    nq, r0 = len(qd), rss_mb()
    with Timer() as t:
        if kind == "dense":
            ix = DenseIndex(root)
        elif kind == "faiss":
            ix, mm = faiss.IndexFlatIP(DIM), np.load(root / "vectors.npy", mmap_mode="r")
            for s in range(0, len(mm), 65536):
                ix.add(np.ascontiguousarray(mm[s : s + 65536]))
            del mm
        elif kind == "sparse":
            ix = LearnedIndex(root)
        else:  # scipy brute force over the index's own forward store
            fwd = root / "learned" if (root / "learned").is_dir() else root  # format 2 keeps it under learned/
            ld = lambda name: np.load(fwd / f"forward.{name}.npy")  # noqa: E731
            DT = sp.csr_matrix((ld("data"), ld("indices"), ld("indptr")), shape=(len(ld("indptr")) - 1, qs.shape[1])).T.tocsr()
    base, out = {"load_s": t.seconds, "rss_MB": rss_mb() - r0}, []
    for p in params:
        if kind in ("dense", "faiss"):
            if p:
                ix.set_search_params(p)
            search = (lambda q: ix.search(q, K)[::-1]) if kind == "faiss" else (lambda q: ix.search(q, K))
            faiss.omp_set_num_threads(1)
            res = latency(lambda i: search(qd[i : i + 1]), nq)
            faiss.omp_set_num_threads(CPUS)
            search(qd[:16])  # warm-up of the batch path (hybridret's imports torch for batches of 8+)
            with Timer() as t:
                rows, scores = search(qd)
        elif kind == "sparse":
            res = latency(lambda i: ix.search(qs[i], K, threads=1), nq)
            ix.search(qs[:16], K, threads=CPUS)  # warm-up of the batch path
            st = SparseSearchStats()
            with Timer() as t:
                rows, scores = ix.search(qs, K, threads=CPUS, stats=st)
            res.update(mean_depth=float(np.mean(st.fetched)), brute_fallbacks=st.brute_force,
                       doc_nnz=ix.forward.nnz / ix.num_docs)
        else:
            res = latency(lambda i: topk_scores((qs[i] @ DT).toarray()), nb) | {"queries_timed": nb}
            with Timer() as t:
                rows, scores = None, np.vstack([topk_scores((qs[s : s + 32] @ DT).toarray()) for s in range(0, nq, 32)])
        out.append((base | res | {"qps_all": nq / t.seconds, "rss_search_MB": rss_mb() - r0}, rows, scores))
    return out


def recall(got: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(np.intersect1d(a, b)) / K for a, b in zip(got, exact)]))


def fresh(fn, *a):
    """Run ``fn(*a)`` in a new interpreter (clean RSS), or here with --quick (spawning costs ~1 s a job)."""
    if IN_PROCESS:
        return fn(*a)
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn, *a).result()


def run_size(n: int, st: dict, args: argparse.Namespace, tmp: Path) -> tuple[list[dict], float]:
    syn, rng, rows = Synth(st, args.rho, args.seed), np.random.default_rng([args.seed, n, 2]), []
    qd, qs = syn.dense(args.queries, rng), syn.sparse_queries(args.queries, rng)

    def row(name: str, **kw: object) -> dict:
        rows.append({"size": n, "index": name, **kw})
        print(f"  {name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items()))
        return rows[-1]

    gen_s, flat, data = generate(st, args, n, tmp / "data"), tmp / "Flat", tmp / "data"
    print(f"  generated in {gen_s:.1f} s")
    info = fresh(job_build, "Flat", flat, data, st["V"], args.seed)
    [(res, exact, _)] = fresh(job_query, "dense", flat, qd, qs, [None], 0)
    ours = row("dense hybridret Flat", **info, **res)
    [(res, got, _)] = fresh(job_query, "faiss", flat, qd, qs, [None], 0)
    ref = row("dense faiss.IndexFlatIP direct", **res, recall10=recall(got, exact))
    ours["x_ref"] = ours["ms_median"] / ref["ms_median"]
    ivf = f"IVF{min(args.nlist, max(8, n // 64))},Flat"
    for fac in [ivf] * (n >= args.ann_min) + ["HNSW32"] * (args.ann_min <= n <= args.hnsw_max):
        d = tmp / fac.replace(",", "_")
        info = fresh(job_build, fac, d, data, st["V"], args.seed)
        params = [f"nprobe={x}" for x in args.nprobe] if fac.startswith("IVF") else [f"efSearch={args.ef}"]
        for p, (res, got, _) in zip(params, fresh(job_query, "dense", d, qd, qs, params, 0)):
            row(f"dense hybridret {fac} {p}", **info, **res, recall10=recall(got, exact))
        shutil.rmtree(d)
    shutil.rmtree(flat)

    info = fresh(job_build, "sparse", tmp / "sparse", data, st["V"], args.seed)
    [(res, _, scores)] = fresh(job_query, "sparse", tmp / "sparse", qd, qs, [None], 0)
    ours = row("sparse hybridret tantivy (exact)", **info, **res)
    [(res, _, brute)] = fresh(job_query, "scipy", tmp / "sparse", qd, qs, [None], min(args.queries, args.brute_queries))
    ref = row("sparse scipy q @ D.T one query / Q @ D.T batched qps", **res)
    ok = [np.allclose(np.where(np.isfinite(a), a, 0), np.maximum(b, 0), rtol=1e-4, atol=1e-5) for a, b in zip(scores, brute)]
    ours.update(x_ref=ours["ms_median"] / ref["ms_median"], exact_top10=float(np.mean(ok)))
    for d in (tmp / "sparse", data):
        shutil.rmtree(d)
    return rows, gen_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--max-minutes", type=float, default=30.0)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--brute-queries", type=int, default=200, help="queries timed one by one for scipy brute force")
    ap.add_argument("--fit", type=Path, default=ROOT / "indexes" / "bench-msmarco-dl19-pool")
    ap.add_argument("--rho", type=float, default=0.6, help="share of the dense covariance in the cluster centres")
    ap.add_argument("--ann-min", type=int, default=100_000, help="build IVF (and HNSW32) from this size")
    ap.add_argument("--hnsw-max", type=int, default=100_000, help="build HNSW32 up to this size")
    ap.add_argument("--nlist", type=int, default=1024)
    ap.add_argument("--nprobe", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--ef", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="sizes 2000 5000, 50 queries, every code path")
    ap.add_argument("--out", type=Path, help="default benchmarks/results/scale.json; with --quick, in the temp dir")
    args = ap.parse_args(argv)
    if args.quick:
        global IN_PROCESS
        IN_PROCESS = True
        args.sizes, args.queries, args.brute_queries, args.ann_min, args.hnsw_max = [2000, 5000], 50, 50, 2000, 2000
    args.out = args.out or (Path(tempfile.gettempdir()) / "hybridret-scale-quick.json" if args.quick else RESULTS / "scale.json")
    t0, load0 = time.perf_counter(), os.getloadavg()
    st = fit(args.fit, np.random.default_rng(args.seed))
    print(f"SYNTHETIC vectors (not encoded text), statistics fitted from {st['fitted_from'] or 'a parametric stand-in'}; "
          f"query terms ~ df**{st['alpha']:.2f}; {args.queries} queries, k={K}, {CPUS} CPUs, load average {load0[0]:.1f}")
    rows, done, skipped, budget = [], [], [], args.max_minutes * 60
    with tempfile.TemporaryDirectory(prefix="hybridret-scale-") as tmp:
        for n in sorted(args.sizes):
            spent = time.perf_counter() - t0
            if done:  # the previous size's time (less an HNSW build not repeated here), scaled linearly
                m, secs = done[-1]["size"], done[-1]["seconds"]
                secs -= sum(r["build_s"] for r in rows if r["size"] == m and "HNSW" in r["index"] and n > args.hnsw_max)
                if spent + secs * n / m > budget:
                    print(f"SKIPPED size {n:,}: {m:,} docs took {secs / 60:.1f} min, so {n:,} would take ~"
                          f"{secs * n / m / 60:.0f} min (linear), over the {args.max_minutes:g} min budget "
                          f"({spent / 60:.1f} min spent)")
                    skipped.append({"size": n, "estimated_minutes": secs * n / m / 60})
                    continue
            print(f"\n== {n:,} documents")
            t = time.perf_counter()
            got, gen_s = run_size(n, st, args, Path(tmp))
            rows += got
            done.append({"size": n, "seconds": time.perf_counter() - t, "generate_s": gen_s})
    cols = ["size", "index", "build_s", "docs/s", "disk_MB", "rss_MB", "rss_search_MB", "build_peak_MB", "ms_median",
            "ms_p95", "qps_all", "x_ref", "recall10", "exact_top10"]
    print("\n" + table(rows, cols))
    total = time.perf_counter() - t0
    print(f"\nSYNTHETIC data; total {total / 60:.1f} min; load average {os.getloadavg()[0]:.1f} at the end. MB: increase "
          f"over a {'process (--quick: in-process, RSS not meaningful)' if IN_PROCESS else 'fresh process'}; x_ref: "
          "our median ms / the reference's (FAISS direct; scipy one query at a time)")
    write_json(args.out, {"synthetic": True, "machine": machine(), "k": K, "queries": args.queries, "seed": args.seed,
                          "fitted_from": st["fitted_from"], "query_df_exponent": st["alpha"], "rho": args.rho,
                          "dense_centres": CENTRES, "sizes_done": done, "in_process": IN_PROCESS,
                          "skipped": skipped, "total_s": total, "load_average_start_end": [load0[0], os.getloadavg()[0]],
                          "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
