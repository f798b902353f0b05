"""BM25 query speed: today's tantivy path against the BM25 posting store, and bm25s, in one run.

    python benchmarks/bm25_speed.py            # MS MARCO DL19 pool (30,005 passages) + cranfield, from ../shared
    python benchmarks/bm25_speed.py --quick    # smoke run: short timing, 3,000 passages

Sections (every figure is queries/s of one batched call over the whole query set, best of rounds):

* ``breakdown``: where a query's time goes on the ready index ``indexes/bench-living-msmarco`` (one
  thread, one query at a time): today's path (analysis, building the tantivy Query, tantivy's
  search, hit conversion; the per-segment clause boosts on the 8-segment index) and the new path
  (analysis, statistics and weights, the store's top-k); µs per query.
* ``search``: the pool written as 1, 8 and 20 segments (BM25-only indexes of the same texts: the
  learned-sparse and dense parts play no role in BM25); hybridret ``old`` (tantivy, global idf by
  clause boosts: the retriever of the previous commit, reproduced below) vs ``new`` (the store, with
  the snapshot's statistics), against bm25s with its numba and numpy backends (Lucene BM25, k1 1.2,
  b 0.75, English stop words, Snowball stemmer: benchmarks/peers.py). Query sets: the real query
  texts of every /work/shared collection (1,409), and the 43 DL19 queries; plus cranfield's own
  corpus and queries. ``text`` includes analysis, ``tokens`` starts from analysed queries. One
  thread and every core. k = 10.
* ``candidates``: exact BM25 of a 300-row union per query (fusion's path): today's term-set query
  against the store.

Writes ``benchmarks/results/bm25-speed.json`` and prints markdown tables with ratios to bm25s-numba.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import peers  # noqa: E402
from _common import RESULTS, ROOT, SHARED, table, write_json  # noqa: E402

from hybridret import IndexWriter  # noqa: E402
from hybridret.encoders.base import EncodedBatch, Encoder  # noqa: E402
from hybridret.index.snapshot import open_snapshot  # noqa: E402
from hybridret.retrievers import QueryBatch, score_rows, search_rows  # noqa: E402
from hybridret.retrievers.base import Retriever  # noqa: E402
from hybridret.retrievers.bm25 import BM25Retriever, bm25_tokens  # noqa: E402

K = 10
POOL = SHARED / "msmarco-dl19-pool"
LIVING = ROOT / "indexes" / "bench-living-msmarco"
CORES = os.cpu_count() or 1


class TextOnly(Encoder):
    """No dense or learned-sparse head: the index holds texts and BM25 only."""

    def encode_queries(self, texts, *, batch_size=None, show_progress=None):
        return EncodedBatch()

    def encode_documents(self, texts, *, batch_size=None, show_progress=None):
        return EncodedBatch()

    def config(self):
        return {"type": "text-only"}


class OldBM25(Retriever):
    """The BM25 retriever of the previous commit: tantivy per segment, idf_global / idf_segment boosts."""

    name, needs, exhaustive_max = "bm25-old", "text", 128

    def __init__(self, threads: int | None) -> None:
        self.threads = threads

    def available(self, snap):
        return True

    def context(self, snap, tokens):
        parts = [s.sparse for s in snap.segments]
        if len(parts) == 1:
            return tokens, None
        n_seg = [p.searcher.num_docs for p in parts]
        n_all = sum(n_seg)
        idf = lambda df, n: math.log(1.0 + (n - df + 0.5) / (df + 0.5))  # noqa: E731
        boosts: list[list[dict[str, float]]] = [[] for _ in parts]
        for toks in tokens:
            df = {t: [p.doc_freq(t) for p in parts] for t in dict.fromkeys(toks)}
            for s in range(len(parts)):
                boosts[s].append({t: idf(sum(d), n_all) / idf(d[s], n_seg[s]) for t, d in df.items() if d[s] > 0})
        return tokens, boosts

    def prepare(self, snap, q, stats=None):
        return self.context(snap, [snap.segments[0].sparse.bm25_tokens(t) for t in q.texts])

    def search_segment(self, snap, i, q, k, allowed, ctx):
        tokens, boosts = ctx
        return snap.segments[i].sparse.search_bm25(q.texts, k, allowed=allowed, tokens=tokens, threads=self.threads,
                                                   boosts=None if boosts is None else boosts[i])

    def score_segment(self, snap, i, q, rows, ctx):
        tokens, boosts = ctx
        return snap.segments[i].sparse.score_bm25(q.texts, rows, tokens=tokens,
                                                  boosts=None if boosts is None else boosts[i])


@contextmanager
def tantivy_only(snap) -> Iterator[None]:
    """Hide the store of every segment (as in a segment written before it): tantivy's path."""
    saved = [s.sparse.bm25_store for s in snap.segments]
    for s in snap.segments:
        s.sparse.bm25_store = None
    try:
        yield
    finally:
        for s, st in zip(snap.segments, saved):
            s.sparse.bm25_store = st


def read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    out = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            out.append(json.loads(line))
            if limit and len(out) >= limit:
                break
    return out


def corpus(name: str, limit: int | None = None) -> list[dict]:
    return [{"id": str(d["_id"]), "text": f"{d.get('title', '')} {d['text']}".strip()}
            for d in read_jsonl(SHARED / name / "corpus.jsonl", limit)]


def all_queries() -> list[str]:
    return [q["text"] for c in sorted(p.name for p in SHARED.iterdir() if (p / "queries.jsonl").is_file())
            for q in read_jsonl(SHARED / c / "queries.jsonl")]


def build(path: Path, docs: list[dict], parts: int) -> Any:
    cuts = np.linspace(0, len(docs), parts + 1).astype(int)
    for j in range(parts):
        with IndexWriter(path, encoder=TextOnly(), settings={"max_segments": 0}) as w:
            w.write(docs[cuts[j]:cuts[j + 1]], mode="build" if j == 0 else "add", chunk_size=4096)
    return open_snapshot(path)


# --------------------------------------------------------------------------------------------- sections

def breakdown(queries: list[str], snap8: Any) -> dict[str, Any]:
    """µs per query, one thread, one query at a time, on the ready index (today's path) and the new one."""
    out: dict[str, Any] = {}
    if not LIVING.is_dir():
        return {"skipped": f"{LIVING} absent"}
    living = open_snapshot(LIVING)
    sp_ = living.segments[0].sparse
    searcher = sp_.searcher
    toks = [sp_.bm25_tokens(t) for t in queries]
    built = [sp_._bm25_query(t) for t in toks]
    hits = [searcher.search(q, 2 * K + 10, count=False).hits if q is not None else [] for q in built]
    n = len(queries)

    def per_query(fn) -> float:
        return 1e6 / peers.rate(fn, n)

    out["old"] = {
        "analysis_us": per_query(lambda: [sp_.bm25_tokens(t) for t in queries]),
        "build_query_us": per_query(lambda: [sp_._bm25_query(t) for t in toks]),
        "tantivy_search_us": per_query(lambda: [searcher.search(q, 2 * K + 10, count=False).hits
                                                for q in built if q is not None]),
        "hit_conversion_us": per_query(lambda: [(np.asarray(searcher.fast_field_values("row", [a for _, a in h]),
                                                            dtype=np.int64), np.asarray([s for s, _ in h], np.float32))
                                                for h in hits]),
        "whole_search_bm25_us": per_query(lambda: [sp_.search_bm25([t], K, threads=1) for t in queries]),
    }
    old8 = OldBM25(1)
    toks8 = bm25_tokens(snap8, queries)
    with tantivy_only(snap8):
        out["old"]["boosts_8_segments_us"] = per_query(lambda: [old8.context(snap8, [t]) for t in toks8])
    new = BM25Retriever(threads=1)
    seg = snap8  # the store's costs on the 8-segment pool
    ctxs = [new.context(seg, [t]) for t in toks8]
    out["new_8_segments"] = {
        "analysis_us": per_query(lambda: bm25_tokens(seg, queries)),
        "stats_and_weights_us": per_query(lambda: [new.context(seg, [t]) for t in toks8]),
        "topk_all_segments_us": per_query(lambda: [
            [s.sparse.bm25_store.search(c.queries[i], c.avgdl, K, threads=1) for i, s in enumerate(seg.segments)]
            for c in ctxs]),
        "whole_us": per_query(lambda: [search_rows(new, seg, QueryBatch([t]), K) for t in queries]),
    }
    return out


def rate_hybridret(r: Retriever, snap: Any, queries: list[str], tokens: list[list[str]], mode: str) -> float:
    q = QueryBatch(queries)
    if mode == "text":
        return peers.rate(lambda: search_rows(r, snap, q, K), len(queries))
    return peers.rate(lambda: search_rows(r, snap, q, K, ctx=r.context(snap, tokens)), len(queries))


def search_section(name: str, snaps: dict[int, Any], qsets: dict[str, list[str]], bm: dict[str, Any]) -> list[dict]:
    rows = []
    for qname, queries in qsets.items():
        bm_tok = {b: m._tok(queries) for b, m in bm.items()}
        for threads in (1, CORES):
            base: dict[str, float] = {}
            for b, m in bm.items():
                n_thr = threads
                base[b + ":text"] = peers.rate(lambda m=m: m.search(queries, K, n_threads=n_thr), len(queries))
                base[b + ":tokens"] = peers.rate(lambda m=m, t=bm_tok[b]: m.model.retrieve(
                    t, k=K, n_threads=n_thr, show_progress=False), len(queries))
            for b in bm:
                for mode in ("text", "tokens"):
                    rows.append({"collection": name, "queries": qname, "threads": threads, "segments": 1,
                                 "system": f"bm25s-{b}", "mode": mode, "qps": base[f"{b}:{mode}"]})
            for n_seg, snap in snaps.items():
                tokens = bm25_tokens(snap, queries)
                for system in ("old", "new"):
                    r: Any = OldBM25(threads) if system == "old" else BM25Retriever(threads=threads)
                    for mode in ("text", "tokens"):
                        if system == "old":
                            with tantivy_only(snap):
                                qps = rate_hybridret(r, snap, queries, tokens, mode)
                        else:
                            qps = rate_hybridret(r, snap, queries, tokens, mode)
                        rows.append({"collection": name, "queries": qname, "threads": threads, "segments": n_seg,
                                     "system": f"hybridret-{system}", "mode": mode, "qps": qps,
                                     "x_bm25s_numba": qps / base.get(f"numba:{mode}", float("nan"))})
                print(f"  {name} {qname} threads={threads} segments={n_seg} done", flush=True)
    return rows


def exactness(snaps: dict[int, Any], queries: list[str]) -> dict[str, Any]:
    """The store's top-10 against tantivy's on one segment, and every segmentation against one segment."""
    q = QueryBatch(queries)
    one = snaps[1]
    new_r, new_s = search_rows(BM25Retriever(), one, q, K)
    with tantivy_only(one):
        old_r, old_s = search_rows(OldBM25(None), one, q, K)
    fin = np.isfinite(old_s)
    out = {"one_segment_vs_tantivy": {
        "max_rel_score_diff": float(np.max(np.abs(new_s[fin] - old_s[fin]) / np.abs(old_s[fin]))) if fin.any() else 0.0,
        "same_top10_ids_share": float(np.mean([set(a[a >= 0]) == set(b[b >= 0]) for a, b in zip(new_r, old_r)]))}}
    ids1 = one.ids[np.maximum(new_r, 0)]
    for n_seg, snap in snaps.items():
        r, s = search_rows(BM25Retriever(), snap, q, K)
        out[f"{n_seg}_segments_equal_one"] = bool((snap.ids[np.maximum(r, 0)] == ids1).all() and np.array_equal(s, new_s))
    return out


def one_at_a_time(snaps: dict[int, Any], queries: list[str], bm: Any) -> list[dict]:
    """Latency: one query per call, one thread, from text (µs per query)."""
    rows = [{"system": "bm25s-numba", "segments": 1,
             "us_per_query": 1e6 / peers.rate(lambda: [bm.search([t], K, n_threads=1) for t in queries], len(queries))}]
    batches = [QueryBatch([t]) for t in queries]
    for n_seg, snap in snaps.items():
        new, old = BM25Retriever(threads=1), OldBM25(1)
        rows.append({"system": "hybridret-new", "segments": n_seg, "us_per_query": 1e6 / peers.rate(
            lambda: [search_rows(new, snap, b, K) for b in batches], len(queries))})
        with tantivy_only(snap):
            rows.append({"system": "hybridret-old", "segments": n_seg, "us_per_query": 1e6 / peers.rate(
                lambda: [search_rows(old, snap, b, K) for b in batches], len(queries))})
    return rows


def candidates(snap: Any, queries: list[str], n_old: int) -> dict[str, Any]:
    q = QueryBatch(queries)
    new = BM25Retriever(threads=1)
    cand, _ = search_rows(new, snap, q, 300)
    rng = np.random.default_rng(0)
    pad = rng.integers(0, snap.num_rows, size=cand.shape)  # fill short lists: always 300 rows
    cand = np.where(cand >= 0, cand, pad)
    ctx = new.prepare(snap, q)
    t_new = peers.rate(lambda: score_rows(new, snap, q, cand, ctx=ctx), len(queries))
    qo = QueryBatch(queries[:n_old])
    old = OldBM25(1)
    with tantivy_only(snap):
        ctx_o = old.prepare(snap, qo)
        t_old = peers.rate(lambda: score_rows(old, snap, qo, cand[:n_old], ctx=ctx_o), n_old, rounds=1)
        old_scores = score_rows(old, snap, qo, cand[:n_old], ctx=ctx_o)
    new_scores = score_rows(new, snap, qo, cand[:n_old], ctx=ctx)
    rel = np.abs(new_scores - old_scores) / np.maximum(np.abs(old_scores), 1e-9)
    return {"rows_per_query": 300, "old_qps": t_old, "new_qps": t_new, "speedup": t_new / t_old,
            "old_ms_per_query": 1e3 / t_old, "new_ms_per_query": 1e3 / t_new, "max_rel_diff": float(rel.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: short timing, 3,000 passages")
    ap.add_argument("--out", type=Path, default=RESULTS / "bm25-speed.json")
    args = ap.parse_args()
    if args.quick:
        peers.TIMING.update(min_seconds=0.1, rounds=1)
    if not (POOL / "corpus.jsonl").is_file():
        sys.exit(f"needs {POOL}")
    import bm25s

    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="bm25-speed-"))
    result: dict[str, Any] = {"k": K, "cpus": CORES, "timing": dict(peers.TIMING)}
    try:
        docs = corpus("msmarco-dl19-pool", 3000 if args.quick else None)
        qsets = {"all-collections": all_queries(), "dl19": [q["text"] for q in read_jsonl(POOL / "queries.jsonl")]}
        if args.quick:
            qsets["all-collections"] = qsets["all-collections"][:300]
        snaps = {}
        for n_seg in (1, 8, 20):
            t0 = time.perf_counter()
            snaps[n_seg] = build(work / f"pool-{n_seg}", docs, n_seg)
            print(f"built {n_seg} segment(s) of {len(docs)} passages in {time.perf_counter() - t0:.1f}s", flush=True)
        result["pool"] = {"docs": len(docs), "queries": {k: len(v) for k, v in qsets.items()}}
        result["breakdown"] = breakdown(qsets["all-collections"], snaps[8])
        print(json.dumps(result["breakdown"], indent=1), flush=True)
        result["exactness"] = exactness(snaps, qsets["all-collections"])
        print(result["exactness"], flush=True)
        texts = [d["text"] for d in docs]
        bm = {}
        for backend in ("numba", "numpy"):
            m = peers.Bm25s()
            m.backend = backend
            m.build(texts)
            bm[backend] = m
        rows = search_section("msmarco-dl19-pool", snaps, qsets, bm)
        result["one_at_a_time_dl19"] = one_at_a_time(snaps, qsets["dl19"], bm["numba"])
        cran = corpus("cranfield")
        snap_c = {1: build(work / "cranfield", cran, 1)}
        bm_c = {}
        for backend in ("numba", "numpy"):
            m = peers.Bm25s()
            m.backend = backend
            m.build([d["text"] for d in cran])
            bm_c[backend] = m
        rows += search_section("cranfield", snap_c, {"cranfield": [q["text"] for q in read_jsonl(
            SHARED / "cranfield" / "queries.jsonl")]}, bm_c)
        result["search"] = rows
        result["candidates"] = candidates(snaps[1], qsets["all-collections"], 100 if args.quick else 300)
        result["bm25s"] = {"version": bm25s.__version__, "notes": bm["numba"].notes}
        result["seconds"] = time.time() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(result["search"], ["collection", "queries", "threads", "segments", "system", "mode", "qps",
                                   "x_bm25s_numba"]))
    print()
    print(table([dict(stage=k, **{s: v.get(k) for s, v in result["breakdown"].items() if isinstance(v, dict)})
                 for k in {k: 0 for v in result["breakdown"].values() if isinstance(v, dict) for k in v}],
                ["stage", *[s for s, v in result["breakdown"].items() if isinstance(v, dict)]]))
    print()
    print(table(result["one_at_a_time_dl19"], ["system", "segments", "us_per_query"]))
    print()
    print(table([result["candidates"]], list(result["candidates"])))
    print()
    print(result["exactness"])
    write_json(args.out, result)


if __name__ == "__main__":
    main()
