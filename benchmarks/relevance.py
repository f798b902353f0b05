"""How well a fixed threshold on ``relevance`` separates relevant from non-relevant hits (issues #21, #34).

For every shared collection (adi, cisi, cranfield, medline, limit-small; msmarco-dl19-pool as a
uniform random subsample of ``--msmarco-docs`` passages, because encoding all 30k takes ~40 min on
two cores): search every judged query (at most :data:`MAX_JUDGED`, a seeded sample) with ``hybrid``
and with each single retriever, take the top
``--k``, and label each hit relevant when the qrels give it a grade >= the collection's level (1;
msmarco: 2, TREC DL's binary level). Hits not in the qrels count as non-relevant (these qrels list
relevant documents only; msmarco's judged-0 passages are not in the file).

Held out: each collection's relevance comes from a calibration fitted on the *other* collections
(leave one collection out, collections weighted equally), with the library's own fitting
(:func:`hybridret.search.calibrate.fit_calibration`) and search path (``search(..., relevance=cal)``).
Reported per collection and method: pooled ROC-AUC of ``relevance`` vs the raw fused score vs the
fused score min-max normalised per query (the usual ad-hoc fix), precision / recall of
``relevance >= t`` for t = 0.3 / 0.5 / 0.7 (recall among the relevant hits of the top ``k``), and
calibration (mean relevance vs fraction relevant per bin, ECE).

Off-topic queries (issue #34): each collection is also searched with ``--off-topic`` queries
drawn evenly from the *other* collections (seeded; adi and cisi, both library / information
science, are not used for each other: their queries are on-topic there). Their correct label is
"nothing relevant here": every hit is non-relevant and the query is not answerable. Held out, the
relevance and the per-query ``answerability`` (the probability that the index holds any relevant
document) are measured on judged + off-topic queries (ROC-AUC, ECE; answerability: per query,
label = a relevant document is in the index), next to the design before issue #34 (no query-level
inputs, ``--baseline``), fitted and tested on the same hits.

``--candidates`` first compares, on the same hits and protocol, the designs of the model's inputs
that were tried (docs/relevance.md says why the shipped one was chosen). ``--in-domain`` also fits
``hybridret calibrate`` on half of each collection's queries and tests it on the other half (both
ways, pooled), next to the held-out calibration on the same hits. ``--fit`` prints the calibration
fitted on all collections (what hybridret/search/relevance.py ships).

    python benchmarks/relevance.py --candidates --in-domain --fit   # tables + benchmarks/results/relevance.json
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
from hybridret.search.calibrate import Judged, calibrate, fit_calibration, fit_logistic, judged_hits
from hybridret.search.relevance import FEATURES, RESOURCE, Calibration, calibration_file, encoder_identity

COLLECTIONS = ("adi", "cisi", "cranfield", "medline", "limit-small", "msmarco-dl19-pool")
MAX_JUDGED = 200  # limit-small has 1,000 judged queries: a sample keeps the collections' weights and time even
SAME_DOMAIN = {frozenset({"adi", "cisi"})}  # their queries are not off-topic in each other
METHODS = ("hybrid", "dense", "sparse", "bm25")
LEVEL = {"msmarco-dl19-pool": 2}
THRESHOLDS = (0.3, 0.5, 0.7)
BINS = np.linspace(0.0, 1.0, 11)
CANDIDATES = ("abs", "abs+top", "abs+minmax", "abs+log_rank", "abs+top+log_rank", "score", "abs+score",
              "abs+score+log_rank", "abs+top+score", "abs+fused_dense", "abs+fused_dense+log_rank")


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


def judgments(name: str) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """The collection's judged queries (at most :data:`MAX_JUDGED`, a seeded sample) and qrels."""
    folder = SHARED / name
    queries = load_queries(folder / "queries.jsonl")
    qrels = load_qrels(folder / "qrels" / "test.tsv")
    judged = sorted(q for q in queries if qrels.get(q))
    if len(judged) > MAX_JUDGED:
        judged = sorted(random.Random(f"judged-{name}").sample(judged, MAX_JUDGED))
    return {q: queries[q] for q in judged}, qrels


def off_topic(name: str, names: list[str], count: int, seed: int = 0) -> list[str]:
    """``count`` query texts drawn evenly (seeded) from the judged queries of the other collections
    (not those of the same domain, :data:`SAME_DOMAIN`)."""
    others = [o for o in names if o != name and frozenset({name, o}) not in SAME_DOMAIN]
    pools = {o: sorted(judgments(o)[0].values()) for o in others}
    for o in others:
        random.Random(f"{seed}-{o}").shuffle(pools[o])
    out: list[str] = []
    i = 0
    while len(out) < count and any(i < len(p) for p in pools.values()):
        out += [pools[o][i] for o in others if i < len(pools[o]) and len(out) < count]
        i += 1
    return out[:count]


# -- metrics -------------------------------------------------------------------------------------------
def auc(score: np.ndarray, y: np.ndarray) -> float | None:
    """ROC-AUC (Mann-Whitney, ties counted half)."""
    pos, neg = int(y.sum()), int((~y).sum())
    if not pos or not neg:
        return None
    ranks = rankdata(score)
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def per_query_minmax(score: np.ndarray, query: np.ndarray) -> np.ndarray:
    out = np.ones(len(score))
    for q in np.unique(query):
        m = query == q
        lo, hi = score[m].min(), score[m].max()
        if hi > lo:
            out[m] = (score[m] - lo) / (hi - lo)
    return out


def evaluate(rel: np.ndarray, y: np.ndarray, fused: np.ndarray, query: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"hits": int(len(y)), "relevant": int(y.sum()), "base_rate": float(y.mean()),
                           "auc_relevance": auc(rel, y), "auc_fused": auc(fused, y),
                           "auc_minmax": auc(per_query_minmax(fused, query), y)}
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


def searched(r: HybridRetriever, name: str, k: int, method: str, cal: Calibration,
             qids: list[str] | None = None, off: list[str] | None = None) -> dict[str, np.ndarray]:
    """The relevance the library gives (``search(..., relevance=cal)``), flat, with labels, scores
    and query numbers, for judged queries ``qids`` and the ``off`` topic ones; and per query its
    answerability (``answer``, NaN without a model) and label (``answerable``)."""
    queries, qrels = judgments(name)
    qids = qids if qids is not None else list(queries)
    off = off or []
    hits = r.search([queries[q] for q in qids] + off, k, method=method, candidates=max(100, k), relevance=cal)
    valid = hits.rows >= 0
    level = LEVEL.get(name, 1)
    judged = [qrels[q] for q in qids] + [{} for _ in off]
    labels = np.array([[j.get(str(d), 0) >= level for d in row] for j, row in zip(judged, hits.ids)], dtype=bool)
    qnum = np.broadcast_to(np.arange(len(judged))[:, None], valid.shape)
    snap = r.searcher.snapshot
    answerable = np.array([any(g >= level and snap.row_of(str(d)) is not None for d, g in j.items()) for j in judged])
    answer = hits.answerability if hits.answerability is not None else np.full(len(judged), np.nan)
    return {"rel": hits.relevance[valid], "y": labels[valid], "score": hits.scores[valid].astype(np.float64),
            "query": qnum[valid], "answer": answer, "answerable": answerable}


def evaluate_answer(s: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per query: answerability vs "a relevant document is in the index" (ROC-AUC, ECE, bins)."""
    a, y = s["answer"], s["answerable"]
    if np.isnan(a).all():
        return {}
    out: dict[str, Any] = {"queries": int(len(y)), "answerable": int(y.sum()), "auc": auc(a, y)}
    bins, ece = [], 0.0
    for lo, hi in zip(BINS[:-1], BINS[1:]):
        m = (a >= lo) & ((a < hi) if hi < 1 else (a <= hi))
        if m.any():
            bins.append({"bin": f"{lo:.1f}-{hi:.1f}", "n": int(m.sum()), "mean_answerability": float(a[m].mean()),
                         "fraction_answerable": float(y[m].mean())})
            ece += m.mean() * abs(a[m].mean() - y[m].mean())
    out["ece"] = float(ece)
    out["bins"] = bins
    for t in THRESHOLDS:
        keep = a >= t
        out[f"p@{t}"] = float(y[keep].mean()) if keep.any() else None
        out[f"r@{t}"] = float(keep[y].mean()) if y.any() else None
    return out


# -- the candidate designs (numpy, on the judged hits; the shipped one also runs through the library) ---------
def design(d: Judged, kind: str, names: list[str]) -> np.ndarray:
    """The inputs of a candidate design: ``abs`` = the retrievers' features; ``top`` = the query's
    top hit's features (the query's "answerability"); ``minmax`` = the method's score min-max
    normalised within the list; ``log_rank``; ``score`` = the method's own score; ``fused_dense``
    = that score times the dense cosine (clipped at 0)."""
    parts = kind.split("+")
    cols: list[np.ndarray] = []
    top = np.zeros(len(d.labels), dtype=int)
    for q in np.unique(d.query):
        idx = np.flatnonzero(d.query == q)
        top[idx] = idx[np.argmin(d.features["log_rank"][idx])]
    for f in names:
        if "abs" in parts:
            cols.append(d.features[f])
        if "top" in parts:
            cols.append(d.features[f][top])
    if "minmax" in parts:
        cols.append(per_query_minmax(d.features["score"], d.query))
    for extra in ("log_rank", "score", "fused_dense"):
        if extra in parts:
            cols.append(d.features[extra])
    return np.stack(cols, axis=1)


def pav(score: np.ndarray, prob: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``prob`` made non-increasing in ``score`` within each query (the library's isotonic step)."""
    from hybridret.search.relevance import monotone

    out = np.empty(len(prob))
    for q in np.unique(query):
        m = np.flatnonzero(query == q)
        out[m] = monotone(score[m][None], prob[m][None])[0]
    return out


def candidate_rows(data: dict[str, dict[str, Judged]], names: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows, results = [], {}
    specs = [("hybrid", kind, "hybrid") for kind in CANDIDATES] + \
            [(m, kind, fit) for m in FEATURES for kind, fit in (("abs", "hybrid"), ("abs", m), ("abs+log_rank", m))]
    for method, kind, fit in specs:
        label = f"{kind} (fit on {fit} lists)" if method != "hybrid" else kind
        res = {}
        for n in names:
            feats = [f for f in FEATURES if f in data[n][method].features]
            train = Judged.pooled([data[o][fit] for o in names if o != n])
            b0, w = fit_logistic(design(train, kind, feats), train.labels, weights=train.weights)
            d = data[n][method]
            p = 1.0 / (1.0 + np.exp(-(b0 + design(d, kind, feats) @ w)))
            res[n] = evaluate(pav(d.features["score"], p, d.query), d.labels, d.features["score"], d.query)
        results[f"{method}: {label}"] = res
        rows.append({"method": method, "design": label,
                     **{n: f"{res[n]['auc_relevance']:.3f} / {res[n]['ece']:.3f}" for n in names},
                     "mean AUC": float(np.mean([res[n]["auc_relevance"] for n in names])),
                     "mean ECE": float(np.mean([res[n]["ece"] for n in names]))})
    return rows, results


# -- run -----------------------------------------------------------------------------------------------
def fit_on(data: dict[str, dict[str, Judged]], names: list[str], encoder: Any, with_tops: bool = True) -> Calibration:
    """A calibration fitted on the judged hits of ``names``, each collection weighing the same
    (``with_tops=False``: the design before issue #34, without query-level inputs or answerability)."""
    return fit_calibration(Judged.pooled([data[n]["hybrid"] for n in names]),
                           {f: Judged.pooled([data[n][f] for n in names]) for f in FEATURES}, encoder=encoder,
                           with_tops=with_tops,
                           fitted_on={"collections": names, "hits": f"top-{data[names[0]]['k']} of hybrid and of each "
                                      "retriever, judged queries and off-topic ones from the other collections",
                                      "script": "benchmarks/relevance.py"})


def in_domain(retrievers: dict[str, HybridRetriever], data: dict[str, dict[str, Judged]], names: list[str], k: int,
              encoder: Any, seed: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``hybridret calibrate`` on half of a collection's queries, tested on the other half (both
    ways, pooled), next to the held-out calibration on the same hits (``hybrid``)."""
    rows, results = [], {}
    for n in names:
        queries, qrels = judgments(n)
        qids = list(queries)
        random.Random(seed).shuffle(qids)
        halves = [qids[: len(qids) // 2], qids[len(qids) // 2:]]
        loco = fit_on(data, [m for m in names if m != n], encoder)
        got: dict[str, list[dict[str, np.ndarray]]] = {"held out": [], "in-domain": []}
        for fit_half, test_half in (halves, halves[::-1]):
            cal = calibrate(retrievers[n], {q: queries[q] for q in fit_half}, qrels, k=k, level=LEVEL.get(n, 1))
            got["in-domain"].append(searched(retrievers[n], n, k, "hybrid", cal, test_half))
            got["held out"].append(searched(retrievers[n], n, k, "hybrid", loco, test_half))
        results[n] = {}
        for label, parts in got.items():
            flat = {key: np.concatenate([p[key] for p in parts]) for key in ("rel", "y", "score")}
            flat["query"] = np.concatenate([p["query"] + i * len(queries) for i, p in enumerate(parts)])
            res = evaluate(flat["rel"], flat["y"], flat["score"], flat["query"])
            results[n][label] = res
            rows.append({"collection": n, "calibration": label, "AUC relevance": res["auc_relevance"],
                         **{f"P/R @{t}": f"{_f(res[f'p@{t}'])} / {_f(res[f'r@{t}'])}" for t in THRESHOLDS},
                         "ECE": res["ece"]})
    return rows, results


def timing(retrievers: dict[str, HybridRetriever], names: list[str], repeats: int = 3) -> list[dict[str, Any]]:
    """What ``relevance=True`` costs: ms per query of ``search(judged queries, 10)`` with and without
    it (``hybrid``; median and spread of ``repeats`` runs after one warm-up)."""
    import time

    rows = []
    for n in names:
        texts = list(judgments(n)[0].values())
        out: dict[str, Any] = {"collection": n, "queries": len(texts)}
        for label, options in (("plain", {}), ("relevance", {"relevance": True})):
            retrievers[n].search(texts, 10, **options)
            runs = []
            for _ in range(repeats):
                t = time.perf_counter()
                retrievers[n].search(texts, 10, **options)
                runs.append((time.perf_counter() - t) * 1000 / len(texts))
            out[f"{label} ms/query"] = float(np.median(runs))
            out[f"{label} spread"] = float(max(runs) - min(runs))
        rows.append(out)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", nargs="+", default=list(COLLECTIONS))
    ap.add_argument("--k", type=int, default=10, help="hits per query evaluated (and fitted on)")
    ap.add_argument("--msmarco-docs", type=int, default=6000, help="msmarco-dl19-pool: passages sampled (of 30,005)")
    ap.add_argument("--candidates", action="store_true", help="compare the candidate designs of the inputs first")
    ap.add_argument("--in-domain", action="store_true", help="also hybridret calibrate on half of each collection")
    ap.add_argument("--fit", action="store_true", help="print the calibration fitted on all collections")
    ap.add_argument("--write", action="store_true",
                    help="with --fit: write it to hybridret/resources/relevance.json (the shipped calibration)")
    ap.add_argument("--off-topic", type=int, default=0,
                    help="off-topic queries per collection, from the others (0: as many as its judged queries)")
    ap.add_argument("--timing", action="store_true", help="only time search with and without relevance, then stop")
    ap.add_argument("--baseline", action="store_true", help="also the design before #34 (no query-level inputs)")
    ap.add_argument("--out", type=Path, default=RESULTS / "relevance.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    names = [c for c in args.collections if (SHARED / c).is_dir()]
    if len(names) < 2:
        print(f"needs at least two collections in {SHARED}", file=sys.stderr)
        return 1
    retrievers = {n: index_of(n, args.msmarco_docs) for n in names}
    encoder = encoder_identity(retrievers[names[0]].searcher.snapshot.manifest.get("encoder"))
    if args.timing:
        rows = timing(retrievers, names)
        print(table(rows, list(rows[0])))
        write_json(args.out, {"timing": rows, "machine": machine()})
        return 0
    data: dict[str, dict[str, Any]] = {}
    off = {n: off_topic(n, names, args.off_topic or len(judgments(n)[0])) for n in names}
    for n in names:
        queries, qrels = judgments(n)
        data[n] = {m: judged_hits(retrievers[n].searcher, queries, qrels, k=args.k, method=m, level=LEVEL.get(n, 1),
                                  candidates=max(100, args.k), off_topic=off[n]) for m in METHODS}
        data[n]["k"] = args.k
    out: dict[str, Any] = {"k": args.k, "collections": names, "msmarco_docs": args.msmarco_docs, "machine": machine(),
                           "off_topic": args.off_topic, "same_domain": sorted(sorted(p) for p in SAME_DOMAIN)}
    if args.candidates:
        rows, out["candidates"] = candidate_rows(data, names)
        print(f"candidate designs, held out (AUC / ECE per collection), top-{args.k}:\n")
        print(table(rows, ["method", "design", *names, "mean AUC", "mean ECE"]))
        print()
    rows, results, answer_rows, folds = [], {}, [], {}
    designs = {"query-level (#34)": True, **({"before #34": False} if args.baseline else {})}
    for n in names:
        rest = [m for m in names if m != n]
        results[n] = {}
        folds[n] = {"fitted_on": rest}
        for label, with_tops in designs.items():
            cal = fit_on(data, rest, encoder, with_tops=with_tops)
            folds[n][label] = {}
            for method in METHODS:
                s = searched(retrievers[n], n, args.k, method, cal, off=off[n])
                on = s["query"] < len(judgments(n)[0])
                res = evaluate(s["rel"], s["y"], s["score"], s["query"])
                res["judged_only"] = {key: v for key, v in evaluate(s["rel"][on], s["y"][on], s["score"][on],
                                                                    s["query"][on]).items() if key != "bins"}
                res["queries"] = int(len(s["answerable"]))
                res["answerability"] = evaluate_answer(s)
                folds[n][label][method] = res
                if label == "query-level (#34)":
                    results[n][method] = res
                ans = res["answerability"]
                answer_rows.append({"held out": n, "design": label, "method": method,
                                    "AUC rel. (+off)": res["auc_relevance"], "ECE rel. (+off)": res["ece"],
                                    "AUC rel. (judged)": res["judged_only"]["auc_relevance"],
                                    "ECE rel. (judged)": res["judged_only"]["ece"],
                                    "AUC answer": ans.get("auc"), "ECE answer": ans.get("ece")})
        for method in METHODS:
            res = results[n][method]
            rows.append({"collection": n, "method": method, "queries": res["queries"], "hits": res["hits"],
                         "rel. rate": res["base_rate"], "AUC relevance": res["auc_relevance"],
                         "AUC fused": res["auc_fused"], "AUC min-max": res["auc_minmax"],
                         **{f"P/R @{t}": f"{_f(res[f'p@{t}'])} / {_f(res[f'r@{t}'])}" for t in THRESHOLDS},
                         "ECE": res["ece"]})
    cols = ["collection", "method", "queries", "hits", "rel. rate", "AUC relevance", "AUC fused", "AUC min-max",
            *[f"P/R @{t}" for t in THRESHOLDS], "ECE"]
    print(f"shipped design, held out (calibration fitted on the other collections), top-{args.k}, judged + "
          f"off-topic queries ({args.off_topic or 'as many as judged'}):\n")
    print(table(rows, cols))
    print(f"\nleave one collection out: relevance with off-topic queries and on judged ones only; answerability "
          f"per query, top-{args.k}:\n")
    print(table(answer_rows, ["held out", "design", "method", "AUC rel. (+off)", "ECE rel. (+off)",
                              "AUC rel. (judged)", "ECE rel. (judged)", "AUC answer", "ECE answer"]))
    summary = {label: {method: {key: float(np.mean([r[key] for r in answer_rows
                                                    if r["design"] == label and r["method"] == method
                                                    and r[key] is not None]))
                                for key in ("AUC rel. (+off)", "ECE rel. (+off)", "AUC rel. (judged)",
                                            "ECE rel. (judged)", "AUC answer", "ECE answer")}
                       for method in METHODS} for label in designs}
    print("\nmean over the held-out collections:\n")
    print(table([{"design": label, "method": m, **v} for label, d in summary.items() for m, v in d.items()],
                ["design", "method", "AUC rel. (+off)", "ECE rel. (+off)", "AUC rel. (judged)", "ECE rel. (judged)",
                 "AUC answer", "ECE answer"]))
    out["results"] = results
    out["folds"] = folds
    out["summary"] = summary
    out["calibration_bins"] = {n: results[n]["hybrid"]["bins"] for n in names}
    if args.in_domain:
        rows, out["in_domain"] = in_domain(retrievers, data, names, args.k, encoder)
        print(f"\nhybridret calibrate on half the queries vs held out, tested on the other half (both ways), top-{args.k}:\n")
        print(table(rows, ["collection", "calibration", "AUC relevance", *[f"P/R @{t}" for t in THRESHOLDS], "ECE"]))
    if args.fit:
        final = fit_on(data, names, encoder)
        out["calibration"] = final.to_dict()
        print("\nfitted on all collections (hybridret/resources/relevance.json):\n")
        print(json.dumps(final.to_dict(), indent=1))
        if args.write:
            (ROOT / "hybridret" / "resources" / RESOURCE).write_text(calibration_file(final))
    write_json(args.out, out)
    return 0


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


if __name__ == "__main__":
    sys.exit(main())
