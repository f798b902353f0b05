"""Filtered search on ANN indexes: recall of HNSW and IVF under a metadata filter, against exact search.

FAISS applies hybridret's filter through its own ID selector (search parameters keep the index's
efSearch / nprobe), so the graph or the visited lists only return matching documents; how many of
the exact top-10 they still reach is what this measures, at ~50%, ~5% and ~0.1% selectivity (the
documents get ``bucket = crc32(id) % 1000``, as in benchmarks/living.py).

    python benchmarks/filtered_ann.py            # the 30k MS MARCO pool, encodings from living.py's cache
    python benchmarks/filtered_ann.py --docs 3000

Writes benchmarks/results/filtered-ann.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
from _common import RESULTS, ROOT, SHARED, machine, table, write_json

from hybridret import HybridRetriever

FILTERS = {"none": None, "~50%": {"bucket": {"$lt": 500}}, "~5%": {"bucket": {"$lt": 50}}, "~0.1%": {"bucket": 0}}
FACTORIES = ("Flat", "HNSW32,Flat", "IVF256,Flat")
K = 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SHARED / "msmarco-dl19-pool")
    ap.add_argument("--docs", type=int, default=None)
    ap.add_argument("--encode-cache", type=Path, default=ROOT / "indexes" / "bench-living-msmarco.encode-cache")
    ap.add_argument("--out", type=Path, default=RESULTS / "filtered-ann.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    docs = []
    with open(args.data / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            docs.append({"id": d["_id"], "title": d.get("title", ""), "text": d["text"],
                         "metadata": {"bucket": zlib.crc32(d["_id"].encode()) % 1000}})
            if args.docs and len(docs) >= args.docs:
                break
    queries = [json.loads(x)["text"] for x in (args.data / "queries.jsonl").read_text().splitlines() if x.strip()]
    rows, out = [], {"machine": machine(), "docs": len(docs), "queries": len(queries), "k": K, "results": []}
    with tempfile.TemporaryDirectory() as tmp:
        built = {}
        for factory in FACTORIES:
            t0 = time.perf_counter()
            r = HybridRetriever.from_models(faiss_factory=factory, bm25=False)
            r.index(docs, workdir=Path(tmp) / factory.replace(",", "_"), encode_cache=args.encode_cache,
                    show_progress=False)
            built[factory] = (r, time.perf_counter() - t0)
        q = built["Flat"][0].encode_queries(queries, {"dense"})
        for label, spec in FILTERS.items():
            exact = built["Flat"][0].search(queries, k=K, method="dense", filter=spec)
            for factory in FACTORIES:
                r = built[factory][0]
                seg = r.searcher.snapshot.segments[0]
                t0 = time.perf_counter()
                hits = r.search(queries, k=K, method="dense", filter=spec)
                ms = (time.perf_counter() - t0) / len(queries) * 1e3
                recall = np.mean([len(set(a[a != ""]) & set(b[b != ""])) / max(1, (b != "").sum())
                                  for a, b in zip(hits.ids, exact.ids)])
                row = {"filter": label, "factory": factory, "faiss in the segment": seg.dense.factory,
                       "recall@10 vs exact": round(float(recall), 4), "ms/query end to end": round(ms, 2),
                       "hits/query": float((hits.ids != "").sum(1).mean())}
                rows.append(row)
        out["build_seconds"] = {f: round(s, 1) for f, (_, s) in built.items()}
        del q
    out["results"] = rows
    print(table(rows, list(rows[0])))
    write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
