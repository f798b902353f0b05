"""Living index: add, search over many segments, compaction, metadata filters, on real passages.

    python benchmarks/living.py                  # MS MARCO DL19 pool from ../shared (30,005 passages)
    python benchmarks/living.py --docs 2000      # the first 2,000 passages only
    python benchmarks/living.py --quick --data DIR   # smoke run (a few hundred documents, short timing)

The last 1% of the passages (``--add``) are held out of the base build and added afterwards, so
the add is measured on documents the index (and the encode cache) has never seen. Sections:

* ``add``: wall time of ``retriever.add(docs)`` against encoding the same texts alone
  (``encoder.encode_documents``, same encoder, warm) and against the full build of the base index
  (the measured build of that index, encoding included); peak RSS of the add.
* ``segments``: the base documents again, written as 20 segments (one build + 19 adds, encodings
  read back from the base build's encode cache), searched as they are and after ``compact()``:
  ms/query with pre-encoded queries (batch and one query at a time) and end to end, per method;
  quality against the fresh one-segment build of the same documents (the base index): nDCG@10 and
  the share of queries whose top-10 differ.
* ``filters``: a synthetic ``bucket = crc32(id) % 1000`` field given to every document by an upsert
  that changes metadata only (``encoded`` must be 0), then filtered search at ~50%, ~5% and ~0.1%
  selectivity against unfiltered, per method; dense and learned-sparse results are checked against
  brute force over the matching documents.

The base index is built once into ``indexes/bench-living-<name>[-<docs>]`` (resumable through the
encode cache beside it; its wall time is kept in ``<index>.build.json``), the rest in a scratch
folder that is removed at the end. Writes ``benchmarks/results/living.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import peers  # noqa: E402
from _common import RESULTS, ROOT, SHARED, machine, table, write_json  # noqa: E402

from hybridret import CorpusReader, HybridRetriever, load_qrels, load_queries  # noqa: E402
from hybridret.eval import per_query, run_from_rows  # noqa: E402
from hybridret.filters import parse_filter  # noqa: E402
from hybridret.retrievers import REGISTRY, search_rows, vectors_of  # noqa: E402
from hybridret.retrievers.base import allowed_mask, merge_topk  # noqa: E402
from hybridret.search.run import fused_search  # noqa: E402

logger = logging.getLogger("bench")
DATA = SHARED / "msmarco-dl19-pool"
METHODS = ("dense", "sparse", "bm25", "hybrid")
K = 10
SEGMENTS = 20
FILTERS = {"~50%": {"bucket": {"$lt": 500}}, "~5%": {"bucket": {"$lt": 50}}, "~0.1%": {"bucket": 0}}
SECTIONS = ("build", "add", "segments", "filters")


def bucket(doc_id: str) -> int:
    return zlib.crc32(doc_id.encode("utf-8")) % 1000


# --------------------------------------------------------------------------- data and the base build

def split_corpus(data: Path, docs: int | None, n_add: int | None) -> tuple[list[Any], list[Any]]:
    """The base documents and the held-out ones (the last ``n_add``, default 1%)."""
    allx = list(CorpusReader(data, format="beir"))
    if docs:
        allx = allx[:docs]
    n_add = n_add if n_add is not None else max(1, round(len(allx) * 0.01))
    if not 0 < n_add < len(allx):
        raise SystemExit(f"--add must be between 1 and {len(allx) - 1}")
    return allx[:-n_add], allx[-n_add:]


def build_base(base_docs: list[Any], index_dir: Path, cache: Path, batch_size: int) -> dict[str, Any]:
    """Build the base index (resumable through the encode cache beside it) unless a complete one of
    the same documents exists; its wall time is kept in a sidecar file, so later runs report it."""
    sidecar = index_dir.parent / f"{index_dir.name}.build.json"
    if (index_dir / "manifest.json").exists() and sidecar.exists():
        info = json.loads(sidecar.read_text())
        if info.get("docs") == len(base_docs) and cache.is_dir():
            return {**info, "from_an_earlier_run": True}
    resumed = cache.is_dir() and any(cache.glob("enc-*"))
    r = HybridRetriever.from_models()
    r.encoder.encode_documents(["warm up"])  # model loading is not part of the build time
    with peers.peak_rss() as mem:
        start = time.perf_counter()
        r.index(base_docs, batch_size=batch_size, workdir=index_dir, encode_cache=cache, total=len(base_docs),
                overwrite=True)
        took = time.perf_counter() - start
    info = {"docs": r.num_docs, "seconds": took, "docs_per_s": r.num_docs / took,
            "peak_rss_delta_bytes": mem["peak_delta"],
            "note": "encoding included" + ("; resumed: some documents came from the encode cache of an interrupted "
                                           "run, so the time is too low" if resumed else "")}
    sidecar.write_text(json.dumps(info, indent=2) + "\n")
    return info


# --------------------------------------------------------------------------- timing helpers

def ms_per_query(fn: Callable[[], Any], n: int, rounds: int | None = None) -> float:
    return 1e3 / peers.rate(fn, n, rounds=rounds)


def searcher_fns(r: HybridRetriever, q: Any, texts: list[str], method: str, filt: Any = None, spec: Any = None
                 ) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
    """(pre-encoded batch, pre-encoded one query at a time, end to end batch) for one method."""
    snap = r.searcher.snapshot
    cfg = r.fusion_config("hybrid")

    def pre(qq: Any) -> tuple[np.ndarray, np.ndarray]:
        if method in REGISTRY:
            return search_rows(REGISTRY[method], snap, qq, K, filt)
        rows, scores, _ = fused_search(cfg, K, snap, qq, filt=filt)
        return rows, scores

    singles = [q.slice(i, i + 1) for i in range(len(q))]

    def one_by_one() -> None:
        for s in singles:
            pre(s)

    return (lambda: pre(q)), one_by_one, (lambda: r.search(texts, k=K, method=method, filter=spec))


def latency_rows(r: HybridRetriever, q: Any, texts: list[str], label: str) -> list[dict[str, Any]]:
    n = len(texts)
    out = []
    for m in METHODS:
        batch, single, e2e = searcher_fns(r, q, texts, m)
        out.append({"index": label, "method": m, "ms/query batch": ms_per_query(batch, n),
                    "ms/query single": ms_per_query(single, n), "ms/query end to end": ms_per_query(e2e, n, rounds=1)})
    return out


def breakdown(r: HybridRetriever, q: Any) -> dict[str, dict[str, float]]:
    """Where a pre-encoded batch search of each single retriever spends its time (ms per query):
    per-call preparation, the per-segment searches, and the merge of the per-segment lists."""
    snap = r.searcher.snapshot
    n = len(q)
    out = {}
    for name in ("dense", "sparse", "bm25"):
        ret = REGISTRY[name]
        best = {"prepare": np.inf, "segments": np.inf, "merge": np.inf}
        for _ in range(3):
            t0 = time.perf_counter()
            ctx = ret.prepare(snap, q)
            t1 = time.perf_counter()
            parts = []
            for i in range(len(snap.segments)):
                rows, scores = ret.search_segment(snap, i, q, K, allowed_mask(snap, i, None), ctx)
                parts.append((np.where(rows >= 0, rows + int(snap.offsets[i]), -1), scores))
            t2 = time.perf_counter()
            merge_topk(parts, K, n)
            t3 = time.perf_counter()
            for key, v in (("prepare", t1 - t0), ("segments", t2 - t1), ("merge", t3 - t2)):
                best[key] = min(best[key], v)
        out[name] = {f"{k} ms/query": v / n * 1e3 for k, v in best.items()}
    return out


# --------------------------------------------------------------------------- quality helpers

def top_ids(r: HybridRetriever, texts: list[str], method: str, k: int = K, spec: Any = None) -> list[list[str]]:
    return top_hits(r, texts, method, k, spec)[0]


def top_hits(r: HybridRetriever, texts: list[str], method: str, k: int = K, spec: Any = None) -> Any:
    hits = r.search(texts, k=k, method=method, filter=spec)
    return [[str(x) for x, row in zip(ids, rows) if row >= 0] for ids, rows in zip(hits.ids, hits.rows)], hits


def ndcg10(r: HybridRetriever, hits: Any, qids: list[str], qrels: dict) -> float:
    pq = per_query(run_from_rows(hits.rows, r.searcher.snapshot.ids, qids), qrels, ("ndcg@10",), relevance_level=2)
    return float(np.mean(list(pq["ndcg@10"].values())))


def compare_quality(a: HybridRetriever, b: HybridRetriever, texts: list[str], qids: list[str], qrels: dict,
                    label_a: str, label_b: str) -> list[dict[str, Any]]:
    rows = []
    for m in METHODS:
        (ia, ha), (ib, hb) = top_hits(a, texts, m), top_hits(b, texts, m)
        same_scores = [np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(ha.scores, hb.scores)]
        rows.append({"method": m, f"nDCG@10 {label_a}": ndcg10(a, ha, qids, qrels),
                     f"nDCG@10 {label_b}": ndcg10(b, hb, qids, qrels),
                     "queries with a different top-10 (ids, in order)": sum(x != y for x, y in zip(ia, ib)),
                     "queries with a different top-10 (as sets)": sum(set(x) != set(y) for x, y in zip(ia, ib)),
                     "queries with different top-10 scores": sum(not x for x in same_scores),
                     "queries": len(texts)})
    return rows


def brute_force_check(r: HybridRetriever, q: Any, spec: Any) -> dict[str, Any]:
    """Filtered dense and sparse top-k against scoring every matching document; a difference that is
    only a tie at the cut-off (same top-k scores, within 1e-5) is counted apart."""
    snap = r.searcher.snapshot
    filt = parse_filter(spec)
    match = np.concatenate([np.flatnonzero(allowed_mask(snap, i, filt)
                                           if allowed_mask(snap, i, filt) is not None else np.ones(s.num_docs, bool))
                            + int(snap.offsets[i]) for i, s in enumerate(snap.segments)])
    out: dict[str, Any] = {"matching_docs": int(len(match))}
    for name in ("dense", "sparse"):
        rows, scores = search_rows(REGISTRY[name], snap, q, K, filt)
        if name == "dense":
            exact = np.asarray(q.dense, np.float32) @ vectors_of(snap, match).T if len(match) else np.zeros((len(q), 0))
        else:
            blocks = []
            for i, s in enumerate(snap.segments):
                mine = match[(match >= snap.offsets[i]) & (match < snap.offsets[i + 1])] - int(snap.offsets[i])
                blocks.append((s.sparse.forward[mine] @ q.sparse.T).T.toarray())
            exact = np.hstack(blocks) if blocks else np.zeros((len(q), 0))
        ids_differ = ties = 0
        for j in range(len(q)):
            e = exact[j]
            order = np.lexsort((match, -e))[:K]
            if name == "sparse":
                order = order[e[order] > 0]
            want = [str(snap.ids[x]) for x in match[order]]
            got = [str(snap.ids[x]) for x in rows[j] if x >= 0]
            if want != got:
                ids_differ += 1
                if len(want) == len(got) and np.allclose(np.sort(e[order]), np.sort(scores[j][: len(got)]), atol=1e-5):
                    ties += 1
        out[name] = {"queries_top10_differ": ids_differ, "of_which_ties_at_equal_scores": ties}
    return out


# --------------------------------------------------------------------------- sections

def section_add(base_dir: Path, work: Path, add_docs: list[Any], build: dict[str, Any], batch_size: int
                ) -> dict[str, Any]:
    """Copy the base index, then time encode-alone, add (with peak RSS), encode-alone again."""
    target = work / "add"
    shutil.copytree(base_dir, target)
    r = HybridRetriever.load(target)
    enc = r.encoder
    enc.encode_documents(["warm up"])
    texts = [d.full_text for d in add_docs]
    t0 = time.perf_counter()
    enc.encode_documents(texts, batch_size=batch_size, show_progress=False)
    encode_before = time.perf_counter() - t0
    with peers.peak_rss() as mem:
        t0 = time.perf_counter()
        res = r.add(add_docs, batch_size=batch_size, show_progress=False)
        add_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    enc.encode_documents(texts, batch_size=batch_size, show_progress=False)
    encode_after = time.perf_counter() - t0
    encode_s = min(encode_before, encode_after)
    info = r.info()
    out = {"docs_added": len(add_docs), "index_docs_before": build["docs"], "index_docs_after": r.num_docs,
           "segments_after": len(info["segments"]), "write_result": res.to_dict(),
           "add_seconds": add_s, "encode_alone_seconds": encode_s,
           "encode_alone_seconds_runs": [encode_before, encode_after],
           "add_over_encode": add_s / encode_s, "overhead_seconds": add_s - encode_s,
           "full_build_seconds": build["seconds"], "full_build_docs": build["docs"],
           "full_build_over_add": build["seconds"] / add_s,
           "rss_before_bytes": mem["before"], "peak_rss_delta_bytes": mem["peak_delta"],
           "note": "encode alone: encoder.encode_documents on the same texts with the same warm encoder, the faster "
                   "of one run before and one after the add; full build: the measured build of the base index "
                   "(encoding included)"}
    del r
    shutil.rmtree(target, ignore_errors=True)
    return out


def rebuild_estimate(base_docs: list[Any], cache: Path, work: Path, add: dict[str, Any], batch_size: int
                     ) -> dict[str, Any]:
    """A full rebuild measured in this run: the base documents built into one segment with every encoding
    read from the cache (all of a rebuild but the encoding), plus their encoding at the rate measured
    for the added documents."""
    r = HybridRetriever.from_models()
    r.encoder.encode_documents(["warm up"])
    t0 = time.perf_counter()
    res = r.index(base_docs, workdir=work / "rebuild", encode_cache=cache, batch_size=batch_size, show_progress=False)
    cached = time.perf_counter() - t0
    encode = add["encode_alone_seconds"] * len(base_docs) / add["docs_added"]
    total = cached + encode
    del r, res
    shutil.rmtree(work / "rebuild", ignore_errors=True)
    return {"rebuild_from_cache_seconds": cached, "rebuild_encoding_seconds_at_add_rate": encode,
            "rebuild_estimate_seconds": total, "rebuild_estimate_over_add": total / add["add_seconds"]}


def build_segmented(base_docs: list[Any], cache: Path, target: Path, n_seg: int, batch_size: int,
                    max_segments: int = 0) -> tuple[HybridRetriever, dict[str, Any]]:
    """The base documents as one build and ``n_seg - 1`` adds of equal size, every encoding read
    back from the base build's encode cache; ``max_segments=0`` turns the merge policy off (then
    there are ``n_seg`` segments), else it merges the smallest segments after each add."""
    bounds = np.linspace(0, len(base_docs), n_seg + 1).astype(int)
    r = HybridRetriever.from_models(max_segments=max_segments)
    t0 = time.perf_counter()
    encoded = 0
    r.index(base_docs[bounds[0]:bounds[1]], workdir=target, encode_cache=cache, batch_size=batch_size,
            show_progress=False)
    for a, b in zip(bounds[1:-1], bounds[2:]):
        encoded += r.add(base_docs[a:b], encode_cache=cache, batch_size=batch_size, show_progress=False).encoded
    took = time.perf_counter() - t0
    n = len(r.info()["segments"])
    return r, {"segments": n, "seconds": took, "encoded_by_the_adds": encoded,
               "docs_per_segment": int(np.diff(bounds).mean()), "adds": n_seg - 1, "max_segments": max_segments}


def section_segments(base: HybridRetriever, base_docs: list[Any], cache: Path, work: Path, texts: list[str],
                     qids: list[str], qrels: dict, batch_size: int) -> tuple[HybridRetriever, dict[str, Any]]:
    r, made = build_segmented(base_docs, cache, work / "segmented", SEGMENTS, batch_size)
    logger.info("  %d segments written in %.1f s", made["segments"], made["seconds"])
    r.search(texts[:2], k=K)  # loads the query encoders
    q = r.encode_queries(texts, {"dense", "sparse"})
    out: dict[str, Any] = {"made": made}
    lat = latency_rows(r, q, texts, f"{made['segments']} segments")
    logger.info("  latency measured")
    out["breakdown_segmented"] = breakdown(r, q)
    out["quality_segmented_vs_fresh"] = compare_quality(r, base, texts, qids, qrels, "segmented", "fresh build")
    # the default: the same adds with the merge policy (max_segments=8) keeping few segments
    merged_r, merged = build_segmented(base_docs, cache, work / "merged", SEGMENTS, batch_size, max_segments=8)
    merged_r.search(texts[:2], k=K)
    out["made_with_merge_policy"] = merged
    merged_label = f"{merged['segments']} segments (merge policy, {merged['adds']} adds)"
    lat += latency_rows(merged_r, merged_r.encode_queries(texts, {"dense", "sparse"}), texts, merged_label)
    del merged_r
    t0 = time.perf_counter()
    res = r.compact(show_progress=False)
    out["compact"] = {"seconds": time.perf_counter() - t0, "write_result": res.to_dict(),
                      "segments_after": len(r.info()["segments"])}
    q = r.encode_queries(texts, {"dense", "sparse"})
    lat += latency_rows(r, q, texts, "compacted")
    out["breakdown_compacted"] = breakdown(r, q)
    out["quality_compacted_vs_fresh"] = compare_quality(r, base, texts, qids, qrels, "compacted", "fresh build")
    by = {(x["index"], x["method"]): x for x in lat}
    seg_label = f"{made['segments']} segments"
    for m in METHODS:
        c = by[("compacted", m)]
        for label, name in ((seg_label, "ratio segmented ÷ compacted"), (merged_label, "ratio merge policy ÷ compacted")):
            s = by[(label, m)]
            lat.append({"index": name, "method": m,
                        **{col: s[col] / c[col] for col in ("ms/query batch", "ms/query single", "ms/query end to end")}})
    out["latency"] = lat
    out["target_ratio_max"] = 1.5
    return r, out


def section_filters(r: HybridRetriever, base_docs: list[Any], texts: list[str]) -> dict[str, Any]:
    """Metadata-only upsert of a bucket field, then filtered search per method and a brute-force check."""
    docs = [{"id": d.id, "title": d.title, "text": d.text, "metadata": {**d.metadata, "bucket": bucket(d.id)}}
            for d in base_docs]
    t0 = time.perf_counter()
    res = r.upsert(docs, show_progress=False)
    up = {"seconds": time.perf_counter() - t0, "write_result": res.to_dict(),
          "segments_after": len(r.info()["segments"])}
    t0 = time.perf_counter()
    r.compact(show_progress=False)
    up["compact_seconds_after"] = time.perf_counter() - t0
    q = r.encode_queries(texts, {"dense", "sparse"})
    n = len(texts)
    rows, checks = [], {}
    for label, spec in (("none", None), *FILTERS.items()):
        filt = parse_filter(spec)
        if spec is not None:
            checks[label] = brute_force_check(r, q, spec)
        matching = checks[label]["matching_docs"] if spec is not None else r.num_docs
        for m in METHODS:
            batch, single, e2e = searcher_fns(r, q, texts, m, filt, spec)
            got = top_ids(r, texts, m, spec=spec)
            violations = sum(bucket(x) not in _allowed_buckets(spec) for row in got for x in row) if spec else 0
            rows.append({"filter": label, "matching docs": matching, "selectivity": matching / r.num_docs,
                         "method": m, "ms/query batch": ms_per_query(batch, n), "ms/query single": ms_per_query(single, n),
                         "ms/query end to end": ms_per_query(e2e, n, rounds=1),
                         "hits/query": float(np.mean([len(x) for x in got])), "hits outside the filter": violations})
    base = {x["method"]: x for x in rows if x["filter"] == "none"}
    for x in rows:
        x["÷ unfiltered (batch)"] = x["ms/query batch"] / base[x["method"]]["ms/query batch"]
    return {"metadata_upsert": up, "filters": {k: v for k, v in FILTERS.items()}, "latency": rows,
            "brute_force": checks}


def _allowed_buckets(spec: Any) -> set[int]:
    (cond,) = spec.values()
    return set(range(cond["$lt"])) if isinstance(cond, dict) else {int(cond)}


# --------------------------------------------------------------------------- output

def tables(res: dict[str, Any]) -> str:
    parts = []
    b = res["build"]
    a = res["add"]
    add_s = a["add_seconds"]
    build_note = "measured when the base index was built" + (f"; {b['note']}" if b.get("note") else "")
    parts.append(f"**add {a['docs_added']} documents to a {a['index_docs_before']:,}-document index**\n\n" + table([
        {"what": "retriever.add(docs)", "seconds": add_s, "÷ add": 1.0},
        {"what": "encoder.encode_documents(texts) alone", "seconds": a["encode_alone_seconds"],
         "÷ add": a["encode_alone_seconds"] / add_s, "notes": "same warm encoder, faster of a run before and after"},
        {"what": "constant overhead (add - encode alone)", "seconds": a["overhead_seconds"]},
        {"what": f"full build of {b['docs']:,} documents", "seconds": b["seconds"], "÷ add": b["seconds"] / add_s,
         "notes": build_note},
        {"what": f"full rebuild of {b['docs']:,} documents, this run", "seconds": a["rebuild_estimate_seconds"],
         "÷ add": a["rebuild_estimate_over_add"],
         "notes": f"{a['rebuild_from_cache_seconds']:.1f} s build with every encoding cached + "
                  f"{a['rebuild_encoding_seconds_at_add_rate']:.0f} s encoding at the rate measured above"},
    ], ["what", "seconds", "÷ add", "notes"]) + f"\n\nadd ÷ encode alone: {a['add_over_encode']:.2f}; constant overhead "
        f"{a['overhead_seconds']:.2f} s. Peak RSS of the add: +{a['peak_rss_delta_bytes'] / 1e6:,.0f} MB over "
        f"{a['rss_before_bytes'] / 1e6:,.0f} MB (index and models loaded). Segments after: {a['segments_after']}.")
    s = res["segments"]
    cols = ["index", "method", "ms/query batch", "ms/query single", "ms/query end to end"]
    parts.append(f"**search latency, {s['made']['segments']} segments of ~{s['made']['docs_per_segment']:,} documents "
                 f"vs compacted** ({res['queries']} queries, k={K}; pre-encoded queries unless end to end)\n\n"
                 + table(s["latency"], cols))
    br = [{"index": lbl, "retriever": m, **v} for lbl, key in (("segmented", "breakdown_segmented"),
                                                                 ("compacted", "breakdown_compacted"))
          for m, v in s[key].items()]
    parts.append("**where the pre-encoded batch time goes**\n\n"
                 + table(br, ["index", "retriever", "prepare ms/query", "segments ms/query", "merge ms/query"]))
    for key, lbl in (("quality_segmented_vs_fresh", "segmented"), ("quality_compacted_vs_fresh", "compacted")):
        cols = ["method", f"nDCG@10 {lbl}", "nDCG@10 fresh build", "queries with a different top-10 (ids, in order)",
                "queries with a different top-10 (as sets)", "queries with different top-10 scores", "queries"]
        parts.append(f"**{lbl} vs a fresh one-segment build of the same documents**\n\n" + table(s[key], cols))
    f = res["filters"]
    up = f["metadata_upsert"]
    parts.append(f"**filtered search** (metadata-only upsert of {up['write_result']['updated']:,} documents: "
                 f"{up['seconds']:.1f} s, encoded {up['write_result']['encoded']}; compacted after in "
                 f"{up['compact_seconds_after']:.1f} s)\n\n" + table(f["latency"], [
                     "filter", "matching docs", "method", "ms/query batch", "ms/query single", "ms/query end to end",
                     "÷ unfiltered (batch)", "hits/query", "hits outside the filter"]))
    bf = [{"filter": lbl, "matching docs": c["matching_docs"], "retriever": m,
           "queries whose top-10 differ from brute force": c[m]["queries_top10_differ"],
           "of which ties": c[m]["of_which_ties_at_equal_scores"]}
          for lbl, c in f["brute_force"].items() for m in ("dense", "sparse")]
    parts.append("**filtered top-10 vs brute force over the matching documents**\n\n" + table(bf, [
        "filter", "matching docs", "retriever", "queries whose top-10 differ from brute force", "of which ties"]))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv)")
    ap.add_argument("--docs", type=int, default=None, help="use the first N passages only")
    ap.add_argument("--add", type=int, default=None, help="documents held out and added (default 1%%)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: at most 120 documents and 10 queries, one short timing round")
    ap.add_argument("--index-root", type=Path, default=ROOT / "indexes")
    ap.add_argument("--out", type=Path, default=RESULTS / "living.json")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--encode-cache", type=Path, default=None,
                    help="encode cache of the base build (default <index>.encode-cache); keyed on content, so the "
                         "cache of a larger build serves any slice of it")
    ap.add_argument("--build-only", action="store_true", help="build (or resume) the base index and stop")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)7.0f ms  %(message)s")
    for noisy in ("hybridret", "sentence_transformers", "faiss"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.quick:
        peers.TIMING.update(min_seconds=0.01, rounds=1)
        args.docs = min(args.docs or 120, 120)
    if not (args.data / "corpus.jsonl").is_file():
        print(f"no BEIR collection at {args.data}", file=sys.stderr)
        return 2
    base_docs, add_docs = split_corpus(args.data, args.docs, args.add)
    short = "msmarco" if args.data.resolve() == DATA.resolve() else args.data.name
    name = f"bench-living-{short}" + (f"-{args.docs}" if args.docs else "")
    index_dir = args.index_root / name
    logger.info("base index %s: %d documents (%d held out for the add)", index_dir, len(base_docs), len(add_docs))
    cache = args.encode_cache or index_dir.parent / f"{name}.encode-cache"
    build = build_base(base_docs, index_dir, cache, args.batch_size)
    logger.info("base build: %.0f s (%.1f docs/s)", build["seconds"], build["docs_per_s"])
    if args.build_only:
        return 0
    queries = load_queries(args.data / "queries.jsonl")
    qrels = load_qrels(args.data / "qrels" / "test.tsv")
    qids = [q for q in queries if qrels.get(q)][: 10 if args.quick else None]
    texts = [queries[q] for q in qids]
    work = args.index_root / f"{name}.work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    result: dict[str, Any] = {"collection": args.data.name, "machine": machine(), "docs": len(base_docs) + len(add_docs),
                              "base_docs": len(base_docs), "queries": len(texts), "k": K, "build": build,
                              "quick": bool(args.quick),
                              "command": " ".join(["python benchmarks/living.py", *(argv if argv is not None else sys.argv[1:])])}
    try:
        logger.info("add ...")
        result["add"] = section_add(index_dir, work, add_docs, build, args.batch_size)
        result["add"].update(rebuild_estimate(base_docs, cache, work, result["add"], args.batch_size))
        base = HybridRetriever.load(index_dir)
        logger.info("segments ...")
        seg, result["segments"] = section_segments(base, base_docs, cache, work, texts, qids, qrels, args.batch_size)
        logger.info("filters ...")
        result["filters"] = section_filters(seg, base_docs, texts)
        logger.info("done")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(tables(result))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
