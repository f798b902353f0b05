"""The engine behind beir.py and msmarco.py: build (or reuse) a hybridret index, run every method and
every available peer on the same corpus and queries, and return one JSON-able result.

Quality: pytrec_eval on each system's ranking (single retrievers and peers: top ``--depth``; fused
methods: the top-100 of their default setting, each retriever's top-100 fused, so their Recall at
deeper cut-offs is left blank; msmarco.py adds a row with ``--depth`` candidates per retriever).
Speed: queries/s with pre-encoded queries (the index
alone) on one thread and on all cores, and end to end from query text; peers' ratios are
hybridret ÷ peer, so above 1 means hybridret is faster.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import peers
import pyserini_peer
from _common import RESULTS, encode_queries

from hybridret import Document, HybridRetriever
from hybridret.eval import evaluate, run_from_rows
from hybridret.fusion.config import fuse
from hybridret.fusion.gather import gather_candidates
from hybridret.retrievers import vectors_of

logger = logging.getLogger("bench")
METRICS = ("ndcg@10", "mrr@10", "recall@2", "recall@100", "recall@1000")
METHODS = ("dense", "sparse", "bm25", "linear", "rrf", "hybrid")
SINGLE = ("dense", "sparse", "bm25")
FUSED_DEPTH = 100  # fused methods are scored as configured by default: each retriever's top-100
LABEL = {"dense": "dense (MiniLM)", "sparse": "learned sparse (SPLADE-tiny)", "bm25": "BM25",
         "linear": "linear fusion", "rrf": "RRF", "hybrid": "hybrid (GQR, default)"}


@dataclass
class Topics:
    """One query set with its judgments (``level``: the grade that counts as relevant for binary metrics)."""

    name: str
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    level: int = 1


@dataclass
class Collection:
    name: str
    documents: Callable[[], Iterable[Document]]  # a fresh stream each call
    topics: list[Topics]
    num_docs: int | None = None
    notes: list[str] = field(default_factory=list)


def _dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.exists() else 0


def _timed_build(docs: Iterable[Document], workdir: Path, settings: dict[str, Any] | None, batch_size: int,
                 **index_kw: Any) -> tuple[HybridRetriever, dict[str, Any]]:
    """Build and save an index into ``workdir`` with the default models; wall time and peak RSS."""
    r = HybridRetriever.from_models(**(settings or {}))
    r.encoder.encode_documents(["warm up"])  # model loading is not part of the build rate
    with peers.peak_rss() as mem:
        start = time.perf_counter()
        r.index(docs, batch_size=batch_size, workdir=workdir, **index_kw)
        r.save(workdir, overwrite=True)
        took = time.perf_counter() - start
    return r, {"docs": r.num_docs, "seconds": took, "docs_per_s": r.num_docs / took,
               "peak_rss_delta_bytes": mem["peak_delta"]}


def build_or_load(coll: Collection, index_dir: Path, batch_size: int = 32, rebuild: bool = False,
                  settings: dict[str, Any] | None = None, build_sample: int = 500) -> tuple[HybridRetriever, dict[str, Any]]:
    """Load ``index_dir``, building it first (resumable: encoded chunks are cached beside it). When the
    index exists, a fresh build of the first ``build_sample`` documents is timed instead, so every run
    measures its own build rate."""
    build: dict[str, Any] = {}
    if rebuild or not (index_dir / "manifest.json").exists():
        import shutil

        cache = index_dir.parent / f"{index_dir.name}.encode-cache"
        resumed = any(cache.glob("chunk-*.npz"))
        _, build = _timed_build(coll.documents(), index_dir, settings, batch_size, encode_cache=cache,
                                total=coll.num_docs)
        build["note"] = "encoding included" + ("; some chunks came from the encoding cache of an interrupted run"
                                               if resumed else "")
        shutil.rmtree(cache, ignore_errors=True)
    elif build_sample:
        import itertools

        sample = list(itertools.islice(iter(coll.documents()), build_sample))
        with tempfile.TemporaryDirectory() as tmp:
            _, build = _timed_build(sample, Path(tmp), settings, batch_size)
        build["note"] = f"fresh build of the first {len(sample):,} documents, encoding included"
    r = HybridRetriever.load(index_dir)
    gen = r.searcher.snapshot.segments[0].root
    build["bytes_on_disk"] = {"dense": _dir_bytes(gen / "dense"), "sparse+bm25": _dir_bytes(gen / "sparse"),
                              "docstore": sum(f.stat().st_size for f in gen.iterdir() if f.is_file())}
    return r, build


def _quality(run: dict[str, dict[str, float]], t: Topics) -> dict[str, float]:
    return {m: round(v, 4) for m, v in evaluate(run, t.qrels, METRICS, relevance_level=t.level).items()}


def _row(system: str, method: str, quality: dict[str, float], qps1: float | None, qps_all: float | None,
         ours: tuple[float | None, float | None] | None = None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"system": system, "method": method, **quality, "q/s 1 thread": qps1, "q/s all cores": qps_all}
    if ours is not None:
        row["hybridret ÷ peer, 1 thread"] = ours[0] / qps1 if ours[0] and qps1 else None
        row["hybridret ÷ peer, all cores"] = ours[1] / qps_all if ours[1] and qps_all else None
    row.update(extra)
    return row


def run_topics(r: HybridRetriever, t: Topics, depth: int, peer_state: dict[str, Any], use_peers: bool,
               deep_fused: bool = False) -> dict[str, Any]:
    qids = [q for q in t.queries if t.qrels.get(q)]
    texts = [t.queries[q] for q in qids]
    ids = r.docs.ids
    k = min(depth, r.num_docs)
    out: dict[str, Any] = {"queries": len(qids), "rows": []}
    encode_queries(r, texts[:2])  # loads the models: not part of the rate
    t0 = time.perf_counter()
    q = encode_queries(r, texts)
    qd, qs = q.dense, q.sparse
    snap = r.searcher.snapshot
    out["query_encoding_qps"] = len(texts) / (time.perf_counter() - t0)
    n = len(texts)
    ours: dict[str, tuple[float | None, float | None]] = {}
    runs: dict[str, dict[str, dict[str, float]]] = {}
    fused_k = min(k, FUSED_DEPTH)
    for m in METHODS:
        hits = r.search(texts, k=k if m in SINGLE else fused_k, method=m)
        runs[m] = run_from_rows(hits.rows, ids, qids)
        if m == "dense":
            def fn1() -> Any:
                return r.dense.search(qd, 10)
            with peers.threads(1):
                q1 = peers.rate(fn1, n)
            qa = peers.rate(fn1, n)
        elif m == "sparse":
            q1 = peers.rate(lambda: r.sparse.search(qs, 10, threads=1), n)
            qa = peers.rate(lambda: r.sparse.search(qs, 10, threads=None), n)
        elif m == "bm25":
            q1 = peers.rate(lambda: bm25_search(r.part("bm25"), texts, 10, 1), n)
            qa = peers.rate(lambda: bm25_search(r.part("bm25"), texts, 10, None), n)
        else:
            cfg = r.fusion_config(m)

            def fused() -> Any:
                c = gather_candidates(cfg.union_retrievers, cfg.depth, snap, q)
                return fuse(cfg, c, 10, snap, q)
            q1, qa = None, peers.rate(fused, n)
        e2e = peers.rate(lambda: r.search(texts, k=10, method=m), n, rounds=1)  # noqa: B023
        ours[m] = (q1, qa)
        quality = _quality(runs[m], t)
        if m not in SINGLE:
            quality.update({x: None for x in quality if x.startswith("recall@") and int(x[7:]) > fused_k})
        out["rows"].append(_row("hybridret", LABEL[m], quality, q1, qa, **{"q/s end to end": e2e}))
    if deep_fused and k > fused_k:  # the default hybrid again, with every retriever's top-k as candidates
        hits = r.search(texts, k=k, method="hybrid", candidates=k)
        qa = peers.rate(lambda: r.search(texts, k=10, method="hybrid", candidates=k), n, rounds=1)
        out["rows"].append(_row("hybridret", f"hybrid (GQR), {k} candidates per retriever",
                                _quality(run_from_rows(hits.rows, ids, qids), t), None, qa, **{"q/s end to end": qa}))
    if not use_peers:
        return out
    # ---- BM25 peers
    bm = peer_state.get("bm25s")
    if bm is not None:
        res, sc = bm.search(texts, k, n_threads=1)
        q1 = peers.rate(lambda: bm.search(texts, 10, n_threads=1), n)
        qa = peers.rate(lambda: bm.search(texts, 10, n_threads=os.cpu_count() or 1), n)
        out["rows"].append(_row("bm25s", "BM25", _quality(peers.to_run(res, sc, qids, ids), t), q1, qa, ours["bm25"],
                                **{"q/s end to end": qa}))
    ps = peer_state.get("pyserini")
    if ps is not None:
        for kind in ("bm25", "impact"):
            try:
                if kind == "bm25":
                    res = pyserini_peer.bm25(peer_state["pyserini_docs"], texts, k, peer_state["workdir"] / f"bm25-{t.name}",
                                             threads=os.cpu_count() or 1)
                else:
                    qvec = [r.encoder.sparse_terms(qs[i]) for i in range(n)]
                    qvec = [{t_: max(1, round(w * 100)) for t_, w in v.items()} for v in qvec]
                    res = pyserini_peer.impact(peer_state["pyserini_vectors"], qvec, k,
                                               peer_state["workdir"] / f"impact-{t.name}",
                                               threads=os.cpu_count() or 1)
            except Exception as exc:  # a peer failing must not lose the rest of the run
                logger.warning("pyserini %s failed: %s", kind, exc)
                out.setdefault("peer_errors", []).append(f"pyserini {kind}: {exc}")
                continue
            q1, qa = n / res.search_seconds_1thread, n / res.search_seconds_all
            label = "BM25" if kind == "bm25" else "learned sparse (impact, same SPLADE vectors ×100)"
            out["rows"].append(_row("pyserini", label, _quality(peers.to_run(res.ids, res.scores, qids), t), q1, qa,
                                    ours["bm25" if kind == "bm25" else "sparse"], notes=f"{ps}; {res.notes}"))
            peer_state.setdefault("pyserini_build", {})[kind] = {
                "seconds": res.build_seconds, "index_bytes": res.index_bytes, "peak_rss_delta_bytes": res.peak_rss_bytes_build}
    # ---- dense peers, on hybridret's own vectors
    for name in ("faiss", "st"):
        if name not in peer_state:
            continue
        peer = peer_state[name]
        res, sc = peer.search(qd, k)
        def fn() -> Any:
            return peer.search(qd, 10)  # noqa: B023
        with peers.threads(1):
            q1 = peers.rate(fn, n)
        qa = peers.rate(fn, n)
        out["rows"].append(_row(peer.name, "dense (same vectors)", _quality(peers.to_run(res, sc, qids, ids), t), q1, qa,
                                ours["dense"]))
    st = peer_state.get("st_model")
    if st is not None:
        st_qps = peers.rate(lambda: st.encode(texts, batch_size=32, convert_to_numpy=True), n, rounds=1)
        ours_qps = peers.rate(lambda: r.encoder.dense.encode_queries(texts), n, rounds=1)
        out["dense_query_encoding"] = {"hybridret_qps": ours_qps, "sentence_transformers_qps": st_qps,
                                       "ratio": ours_qps / st_qps}
    # ---- fusion peers (ranx) on the same dense + sparse top-100 runs
    c = gather_candidates(("dense", "sparse"), 100, snap, q)
    top = {name: {q: dict(sorted(d.items(), key=lambda kv: -kv[1])[:100]) for q, d in run.items()} for name, run in runs.items()
           if name in ("dense", "sparse")}
    for method, ours_m in (("rrf", "rrf"), ("minmax", "linear")) if _has("ranx") else ():
        fused = peers.ranx_fuse(top, method)
        qf = peers.rate(lambda: peers.ranx_fuse(top, method), n, rounds=1)  # noqa: B023
        cfg = r.fusion_config(ours_m).with_(retrievers=("dense", "sparse"))
        our_fuse = peers.rate(lambda: fuse(cfg, c, 10, snap, q), n)  # noqa: B023
        label = "RRF (dense, sparse)" if method == "rrf" else "min-max linear (dense, sparse), top-100 lists"
        out["rows"].append(_row(f"ranx {_version('ranx')}", label, _quality(fused, t), None, qf, (None, our_fuse),
                                notes="fusion step only; hybridret's fuse() on the same candidates"))
    return out


def _version(pkg: str) -> str:
    from importlib.metadata import version

    try:
        return version(pkg)
    except Exception:
        return "?"


def prepare_peers(r: HybridRetriever, coll: Collection, use_peers: bool, workdir: Path) -> dict[str, Any]:
    """Build every peer's index once per collection; returns their state and build measurements."""
    state: dict[str, Any] = {"workdir": workdir}
    builds: dict[str, Any] = {}
    vectors = np.asarray(vectors_of(r.searcher.snapshot, np.arange(r.num_docs)[None, :])[0])
    if not use_peers:
        return {"state": state, "builds": builds}
    state["faiss"] = peers.FaissFlat(vectors)
    if _has("sentence_transformers"):
        state["st"] = peers.StSemanticSearch(vectors)
    else:
        builds["sentence-transformers"] = {"skipped": "sentence-transformers is not installed (pip install -e '.[bench]')"}
    docs = [(d.id, d.full_text) for d in coll.documents()]
    if _has("bm25s"):
        bm = peers.Bm25s()
        with peers.peak_rss() as mem:
            t0 = time.perf_counter()
            bm.build([t for _, t in docs])
            took = time.perf_counter() - t0
        builds["bm25s"] = {"seconds": took, "docs_per_s": len(docs) / took, "index_bytes_in_memory": bm.nbytes(),
                           "peak_rss_delta_bytes": mem["peak_delta"], "notes": bm.notes}
        state["bm25s"] = bm
    else:
        builds["bm25s"] = {"skipped": "bm25s is not installed (pip install -e '.[bench]')"}
    ok, why = pyserini_peer.available()
    if ok:
        state["pyserini"] = why
        state["pyserini_docs"] = docs
        vocab = r.encoder.vocab
        fwd = r.sparse.forward
        state["pyserini_vectors"] = [
            (docs[i][0], {vocab[j]: max(1, round(float(w) * 100)) for j, w in
                          zip(fwd.indices[fwd.indptr[i]:fwd.indptr[i + 1]], fwd.data[fwd.indptr[i]:fwd.indptr[i + 1]]) if w > 0})
            for i in range(r.num_docs)]
    else:
        builds["pyserini"] = {"skipped": why}
        logger.warning("pyserini skipped: %s", why)
    if "st" in state:
        from hybridret.models import resolve_model

        state["st_model"] = peers.st_encoder(str(resolve_model("all-MiniLM-L6-v2")))
    return {"state": state, "builds": builds}


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run_collection(coll: Collection, index_dir: Path, *, depth: int = 1000, use_peers: bool = True,
                   rebuild: bool = False, settings: dict[str, Any] | None = None, batch_size: int = 32,
                   build_sample: int = 500, deep_fused: bool = False) -> dict[str, Any]:
    r, build = build_or_load(coll, index_dir, batch_size=batch_size, rebuild=rebuild, settings=settings,
                             build_sample=build_sample)
    result: dict[str, Any] = {"collection": coll.name, "docs": r.num_docs, "build": {"hybridret": build},
                              "notes": coll.notes, "topics": {}}
    with tempfile.TemporaryDirectory(prefix="hybridret-peers-") as tmp:
        prepared = prepare_peers(r, coll, use_peers, Path(tmp))
        result["build"].update(prepared["builds"])
        for t in coll.topics:
            result["topics"][t.name] = run_topics(r, t, depth, prepared["state"], use_peers, deep_fused)
            logger.info("%s / %s: %d queries done", coll.name, t.name, result["topics"][t.name]["queries"])
        result["build"].update({f"pyserini {k}": v for k, v in prepared["state"].get("pyserini_build", {}).items()})
    return result


def add_common_args(ap: Any, depth: int) -> None:
    """The options beir.py and msmarco.py share."""
    from _common import ROOT

    ap.add_argument("--depth", type=int, default=depth, help=f"ranking depth scored per system (default {depth})")
    ap.add_argument("--no-peers", action="store_true", help="hybridret only")
    ap.add_argument("--rebuild", action="store_true", help="rebuild hybridret's index even if one exists")
    ap.add_argument("--index-root", type=Path, default=ROOT / "indexes", help="where bench-<name> indexes live")
    ap.add_argument("--results", type=Path, default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--build-sample", type=int, default=500,
                    help="when the index already exists, time a fresh build of this many documents (0: skip)")
    ap.add_argument("--quick", action="store_true", help="one short timing round (smoke tests)")


def setup_run(args: Any) -> None:
    """Apply --quick and quiet the chatty libraries."""
    if args.quick:
        peers.TIMING.update(min_seconds=0.01, rounds=1)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("hybridret", "sentence_transformers", "bm25s", "faiss"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def results_path(name: str) -> Path:
    return RESULTS / f"peers-{name}.json"


QUALITY_COLS = {"beir": ["ndcg@10", "recall@100"], "msmarco": ["mrr@10", "ndcg@10", "recall@1000"],
                "limit": ["recall@2", "recall@100", "ndcg@10"]}
SPEED_COLS = ["q/s 1 thread", "q/s all cores", "hybridret ÷ peer, 1 thread", "hybridret ÷ peer, all cores"]


def tables(result: dict[str, Any], kind: str) -> str:
    """Markdown: one quality + speed table per topic set, then the build table."""
    from _common import table

    parts = []
    for name, t in result["topics"].items():
        cols = ["system", "method", *QUALITY_COLS[kind], *SPEED_COLS]
        parts.append(f"**{result['collection']} / {name}** ({t['queries']} queries, {result['docs']:,} documents)\n\n"
                     + table(t["rows"], cols))
        enc = t.get("dense_query_encoding")
        line = f"Query encoding (dense + sparse, one batch): {t['query_encoding_qps']:,.0f} queries/s."
        if enc:
            line += (f" Dense query encoding alone: hybridret {enc['hybridret_qps']:,.0f} q/s, sentence-transformers "
                     f"`encode` {enc['sentence_transformers_qps']:,.0f} q/s on the same model (ratio {enc['ratio']:.2f}).")
        parts.append(line)
    rows = []
    for system, b in result["build"].items():
        if "skipped" in b:
            rows.append({"system": system, "notes": b["skipped"]})
            continue
        size = sum(b["bytes_on_disk"].values()) if "bytes_on_disk" in b else b.get("index_bytes", b.get("index_bytes_in_memory"))
        rows.append({"system": system, "docs/s": b.get("docs_per_s", result["docs"] / b["seconds"] if b.get("seconds") else ""),
                     "index MB": size / 1e6 if size else "", "peak RSS MB": b.get("peak_rss_delta_bytes", 0) / 1e6,
                     "notes": b.get("note", b.get("notes", ""))})
    parts.append("**index build**\n\n" + table(rows, ["system", "docs/s", "index MB", "peak RSS MB", "notes"]))
    return "\n\n".join(parts)


def bm25_search(store: Any, texts: list[str], k: int, threads: int | None) -> Any:
    """BM25 top-k of one segment's posting store from query text (analysis included), under its own statistics."""
    tokens = [list(store.analyzer.analyze(t)) for t in texts]
    return store.search(store.own_queries(tokens), store.total_len / max(1, store.num_docs), k, threads=threads)
