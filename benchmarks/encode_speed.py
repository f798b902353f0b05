"""Encoding speed, build memory, query-encoding latency and the quality cost of each encoder backend
(numpy, torch, torch-bf16, torch-int8; hybridret/encoders/backends.py).

    python benchmarks/encode_speed.py                       # the default run (~25 min on 2 idle cores)
    python benchmarks/encode_speed.py --quick               # a smoke run (small slices, two collections)
    python benchmarks/encode_speed.py --sections speed queries --backends numpy torch --no-today --no-peers
                                                            # numpy against torch, both in one run
    python benchmarks/encode_speed.py --msmarco-quality 30005   # also nDCG@10 on the msmarco-dl19 pool (hours on CPU)

"today" is the committed hybridret (``git archive HEAD hybridret``, run from a temporary folder), so
the memory cap and the query-overhead cuts are measured against the code they replace, in the same run.
Every measurement runs in its own subprocess: peak RSS is that process's ``VmHWM``, and thread
settings do not leak. Sections:

* speed: docs/s of the dense encoder, the sparse encoder, and a whole build (both encoders, BM25,
  FAISS, sparse index) of the first ``--speed-docs`` msmarco-dl19-pool passages, on all cores and on
  1 thread (``--one-thread-docs`` passages); peers: sentence-transformers' torch and ONNX backends.
* memory: peak RSS of a whole build of ``--rss-docs`` passages at batch 8/32/64, today and now.
* quality: nDCG@10 (dense, sparse, default hybrid) per collection and backend; a whole build of each
  collection, timed (cisi gives the second build-speed figure).
* queries: one query at a time through both models, median/p95 ms, today and now.

Writes benchmarks/results/encode-speed.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, SHARED, machine, table, write_json  # noqa: E402

COLLECTIONS = ("adi", "cisi", "cranfield", "medline", "limit-small")
SECTIONS = ("vectors", "interleaved", "speed", "rss", "queries", "quality")
MSMARCO = SHARED / "msmarco-dl19-pool"


# ---------------------------------------------------------------- workers (run in subprocesses)

def _texts(n: int, corpus: str = "msmarco") -> list[Any]:
    """The first ``n`` msmarco-dl19-pool passages, or (``"chunks"``) the first ``n`` chunks of 200
    tokens of long documents: the Python standard library's modules of 4-79 KB, as issue 33's test did."""
    from hybridret import CorpusReader, Document

    if corpus == "chunks":
        import sysconfig

        from hybridret.chunking import Chunker
        from hybridret.encoders import DenseEncoder

        chunker = Chunker(200, encoder=DenseEncoder(backend="numpy"))
        files = sorted(p for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py") if 4096 <= p.stat().st_size <= 80_000)
        chunks: list[Any] = []
        for f in files:
            chunks += chunker.chunk(Document(f.stem, f.read_text(encoding="utf-8", errors="replace"), title=f.name))
            if len(chunks) >= n:
                break
        return chunks[:n]
    out = []
    for doc in CorpusReader(MSMARCO, format="beir"):
        out.append(doc)
        if len(out) >= n:
            break
    return out


def _peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _encoders(backend: str) -> tuple[Any, Any]:
    from hybridret.encoders import DenseEncoder, SpladeEncoder

    return DenseEncoder(backend=backend).warm(), SpladeEncoder(backend=backend).warm()


def _retriever(backend: str) -> Any:
    from hybridret import HybridRetriever

    return HybridRetriever.from_models(backend=backend)


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def work_speed(job: dict[str, Any]) -> dict[str, Any]:
    docs = _texts(job["docs"], job.get("corpus", "msmarco"))
    texts = [d.full_text for d in docs]
    dense, sparse = _encoders(job["backend"])
    out: dict[str, Any] = {}
    for name, enc in (("dense", dense), ("sparse", sparse)):
        enc.encode_documents(texts[:16])
        out[f"{name}_docs_s"] = len(texts) / _timed(lambda enc=enc: enc.encode_documents(texts, show_progress=False))
    if job.get("build", True):
        r = _retriever(job["backend"])
        r.encoder.warm()
        out["build_docs_s"] = len(docs) / _timed(lambda: r.index(docs, show_progress=False))
    out["both_docs_s"] = 1 / (1 / out["dense_docs_s"] + 1 / out["sparse_docs_s"])
    return out


def work_interleaved(job: dict[str, Any]) -> dict[str, Any]:
    """Every backend in one process, taking turns on the same texts for ``rounds`` rounds: on a shared,
    loaded machine the turns see the same load, so their ratios hold where separate runs' do not.
    numpy here is today's numpy backend (this change leaves its code as it was)."""
    import numpy as np

    texts = [d.full_text for d in _texts(job["docs"], job.get("corpus", "msmarco"))]
    encs = {b: _encoders(b) for b in job["backends"]}
    peer = None
    if job.get("peer"):
        from sentence_transformers import SentenceTransformer

        from hybridret.models import resolve_model

        peer = SentenceTransformer(resolve_model("all-MiniLM-L6-v2"), device="cpu", local_files_only=True)
        peer.max_seq_length = 256
        peer.encode(texts[:8], batch_size=32)
    for dense, sparse in encs.values():
        dense.encode_documents(texts[:8])
        sparse.encode_documents(texts[:8])
    times: dict[str, list[float]] = {f"{b}_{m}": [] for b in encs for m in ("dense", "sparse")}
    if peer is not None:
        times["st-torch_dense"] = []
    for _ in range(job["rounds"]):
        for b, (dense, sparse) in encs.items():
            times[f"{b}_dense"].append(_timed(lambda e=dense: e.encode_documents(texts, show_progress=False)))
            times[f"{b}_sparse"].append(_timed(lambda e=sparse: e.encode_documents(texts, show_progress=False)))
        if peer is not None:
            times["st-torch_dense"].append(_timed(lambda: peer.encode(texts, batch_size=32, show_progress_bar=False)))
    out: dict[str, Any] = {"texts": len(texts), "rounds": job["rounds"]}
    for key, ts in times.items():
        out[f"{key}_docs_s"] = len(texts) / float(np.median(ts))
        out[f"{key}_docs_s_best"] = len(texts) / min(ts)
    for b in encs:
        both = [d + s for d, s in zip(times[f"{b}_dense"], times[f"{b}_sparse"])]
        out[f"{b}_both_docs_s"] = len(texts) / float(np.median(both))
        out[f"{b}_both_docs_s_best"] = len(texts) / min(both)
    return out


def work_vectors(job: dict[str, Any]) -> dict[str, Any]:
    """Each backend's vectors against the reference's on the same passages: dense cosine per text,
    overlap of the 20 heaviest sparse terms, the largest sparse weight difference."""
    import numpy as np

    texts = [d.full_text for d in _texts(job["docs"], job.get("corpus", "msmarco"))]
    got = {}
    for b in [job["reference"], *job["backends"]]:
        dense, sparse = _encoders(b)
        got[b] = (dense.encode_documents(texts).dense, sparse.encode_documents(texts).sparse.toarray())
    ref_d, ref_s = got[job["reference"]]
    out: dict[str, Any] = {"texts": len(texts), "reference": job["reference"]}
    for b in job["backends"]:
        d, sp_ = got[b]
        cos = (d * ref_d).sum(axis=1)
        top = lambda m: np.argsort(-m, axis=1)[:, :20]  # noqa: E731
        overlap = [len(set(a) & set(r)) / 20 for a, r in zip(top(sp_), top(ref_s))]
        out[b] = {"dense_cos_min": float(cos.min()), "dense_cos_mean": float(cos.mean()),
                  "sparse_top20_overlap_mean": float(np.mean(overlap)), "sparse_top20_overlap_min": float(min(overlap)),
                  "sparse_max_abs_diff": float(np.abs(sp_ - ref_s).max())}
    return out


def work_peer(job: dict[str, Any]) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    from hybridret.models import resolve_model

    texts = [d.full_text for d in _texts(job["docs"], job.get("corpus", "msmarco"))]
    kw = {"backend": "onnx"} if job["peer"] == "st-onnx" else {}
    try:
        model = SentenceTransformer(resolve_model("all-MiniLM-L6-v2"), device="cpu", local_files_only=True, **kw)
    except Exception as exc:  # noqa: BLE001 - reported, not raised: a peer that cannot run offline is skipped
        return {"skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    model.max_seq_length = 256
    model.encode(texts[:16], batch_size=32)
    return {"dense_docs_s": len(texts) / _timed(lambda: model.encode(texts, batch_size=32, show_progress_bar=False))}


def work_rss(job: dict[str, Any]) -> dict[str, Any]:
    docs = _texts(job["docs"])
    r = _retriever(job["backend"])
    r.encoder.warm()
    loaded = _peak_mb()
    r.index(docs, batch_size=job["batch_size"], show_progress=False)
    return {"peak_rss_mb": _peak_mb(), "after_load_mb": loaded}


def work_query(job: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from hybridret import load_beir
    from hybridret.encoders import PairedEncoder

    if job.get("text"):  # one short query, again and again: the fixed cost of a query's encoding
        queries = [job["text"]] * job["queries"]
    else:
        queries = []
        for name in ("msmarco-dl19-pool", "cisi", "cranfield"):
            queries += list(load_beir(SHARED / name)[1].values())
        queries = queries[: job["queries"]]
    if job.get("backends"):  # every backend in one process, taking turns query by query
        encs = {b: PairedEncoder.from_names(backend=b).warm() for b in job["backends"]}
        for e in encs.values():
            for q in queries[:20]:
                e.encode_queries([q])
        per: dict[str, list[float]] = {b: [] for b in encs}
        for q in queries:
            for b, e in encs.items():
                t = time.perf_counter()
                e.encode_queries([q])
                per[b].append((time.perf_counter() - t) * 1e3)
        return {b: {"median_ms": float(np.median(ts)), "p95_ms": float(np.percentile(ts, 95)), "queries": len(ts)}
                for b, ts in per.items()}
    enc = PairedEncoder.from_names(backend=job["backend"])
    enc.warm()
    for q in queries[:20]:
        enc.encode_queries([q])
    times = []
    for q in queries:
        t = time.perf_counter()
        enc.encode_queries([q])
        times.append((time.perf_counter() - t) * 1e3)
    return {"median_ms": float(np.median(times)), "p95_ms": float(np.percentile(times, 95)), "queries": len(times),
            "backends": sorted({r.backend for r in (enc.dense.runner, enc.sparse.runner)})}


def work_quality(job: dict[str, Any]) -> dict[str, Any]:
    from hybridret import CorpusReader, load_beir
    from hybridret.eval import evaluate, run_from_hits

    folder = SHARED / job["collection"]
    _, queries, qrels = load_beir(folder)
    docs = list(CorpusReader(folder, format="beir"))
    if job.get("limit"):
        docs = docs[: job["limit"]]
    qids = [q for q in queries if q in qrels]
    r = _retriever(job["backend"])
    r.encoder.warm()
    build_s = _timed(lambda: r.index(docs, show_progress=False))
    level = 2 if "msmarco" in job["collection"] else 1
    out: dict[str, Any] = {"docs": len(docs), "queries": len(qids), "build_docs_s": len(docs) / build_s}
    for method in ("dense", "sparse", "hybrid"):
        hits = r.search([queries[q] for q in qids], k=10, method=method)
        out[method] = evaluate(run_from_hits(hits, qids), qrels, ["ndcg@10"], relevance_level=level)["ndcg@10"]
    return out


WORKERS = {"vectors": work_vectors, "interleaved": work_interleaved, "speed": work_speed, "peer": work_peer, "rss": work_rss, "query": work_query, "quality": work_quality}


def worker_main(spec: str) -> int:
    import logging

    logging.getLogger("hybridret").setLevel(logging.WARNING)
    job = json.loads(spec)
    if job["backend"].startswith("torch") or job.get("peer") or any(b.startswith("torch") for b in job.get("backends", [])):
        # numpy's BLAS threads follow OPENBLAS_NUM_THREADS (run_job)
        import torch

        torch.set_num_threads(job.get("threads") or os.cpu_count() or 1)
    print("RESULT " + json.dumps(WORKERS[job["task"]](job)), flush=True)
    return 0


# ---------------------------------------------------------------- driver

def export_today(dest: Path, ref: str = "HEAD") -> Path:
    """The hybridret package at git ``ref``, unpacked under ``dest`` (read-only use of git)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "hybridret"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def run_job(job: dict[str, Any], today: Path | None = None, timeout: float = 3600) -> dict[str, Any]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE",
               PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = str(today) if today is not None else str(ROOT)
    if job.get("threads"):
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(job["threads"])
        env["HYBRIDRET_ENCODE_THREADS"] = str(job["threads"])
    cwd = str(today) if today is not None else str(ROOT)  # today's package must win over the working tree's
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        res = {"error": " | ".join(tail)[:400]}
    else:
        res = json.loads(line[len("RESULT "):])
    res["wall_s"] = round(time.perf_counter() - t, 1)
    print(f"  {job} -> {res}", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--backends", nargs="+", default=["numpy", "onnx", "onnx-int8", "torch", "torch-bf16", "torch-int8"])
    ap.add_argument("--reference", default="numpy",
                    help="the backend nDCG@10 losses are measured against (numpy: float32, the same vectors as torch)")
    ap.add_argument("--no-today", action="store_true", help="skip the committed hybridret's runs (today)")
    ap.add_argument("--today-ref", default="HEAD", help="the git commit or branch 'today' is (default HEAD)")
    ap.add_argument("--today-backend", default="torch", help="the backend 'today' runs (default torch)")
    ap.add_argument("--corpora", nargs="+", default=["msmarco"], choices=("msmarco", "chunks"),
                    help="speed: msmarco-dl19-pool passages and/or chunks of 200 tokens of long documents")
    ap.add_argument("--peers", nargs="*", default=["st-torch", "st-onnx"], help="sentence-transformers peers")
    ap.add_argument("--vector-docs", type=int, default=200, help="vectors: texts compared (default 200)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved: turns per backend (default 3)")
    ap.add_argument("--query-text", default=None,
                    help="queries: time this one query (e.g. ~10 tokens) instead of the collections' queries")
    ap.add_argument("--speed-docs", type=int, default=2000, help="msmarco passages for docs/s on all cores (2000)")
    ap.add_argument("--one-thread-docs", type=int, default=500, help="passages for docs/s on 1 thread (500)")
    ap.add_argument("--rss-docs", type=int, default=1000, help="passages per peak-RSS build (1000)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--rss-backends", nargs="+", default=None, help="backends whose build RSS is measured (all)")
    ap.add_argument("--collections", nargs="+", default=list(COLLECTIONS))
    ap.add_argument("--msmarco-quality", type=int, default=0, metavar="N",
                    help="also nDCG@10 on the first N msmarco-dl19-pool passages (30005: the full pool; slow)")
    ap.add_argument("--queries", type=int, default=300, help="single queries timed per configuration (300)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--quick", action="store_true", help="small slices, two collections: a smoke run")
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS,
                    help="what to run (default: all); results of other sections already in --output are kept")
    ap.add_argument("--output", type=Path, default=RESULTS / "encode-speed.json")
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    if args.quick:
        args.speed_docs, args.one_thread_docs, args.rss_docs, args.queries = 200, 100, 200, 50
        args.collections = ["adi", "limit-small"]
    if not MSMARCO.is_dir():
        print(f"{MSMARCO} not found: nothing to measure", file=sys.stderr)
        return 2
    started = time.time()
    out: dict[str, Any] = {"vectors": [], "interleaved": [], "speed": [], "peers": [], "rss": [], "queries": [], "quality": []}
    if args.output.is_file():  # keep the sections not run this time
        out.update({k: v for k, v in json.loads(args.output.read_text()).items() if k in out})
    for section in args.sections:
        out[section] = []
    if "speed" in args.sections:
        out["peers"] = []
    out["machine"] = machine()
    out.setdefault("args", {})
    out["args"].update({f"{sec}": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                                   if k not in ("worker", "sections")} for sec in args.sections})
    with tempfile.TemporaryDirectory(prefix="hybridret-today-") as tmp:
        today = export_today(Path(tmp), args.today_ref)
        runs = (([] if args.no_today else [("today", args.today_backend, today)])
                + [("now", b, None) for b in args.backends])
        if "vectors" in args.sections:
            print("## vectors against the reference backend", flush=True)
            for corpus in args.corpora:
                res = run_job({"task": "vectors", "backend": "numpy", "reference": args.reference, "corpus": corpus,
                               "backends": [b for b in args.backends if b != args.reference], "docs": args.vector_docs})
                for b in args.backends:
                    if isinstance(res.get(b), dict):
                        out["vectors"].append({"corpus": corpus, "backend": b, "reference": args.reference,
                                               "texts": res["texts"], **res[b]})
        if "interleaved" in args.sections:
            print("## interleaved: every backend in one process, taking turns", flush=True)
            for corpus in args.corpora:
                for threads, n in ((1, args.one_thread_docs), (None, args.speed_docs)):
                    res = run_job({"task": "interleaved", "backend": "numpy", "backends": args.backends, "docs": n,
                                   "threads": threads, "corpus": corpus, "rounds": args.rounds,
                                   "peer": not args.no_peers and "st-torch" in args.peers}, timeout=7200)
                    out["interleaved"].append({"corpus": corpus, "threads": "all" if threads is None else "1",
                                               "docs": n, **res})
        if "speed" in args.sections:
            print("## speed", flush=True)
            for corpus in args.corpora:
                for threads, n in ((None, args.speed_docs), (1, args.one_thread_docs)):
                    label = "all" if threads is None else "1"
                    for impl, backend, where in runs:
                        res = run_job({"task": "speed", "backend": backend, "docs": n, "threads": threads,
                                       "corpus": corpus}, where)
                        out["speed"].append({"corpus": corpus, "impl": impl, "backend": backend, "threads": label,
                                             "docs": n, **res})
                    if not args.no_peers:
                        for peer in args.peers:
                            res = run_job({"task": "peer", "peer": peer, "docs": n, "threads": threads,
                                           "corpus": corpus})
                            out["peers"].append({"corpus": corpus, "peer": peer, "threads": label, "docs": n, **res})
        if "rss" in args.sections:
            print("## peak RSS of a build", flush=True)
            for bs in args.batch_sizes:
                for impl, backend, where in runs:
                    if impl == "now" and args.rss_backends and backend not in args.rss_backends:
                        continue
                    res = run_job({"task": "rss", "backend": backend, "docs": args.rss_docs, "batch_size": bs}, where)
                    out["rss"].append({"impl": impl, "backend": backend, "batch_size": bs, "docs": args.rss_docs, **res})
        if "queries" in args.sections:
            print("## one query through both models", flush=True)
            for threads in (1, None):
                res = run_job({"task": "query", "backend": "numpy", "backends": args.backends, "queries": args.queries,
                               "threads": threads, "text": args.query_text})
                for b in args.backends:
                    if isinstance(res.get(b), dict):
                        out["queries"].append({"impl": "now, interleaved", "backend": b,
                                               "query": args.query_text or "collections",
                                               "threads": "all" if threads is None else "1", **res[b]})
            for threads in (None, 1):
                for impl, backend, where in runs:
                    res = run_job({"task": "query", "backend": backend, "queries": args.queries, "threads": threads,
                                   "text": args.query_text}, where)
                    out["queries"].append({"impl": impl, "backend": backend, "query": args.query_text or "collections",
                                           "threads": "all" if threads is None else "1", **res})
    if "quality" in args.sections:
        print("## quality", flush=True)
        colls = [(c, 0) for c in args.collections] + ([("msmarco-dl19-pool", args.msmarco_quality)]
                                                     if args.msmarco_quality else [])
        for coll, limit in colls:
            for backend in args.backends:
                res = run_job({"task": "quality", "backend": backend, "collection": coll, "limit": limit})
                out["quality"].append({"collection": coll, "backend": backend, **res})
    out["summary"] = summarise(out, args.backends, args.reference)
    out.setdefault("elapsed_s", {})
    if not isinstance(out["elapsed_s"], dict):
        out["elapsed_s"] = {}
    out["elapsed_s"][" ".join(args.sections)] = round(time.time() - started)
    print_tables(out)
    if args.output.is_file():  # another run may have finished other sections meanwhile
        for k, v in json.loads(args.output.read_text()).items():
            if k in ("vectors", "interleaved", "speed", "peers", "rss", "queries", "quality") and k not in args.sections and v:
                if not (k == "peers" and "speed" in args.sections):
                    out[k] = v
        out["summary"] = summarise(out, args.backends, args.reference)
    write_json(args.output, out)
    return 0


def summarise(out: dict[str, Any], backends: list[str], reference: str = "numpy") -> dict[str, Any]:
    """Speed ratios vs today and the nDCG@10 loss per backend (average over collections)."""
    summary: dict[str, Any] = {}
    base = {(r.get("corpus", "msmarco"), r["threads"]): r for r in out["speed"] if r["impl"] == "today"}
    for r in out["speed"]:
        b = base.get((r.get("corpus", "msmarco"), r["threads"]), {})
        for key in ("dense_docs_s", "sparse_docs_s", "both_docs_s", "build_docs_s"):
            if key in r and key in b:
                r[key.replace("_docs_s", "_x")] = r[key] / b[key]
    ref = {q["collection"]: q for q in out["quality"] if q["backend"] == reference and "dense" in q}
    rows = []
    for r in out.get("interleaved", []):
        base = r.get("numpy_both_docs_s")
        for key in [k for k in r if k.endswith("_dense_docs_s")]:
            b = key[: -len("_dense_docs_s")]
            row = {"corpus": r["corpus"], "threads": r["threads"], "texts": r.get("texts"), "backend": b,
                   "dense_docs_s": r[key], "sparse_docs_s": r.get(f"{b}_sparse_docs_s"),
                   "both_docs_s": r.get(f"{b}_both_docs_s"), "both_best": r.get(f"{b}_both_docs_s_best"),
                   "run": r.get("run", "")}
            if b == "onnx-int8" and r.get("onnx_int8_variant"):
                row["backend"] = f"onnx-int8 ({r['onnx_int8_variant']})"
            if base and row["both_docs_s"]:
                row["both_x_numpy"] = row["both_docs_s"] / base
            if r.get("numpy_dense_docs_s"):
                row["dense_x_numpy"] = r[key] / r["numpy_dense_docs_s"]
            rows.append(row)
    out["interleaved_rows"] = rows
    out["quality_reference"] = reference
    for q in out["quality"]:
        r0 = ref.get(q["collection"])
        if r0 is not None and "dense" in q:
            for m in ("dense", "sparse", "hybrid"):
                q[f"{m}_loss"] = r0[m] - q[m]
    for backend in backends:
        rows = [q for q in out["quality"] if q["backend"] == backend and "dense_loss" in q]
        if rows:
            summary[backend] = {f"avg_{m}_loss": sum(q[f"{m}_loss"] for q in rows) / len(rows)
                                for m in ("dense", "sparse", "hybrid")}
    return summary


def print_tables(out: dict[str, Any]) -> None:
    sections = [
        ("vectors against the reference backend", "vectors",
         ["corpus", "backend", "reference", "texts", "dense_cos_min", "dense_cos_mean", "sparse_top20_overlap_mean",
          "sparse_top20_overlap_min", "sparse_max_abs_diff"]),
        ("docs/s, every backend in one process taking turns (median of rounds; x = ratio to numpy)",
         "interleaved_rows", ["run", "corpus", "threads", "texts", "backend", "dense_docs_s", "dense_x_numpy", "sparse_docs_s",
                              "both_docs_s", "both_x_numpy", "both_best"]),
        ("docs/s (x = ratio to today)", "speed",
         ["corpus", "impl", "backend", "threads", "docs", "dense_docs_s", "dense_x", "sparse_docs_s", "sparse_x", "both_docs_s",
          "both_x", "build_docs_s", "build_x"]),
        ("peers: sentence-transformers, dense MiniLM only", "peers",
         ["corpus", "peer", "threads", "docs", "dense_docs_s", "skipped"]),
        ("peak RSS of a whole build (MB)", "rss", ["impl", "backend", "batch_size", "docs", "after_load_mb", "peak_rss_mb"]),
        ("one query through both models (ms)", "queries", ["query", "impl", "backend", "threads", "median_ms", "p95_ms"]),
        ("nDCG@10 (loss = reference backend minus backend)", "quality",
         ["collection", "backend", "docs", "build_docs_s", "dense", "sparse", "hybrid", "dense_loss", "sparse_loss",
          "hybrid_loss"]),
    ]
    for title, key, columns in sections:
        if out.get(key):
            print(f"\n### {title}\n")
            print(table(out[key], columns))
    if out.get("summary"):
        print("\n### average nDCG@10 loss per backend\n")
        print(table([{"backend": b, **v} for b, v in out["summary"].items()],
                    ["backend", "avg_dense_loss", "avg_sparse_loss", "avg_hybrid_loss"]))


if __name__ == "__main__":
    sys.exit(main())
