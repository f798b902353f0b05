"""``hybridret eval`` (metrics of a method on judged queries) and ``hybridret tune`` (grid-search
the fusion settings and store the best in the index)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import HybridRetError
from ._common import add_eval_args, add_method_arg, judged, logger

__all__ = ["add_parsers", "run_calibrate", "run_eval", "run_tune"]


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate a method on judged queries (nDCG@10, MRR@10, Recall@100)")
    add_eval_args(p, stored_run=True)
    add_method_arg(p)
    p.add_argument("--run", metavar="FILE", dest="stored_run", default=None,
                   help="evaluate this stored TREC run file against --qrels instead of searching an index "
                        "(no DIR, no --queries; nothing is loaded but the two files)")
    p.add_argument("--metrics", nargs="+", default=["ndcg@10", "mrr@10", "recall@100"],
                   help="ndcg@K, mrr@K, recall@K, precision@K, map (default: ndcg@10 mrr@10 recall@100)")
    p.add_argument("-k", type=int, default=100, help="depth of each ranking (default: 100)")
    p.add_argument("--save-run", metavar="FILE", default=None,
                   help="also write the ranking as a TREC run file (trec_eval / ranx / pyserini can read it)")
    p.set_defaults(run=run_eval)

    p = sub.add_parser("tune", help="grid-search fusion and GQR settings; store the best in the index")
    add_eval_args(p)
    p.add_argument("--metric", default="ndcg@10", help="metric to maximise (default: ndcg@10)")
    p.add_argument("--dry-run", action="store_true", help="report only; do not store the best setting")
    p.set_defaults(run=run_tune)

    p = sub.add_parser("calibrate", help="fit the calibrated relevance (search --relevance) on judged queries; "
                                         "store it in the index")
    add_eval_args(p)
    p.add_argument("-k", type=int, default=10, help="hits per query fitted on (default: 10)")
    add_method_arg(p, calibration=True)
    p.add_argument("--dry-run", action="store_true", help="report only; do not store the calibration")
    p.set_defaults(run=run_calibrate)


def run_eval(args: argparse.Namespace) -> int:
    from ..eval import evaluate, run_from_hits

    if args.stored_run is not None:
        return _eval_stored_run(args)
    if args.index is None or args.queries is None:
        raise HybridRetError("eval needs DIR and --queries (or --run FILE to evaluate a stored run)")
    retriever, queries, qrels = judged(args)
    qids = list(queries)
    hits = retriever.search([queries[q] for q in qids], k=args.k, method=args.method)
    run = run_from_hits(hits, qids)
    metrics = evaluate(run, qrels, args.metrics, relevance_level=args.relevance_level)
    if args.save_run:
        from ..runs import write_run

        write_run(run, args.save_run, tag=f"hybridret-{hits.method}".replace(" ", "_"))
        logger.info("wrote the %s run to %s", hits.method, args.save_run)
    if args.json:
        print(json.dumps({"method": args.method, "resolved": hits.method, "metrics": metrics, "queries": len(qids)}))
    else:
        print(f"{hits.method} on {len(qids)} queries: " + "  ".join(f"{m} {v:.4f}" for m, v in metrics.items()))
    return 0


def _eval_stored_run(args: argparse.Namespace) -> int:
    from ..data import load_qrels
    from ..eval import evaluate
    from ..runs import load_run

    if args.index is not None or args.save_run:
        raise HybridRetError("--run evaluates a stored run: give no DIR and no --save-run with it")
    run = load_run(args.stored_run)
    qrels = load_qrels(args.qrels)
    judged_run = {q: docs for q, docs in run.items() if qrels.get(q)}
    if not judged_run:
        raise HybridRetError(f"none of the {len(run)} queries in {args.stored_run} has judgments in {args.qrels}")
    metrics = evaluate(judged_run, qrels, args.metrics, relevance_level=args.relevance_level)
    if args.json:
        print(json.dumps({"run": args.stored_run, "metrics": metrics, "queries": len(judged_run)}))
    else:
        print(f"{args.stored_run} on {len(judged_run)} queries: " + "  ".join(f"{m} {v:.4f}" for m, v in metrics.items()))
    return 0


def run_tune(args: argparse.Namespace) -> int:
    from ..tune import tune

    retriever, queries, qrels = judged(args)
    best, table = tune(retriever, queries, qrels, metric=args.metric, relevance_level=args.relevance_level)
    ranked = sorted(table, key=lambda r: -r[args.metric])
    if not args.dry_run:
        retriever.set_fusion(best, {"queries": str(args.queries), "qrels": str(args.qrels), "metric": args.metric,
                                    "value": ranked[0][args.metric], "n_queries": len(queries)})
    if args.json:
        print(json.dumps({"best": best.to_dict(), "metric": args.metric, "value": ranked[0][args.metric],
                          "stored": not args.dry_run, "results": ranked}))
        return 0
    print(f"{'rank':>4}  {args.metric:>9}  setting")
    for i, row in enumerate(ranked[:10], 1):
        cfg = row["config"]
        detail = {k: cfg[k] for k in ("retrievers", "weights", "normalisation")} if cfg["method"] == "linear" else \
            {"retrievers": cfg["retrievers"], "rrf_k": cfg["rrf_k"]} if cfg["method"] == "rrf" else \
            {"guide": cfg["guide"], "guide_weighting": cfg["guide_weighting"], "alpha": cfg["gqr"]["alpha"],
             "t_dense": cfg["gqr"]["t_dense"], "final_guide": cfg["gqr"]["final_guide"]}
        print(f"{i:>4}  {row[args.metric]:9.4f}  {cfg['method']} {json.dumps(detail)}")
    print("stored as the index's hybrid setting" if not args.dry_run else "(dry run: nothing stored)")
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    from ..search.calibrate import calibrate

    retriever, queries, qrels = judged(args)
    cal = calibrate(retriever, queries, qrels, k=args.k, method=args.method, level=args.relevance_level,
                    fitted_on={"queries_file": str(args.queries), "qrels_file": str(args.qrels)})
    if not args.dry_run:
        retriever.set_relevance(cal)
    if args.json:
        print(json.dumps({"calibration": cal.to_dict(), "stored": not args.dry_run}))
        return 0
    fit = cal.fitted_on
    print(f"fitted on {fit['hits']} hits of {fit['queries']} queries ({fit['relevant']} relevant), top {args.k} of "
          f"{args.method}")
    for m in cal.models.values():
        terms = " + ".join(f"{w:.3f} {f}" for f, w in zip(m.features, m.weights))
        print(f"  {'+'.join(m.features):<18} p = sigmoid({m.intercept:.3f} + {terms})")
    print("stored in the index: search --relevance uses it" if not args.dry_run else "(dry run: nothing stored)")
    return 0
