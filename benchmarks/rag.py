"""RAG over documents made of chunks: distinct documents in the top 10, document-level nDCG@10,
and the cost of grouping and of a cross-encoder reranker, on the shared MS MARCO pool.

How the "documents" are made: the pool's 30,005 passages are sorted by MS MARCO passage id and cut
into runs of 1-8 consecutive passages (sizes drawn with a fixed seed, mean 4.5); each run is one
synthetic document and each passage one chunk (metadata ``parent_id``). Consecutive MS MARCO ids
often come from the same query's candidate set, so a document tends to hold related passages, as
a long web page does. A document's relevance to a query is the best grade of its passages.

Budget (encoding costs ~18 passages/s on one core): the run keeps ``--queries`` DL19 queries,
every document holding a judged passage of one of them, and random other documents until
``--passages`` chunks; ``--smoke`` is a 300-chunk, 4-query version (a minute) for CI.

Per method (dense, learned sparse, BM25, hybrid) it measures, per query:

* ``chunks@10``: the plain top 10 chunks: how many distinct documents they hold, and the
  document-level nDCG@10 of those documents (in order of their best chunk);
* ``chunks@30->10``: the usual workaround, 30 chunks deduplicated to the first 10 documents;
* ``group max``: ``search(k=10, group_by="parent_id", group_size=3)``: 10 documents (the library's
  group score, the best chunk's score);
* ``group decayed``: the alternative group score ``s1 + s2/2 + s3/4`` over a document's best 3
  chunks, re-ranking the top 30 groups by max (single retrievers only: fused scores of GQR are
  z-scores and may be negative, where a sum is meaningless);
* the search time per query of the plain top 10 and of the grouped search.

The reranker row: a cross-encoder of the size of ``cross-encoder/ms-marco-MiniLM-L6-v2`` (the
packaged all-MiniLM-L6-v2 encoder with a randomly initialised one-logit head: no cross-encoder
weights can be installed here, so it measures cost only, not quality) reranking the hybrid top
``--rerank-depth`` through ``search(rerank=folder)``, time per query.

Prints a table and writes ``benchmarks/results/rag.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import RESULTS, SHARED, machine, table, write_json  # noqa: E402

METHODS = ("dense", "sparse", "bm25", "hybrid")
DECAY = (1.0, 0.5, 0.25)


def read_pool(folder: Path) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, dict[str, int]]]:
    corpus = [json.loads(line) for line in (folder / "corpus.jsonl").open(encoding="utf-8")]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (folder / "queries.jsonl").open(encoding="utf-8"))}
    qrels: dict[str, dict[str, int]] = {}
    dl19 = folder / "qrels" / "dl19.tsv"
    with (dl19 if dl19.is_file() else folder / "qrels" / "test.tsv").open(encoding="utf-8") as fh:
        next(fh)
        for line in fh:
            qid, pid, grade = line.split("\t")
            qrels.setdefault(qid, {})[pid] = int(grade)
    return corpus, queries, qrels


def cut_documents(corpus: list[dict[str, Any]], seed: int = 22) -> list[list[dict[str, Any]]]:
    """Runs of 1-8 consecutive passages (by passage id) as documents."""
    rng = random.Random(seed)
    ordered = sorted(corpus, key=lambda d: int(d["_id"]) if d["_id"].isdigit() else d["_id"])
    docs, at = [], 0
    while at < len(ordered):
        n = rng.randint(1, 8)
        docs.append(ordered[at:at + n])
        at += n
    return docs


def select(docs: list[list[dict[str, Any]]], qrels: dict[str, dict[str, int]], n_queries: int, n_passages: int,
           seed: int = 22) -> tuple[list[list[dict[str, Any]]], list[str]]:
    """The queries kept, every document with a judged passage of theirs, then random documents."""
    rng = random.Random(seed)
    qids = sorted(qrels)[:n_queries] if n_queries < len(qrels) else sorted(qrels)
    judged = {pid for q in qids for pid in qrels[q]}
    keep = [d for d in docs if any(p["_id"] in judged for p in d)]
    rest = [d for d in docs if not any(p["_id"] in judged for p in d)]
    rng.shuffle(rest)
    total = sum(len(d) for d in keep)
    for d in rest:
        if total >= n_passages:
            break
        keep.append(d)
        total += len(d)
    return keep, qids


def ndcg10(ranked: list[str], grades: dict[str, int]) -> float:
    import math

    dcg = sum((2 ** grades.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(grades.values(), reverse=True)[:10]
    idcg = sum((2 ** g - 1) / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def first_docs(hits: list[Any], n: int = 10) -> list[str]:
    out: list[str] = []
    for h in hits:
        p = h.metadata["parent_id"]
        if p not in out:
            out.append(p)
    return out[:n]


def timed(fn: Any, repeat: int) -> tuple[Any, float]:
    fn()  # warm (encoder, caches, group index of the snapshot)
    start = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    return out, (time.perf_counter() - start) / repeat


def cross_encoder_folder(where: Path) -> Path:
    """all-MiniLM-L6-v2 (the size of ms-marco-MiniLM-L6-v2) with a random one-logit head, as safetensors."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from hybridret.models import resolve_model

    src = resolve_model("all-MiniLM-L6-v2")
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(src, num_labels=1)
    model.save_pretrained(where, safe_serialization=True)
    AutoTokenizer.from_pretrained(src).save_pretrained(where)
    return where


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", type=Path, default=SHARED / "msmarco-dl19-pool")
    ap.add_argument("--queries", type=int, default=20, help="DL19 queries kept (default: 20)")
    ap.add_argument("--passages", type=int, default=4000, help="chunks indexed (default: 4000)")
    ap.add_argument("--rerank-depth", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3, help="timed repetitions of each search")
    ap.add_argument("--smoke", action="store_true", help="300 chunks, 4 queries: the CI version")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS / "rag.json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.queries, args.passages, args.rerank_depth, args.repeat = 4, 300, 10, 1
    if not (args.pool / "corpus.jsonl").is_file():
        print(f"skipped: {args.pool} is not there (the shared MS MARCO pool)")
        return 0
    import torch

    from hybridret import HybridRetriever

    torch.set_num_threads(1)
    corpus, queries, qrels = read_pool(args.pool)
    docs, qids = select(cut_documents(corpus), qrels, args.queries, args.passages)
    chunks = [{"id": p["_id"], "text": p["text"], "metadata": {"parent_id": f"D{i}", "chunk": j}}
              for i, d in enumerate(docs) for j, p in enumerate(d)]
    parent = {c["id"]: c["metadata"]["parent_id"] for c in chunks}
    doc_grades = {}
    for q in qids:
        g: dict[str, int] = {}
        for pid, grade in qrels[q].items():
            if pid in parent:
                g[parent[pid]] = max(g.get(parent[pid], 0), grade)
        doc_grades[q] = g
    texts = [queries[q] for q in qids]
    tmp = tempfile.TemporaryDirectory()
    work = args.workdir or Path(tmp.name)
    t0 = time.perf_counter()
    r = HybridRetriever.from_models().index(chunks, workdir=work / "idx", show_progress=False)
    build_s = time.perf_counter() - t0
    print(f"indexed {len(chunks)} chunks of {len(docs)} documents in {build_s:.0f} s; {len(qids)} queries")

    rows, results = [], {}
    for method in METHODS:
        flat, t_flat = timed(lambda: r.search(texts, k=10, method=method), args.repeat)
        deep = r.search(texts, k=30, method=method)
        grouped, t_group = timed(lambda: r.search(texts, k=10, method=method, group_by="parent_id", group_size=3),
                                 args.repeat)
        out: dict[str, Any] = {"ms_per_query": {"chunks@10": 1000 * t_flat / len(texts),
                                                "group@10": 1000 * t_group / len(texts)}}
        variants = {"chunks@10": [first_docs(flat[i]) for i in range(len(texts))],
                    "chunks@30->10": [first_docs(deep[i]) for i in range(len(texts))],
                    "group max": [[g.key for g in grouped.groups(i)] for i in range(len(texts))]}
        if method != "hybrid":
            wide = r.search(texts, k=30, method=method, group_by="parent_id", group_size=3)
            variants["group decayed"] = []
            for i in range(len(texts)):
                rescored = sorted(wide.groups(i), key=lambda g: -sum(w * h.score for w, h in zip(DECAY, g.hits)))
                variants["group decayed"].append([g.key for g in rescored][:10])
        for name, lists in variants.items():
            distinct = sum(len(x) for x in lists) / len(lists)
            nd = sum(ndcg10(x, doc_grades[q]) for x, q in zip(lists, qids)) / len(lists)
            out[name] = {"distinct_docs_top10": round(distinct, 2), "doc_ndcg@10": round(nd, 4)}
            rows.append({"method": method, "result": name, "distinct docs": distinct, "doc nDCG@10": nd,
                         "ms/query": out["ms_per_query"].get("group@10" if name.startswith("group") else "chunks@10")
                         if name != "chunks@30->10" else None})
        results[method] = out
    folder = cross_encoder_folder(work / "ce")
    r.search(texts[:1], k=10, method="hybrid", rerank=str(folder), rerank_depth=args.rerank_depth)  # load, warm
    start = time.perf_counter()  # one timed call: the reranker dominates, repeats add little
    r.search(texts, k=10, method="hybrid", rerank=str(folder), rerank_depth=args.rerank_depth)
    t_rr = time.perf_counter() - start
    _, t_h = timed(lambda: r.search(texts, k=10, method="hybrid"), args.repeat)
    rerank = {"model": "all-MiniLM-L6-v2 body + random head (22.7M parameters, the size of "
                       "cross-encoder/ms-marco-MiniLM-L6-v2)", "depth": args.rerank_depth,
              "ms_per_query": 1000 * t_rr / len(texts), "hybrid_ms_per_query": 1000 * t_h / len(texts),
              "device": getattr(r.searcher.reranker(str(folder)), "device", None)}
    rows.append({"method": "hybrid", "result": f"+ rerank top {args.rerank_depth}", "distinct docs": None,
                 "doc nDCG@10": None, "ms/query": rerank["ms_per_query"]})
    print(table(rows, ["method", "result", "distinct docs", "doc nDCG@10", "ms/query"]))
    print(f"(reranker: cost only, random head; hybrid without it {rerank['hybrid_ms_per_query']:.1f} ms/query)")
    write_json(args.out, {
        "collection": "msmarco-dl19-pool", "smoke": args.smoke, "machine": machine(),
        "documents": {"how": "passages sorted by MS MARCO id, cut into runs of 1-8 (seed 22)", "count": len(docs),
                      "chunks": len(chunks), "queries": len(qids), "build_seconds": round(build_s, 1)},
        "methods": results, "rerank": rerank, "table": rows,
        "columns": ["method", "result", "distinct docs", "doc nDCG@10", "ms/query"],
        "notes": "ms/query: a batch of all queries, one core, after one warm-up call; group decayed = s1+s2/2+s3/4 "
                 "over each of the top 30 groups by max"})
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
