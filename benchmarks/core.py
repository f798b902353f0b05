"""Core engine benchmark on a BEIR-format folder: index build rate, search rate per method, quality.

    python benchmarks/core.py [--data ../shared/data/msmarco-dl19-pool] [--index DIR] [--rebuild]

Builds (or reuses) an index with the default packaged models, then for every method reports
queries/s end to end (query encoding included) and for the index alone (pre-encoded queries,
one thread and all threads), plus nDCG@10 / MRR@10 / Recall@100 via pytrec_eval on each method's
top-100. Writes benchmarks/results/core-<collection>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, SHARED, Timer, encode_queries, machine, table, write_json  # noqa: E402
from _suite import bm25_search  # noqa: E402

from hybridret import CorpusReader, HybridRetriever, load_qrels, load_queries  # noqa: E402
from hybridret.eval import evaluate, run_from_hits  # noqa: E402
from hybridret.index._tantivy import SparseSearchStats  # noqa: E402
from hybridret.search.run import fused_search  # noqa: E402

METHODS = ("dense", "sparse", "bm25", "linear", "rrf", "hybrid")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SHARED / "msmarco-dl19-pool")
    ap.add_argument("--index", type=Path, default=None, help="index dir (default: indexes/bench-<name>)")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="timing repetitions (best is kept)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--build-sample", type=int, default=0,
                    help="also time a fresh build of the first N documents (into a temporary folder)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.data.is_dir():
        print(f"no collection at {args.data}", file=sys.stderr)
        return 2
    name = args.data.name
    index_dir = args.index or ROOT / "indexes" / f"bench-{name}"
    result: dict = {"collection": name, "machine": machine()}

    if args.rebuild or not (index_dir / "manifest.json").exists():
        reader = CorpusReader(args.data)
        retriever = HybridRetriever.from_models()
        with Timer() as t:
            retriever.index(reader, batch_size=args.batch_size, workdir=index_dir)
            retriever.save(index_dir, overwrite=True)
        result["build"] = {"docs": retriever.num_docs, "seconds": t.seconds, "docs_per_s": retriever.num_docs / t.seconds}
        print(f"built {index_dir}: {retriever.num_docs} docs in {t.seconds:.0f} s "
              f"({retriever.num_docs / t.seconds:.1f} docs/s, encoding included)")
    else:
        previous = RESULTS / f"core-{name}.json"
        if previous.is_file() and "build" in json.loads(previous.read_text()):
            result["build"] = {**json.loads(previous.read_text())["build"], "from_an_earlier_run": True}
    retriever = HybridRetriever.load(index_dir)
    result["index"] = {"dir": str(index_dir), "bytes_on_disk": retriever.info()["bytes_on_disk"]}

    if args.build_sample:
        import itertools
        import tempfile

        sample = list(itertools.islice(iter(CorpusReader(args.data)), args.build_sample))
        fresh = HybridRetriever.from_models()
        fresh.encoder.encode_documents(["warm up"])
        with tempfile.TemporaryDirectory() as tmp, Timer() as t:
            fresh.index(sample, batch_size=args.batch_size, workdir=tmp)
        result["build_sample"] = {"docs": len(sample), "seconds": t.seconds, "docs_per_s": len(sample) / t.seconds}
        print(f"fresh build of {len(sample)} docs: {len(sample) / t.seconds:.1f} docs/s")
    queries = load_queries(args.data / "queries.jsonl")
    qrels = load_qrels(args.data / "qrels" / "test.tsv")
    qids = [q for q in queries if q in qrels]
    texts = [queries[q] for q in qids]
    level = 2 if "msmarco" in name else 1
    retriever.search(texts[:2], k=10)  # warm up (loads the encoders)

    with Timer() as t:
        q = encode_queries(retriever, texts)
    qd, qs = q.dense, q.sparse
    snap = retriever.searcher.snapshot
    enc_qps = len(texts) / t.seconds
    rows = []
    for method in METHODS:
        hits = retriever.search(texts, k=100, method=method)
        quality = evaluate(run_from_hits(hits, qids), qrels, ("ndcg@10", "mrr@10", "recall@100"), relevance_level=level)
        best_e2e = min(_time(lambda: retriever.search(texts, k=10, method=method)) for _ in range(args.repeat))
        only = {}
        for threads in (1, None):
            def run_index() -> None:
                if method == "dense":
                    retriever.dense.search(qd, 10)
                elif method == "sparse":
                    retriever.sparse.search(qs, 10, threads=threads)
                elif method == "bm25":
                    bm25_search(retriever.part("bm25"), texts, 10, threads)
                else:  # fused methods: candidate gathering, exact scoring and fusion, queries pre-encoded
                    fused_search(retriever.fusion_config(method), 10, snap, q)
            if threads == 1 and method in ("linear", "rrf", "hybrid", "dense"):
                continue  # no single-thread switch for FAISS or the fused path
            only["1 thread" if threads == 1 else "all threads"] = len(texts) / min(_time(run_index) for _ in range(args.repeat))
        row = {"method": method, **{k: round(v, 4) for k, v in quality.items()},
               "q/s end-to-end": len(texts) / best_e2e, "q/s index, 1 thread": only.get("1 thread", ""),
               "q/s index, all threads": only.get("all threads", "")}
        rows.append(row)
    result["query_encoding_qps"] = enc_qps
    result["methods"] = rows
    stats = SparseSearchStats()  # tantivy depth the exact sparse top-10 needed, per query
    retriever.sparse.search(qs, 10, stats=stats)
    result["sparse_depth_mean"] = float(sum(stats.fetched) / max(1, len(qids)))
    cols = ["method", "ndcg@10", "mrr@10", "recall@100", "q/s end-to-end", "q/s index, 1 thread", "q/s index, all threads"]
    print(f"\n{name}: {len(qids)} queries, {retriever.num_docs} docs; query encoding {enc_qps:.0f} q/s (dense + sparse)")
    print(table(rows, cols))
    write_json(RESULTS / f"core-{name}.json", result)
    return 0


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    with Timer() as t:
        fn()
    return t.seconds


if __name__ == "__main__":
    sys.exit(main())
