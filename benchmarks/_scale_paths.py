"""The search paths scale_sparse.py times, one group per process: learned sparse, BM25, dense, hybrid.

Every group runs on one core (the caller pins the process and sets every library to one thread),
times its paths round-robin (``repeats`` rounds after an untimed warm-up run, best and median kept,
wall and process CPU time) so that load changes on a shared machine hit peers alike, and checks each
path's top-10 against a reference computed independently in the same process.
"""

from __future__ import annotations

import inspect
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from _resample import read_sparse, read_texts

K = 10
RTOL, ATOL = 1e-5, 1e-6

LABELS = {
    "windows-exact": "learned sparse exact: WindowImpactIndex (v2, the default: 8-bit impacts in row windows)",
    "windows-approx": "learned sparse approx: WindowImpactIndex mode='approx' (certified per query)",
    "windows-approx-escalated": "learned sparse approx, uncertified queries re-run exactly (escalate=True)",
    "impact-exact": "learned sparse exact: ImpactIndex (v1, pruned impact layers; before #30)",
    "tantivy-exact": "learned sparse exact: LearnedIndex, tantivy tf-grid (today)",
    "numpy-inverted": "learned sparse exact: numpy inverted index + bincount (peer)",
    "scipy-brute": "learned sparse exact: scipy Q @ D.T in document blocks (reference)",
    "impact-approx": "learned sparse approx: ImpactIndex mode='approx'",
    "bm25-store": "BM25: BM25Store, exhaustive (today)",
    "bm25-store-pruned": "BM25: BM25Store as built (v3: u8 impact windows; v2: u8 impacts, windowed MaxScore)",
    "bm25-store-v3": "BM25: BM25Store v3 (u8 impact windows, the default), same postings",
    "bm25-store-v2": "BM25: BM25Store v2 (u8 impacts, windowed MaxScore), same postings",
    "bm25-store-v1-pruned": "BM25: BM25Store v1 MaxScore over float64 factors (before #30)",
    "bm25s-numba": "BM25: bm25s numba, incl. tokenising (peer)",
    "bm25s-numba-pretokenised": "BM25: bm25s numba, pre-tokenised queries",
    "dense-hybridret": "dense: hybridret DenseIndex as built (size rule: Flat, or IVF-RaBitQ + exact re-scoring), batch",
    "dense-faiss": "dense: FAISS IndexFlatIP.search, batch",
    "dense-numpy": "dense: numpy matmul + argpartition, 64-query blocks",
    "dense-hybridret-b256": "dense: hybridret DenseIndex as built, 256-query batches (the hybrid's fusion chunk)",
    "dense-hybridret-single": "dense: hybridret DenseIndex as built, one query at a time",
    "dense-faiss-single": "dense: FAISS IndexFlatIP.search, one query at a time",
    "dense-numpy-single": "dense: numpy matvec + argpartition, one query at a time",
    "hybrid-default": "hybrid: default (GQR over dense + sparse + bm25), Searcher's plan, pre-encoded",
    "hybrid-exact-dense": "hybrid: default, with every dense part searched exactly (FAISS Flat in memory)",
    "retriever-dense": "retriever dense top-10 (library path)",
    "retriever-sparse": "retriever sparse top-10 (library path)",
    "retriever-bm25": "retriever bm25 top-10 (library path)",
    "hybrid-default-today": "hybrid: default, on the same corpus built with the tantivy tf-grid sparse part (today)",
    "retriever-sparse-today": "retriever sparse top-10 on the tf-grid index (library path, today)",
}
EXACT = ("windows-exact", "windows-approx-escalated", "impact-exact", "tantivy-exact", "numpy-inverted", "scipy-brute",
         "bm25-store-pruned", "dense-faiss", "dense-faiss-single", "dense-numpy-single")  # the dense part's paths are exact only when it is Flat


def peak_rss_mb() -> float:
    """This process's peak RSS (MB): ``VmHWM``, the high-water mark of its own address space.
    ``ru_maxrss`` would do on its own, but Linux carries the parent's RSS at fork into it, which
    floors every child at what the parent held."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def unavailable(reason: str) -> dict[str, Any]:
    return {"available": False, "reason": reason}


def impact_class() -> Any:
    try:
        from hybridret.index.impact import ImpactIndex
    except ImportError as exc:
        return exc
    return ImpactIndex


def call_flexibly(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)`` without the keywords ``fn`` does not take (an API still settling)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kw)
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kw = {k: v for k, v in kw.items() if k in params}
    return fn(*args, **kw)


# --------------------------------------------------------------------------- timing
def race(plans: dict[str, Callable[[], Any]], repeats: int, n: dict[str, int]
         ) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """Warm each plan once (its output is returned for the checks), then ``repeats`` round-robin
    rounds; ms per query (``n[name]`` queries a call): best and median, wall and CPU."""
    outs = {name: fn() for name, fn in plans.items()}
    wall: dict[str, list[float]] = {name: [] for name in plans}
    cpu: dict[str, list[float]] = {name: [] for name in plans}
    for _ in range(repeats):
        for name, fn in plans.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    res = {}
    for name in plans:
        q = max(1, n[name])
        res[name] = {"ms_per_query": 1e3 * min(wall[name]) / q, "ms_median": 1e3 * float(np.median(wall[name])) / q,
                     "cpu_ms_per_query": 1e3 * min(cpu[name]) / q, "queries_timed": n[name], "rounds": repeats}
    return res, outs


def topk_of(scores: np.ndarray, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    """Top-k columns of each row of a dense score block, descending, ties by column."""
    kk = min(k, scores.shape[1])
    top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
    part = np.take_along_axis(scores, top, axis=1)
    order = np.lexsort((top, -part), axis=1) if top.size else top
    return np.take_along_axis(top, order, axis=1), np.take_along_axis(part, order, axis=1)


def merge_topk(rows: np.ndarray, scores: np.ndarray, new_rows: np.ndarray, new_scores: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    r = np.concatenate([rows, new_rows], axis=1)
    s = np.concatenate([scores, new_scores], axis=1)
    top, part = topk_of(s)
    return np.take_along_axis(r, top, axis=1), part


# --------------------------------------------------------------------------- agreement
def share_exact(got_scores: np.ndarray, ref_scores: np.ndarray) -> float:
    """Share of queries whose top-k scores (true scores of the rows returned) equal the reference
    top-k scores, rtol 1e-5 (a missing row and a reference score <= 0 both count as 0)."""
    a = np.where(np.isfinite(got_scores) & (got_scores > 0), got_scores, 0.0)
    b = np.where(np.isfinite(ref_scores) & (ref_scores > 0), ref_scores, 0.0)
    a = -np.sort(-a, axis=1)
    return float(np.mean(np.all(np.isclose(a, b, rtol=RTOL, atol=ATOL), axis=1)))


def recall(got_true: np.ndarray, ref_scores: np.ndarray) -> float:
    """recall@k against the exact top-k, tie-aware: returned rows whose true score reaches the exact
    k-th score, over the number of exact hits with a positive score."""
    out = []
    for a, b in zip(got_true, ref_scores):
        want = int(np.sum(b > 0))
        if want == 0:
            continue
        kth = b[want - 1] * (1 - RTOL) - ATOL
        out.append(min(want, int(np.sum(np.isfinite(a) & (a > 0) & (a >= kth)))) / want)
    return float(np.mean(out)) if out else 1.0


def true_sparse_scores(D: sp.csr_matrix, Q: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
    """Exact dot products of the returned rows (``-1`` -> -inf), from the float forward store."""
    out = np.full(rows.shape, -np.inf, dtype=np.float32)
    for i in range(rows.shape[0]):
        ok = rows[i] >= 0
        if ok.any():
            out[i, ok] = (D[rows[i, ok]] @ Q[i].T).toarray().ravel()
    return out


def brute_sparse(D: sp.csr_matrix, Q: sp.csr_matrix, block: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by scipy sparse products over blocks of documents (memory bounded)."""
    nq = Q.shape[0]
    rows = np.full((nq, K), -1, dtype=np.int64)
    scores = np.full((nq, K), -np.inf, dtype=np.float32)
    for lo in range(0, D.shape[0], block):
        S = (Q @ D[lo:lo + block].T).toarray()
        r, s = topk_of(S)
        rows, scores = merge_topk(rows, scores, r + lo, s)
    return np.where(scores > 0, rows, -1), np.where(scores > 0, scores, -np.inf)


# --------------------------------------------------------------------------- groups
def group_learned(spec: dict[str, Any], Q: sp.csr_matrix, ms: np.ndarray) -> dict[str, Any]:
    from sparse_exact import NumpyInverted

    from hybridret.index.formats import open_part

    out: dict[str, Any] = {"paths": {}, "rss_after_open_MB": {}}
    r0 = rss_mb()
    t = time.perf_counter()
    D = read_sparse(Path(spec["data"]))
    out["load_forward_s"] = time.perf_counter() - t
    out["rss_after_open_MB"]["forward store (CSR, in memory)"] = rss_mb() - r0
    plans: dict[str, Callable[[], Any]] = {}
    n: dict[str, int] = {}
    Qm = Q[ms]

    def add(name: str, fn: Callable[[sp.csr_matrix], Any]) -> None:
        plans[name], n[name] = (lambda: fn(Q)), Q.shape[0]
        if ms.any() and ms.sum() < Q.shape[0]:
            plans[name + "@msmarco"], n[name + "@msmarco"] = (lambda: fn(Qm)), int(ms.sum())

    t = time.perf_counter()
    inv = NumpyInverted(D)
    out["numpy_inverted_build_s"] = time.perf_counter() - t
    add("numpy-inverted", lambda q: inv.search(q, K))
    # the reference: computed (and timed) once, outside the rounds (it is the slowest by far)
    t = time.perf_counter()
    ref_rows, ref_scores = brute_sparse(D, Q)
    brute_s = time.perf_counter() - t
    Impact = impact_class()
    impact_dir = spec.get("impact_dir")
    if isinstance(Impact, Exception):
        out["paths"]["impact-exact"] = out["paths"]["impact-approx"] = unavailable(
            f"hybridret.index.impact is not importable here ({Impact})")
    elif not impact_dir:
        out["paths"]["impact-exact"] = out["paths"]["impact-approx"] = unavailable(spec.get("impact_reason", "not built"))
    else:
        r1 = rss_mb()
        imp = Impact(impact_dir)
        out["rss_after_open_MB"]["ImpactIndex"] = rss_mb() - r1
        add("impact-exact", lambda q: call_flexibly(imp.search, q, K, threads=1, mode="exact"))
        add("impact-approx", lambda q: call_flexibly(imp.search, q, K, threads=1, mode="approx"))
    if spec.get("windows_dir"):
        from hybridret.index.impact import ImpactSearchStats
        from hybridret.index.impact_windows import WindowImpactIndex

        r1 = rss_mb()
        win = WindowImpactIndex(spec["windows_dir"])
        out["rss_after_open_MB"]["WindowImpactIndex"] = rss_mb() - r1
        out["windows_bytes_per_posting"] = win.bytes_per_posting()
        add("windows-exact", lambda q: win.search(q, K, threads=1))
        add("windows-approx", lambda q: win.search(q, K, threads=1, mode="approx"))
        add("windows-approx-escalated", lambda q: win.search(q, K, threads=1, mode="approx", escalate=True))
        st = ImpactSearchStats()
        win.search(Q, K, threads=1, mode="approx", stats=st)
        out["windows_approx_certified_share"] = float(st.certified.mean()) if len(st.certified) else None
    else:
        out["paths"]["windows-exact"] = unavailable("the index has no hybridret-impact-v2 part")
    if spec.get("learned_dir"):
        r1 = rss_mb()
        li = open_part(Path(spec["learned_dir"]))
        out["rss_after_open_MB"]["LearnedIndex"] = rss_mb() - r1
        add("tantivy-exact", lambda q: li.search(q, K, threads=1))
    else:
        out["paths"]["tantivy-exact"] = unavailable(spec.get("learned_reason", "not built"))
    res, outs = race(plans, spec["repeats"], n)
    res["scipy-brute"] = {"ms_per_query": 1e3 * brute_s / Q.shape[0], "queries_timed": Q.shape[0], "rounds": 1}
    outs["scipy-brute"] = (ref_rows, ref_scores)
    ref_ms = ref_scores[ms]
    for name, r in res.items():
        base, _, sub = name.partition("@")
        rows = np.asarray(outs[name][0])
        true = true_sparse_scores(D, Qm if sub else Q, rows)
        ref = ref_ms if sub else ref_scores
        r.update(top10_exact=share_exact(true, ref), recall_at_10=recall(true, ref))
        if sub:
            out["paths"].setdefault(base, {})["msmarco"] = r
        else:
            out["paths"].setdefault(base, {}).update({"available": True, **r})
    out["postings_per_query"] = float(np.mean([np.diff(inv.indptr)[Q.indices[Q.indptr[i]:Q.indptr[i + 1]]].sum()
                                               for i in range(Q.shape[0])]))
    out["docs"], out["terms_per_doc"] = D.shape[0], D.nnz / D.shape[0]
    out["terms_per_query"] = Q.nnz / Q.shape[0]
    out["peak_rss_MB"] = peak_rss_mb()
    return out


def group_bm25(spec: dict[str, Any], texts: list[str], ms: np.ndarray) -> dict[str, Any]:
    from hybridret.index.formats import open_part

    out: dict[str, Any] = {"paths": {}, "rss_after_open_MB": {}}
    r0 = rss_mb()
    store = open_part(Path(spec["bm25_dir"]))
    out["rss_after_open_MB"]["BM25Store"] = rss_mb() - r0
    avgdl = store.total_len / max(1, store.num_docs)
    tms = [t for t, m in zip(texts, ms) if m]
    prune_kw = "prune" in inspect.signature(store.search).parameters

    def store_search(qs: list[str], **kw: Any) -> Any:
        tokens = [list(store.analyzer.analyze(t)) for t in qs]
        return store.search(store.own_queries(tokens), avgdl, K, threads=1, **kw)

    plans: dict[str, Callable[[], Any]] = {}
    n: dict[str, int] = {}

    def add(name: str, fn: Callable[[list[str]], Any]) -> None:
        plans[name], n[name] = (lambda: fn(texts)), len(texts)
        if tms and len(tms) < len(texts):
            plans[name + "@msmarco"], n[name + "@msmarco"] = (lambda: fn(tms)), len(tms)

    if prune_kw:
        add("bm25-store", lambda qs: store_search(qs, prune=False))
        add("bm25-store-pruned", lambda qs: store_search(qs, prune=True))
        out["store_search_switch"] = "prune= (False: exhaustive, True: pruned)"
        out["store_format"] = store.meta.get("format")
        if getattr(store, "impacts", None) is not None:  # v2: today's v1 MaxScore on the same postings too
            import copy

            v1 = copy.copy(store)
            v1.impacts = None
            fac = v1.tf_factors(avgdl)

            def v1_search(qs: list[str]) -> Any:
                tokens = [list(store.analyzer.analyze(t)) for t in qs]
                return v1.search(store.own_queries(tokens), avgdl, K, threads=1, prune=True, fac=fac)

            add("bm25-store-v1-pruned", v1_search)
        other = _sibling_store(store, Path(spec["data"]).parent)
        if other is not None:  # the other impact format over the same postings, in the same run
            name = "bm25-store-v3" if other.windows is not None else "bm25-store-v2"
            out["sibling_store"] = {"path": name, "dir": str(other.root), "format": other.meta["format"]}
            add(name, lambda qs: other.search(other.own_queries([list(store.analyzer.analyze(t)) for t in qs]),
                                              avgdl, K, threads=1, prune=True))
    else:
        add("bm25-store", store_search)
        out["paths"]["bm25-store-pruned"] = unavailable("BM25Store.search has no prune= switch yet (this code "
                                                        "revision is exhaustive only)")
    try:
        import bm25s
        import Stemmer
    except ImportError as exc:
        reason = f"not installed ({exc.name}); pip install bm25s PyStemmer"
        out["paths"]["bm25s-numba"] = out["paths"]["bm25s-numba-pretokenised"] = unavailable(reason)
    else:
        out["bm25s_version"] = getattr(bm25s, "__version__", "?")
        docs = read_texts(Path(spec["data"]))
        stemmer = Stemmer.Stemmer("english")
        r1, t = rss_mb(), time.perf_counter()
        model = bm25s.BM25(method="lucene", k1=1.2, b=0.75, backend="numba")
        model.index(bm25s.tokenize(docs, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
        out["bm25s_build_s"] = time.perf_counter() - t
        del docs
        out["rss_after_open_MB"]["bm25s (index in memory)"] = rss_mb() - r1

        def tok(qs: list[str]) -> Any:
            return bm25s.tokenize(qs, stopwords="en", stemmer=stemmer, show_progress=False, return_ids=False)

        def retrieve(qt: Any) -> Any:
            qt = [q if q else ["<empty>"] for q in qt]  # bm25s rejects a query without known tokens
            return model.retrieve(qt, k=K, show_progress=False, n_threads=1)

        pre, pre_ms = tok(texts), tok(tms)
        plans["bm25s-numba-pretokenised"], n["bm25s-numba-pretokenised"] = (lambda: retrieve(pre)), len(texts)
        if tms and len(tms) < len(texts):
            plans["bm25s-numba-pretokenised@msmarco"] = lambda: retrieve(pre_ms)
            n["bm25s-numba-pretokenised@msmarco"] = len(tms)
        add("bm25s-numba", lambda qs: retrieve(tok(qs)))
    res, outs = race(plans, spec["repeats"], n)
    for name, r in res.items():
        base, _, sub = name.partition("@")
        ref = np.asarray(outs["bm25-store@msmarco" if sub else "bm25-store"][1])
        if base.startswith("bm25-store"):
            r["top10_exact"] = share_exact(np.asarray(outs[name][1]), ref)
        else:  # another analyser and length normalisation: how far the peer's top-10 is from ours
            r["top10_overlap_with_store"] = _overlap(np.asarray(outs[name][0]),
                                                    np.asarray(outs["bm25-store@msmarco" if sub else "bm25-store"][0]))
        if sub:
            out["paths"].setdefault(base, {})["msmarco"] = r
        else:
            out["paths"].setdefault(base, {}).update({"available": True, **r})
    out["peak_rss_MB"] = peak_rss_mb()
    return out


def _sibling_store(store: Any, work: Path) -> Any:
    """The same postings with the other impact format (v2 for a v3 store, v3 for a v2 one), in
    ``work/bm25-<format>`` (the v1 files hard-linked, the impact files written; kept): ``None``
    for a v1 store."""
    import os
    import shutil

    from hybridret.index.bm25 import FORMAT_V2, FORMAT_V3, BM25Store, fieldnorm_to_id, norm_table
    from hybridret.index.bm25_impacts import write_impacts
    from hybridret.index.bm25_windows import write_windows

    fmt = {FORMAT_V2: FORMAT_V3, FORMAT_V3: FORMAT_V2}.get(store.meta.get("format"))
    if fmt is None:
        return None
    root = work / f"bm25-{fmt.rsplit('-', 1)[-1]}"
    if not (root / "meta.json").is_file():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        for f in ("vocab.json", "postings.indptr.npy", "postings.docs.npy", "postings.tf.npy", "lengths.npy"):
            os.link(store.root / f, root / f)
        meta = {k: store.meta[k] for k in ("num_docs", "num_terms", "nnz", "total_len", "k1", "b")}
        a0 = store.own_avgdl
        write = write_windows if fmt == FORMAT_V3 else write_impacts
        meta.update(write(root, store.indptr, store.docs, store.tfs, fieldnorm_to_id(store.lengths), a0, norm_table(a0)),
                    format=fmt)
        (root / "meta.json").write_text(json.dumps(meta))
    return BM25Store(root)


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean([len(set(x[x >= 0].tolist()) & set(y[y >= 0].tolist())) / max(1, int((y >= 0).sum()))
                          for x, y in zip(a, b)]))


def _flat_copy(vectors: Any, metric: str = "ip") -> Any:
    """A FAISS Flat index over the float vectors (read in blocks, not through the memory map)."""
    import faiss

    flat = faiss.IndexFlatIP(vectors.shape[1]) if metric == "ip" else faiss.IndexFlatL2(vectors.shape[1])
    for a in range(0, len(vectors), 65536):
        flat.add(np.ascontiguousarray(vectors[a:a + 65536], dtype=np.float32))
    return flat


def group_dense(spec: dict[str, Any], qd: np.ndarray, ms: np.ndarray) -> dict[str, Any]:
    import faiss

    from hybridret.index.formats import open_part

    faiss.omp_set_num_threads(1)
    out: dict[str, Any] = {"paths": {}, "rss_after_open_MB": {}}
    r0 = rss_mb()
    dense = open_part(Path(spec["dense_dir"]))
    out["rss_after_open_MB"][f"DenseIndex ({dense.factory})"] = rss_mb() - r0
    out["dense_part"] = {k: dense.meta.get(k) for k in ("factory", "nprobe", "candidates", "tuned_recall_at_10")}
    out["dense_index_bytes_per_vector"] = (faiss.serialize_index(dense.index).nbytes / max(1, dense.num_docs)
                                           if dense.factory != "Flat" else 4.0 * dense.dim)
    r0 = rss_mb()
    raw = dense.index if dense.factory == "Flat" else _flat_copy(dense.vectors)  # exact FAISS Flat, the peer
    out["rss_after_open_MB"]["FAISS IndexFlatIP (peer)"] = rss_mb() - r0 if dense.factory != "Flat" else 0.0
    X = np.asarray(dense.vectors)  # memory-mapped vectors.npy
    nq = len(qd)
    single = int(spec["single_queries"])
    q1 = qd[:single]

    def numpy_batch(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, scores = [], []
        for lo in range(0, len(q), 64):
            r, s = topk_of((X @ q[lo:lo + 64].T).T)
            rows.append(r)
            scores.append(s)
        return np.vstack(rows), np.vstack(scores)

    plans: dict[str, Callable[[], Any]] = {
        "dense-hybridret": lambda: dense.search(qd, K, threads=1),
        "dense-faiss": lambda: raw.search(qd, K)[::-1],
        "dense-numpy": lambda: numpy_batch(qd),
        "dense-hybridret-b256": lambda: _stack([dense.search(qd[lo:lo + 256], K, threads=1)
                                                for lo in range(0, nq, 256)]),
        "dense-hybridret-single": lambda: _stack([dense.search(q1[i:i + 1], K, threads=1) for i in range(single)]),
        "dense-faiss-single": lambda: _stack([raw.search(q1[i:i + 1], K)[::-1] for i in range(single)]),
        "dense-numpy-single": lambda: _stack([topk_of((X @ q1[i])[None, :]) for i in range(single)]),
    }
    n = {name: (single if name.endswith("single") else nq) for name in plans}
    res, outs = race(plans, spec["repeats"], n)
    ref_rows, ref = outs["dense-numpy"]
    for name, r in res.items():
        got_rows, got = (np.asarray(a) for a in outs[name])
        r["top10_exact"] = share_exact(got, ref[:len(got)])
        r["recall_at_10"] = _overlap(got_rows, np.asarray(ref_rows)[:len(got_rows)])
        sub = ms[:len(got_rows)]
        if sub.any():  # in-domain queries (MS MARCO DL19) apart: the others are off-domain near-ties
            r["recall_at_10_msmarco"] = _overlap(got_rows[sub], np.asarray(ref_rows)[:len(got_rows)][sub])
        out["paths"][name] = {"available": True, **r}
    out["faiss_distance_compute_blas_threshold"] = int(faiss.cvar.distance_compute_blas_threshold)
    out["peak_rss_MB"] = peak_rss_mb()
    return out


def _stack(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.vstack([p[0] for p in pairs]), np.vstack([p[1] for p in pairs])


def group_hybrid(spec: dict[str, Any], texts: list[str], qd: np.ndarray, Q: sp.csr_matrix) -> dict[str, Any]:
    """The default hybrid on the index as built today, beside (``spec["index_today"]``) the same
    corpus built with the tantivy tf-grid learned-sparse part: ms/query and the share of queries
    whose top-10 rows are the same."""
    import faiss

    from hybridret import Searcher
    from hybridret.fusion.config import fuse
    from hybridret.fusion.gather import gather_candidates
    from hybridret.search.run import fused_search
    from hybridret.retrievers import REGISTRY, QueryBatch, search_rows

    faiss.omp_set_num_threads(1)
    out: dict[str, Any] = {"paths": {}, "rss_after_open_MB": {}}
    m = min(len(texts), int(spec["hybrid_queries"]))
    q = QueryBatch(texts[:m], dense=qd[:m], sparse=Q[:m])
    plans: dict[str, Callable[[], Any]] = {}
    cfg = None
    for tag, root in (("", spec["index"]), ("-today", spec.get("index_today"))):
        if not root:
            continue
        r0 = rss_mb()
        searcher = Searcher(root, threads=1)
        snap = searcher.snapshot
        out["rss_after_open_MB"][f"Searcher{tag} (every part)"] = rss_mb() - r0
        c = searcher.fusion_config("hybrid")
        cfg = cfg or c
        out[f"hybrid_config{tag}"] = c.to_dict() if c is not None else None
        out[f"parts{tag}"] = {name: type(p).__name__ for name, p in snap.segments[0].parts.items()}
        plans[f"hybrid-default{tag}"] = lambda c=c, snap=snap: fused_search(c, K, snap, q, threads=1)
        for name in ("dense", "sparse", "bm25") if not tag else ("sparse",):
            ret = REGISTRY.get(name)
            if ret is not None and ret.available(snap):
                plans[f"retriever-{name}{tag}"] = lambda ret=ret, snap=snap: search_rows(ret, snap, q, K, threads=1)
        if not tag:
            default_snap = snap
    if "hybrid-default-today" not in plans:
        out["paths"]["hybrid-default-today"] = unavailable(spec.get("today_reason", "no tf-grid index built"))
    exact = Searcher(spec["index"], threads=1)  # the same index, every compressed dense part searched exactly
    swapped = 0
    for seg in exact.snapshot.segments:
        part = seg.part("dense")
        if part is not None and part.compressed:
            part.index, part.factory, part.candidates, part.nprobe = (_flat_copy(part.vectors, part.metric), "Flat",
                                                                      None, None)
            swapped += 1
    if swapped:
        c = exact.fusion_config("hybrid")
        plans["hybrid-exact-dense"] = lambda c=c, snap=exact.snapshot: fused_search(c, K, snap, q, threads=1)
    else:
        out["paths"]["hybrid-exact-dense"] = unavailable("every dense part is Flat already: hybrid-default is exact")
    snap = default_snap
    stages: dict[str, Callable[[], Any]] = {}
    for name in cfg.union_retrievers:
        ret = REGISTRY[name]
        stages[f"{name} top-{cfg.depth}"] = lambda ret=ret: search_rows(ret, snap, q, cfg.depth, threads=1)
    stages["gather (top lists + exact union scores)"] = lambda: gather_candidates(
        cfg.union_retrievers, cfg.depth, snap, q, threads=1)
    cands = gather_candidates(cfg.union_retrievers, cfg.depth, snap, q, threads=1)
    stages["fuse"] = lambda: fuse(cfg, cands, K, snap, q, threads=1)
    res, outs = race({**plans, **{f"stage:{s}": f for s, f in stages.items()}}, spec["repeats"],
                     {name: m for name in [*plans, *(f"stage:{s}" for s in stages)]})
    for name, r in res.items():
        if name.startswith("stage:"):
            out.setdefault("hybrid_stages_ms", {})[name[6:]] = r["ms_per_query"]
            continue
        if name.endswith("-today"):  # the same corpus in the same order: rows compare directly
            mine = np.asarray(outs[name.removesuffix("-today")][0])
            r["same_top10_as_default"] = float(np.mean(np.all(np.asarray(outs[name][0]) == mine, axis=1)))
        if name == "hybrid-exact-dense":  # the same index: rows compare directly
            mine = np.asarray(outs["hybrid-default"][0])
            r["same_top10_as_default"] = float(np.mean(np.all(np.asarray(outs[name][0]) == mine, axis=1)))
            r["top10_overlap_with_default"] = _overlap(mine, np.asarray(outs[name][0]))
        out["paths"][name] = {"available": True, **r}
    out["peak_rss_MB"] = peak_rss_mb()
    return out
