"""Grid search of fusion and GQR settings on judged queries (``hybridret tune``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .eval import evaluate, run_from_rows
from .fusion.config import FUSION_CHUNK, FusionConfig, GQRConfig, fuse
from .fusion.gather import gather_candidates
from .fusion.scores import Candidates
from .retrievers import REGISTRY

if TYPE_CHECKING:  # pragma: no cover
    from .retriever import HybridRetriever

__all__ = ["default_grid", "tune"]

logger = logging.getLogger(__name__)


def default_grid(has_bm25: bool = True, depth: int = 100) -> list[FusionConfig]:
    """About 60 settings: linear (2 and 3 signals), RRF, and GQR with sparse / BM25 / mixed guides
    (the mixture with fixed and with agreement weights)."""
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
                if len(guide) > 1:  # the hybrid default's per-query guide weights (docs/fusion.md)
                    for final_guide in (0.0, 0.25):  # 0.25: the share of the guide kept in hybrid's ranking
                        grid.append(FusionConfig("gqr", guide=guide, depth=depth, guide_weighting="agreement",
                                                 gqr=GQRConfig(alpha=alpha, t_dense=t_dense, final_guide=final_guide)))
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
    searcher = retriever.searcher
    snap = searcher.snapshot
    have = searcher.available(snap)
    settings = list(grid) if grid is not None else default_grid(have["bm25"])
    settings = [c for c in settings if all(have[r] for r in c.union_retrievers)]
    if not settings:
        raise ConfigError("no fusion setting of the grid can run on this index")
    texts = [queries[q] for q in qids]
    needs = {REGISTRY[r].needs for c in settings for r in c.union_retrievers}
    results: list[dict[str, Any]] = []
    ids = snap.ids
    by_config: dict[int, float] = {}
    for a in range(0, len(texts), FUSION_CHUNK):  # bounded memory, as every fused search
        q = searcher.encode_queries(texts[a:a + FUSION_CHUNK], needs)
        cache: dict[tuple[tuple[str, ...], int], Candidates] = {}
        for n, cfg in enumerate(settings):
            key = (tuple(sorted(cfg.union_retrievers)), max(k, cfg.depth))
            if key not in cache:
                cache[key] = gather_candidates(cfg.union_retrievers, key[1], snap, q)
            rows, _, _ = fuse(cfg, cache[key], k, snap, q)
            part = evaluate(run_from_rows(rows, ids, qids[a:a + FUSION_CHUNK]), qrels, (metric,),
                            relevance_level=relevance_level)[metric]
            by_config[n] = by_config.get(n, 0.0) + part * len(q)
    for n, cfg in enumerate(settings):
        score = by_config[n] / len(texts)
        results.append({"config": cfg.to_dict(), metric: score})
        logger.debug("%s %s = %.4f", cfg.method, cfg.to_dict(), score)
    best = max(range(len(results)), key=lambda i: results[i][metric])
    logger.info("best of %d settings on %d queries: %s %s = %.4f", len(results), len(qids), settings[best].method,
                metric, results[best][metric])
    return settings[best], results


