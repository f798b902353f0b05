"""Retrieval metrics through pytrec_eval (trec_eval's own code), not re-implemented here."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ConfigError, MissingDependencyError

__all__ = ["DEFAULT_METRICS", "Coverage", "evaluate", "judgment_coverage", "per_query", "run_from_hits",
           "run_from_rows", "warn_coverage"]

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("ndcg@10", "mrr@10", "recall@100")
_PATTERN = re.compile(r"^(ndcg|mrr|recall|precision|map)(?:@(\d+))?$")


def _parse(metric: str) -> tuple[str, int | None]:
    m = _PATTERN.match(metric.lower())
    if not m:
        raise ConfigError(f"unknown metric {metric!r}; use ndcg@K, mrr@K, recall@K, precision@K or map")
    return m.group(1), (int(m.group(2)) if m.group(2) else None)


def _truncate(run: Mapping[str, Mapping[str, float]], k: int) -> dict[str, dict[str, float]]:
    out = {}
    for qid, docs in run.items():
        top = sorted(docs.items(), key=lambda x: (-x[1], x[0]))[:k]
        out[qid] = dict(top)
    return out


def per_query(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]],
              metrics: Sequence[str] = DEFAULT_METRICS, *, relevance_level: int = 1) -> dict[str, dict[str, float]]:
    """``{metric: {qid: value}}`` for every judged query that is in the run (the queries you
    searched); one that retrieved nothing scores 0. Judged queries you did not search are left out,
    so a qrels file covering more queries than the query file does not dilute the means.

    ``relevance_level`` is the smallest grade that counts as relevant for binary metrics
    (MRR, recall, precision, MAP); nDCG always uses the graded judgments. TREC DL uses 2.

    Raises:
        MissingDependencyError: pytrec_eval is not installed (the ``eval`` extra).
    """
    try:
        import pytrec_eval
    except ImportError as exc:
        raise MissingDependencyError("evaluation needs pytrec_eval, which is not installed: "
                                     f"pip install 'hybridret[eval]' ({exc})") from exc

    judged = {q: {d: int(g) for d, g in docs.items()} for q, docs in qrels.items() if docs and q in run}
    if not judged:
        raise ConfigError("no query of the run has relevance judgments (check that query ids match the qrels)")
    results: dict[str, dict[str, float]] = {}
    for metric in metrics:
        name, k = _parse(metric)
        if name == "mrr":
            measure, sub_run, key = "recip_rank", _truncate(run, k) if k else run, "recip_rank"
        elif name == "ndcg":
            measure, sub_run, key = (f"ndcg_cut.{k}", run, f"ndcg_cut_{k}") if k else ("ndcg", run, "ndcg")
        elif name == "recall":
            measure, sub_run, key = (f"recall.{k}", run, f"recall_{k}") if k else ("recall.1000", run, "recall_1000")
        elif name == "precision":
            measure, sub_run, key = (f"P.{k}", run, f"P_{k}") if k else ("P.10", run, "P_10")
        else:
            measure, sub_run, key = "map", _truncate(run, k) if k else run, "map"
        evaluator = pytrec_eval.RelevanceEvaluator(judged, {measure}, relevance_level=relevance_level)
        scored = evaluator.evaluate({q: dict(sub_run.get(q, {})) for q in judged if sub_run.get(q)})
        results[metric] = {q: float(scored.get(q, {}).get(key, 0.0)) for q in judged}
    return results


def evaluate(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]],
             metrics: Sequence[str] = DEFAULT_METRICS, *, relevance_level: int = 1) -> dict[str, float]:
    """Mean of each metric over the judged queries (see :func:`per_query`)."""
    table = per_query(run, qrels, metrics, relevance_level=relevance_level)
    return {m: float(np.mean(list(v.values()))) for m, v in table.items()}


def _ranked_run(ranked_ids: Sequence[Any], query_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    if len(query_ids) != len(ranked_ids):
        raise ConfigError(f"{len(query_ids)} query ids for {len(ranked_ids)} result lists")
    # descending ranks as scores, so trec_eval's sort (by score) keeps our order where scores tie
    return {str(qid): {str(d): float(len(ids) - j) for j, d in enumerate(ids)}
            for qid, ids in zip(query_ids, ranked_ids)}


def run_from_rows(rows: np.ndarray, doc_ids: np.ndarray, query_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """A run ``{qid: {doc_id: score}}`` from ranked row numbers ``(nq, k)`` (``-1`` = padding).

    Scores are written as descending ranks, so trec_eval's sort (by score) keeps our order even
    where the retriever's scores tie."""
    return _ranked_run([doc_ids[r[r >= 0]] for r in np.asarray(rows)], query_ids)


def run_from_hits(hits: Any, query_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """A run from :class:`~hybridret.types.Hits` (see :func:`run_from_rows`)."""
    return _ranked_run([hits.ids[i][hits.rows[i] >= 0] for i in range(len(hits))], query_ids)


@dataclass
class Coverage:
    """How well judgments and an index fit a set of queries (:func:`judgment_coverage`).

    ``unjudged``: query ids without any judgment (left out of every mean); ``judged_missing``:
    judged documents (any grade) that are not in the index; ``relevant`` / ``relevant_missing``:
    the judgments at or above the relevance level, and those naming documents absent from the
    index (they can never be retrieved: recall and nDCG are capped below 1);
    ``queries_without_relevant``: judged queries none of whose relevant documents are in the index
    (they score 0 whatever the method)."""

    queries: int = 0
    unjudged: list[str] = field(default_factory=list)
    judged: int = 0
    judged_missing: int = 0
    relevant: int = 0
    relevant_missing: int = 0
    queries_without_relevant: list[str] = field(default_factory=list)


def judgment_coverage(qrels: Mapping[str, Mapping[str, int]], query_ids: Iterable[str],
                      contains: Callable[[str], bool], *, relevance_level: int = 1) -> Coverage:
    """Count what an evaluation of ``query_ids`` against ``qrels`` cannot see: queries without
    judgments and judged documents that ``contains`` (``doc_id in index``) says are not indexed."""
    out = Coverage()
    for qid in query_ids:
        out.queries += 1
        docs = qrels.get(qid) or {}
        if not docs:
            out.unjudged.append(qid)
            continue
        found_relevant = had_relevant = False
        for doc_id, grade in docs.items():
            present = bool(contains(doc_id))
            out.judged += 1
            out.judged_missing += not present
            if grade >= relevance_level:
                had_relevant = True
                out.relevant += 1
                out.relevant_missing += not present
                found_relevant = found_relevant or present
        if had_relevant and not found_relevant:
            out.queries_without_relevant.append(qid)
    return out


def warn_coverage(cov: Coverage, *, queries: str = "the queries", qrels: str = "the qrels",
                  index: str = "the index") -> list[str]:
    """Log (and return) one warning per gap :func:`judgment_coverage` found, with counts."""
    lines = []
    if cov.unjudged:
        shown = ", ".join(repr(q) for q in cov.unjudged[:3]) + (" ..." if len(cov.unjudged) > 3 else "")
        lines.append(f"{len(cov.unjudged)} of {cov.queries} queries in {queries} have no judgments in {qrels} and "
                     f"are not scored ({shown})")
    if cov.relevant_missing:
        lines.append(f"{cov.relevant_missing} of {cov.relevant} relevant judgments in {qrels} name documents that "
                     f"are not in {index} (they can never be retrieved, so the scores understate any method); "
                     f"{len(cov.queries_without_relevant)} queries have no relevant document in the index at all")
    elif cov.judged_missing:
        lines.append(f"{cov.judged_missing} of {cov.judged} judged documents in {qrels} are not in {index}")
    for line in lines:
        logger.warning("%s", line)
    return lines
