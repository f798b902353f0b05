"""Diversity (MMR, ``search(..., diversify=λ)``): redundancy of the top 10 and nDCG@10 at λ = 1.0 / 0.9 / 0.7 / 0.5.

For each shared collection (BEIR format under ``../shared/data``; a missing one is skipped with a
line saying so), the documents are indexed **as chunks** (``chunk_tokens`` tokens, the library's
chunker: metadata ``parent_id``), since a RAG prompt is filled with chunks and near-identical chunks
of one document are what MMR should thin out. Every judged query is searched with ``hybrid`` (the
default) and, per λ:

* ``chunks``: the plain top 10 chunks in MMR order: the mean and the max pairwise cosine of their
  dense vectors (per query, then averaged over queries), the distinct documents among them, and the
  document-level nDCG@10 of those documents (each document at the rank of its first chunk; linear
  gains, as trec_eval's ``ndcg_cut_10``);
* ``documents``: ``group_by="parent_id"`` (10 documents, diversified by their best chunks): the same
  cosines between the documents' best chunks and nDCG@10 of the 10 documents;
* the search time per query (median of ``--repeats`` passes over the queries, after one warm pass),
  with and without ``diversify`` (both include encoding the query, which dominates), and the MMR
  computation alone (:func:`~hybridret.search.diversify.mmr_order` over pools of 100 and 300
  candidates of 384 dimensions, 10 picked: what the stage adds beyond reading the pool's vectors).

λ = 1.0 is the plain order (the stage returns the first stage's order; checked here).

    taskset -c 1 python benchmarks/rag_diversity.py                 # adi + medline: table + results/rag-diversity.json
    python benchmarks/rag_diversity.py --collections adi --smoke    # a minute
    python benchmarks/rag_diversity.py --beir tests-folder --smoke  # any BEIR folder (what CI runs)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import RESULTS, ROOT, SHARED, table, write_json  # noqa: E402

from hybridret import CorpusReader, HybridRetriever, load_qrels, load_queries  # noqa: E402
from hybridret.retrievers import vectors_of  # noqa: E402
from hybridret.search.diversify import mmr_order  # noqa: E402

LAMBDAS = (1.0, 0.9, 0.7, 0.5)
K = 10


def chunked_index(folder: Path, root: Path, chunk_tokens: int, limit: int | None) -> HybridRetriever:
    """The collection's chunks with the packaged models, built once into ``root/div-NAME-TOKENS``."""
    out = root / (f"div-{folder.name}-{chunk_tokens}" + (f"-{limit}" if limit else ""))
    if not (out / "manifest.json").exists():
        docs = list(CorpusReader(folder))[:limit] if limit else list(CorpusReader(folder))
        r = HybridRetriever.from_models()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r.index(docs, workdir=out, chunk_tokens=chunk_tokens, chunk_overlap=0)
        r.save(out, overwrite=True)
    return HybridRetriever.load(out)


def ndcg10(ranked: list[str], grades: dict[str, int]) -> float:
    dcg = sum(grades.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:K]))
    ideal = sorted((g for g in grades.values() if g > 0), reverse=True)[:K]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def redundancy(snap: Any, rows: np.ndarray) -> tuple[float, float]:
    """Mean and max pairwise cosine of the rows' dense vectors (nan with fewer than two)."""
    rows = rows[rows >= 0]
    if len(rows) < 2:
        return float("nan"), float("nan")
    v = vectors_of(snap, rows).astype(np.float64)
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    sims = (v @ v.T)[np.triu_indices(len(rows), 1)]
    return float(sims.mean()), float(sims.max())


def measure(r: HybridRetriever, queries: dict[str, str], qrels: dict[str, dict[str, int]], repeats: int
            ) -> list[dict[str, Any]]:
    snap = r.searcher.snapshot
    qids = list(queries)
    texts = [queries[q] for q in qids]
    out = []
    plain = {mode: r.search(texts, k=K, **kw) for mode, kw in
             (("chunks", {}), ("documents", {"group_by": "parent_id", "group_size": 1}))}
    for lam in LAMBDAS:
        for mode, kw in (("chunks", {}), ("documents", {"group_by": "parent_id", "group_size": 1})):
            hits = r.search(texts, k=K, diversify=lam, **kw)
            if lam == 1.0:
                assert hits.ids.tolist() == plain[mode].ids.tolist(), "λ = 1 must be the plain order"
            means, maxes, distinct, gains = [], [], [], []
            for i, qid in enumerate(qids):
                rows = hits.rows[i]
                m, x = redundancy(snap, rows)
                means.append(m)
                maxes.append(x)
                parents = [str(h.metadata.get("parent_id", h.id)) for h in hits[i]]
                docs = list(dict.fromkeys(parents))
                distinct.append(len(docs))
                gains.append(ndcg10(docs, qrels.get(qid, {})))
            times = []
            r.search(texts, k=K, diversify=lam, **kw)  # warm
            for _ in range(repeats):
                t = time.perf_counter()
                for text in texts:
                    r.search(text, k=K, diversify=lam, **kw)
                times.append((time.perf_counter() - t) / len(texts) * 1000)
            base = []
            for _ in range(repeats):
                t = time.perf_counter()
                for text in texts:
                    r.search(text, k=K, **kw)
                base.append((time.perf_counter() - t) / len(texts) * 1000)
            out.append({"lambda": lam, "mode": mode, "queries": len(qids),
                        "mean_cos": float(np.nanmean(means)), "max_cos": float(np.nanmean(maxes)),
                        "distinct_docs": float(np.mean(distinct)), "ndcg@10": float(np.mean(gains)),
                        "ms_per_query": statistics.median(times), "ms_spread": [min(times), max(times)],
                        "ms_plain": statistics.median(base)})
    return out


def mmr_cost(repeats: int) -> list[dict[str, Any]]:
    """Milliseconds of one query's MMR (10 picked) over pools of 100 and 300 candidates, 384 dims."""
    rng = np.random.default_rng(0)
    out = []
    for m in (100, 300):
        scores = rng.normal(size=(1, m))
        vecs = rng.normal(size=(1, m, 384)).astype(np.float32)
        valid = np.ones((1, m), bool)
        times = []
        for _ in range(max(repeats, 3)):
            t = time.perf_counter()
            for _ in range(50):
                mmr_order(scores, vecs, valid, 0.7, K)
            times.append((time.perf_counter() - t) / 50 * 1000)
        out.append({"pool": m, "dim": 384, "picked": K, "ms": statistics.median(times),
                    "ms_spread": [min(times), max(times)]})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collections", nargs="*", default=["adi", "medline"], help="names under ../shared/data")
    p.add_argument("--beir", nargs="*", default=[], type=Path, help="other BEIR folders")
    p.add_argument("--chunk-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="60 documents, 5 queries, 1 repeat")
    p.add_argument("--index-root", type=Path, default=ROOT / "indexes")
    p.add_argument("--out", type=Path, default=RESULTS / "rag-diversity.json")
    args = p.parse_args(argv)
    folders = [SHARED / c for c in args.collections] + list(args.beir)
    results: dict[str, Any] = {"k": K, "lambdas": list(LAMBDAS), "chunk_tokens": args.chunk_tokens,
                               "method": "hybrid", "collections": {}}
    for folder in folders:
        if not (folder / "corpus.jsonl").is_file():
            print(f"skipped {folder.name}: no {folder}/corpus.jsonl")
            continue
        queries = load_queries(folder / "queries.jsonl")
        qrels = load_qrels(folder / "qrels" / "test.tsv")
        queries = {q: t for q, t in queries.items() if qrels.get(q)}
        if args.smoke:
            queries = dict(list(queries.items())[:5])
        r = chunked_index(folder, args.index_root, args.chunk_tokens, 60 if args.smoke else None)
        docs, chunks = r.document_counts()
        t = time.perf_counter()
        rows = measure(r, queries, qrels, 1 if args.smoke else args.repeats)
        print(f"\n{folder.name}: {docs} documents, {chunks} chunks of <= {args.chunk_tokens} tokens, "
              f"{len(queries)} judged queries, hybrid, top {K} ({time.perf_counter() - t:.0f} s)")
        print(table(rows, ["mode", "lambda", "mean_cos", "max_cos", "distinct_docs", "ndcg@10", "ms_per_query",
                           "ms_plain"]))
        results["collections"][folder.name] = {"documents": docs, "chunks": chunks, "rows": rows}
    results["mmr_order_ms"] = mmr_cost(args.repeats)
    print("\nMMR alone, one query:", ", ".join(f"pool {c['pool']}: {c['ms']:.3f} ms "
                                             f"({c['ms_spread'][0]:.3f}-{c['ms_spread'][1]:.3f})"
                                             for c in results["mmr_order_ms"]))
    write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
