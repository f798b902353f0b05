"""Fusion benchmark: dense, sparse, BM25, RRF, linear (default and tuned), GQR (default and tuned)
on every BEIR-format collection given, with each fusion's added latency and the GQR step cost.

    python benchmarks/fusion.py [DATA_DIR ...]     (default: every folder in ../shared/data)

Tuned settings are chosen on one half of the queries and scored on the other half, both ways
(2-fold), so the tuned numbers are honest held-out figures. nDCG@10 and Recall@100 come from
pytrec_eval over each method's top-100. Indexes are built once into indexes/bench-<name>.
Writes benchmarks/results/fusion.json and docs/fusion.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, SHARED, encode_queries, machine, table, write_json  # noqa: E402

from hybridret import CorpusReader, HybridRetriever, load_qrels, load_queries  # noqa: E402
from hybridret.eval import per_query, run_from_rows  # noqa: E402
from hybridret.hybrid import FusionConfig, fuse, gather_candidates  # noqa: E402
from hybridret.refine import GQRConfig, gqr_refine  # noqa: E402
from hybridret.retrievers import vectors_of  # noqa: E402
from hybridret.tune import default_grid  # noqa: E402

FIXED = {
    "RRF(dense, sparse)": FusionConfig("rrf", ("dense", "sparse")),
    "RRF(dense, sparse, BM25)": FusionConfig("rrf", ("dense", "sparse", "bm25")),
    "linear(dense, sparse) 0.5/0.5 minmax": FusionConfig("linear", ("dense", "sparse")),
    "linear(dense, sparse, BM25) equal": FusionConfig("linear", ("dense", "sparse", "bm25")),
    "GQR, sparse guide": FusionConfig("gqr", guide={"sparse": 1.0}),
    "GQR, sparse + BM25 guide (default)": FusionConfig("gqr", guide={"sparse": 0.5, "bm25": 0.5}),
    "GQR, sparse + BM25 guide, final=fuse": FusionConfig("gqr", gqr=GQRConfig(final="fuse")),
}
METRICS = ("ndcg@10", "recall@100")


def build(folder: Path) -> HybridRetriever:
    out = ROOT / "indexes" / f"bench-{folder.name}"
    if not (out / "manifest.json").exists():
        r = HybridRetriever.from_models()
        r.index(CorpusReader(folder), workdir=out)
        r.save(out, overwrite=True)
    return HybridRetriever.load(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="*", type=Path)
    ap.add_argument("--depth", type=int, default=100)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    folders = args.data or sorted(p for p in SHARED.iterdir() if (p / "corpus.jsonl").is_file())
    summary, per_coll, costs = [], {}, {}
    for folder in folders:
        r = build(folder)
        queries, qrels = load_queries(folder / "queries.jsonl"), load_qrels(folder / "qrels" / "test.tsv")
        qids = [q for q in queries if qrels.get(q)]
        texts = [queries[q] for q in qids]
        level = 2 if "msmarco" in folder.name else 1
        q = encode_queries(r, texts)
        qd, snap = q.dense, r.searcher.snapshot
        cands = {}
        t0 = time.perf_counter()
        for names in (("dense", "sparse"), ("dense", "sparse", "bm25")):
            cands[names] = gather_candidates(names, args.depth, snap, q)
        gather_s = time.perf_counter() - t0

        def score(rows: np.ndarray) -> dict[str, dict[str, float]]:
            return per_query(run_from_rows(rows, r.docs.ids, qids), qrels, METRICS, relevance_level=level)

        def cand_for(cfg: FusionConfig):  # type: ignore[no-untyped-def]
            names = ("dense", "sparse", "bm25") if "bm25" in cfg.union_retrievers else ("dense", "sparse")
            return cands[names]

        rows: dict[str, dict[str, dict[str, float]]] = {}
        latency: dict[str, float] = {}
        for label, k in (("dense", "dense"), ("sparse", "sparse"), ("BM25", "bm25")):
            rows[label] = score(r.search(texts, k=100, method=k).rows)
        for label, cfg in FIXED.items():
            c = cand_for(cfg)
            t0 = time.perf_counter()
            out, _, _ = fuse(cfg, c, 100, snap, q)
            latency[label] = (time.perf_counter() - t0) / len(qids) * 1e3
            rows[label] = score(out)
        # 2-fold tuning: pick on one half, score on the other
        rng = np.random.default_rng(0)
        perm = rng.permutation(len(qids))
        halves = [perm[: len(perm) // 2], perm[len(perm) // 2 :]]
        grid = default_grid(True, args.depth)
        grid_scores = []
        for cfg in grid:
            out, _, _ = fuse(cfg, cand_for(cfg), 100, snap, q)
            grid_scores.append(score(out))
        for label, methods in (("linear, tuned (2-fold)", ("linear",)), ("RRF, tuned (2-fold)", ("rrf",)),
                               ("GQR, tuned (2-fold)", ("gqr",)), ("any fusion, tuned (2-fold)", ("linear", "rrf", "gqr"))):
            held: dict[str, dict[str, float]] = {m: {} for m in METRICS}
            for a, b in ((0, 1), (1, 0)):
                train = [qids[i] for i in halves[a]]
                test = [qids[i] for i in halves[b]]
                best = max((i for i, c in enumerate(grid) if c.method in methods),
                           key=lambda i: np.mean([grid_scores[i]["ndcg@10"][q] for q in train]))
                for m in METRICS:
                    held[m].update({q: grid_scores[best][m][q] for q in test})
            rows[label] = held
        for label, res in rows.items():
            per_coll.setdefault(label, {})[folder.name] = {m: float(np.mean(list(res[m].values()))) for m in METRICS}
        costs[folder.name] = {"fusion_ms_per_query": latency, "candidate_gather_ms_per_query": gather_s / len(qids) * 1e3}
        # GQR step cost alone, batched, at depth 10 and 100 per retriever
        for depth in (10, 100):
            c = gather_candidates(("dense", "sparse"), depth, snap, q)
            docs = vectors_of(snap, c.rows)
            best_t = min(_t(lambda: gqr_refine(qd, docs, c.valid, c.exact["sparse"], GQRConfig())) for _ in range(3))
            costs[folder.name][f"gqr_step_ms_per_query_depth{depth}"] = best_t / len(qids) * 1e3
            costs[folder.name][f"union_size_depth{depth}"] = float(c.valid.sum(1).mean())
        print(f"{folder.name}: done ({len(qids)} queries)", flush=True)
    names = [f.name for f in folders]
    for label, by in per_coll.items():
        row = {"method": label}
        for n in names:
            row[n] = by[n]["ndcg@10"]
        row["avg nDCG@10"] = float(np.mean([by[n]["ndcg@10"] for n in names]))
        row["avg R@100"] = float(np.mean([by[n]["recall@100"] for n in names]))
        summary.append(row)
    cols = ["method", *names, "avg nDCG@10", "avg R@100"]
    md = table(summary, cols)
    print("\nnDCG@10 (top-100 runs; tuned rows are held-out 2-fold)\n" + md)
    cost_rows = [{"collection": n, **{k: v for k, v in c.items() if not isinstance(v, dict)}} for n, c in costs.items()]
    cost_md = table(cost_rows, list(cost_rows[0].keys()))
    print("\nGQR step cost (ms/query, batched numpy, 50 Adam steps)\n" + cost_md)
    lat_rows = [{"collection": n, **c["fusion_ms_per_query"]} for n, c in costs.items()]
    lat_md = table(lat_rows, list(lat_rows[0].keys()))
    print("\nAdded latency of each fusion on gathered candidates (ms/query)\n" + lat_md)
    write_json(RESULTS / "fusion.json", {"machine": machine(), "ndcg_recall": per_coll, "costs": costs})
    doc = ROOT / "docs" / "fusion.md"
    doc.write_text("# Fusion benchmark\n\nGenerated by `python benchmarks/fusion.py` on "
                   f"{machine()['cpus']} CPU cores. nDCG@10 over each method's top-100 (pytrec_eval; TREC DL "
                   "binary metrics count grade >= 2). Tuned rows: settings picked on half the queries, "
                   "scored on the other half, both ways.\n\n" + md +
                   "\n\n## GQR cost (ms per query, batched, 50 Adam steps)\n\n" + cost_md +
                   "\n\n## Added latency per fusion (ms per query, on gathered candidates)\n\n" + lat_md + "\n")
    print(f"wrote {doc}")
    return 0


def _t(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
