"""Grid search of fusion and GQR settings on judged queries (``hybridret tune``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .eval import evaluate, run_from_rows
from .hybrid import Candidates, FusionConfig, fuse, gather_candidates
from .refine import GQRConfig

if TYPE_CHECKING:  # pragma: no cover
    from .retriever import HybridRetriever

__all__ = ["default_grid", "tune"]

logger = logging.getLogger(__name__)


def default_grid(has_bm25: bool = True, depth: int = 100) -> list[FusionConfig]:
    """About 50 settings: linear (2 and 3 signals), RRF, and GQR with sparse / BM25 / mixed guides."""
    grid: list[FusionConfig] = []
    for norm in ("minmax", "zscore"):
        for w in (0.3, 0.4, 0.5, 0.6, 0.7):
            grid.append(FusionConfig("linear", ("dense", "sparse"), {"dense": w, "sparse": 1 - w}, norm, depth=depth))
        if has_bm25:
            for wd, ws, wb in ((1 / 3, 1 / 3, 1 / 3), (0.5, 0.25, 0.25), (0.25, 0.5, 0.25), (0.25, 0.25, 0.5),
                               (0.4, 0.2, 0.4)):
                grid.append(FusionConfig("linear", ("dense", "sparse", "bm25"),
                                         {"dense": wd, "sparse": ws, "bm25": wb}, norm, depth=depth))
    for rrf_k in (10.0, 30.0, 60.0):
        grid.append(FusionConfig("rrf", ("dense", "sparse"), rrf_k=rrf_k, depth=depth))
        if has_bm25:
            grid.append(FusionConfig("rrf", ("dense", "sparse", "bm25"), rrf_k=rrf_k, depth=depth))
    guides: list[dict[str, float]] = [{"sparse": 1.0}]
    if has_bm25:
        guides += [{"sparse": 0.5, "bm25": 0.5}, {"bm25": 1.0}]
    for guide in guides:
        for alpha in (0.3, 0.5, 0.7):
            for t_dense in (0.05, 0.1):
                grid.append(FusionConfig("gqr", guide=guide, depth=depth, gqr=GQRConfig(alpha=alpha, t_dense=t_dense)))
    return grid


def tune(retriever: HybridRetriever, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], *,
         metric: str = "ndcg@10", grid: Iterable[FusionConfig] | None = None, relevance_level: int = 1,
         k: int = 100) -> tuple[FusionConfig, list[dict[str, Any]]]:
    """Evaluate every setting of ``grid`` on the judged queries; return the best and the full table.

    Candidates are gathered once per distinct union of retrievers and reused across settings.
    """
    qids = [q for q in queries if q in qrels and qrels[q]]
    if not qids:
        raise ConfigError("no query has relevance judgments: check that query ids match the qrels")
    has_bm25 = retriever.sparse is not None and bool(retriever.sparse.meta.get("bm25"))
    settings = list(grid) if grid is not None else default_grid(has_bm25)
    texts = [queries[q] for q in qids]
    need_sparse = any("sparse" in c.union_retrievers for c in settings)
    qd, qs = retriever._encode_queries(texts, True, need_sparse)
    cache: dict[tuple[tuple[str, ...], int], Candidates] = {}
    results: list[dict[str, Any]] = []
    ids = retriever.docs.ids  # type: ignore[union-attr]
    for cfg in settings:
        key = (tuple(sorted(cfg.union_retrievers)), max(k, cfg.depth))
        if key not in cache:
            cache[key] = gather_candidates(cfg.union_retrievers, key[1], texts=texts, qd=qd, qs=qs,
                                           dense=retriever.dense, sparse=retriever.sparse)
        rows, _, _ = fuse(cfg, cache[key], k, qd=qd, dense=retriever.dense)
        score = evaluate(run_from_rows(rows, ids, qids), qrels, (metric,), relevance_level=relevance_level)[metric]
        results.append({"config": cfg.to_dict(), metric: score})
        logger.debug("%s %s = %.4f", cfg.method, cfg.to_dict(), score)
    best = max(range(len(results)), key=lambda i: results[i][metric])
    logger.info("best of %d settings on %d queries: %s %s = %.4f", len(results), len(qids), settings[best].method,
                metric, results[best][metric])
    return settings[best], results


