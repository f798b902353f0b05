"""How well a fixed threshold on ``relevance`` separates relevant from non-relevant hits (issue #21).

For every shared collection (adi, cisi, cranfield, medline, limit-small; msmarco-dl19-pool as a
uniform random subsample of ``--msmarco-docs`` passages, because encoding all 30k takes ~40 min on
two cores): search every query with ``hybrid`` (and the single retrievers), take the top ``--k``,
and label each hit relevant when the qrels give it a grade >= the collection's level (1; msmarco: 2,
TREC DL's binary level). Hits not in the qrels count as non-relevant (these qrels list relevant
documents only; msmarco's judged-0 passages are not in the file).

Held out: each collection's relevance comes from a calibration fitted on the *other* collections
(leave one collection out, collections weighted equally). Reported per collection: pooled ROC-AUC
of ``relevance`` vs the raw fused score vs the fused score min-max normalised per query (the usual
ad-hoc fix), precision / recall of ``relevance >= t`` for t = 0.3 / 0.5 / 0.7 (recall among the
relevant hits of the top ``k``), and calibration (mean relevance vs fraction relevant per bin, ECE).

``--fit`` prints the calibration fitted on all collections (what hybridret/relevance.py ships).

    python benchmarks/relevance.py                  # table + benchmarks/results/relevance.json
    python benchmarks/relevance.py --fit            # also the shipped constants (JSON)
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS, ROOT, SHARED, machine, table, write_json
from scipy.stats import rankdata

from hybridret import CorpusReader, HybridRetriever, load_qrels, load_queries
from hybridret.relevance import (
    FEATURES,
    Calibration,
    bm25_bounds,
    encoder_identity,
    features_of,
    fit_calibration,
    sparse_self_scores,
)

COLLECTIONS = ("adi", "cisi", "cranfield", "medline", "limit-small", "msmarco-dl19-pool")
LEVEL = {"msmarco-dl19-pool": 2}
THRESHOLDS = (0.3, 0.5, 0.7)
BINS = np.linspace(0.0, 1.0, 11)


def index_of(name: str, msmarco_docs: int) -> HybridRetriever:
    """The collection's index with the packaged models, built once into indexes/bench-NAME."""
    tag = f"{name}-{msmarco_docs}" if name == "msmarco-dl19-pool" else name
    out = ROOT / "indexes" / f"bench-{tag}"
    if not (out / "manifest.json").exists():
        docs: Any = CorpusReader(SHARED / name)
        if name == "msmarco-dl19-pool":
            docs = list(docs)
            docs = random.Random(0).sample(docs, min(msmarco_docs, len(docs)))
        r = HybridRetriever.from_models()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # truncation of long abstracts: said once in the docs
            r.index(docs, workdir=out)
        r.save(out, overwrite=True)
    return HybridRetriever.load(out)


def judged_hits(r: HybridRetriever, name: str, k: int, method: str) -> dict[str, Any]:
    """Every query's top ``k`` of ``method``: scores, features and labels (flat, with query numbers)."""
    folder = SHARED / name
    queries = load_queries(folder / "queries.jsonl")
    qrels = load_qrels(folder / "qrels" / "test.tsv")
    qids = [q for q in queries if q in qrels]
    texts = [queries[q] for q in qids]
    level = LEVEL.get(name, 1)
    hits = r.search(texts, k, method=method, candidates=max(100, k))
    snap = r.searcher.snapshot
    n = len(texts)
    scales = {"sparse": sparse_self_scores(hits.query_sparse, n) if hits.query_sparse is not None else np.zeros(n),
              "bm25": bm25_bounds(snap, texts) if "bm25" in hits.components else np.zeros(n)}
    feats = features_of(hits.components, scales)
    valid = hits.rows >= 0
    labels = np.array([[qrels[q].get(str(d), 0) >= level for d in row] for q, row in zip(qids, hits.ids)])
    qnum = np.repeat(np.arange(n)[:, None], hits.rows.shape[1], axis=1)
    return {"queries": texts, "scores": hits.scores, "components": hits.components, "scales": scales,
            "feats": {f: v[valid] for f, v in feats.items()}, "labels": labels[valid], "valid": valid,
            "label_grid": labels, "query": qnum[valid], "hits": hits}


def auc(score: np.ndarray, y: np.ndarray) -> float | None:
    """ROC-AUC (Mann-Whitney, ties counted half)."""
    pos, neg = int(y.sum()), int((~y).sum())
    if not pos or not neg:
        return None
    ranks = rankdata(score)
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def minmax(scores: np.ndarray, valid: np.ndarray) -> np.ndarray:
    s = np.where(valid, scores, np.nan).astype(np.float64)
    lo, hi = np.nanmin(s, axis=1, keepdims=True), np.nanmax(s, axis=1, keepdims=True)
    return np.where(hi > lo, (s - lo) / np.where(hi > lo, hi - lo, 1.0), 1.0)


def evaluate(rel: np.ndarray, y: np.ndarray, fused: np.ndarray, mm: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"hits": int(len(y)), "relevant": int(y.sum()), "base_rate": float(y.mean()),
                           "auc_relevance": auc(rel, y), "auc_fused": auc(fused, y), "auc_minmax": auc(mm, y)}
    for t in THRESHOLDS:
        keep = rel >= t
        out[f"p@{t}"] = float(y[keep].mean()) if keep.any() else None
        out[f"r@{t}"] = float(keep[y].mean()) if y.any() else None
        out[f"kept@{t}"] = float(keep.mean())
    bins, ece = [], 0.0
    for a, b in zip(BINS[:-1], BINS[1:]):
        m = (rel >= a) & ((rel < b) if b < 1 else (rel <= b))
        if m.any():
            bins.append({"bin": f"{a:.1f}-{b:.1f}", "n": int(m.sum()), "mean_relevance": float(rel[m].mean()),
                         "fraction_relevant": float(y[m].mean())})
            ece += m.mean() * abs(rel[m].mean() - y[m].mean())
    out["ece"] = float(ece)
    out["bins"] = bins
    return out


def fit_on(data: dict[str, dict[str, Any]], names: list[str], encoder: Any) -> Calibration:
    """A calibration fitted on the hits of ``names``, each collection weighing the same."""
    feats = {f: np.concatenate([data[n]["feats"][f] for n in names]) for f in FEATURES}
    y = np.concatenate([data[n]["labels"] for n in names])
    w = np.concatenate([np.full(len(data[n]["labels"]), 1.0 / len(data[n]["labels"])) for n in names])
    return fit_calibration(feats, y, weights=w, encoder=encoder,
                           fitted_on={"collections": names, "hits": "hybrid top-%d" % data[names[0]]["k"],
                                      "script": "benchmarks/relevance.py"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", nargs="+", default=list(COLLECTIONS))
    ap.add_argument("--k", type=int, default=10, help="hits per query evaluated (and fitted on)")
    ap.add_argument("--methods", nargs="+", default=["hybrid", "dense", "sparse", "bm25"])
    ap.add_argument("--msmarco-docs", type=int, default=6000, help="msmarco-dl19-pool: passages sampled (of 30,005)")
    ap.add_argument("--fit", action="store_true", help="print the calibration fitted on all collections")
    ap.add_argument("--out", type=Path, default=RESULTS / "relevance.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    names = [c for c in args.collections if (SHARED / c).is_dir()]
    if len(names) < 2:
        print(f"needs at least two collections in {SHARED}", file=sys.stderr)
        return 1
    retrievers = {n: index_of(n, args.msmarco_docs) for n in names}
    encoder = encoder_identity(retrievers[names[0]].searcher.snapshot.manifest.get("encoder"))
    data = {}
    for n in names:
        data[n] = judged_hits(retrievers[n], n, args.k, "hybrid")
        data[n]["k"] = args.k
    rows, results = [], {}
    for n in names:
        cal = fit_on(data, [m for m in names if m != n], encoder)
        results[n] = {}
        for method in args.methods:
            d = data[n] if method == "hybrid" else judged_hits(retrievers[n], n, args.k, method)
            hits = retrievers[n].search(d["queries"], args.k, method=method, candidates=max(100, args.k),
                                        relevance=cal)
            valid = d["valid"]
            rel, y = hits.relevance[valid], d["label_grid"][valid]
            res = evaluate(rel, y, d["scores"][valid], minmax(d["scores"], valid)[valid])
            res["queries"] = len(d["queries"])
            results[n][method] = res
            rows.append({"collection": n, "method": method, "queries": res["queries"], "hits": res["hits"],
                         "rel. rate": res["base_rate"], "AUC relevance": res["auc_relevance"],
                         "AUC fused": res["auc_fused"], "AUC min-max": res["auc_minmax"],
                         **{f"P/R @{t}": f"{_f(res[f'p@{t}'])} / {_f(res[f'r@{t}'])}" for t in THRESHOLDS},
                         "ECE": res["ece"]})
    cols = ["collection", "method", "queries", "hits", "rel. rate", "AUC relevance", "AUC fused", "AUC min-max",
            *[f"P/R @{t}" for t in THRESHOLDS], "ECE"]
    print(f"held out (calibration fitted on the other collections), top-{args.k}:\n")
    print(table(rows, cols))
    pooled = {n: results[n]["hybrid"]["bins"] for n in names}
    out: dict[str, Any] = {"k": args.k, "collections": names, "msmarco_docs": args.msmarco_docs,
                           "results": results, "calibration_bins": pooled, "machine": machine()}
    if args.fit:
        final = fit_on(data, names, encoder)
        out["calibration"] = final.to_dict()
        print("\nfitted on all collections (hybridret/relevance.py _DEFAULT):\n")
        print(json.dumps(final.to_dict(), indent=1))
    write_json(args.out, out)
    return 0


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


if __name__ == "__main__":
    sys.exit(main())
