"""Fit a relevance calibration on judged queries (``hybridret calibrate``, :func:`calibrate`).

The shipped calibration (:data:`hybridret.relevance.DEFAULT_CALIBRATION`) holds for the packaged
models only. For an index with other models, or to fit your own domain, :func:`calibrate` searches
judged queries, labels each hit of the top ``k`` (relevant: a qrels grade >= ``level``; a hit
without a judgment counts as non-relevant) and fits one logistic model per set of features
(:func:`hybridret.relevance.fit_calibration`); :meth:`HybridRetriever.set_relevance` stores it in
the index, where every later ``search(..., relevance=True)`` (library, server, CLI) finds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import ConfigError
from .relevance import FEATURES, Calibration, bm25_bounds, encoder_identity, features_of, fit_calibration, sparse_self_scores

__all__ = ["MIN_JUDGED", "calibrate", "judged_features"]

MIN_JUDGED = 20
"""Fewest relevant and fewest non-relevant judged hits a calibration is fitted on."""


def judged_features(searcher: Any, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], *,
                    k: int = 10, method: str = "hybrid", level: int = 1) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The calibration features of every hit in the top ``k`` of ``method`` for the judged
    ``queries`` on a :class:`~hybridret.Searcher`, and their labels (flat arrays)."""
    qids = [q for q in queries if qrels.get(q)]
    if not qids:
        raise ConfigError("none of the queries has judgments in the qrels")
    texts = [queries[q] for q in qids]
    hits = searcher.search(texts, k, method=method)
    snap = hits._source.snap if hits._source is not None else searcher.snapshot
    n = len(texts)
    scales = {"sparse": sparse_self_scores(hits.query_sparse, n),
              "bm25": bm25_bounds(snap, texts) if "bm25" in hits.components else np.zeros(n)}
    feats = features_of(hits.components, scales)
    valid = hits.rows >= 0
    labels = np.array([[int(qrels[q].get(str(d), 0)) >= level for d in row] for q, row in zip(qids, hits.ids)])
    return {f: v[valid] for f, v in feats.items() if f in FEATURES}, labels[valid]


def calibrate(retriever: Any, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], *, k: int = 10,
              method: str = "hybrid", level: int = 1, fitted_on: Mapping[str, Any] | None = None) -> Calibration:
    """A :class:`~hybridret.relevance.Calibration` for this index's models, fitted on the top ``k``
    hits of ``method`` for the judged ``queries`` (``qrels``: query id -> document id -> grade;
    relevant: grade >= ``level``). Needs at least :data:`MIN_JUDGED` relevant and as many
    non-relevant hits. Store it with :meth:`HybridRetriever.set_relevance`."""
    searcher = getattr(retriever, "searcher", retriever)
    feats, y = judged_features(searcher, queries, qrels, k=k, method=method, level=level)
    pos, neg = int(y.sum()), int((~y).sum())
    if pos < MIN_JUDGED or neg < MIN_JUDGED:
        raise ConfigError(f"too few judged hits to calibrate on: {pos} relevant and {neg} non-relevant in the top {k} "
                          f"(at least {MIN_JUDGED} of each); add judged queries or raise k")
    return fit_calibration(feats, y, encoder=encoder_identity(searcher.snapshot.manifest.get("encoder")),
                           fitted_on={"queries": len({q for q in queries if qrels.get(q)}), "hits": int(len(y)),
                                      "relevant": pos, "k": k, "method": method, "level": level, **(fitted_on or {})})
