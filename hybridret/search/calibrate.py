"""Fit a relevance calibration on judged queries (``hybridret calibrate``, :func:`calibrate`).

The shipped calibration (:data:`hybridret.search.relevance.DEFAULT_CALIBRATION`) holds for the packaged
models only. For an index with other models, or to fit your own domain, :func:`calibrate` searches
judged queries, labels each hit of the top ``k`` (relevant: a qrels grade >= ``level``; a hit
without a judgment counts as non-relevant) and fits the logistic models of
:mod:`hybridret.search.relevance` (:func:`fit_calibration`): one per set of retrievers, on the retriever's
own lists for a single one, and one with the fused score for the fusion ``method`` ran.
:meth:`HybridRetriever.set_relevance` stores it in the index, where every later
``search(..., relevance=True)`` (library, server, CLI) finds it. ``benchmarks/relevance.py`` fits
the shipped constants with the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from .relevance import FEATURES, Calibration, LogisticModel, encoder_identity, hit_inputs
from .request import SearchRequest

__all__ = ["MAX_LOGIT", "MIN_JUDGED", "Judged", "calibrate", "calibration_methods", "check_fit", "fit_answerability",
           "fit_calibration", "fit_logistic", "judged_hits"]

MIN_JUDGED = 20
"""Fewest relevant and fewest non-relevant judged hits a calibration is fitted on."""

MAX_LOGIT = 30.0
"""The largest log-odds a fitted model may give a judged hit, and the largest change one term
(intercept, or a weight times its feature's largest magnitude) may make: beyond it the
probabilities are 0 or 1 to ~13 digits, which judged relevance never supports (the shipped
models stay under 10); such a fit is degenerate and refused."""


def calibration_methods(registry: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The search methods a calibration can be fitted on: every fusion method, and the single
    retrievers whose scores are relevance features (:data:`~hybridret.search.relevance.FEATURES`)."""
    from ..methods import method_names
    from ..retrievers import REGISTRY

    registry = REGISTRY if registry is None else registry
    return tuple(m for m in method_names(registry) if m not in registry or m in FEATURES)


def check_method(method: Any) -> str:
    """``method`` if a calibration can be fitted on it, else a :class:`ConfigError` listing those that can."""
    allowed = calibration_methods()
    if method not in allowed:
        raise ConfigError(f"cannot calibrate on method {method!r}: its hits carry none of the scores a relevance "
                          f"model reads ({', '.join(FEATURES)}); choose one of {', '.join(allowed)}")
    return method


@dataclass
class Judged:
    """The judged hits of one list kind, flat: ``features`` (each of
    :data:`hybridret.search.relevance.INPUTS` the lists have), ``labels`` (relevant or not), ``query``
    (the query's number, per hit), ``fusion`` (the fusion whose score ``features["score"]`` is, or
    ``None``) and per-hit ``weights`` (``None``: all 1)."""

    features: dict[str, np.ndarray]
    labels: np.ndarray
    query: np.ndarray
    fusion: dict[str, Any] | None
    weights: np.ndarray | None = None
    queries: dict[str, np.ndarray] | None = None  # per query: its TOPS (nq,) ...
    answerable: np.ndarray | None = None  # ... and whether the index holds a relevant document for it
    query_weights: np.ndarray | None = None

    @property
    def usable(self) -> bool:
        """At least :data:`MIN_JUDGED` relevant and as many non-relevant hits."""
        pos = int(self.labels.sum())
        return pos >= MIN_JUDGED and len(self.labels) - pos >= MIN_JUDGED

    @classmethod
    def pooled(cls, parts: Sequence[Judged]) -> Judged:
        """Several collections' judged hits as one, each collection weighing the same."""
        if not parts or any(p.fusion != parts[0].fusion for p in parts):
            raise ConfigError("pooled judged hits need the same fusion settings in every part")
        names = [f for f in parts[0].features if all(f in p.features for p in parts)]
        offsets = np.cumsum([0] + [len(p.answerable) if p.answerable is not None else
                                   (int(p.query.max()) + 1 if len(p.query) else 0) for p in parts])
        queries = answerable = query_weights = None
        if all(p.queries is not None and p.answerable is not None for p in parts):
            qnames = [f for f in parts[0].queries if all(f in p.queries for p in parts)]  # type: ignore[union-attr]
            queries = {f: np.concatenate([p.queries[f] for p in parts]) for f in qnames}  # type: ignore[index]
            answerable = np.concatenate([p.answerable for p in parts])  # type: ignore[misc]
            query_weights = np.concatenate([np.full(len(p.answerable), 1.0 / max(len(p.answerable), 1))  # type: ignore[arg-type]
                                            for p in parts])
        return cls({f: np.concatenate([p.features[f] for p in parts]) for f in names},
                   np.concatenate([p.labels for p in parts]),
                   np.concatenate([p.query + o for p, o in zip(parts, offsets)]), parts[0].fusion,
                   np.concatenate([np.full(len(p.labels), 1.0 / max(len(p.labels), 1)) for p in parts]),
                   queries, answerable, query_weights)


def judged_hits(searcher: Any, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], *,
                k: int = 10, method: str = "hybrid", level: int = 1, candidates: int | None = None,
                off_topic: Sequence[str] = ()) -> Judged:
    """The model inputs and labels of every hit in the top ``k`` of ``method`` for the judged
    ``queries`` (those with a judgment in ``qrels``) on a :class:`~hybridret.Searcher`, and of
    each query (:attr:`Judged.queries`: its query-level inputs; :attr:`Judged.answerable`: a
    document of grade >= ``level`` is in the index). ``off_topic``: more query texts for which the
    index holds nothing relevant (e.g. another collection's queries): every hit non-relevant."""
    qids = [q for q in queries if qrels.get(q)]
    if not qids:
        raise ConfigError("none of the queries has judgments in the qrels")
    texts = [queries[q] for q in qids] + [str(t) for t in off_topic]
    judgments = [qrels[q] for q in qids] + [{} for _ in off_topic]
    snap, plan, res = searcher._run(SearchRequest(texts, k, method=method, candidates=candidates, relevance=True))
    inputs = hit_inputs(snap, plan, res)
    valid = inputs.valid
    labels = np.array([[int(j.get(str(d), 0)) >= level for d in row] for j, row in zip(judgments, res.ids)], dtype=bool)
    answerable = np.array([any(g >= level and snap.row_of(str(d)) is not None for d, g in j.items())
                           for j in judgments], dtype=bool)
    qnum = np.broadcast_to(np.arange(len(texts))[:, None], valid.shape)
    return Judged({f: v[valid] for f, v in inputs.features.items()}, labels.reshape(valid.shape)[valid], qnum[valid],
                  inputs.fusion, queries=dict(inputs.query), answerable=answerable)


def fit_logistic(x: np.ndarray, y: np.ndarray, *, weights: np.ndarray | None = None, l2: float = 1e-3,
                 iterations: int = 50) -> tuple[float, np.ndarray]:
    """Logistic regression (Newton's method, a small L2 penalty on the weights; ``weights``: per
    sample, e.g. to weigh collections equally): ``(intercept, weights)``."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or len(x) != len(y) or not len(y):
        raise ConfigError(f"fit_logistic needs features (n, d) and n labels, got {x.shape} and {y.shape}")
    if y.min() == y.max():
        raise ConfigError("cannot fit a relevance calibration: the judged hits are all relevant or all non-relevant")
    sw = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    sw = sw * (len(y) / sw.sum())
    a = np.hstack([np.ones((len(x), 1)), x])
    beta = np.zeros(a.shape[1])
    mean = float((sw * y).sum() / sw.sum())
    beta[0] = math.log(mean / (1 - mean))
    reg = np.full(a.shape[1], l2 * len(y))
    reg[0] = 0.0

    def loss(b: np.ndarray) -> float:  # the penalized negative log-likelihood Newton minimises
        z = a @ b
        return float((sw * (np.logaddexp(0.0, z) - y * z)).sum() + 0.5 * (reg * b * b).sum())

    current = loss(beta)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(a @ beta, -60, 60)))
        grad = a.T @ (sw * (p - y)) + reg * beta
        hess = (a * (sw * p * (1 - p))[:, None]).T @ a + np.diag(reg + 1e-9)
        step = np.linalg.solve(hess, grad)
        # a full Newton step where it lowers the loss (always, near the optimum); else halved until it
        # does: on a near-singular Hessian (e.g. most hits far below the relevant ones) the full step
        # can overshoot by orders of magnitude (an intercept of -7.7e12)
        for _ in range(60):
            trial = loss(beta - step)
            if trial <= current or not np.abs(step).max() > 1e-12:
                break
            step = step / 2
        beta -= step
        current = loss(beta)
        if np.abs(step).max() < 1e-8:
            break
    return float(beta[0]), beta[1:]


def _model(data: Judged, features: tuple[str, ...], fusion: dict[str, Any] | None = None) -> LogisticModel:
    x = np.stack([np.asarray(data.features[f], dtype=np.float64) for f in features], axis=1)
    keep = np.isfinite(x).all(axis=1)  # a hit a retriever did not score (NaN) says nothing of that feature
    labels = np.asarray(data.labels)[keep]
    weights = None if data.weights is None else np.asarray(data.weights)[keep]
    if not keep.any():
        raise ConfigError(f"cannot fit a relevance calibration of {list(features)}: no judged hit has all of them")
    b0, w = fit_logistic(x[keep], labels, weights=weights)
    check_fit(b0, w, x[keep], labels, features)
    return LogisticModel(features, round(b0, 6), tuple(round(float(v), 6) for v in w), fusion)


def check_fit(intercept: float, weights: np.ndarray, x: np.ndarray, labels: np.ndarray,
              features: Sequence[str]) -> None:
    """Refuse a degenerate logistic fit (a :class:`ConfigError` naming the model and why), never
    store it: non-finite coefficients; a term beyond :data:`MAX_LOGIT` (e.g. an intercept of
    -7.7e12, which makes every hit's relevance ~0); or judged hits that the features separate
    perfectly (every relevant hit above every other one), whose fit says 0 or 1 and nothing between."""
    name = "+".join(features)
    hint = "judge more queries (with relevant and non-relevant hits among the top k), or lower k"
    w = np.asarray(weights, dtype=np.float64)
    if not (math.isfinite(intercept) and np.isfinite(w).all()):
        raise ConfigError(f"the relevance model {name} did not converge (non-finite coefficients); {hint}")
    spread = np.abs(x).max(axis=0) if len(x) else np.zeros(len(w))
    terms = np.abs(w) * spread
    worst = int(np.argmax(terms)) if len(terms) else 0
    if abs(intercept) > MAX_LOGIT or (len(terms) and terms[worst] > MAX_LOGIT):
        what = (f"intercept {intercept:.4g}" if abs(intercept) > MAX_LOGIT
                else f"weight {w[worst]:.4g} on {features[worst]}")
        raise ConfigError(f"the relevance model {name} is degenerate ({what}: probabilities of 0 or 1 only); {hint}")
    logits = intercept + x @ w
    y = np.asarray(labels, dtype=bool)
    if y.any() and (~y).any() and logits[y].min() > logits[~y].max():
        raise ConfigError(f"the relevance model {name} cannot be fitted: its features separate the judged hits "
                          f"perfectly ({int(y.sum())} relevant above all {int((~y).sum())} others), so any fit says 0 "
                          f"or 1; {hint}")


def fit_calibration(lists: Judged, single: Mapping[str, Judged] | None = None, *,
                    encoder: dict[str, dict[str, Any]] | None = None,
                    fitted_on: Mapping[str, Any] | None = None, with_tops: bool = True) -> Calibration:
    """The models of a calibration: for every non-empty set of the retrievers that scored
    ``lists``' hits, a model of their features and ``log_rank`` (a single retriever's on its own
    lists, ``single[name]``, when given and :attr:`Judged.usable`; else on ``lists``), so that a
    search whose hits have fewer components (``method="bm25"``, an index without BM25) is
    calibrated too; and when ``lists`` are a fusion's with a dense retriever, a model of every
    retriever's feature and ``fused_dense`` (the fused score times the dense cosine), for that
    fusion setting only. ``with_tops``: each model also reads the query-level inputs
    (:data:`~hybridret.search.relevance.TOPS`) of its retrievers, and the answerability models are
    fitted (:func:`fit_answerability`) when ``lists`` has answerable and unanswerable queries."""
    names = [f for f in FEATURES if f in lists.features]
    if not names:
        raise ConfigError(f"fit_calibration needs at least one of the features {FEATURES}")
    models: list[LogisticModel] = []
    for mask in range(1, 1 << len(names)):
        subset = tuple(f for b, f in enumerate(names) if mask >> b & 1)
        own = (single or {}).get(subset[0]) if len(subset) == 1 else None
        data = own if own is not None and own.usable else lists
        tops = tuple(f"top_{f}" for f in subset if f"top_{f}" in data.features) if with_tops else ()
        models.append(_model(data, (*subset, *tops, "log_rank")))
    if lists.fusion is not None and "fused_dense" in lists.features:
        tops = tuple(f"top_{f}" for f in names if f"top_{f}" in lists.features) if with_tops else ()
        models.append(_model(lists, (*names, *tops, "fused_dense"), lists.fusion))
    answer = fit_answerability(lists) if with_tops and lists.answerable is not None else {}
    return Calibration({m.key: m for m in models}, encoder, dict(fitted_on or {}), answer)


def fit_answerability(lists: Judged) -> dict[tuple[str, ...], LogisticModel]:
    """The answerability models (one per non-empty set of the retrievers whose query-level inputs
    ``lists`` has: their :data:`~hybridret.search.relevance.TOPS`) fitted on ``lists``' queries:
    answerable or not. Empty when the queries are all answerable or all not (e.g. judged queries
    only, without off-topic ones)."""
    if lists.queries is None or lists.answerable is None:
        return {}
    y = np.asarray(lists.answerable, dtype=bool)
    if y.all() or not y.any():
        return {}
    have = [f for f in FEATURES if f"top_{f}" in lists.queries]
    out: dict[tuple[str, ...], LogisticModel] = {}
    for mask in range(1, 1 << len(have)):
        subset = tuple(f"top_{f}" for b, f in enumerate(have) if mask >> b & 1)
        x = np.stack([np.nan_to_num(np.asarray(lists.queries[f], dtype=np.float64)) for f in subset], axis=1)
        b0, w = fit_logistic(x, y, weights=lists.query_weights)
        check_fit(b0, w, x, y, subset)
        m = LogisticModel(subset, round(b0, 6), tuple(round(float(v), 6) for v in w))
        out[m.retrievers] = m
    return out


def calibrate(retriever: Any, queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], *, k: int = 10,
              method: str = "hybrid", level: int = 1, fitted_on: Mapping[str, Any] | None = None) -> Calibration:
    """A :class:`~hybridret.search.relevance.Calibration` for this index's models, fitted on the top ``k``
    hits of ``method`` for the judged ``queries`` (``qrels``: query id -> document id -> grade;
    relevant: grade >= ``level``), and on each retriever's own top ``k`` for its single-retriever
    model. Needs at least :data:`MIN_JUDGED` relevant and as many non-relevant hits. Store it with
    :meth:`HybridRetriever.set_relevance`."""
    check_method(method)
    searcher = getattr(retriever, "searcher", retriever)
    lists = judged_hits(searcher, queries, qrels, k=k, method=method, level=level)
    pos, neg = int(lists.labels.sum()), int((~lists.labels).sum())
    if pos < MIN_JUDGED or neg < MIN_JUDGED:
        raise ConfigError(f"too few judged hits to calibrate on: {pos} relevant and {neg} non-relevant in the top {k} "
                          f"(at least {MIN_JUDGED} of each); add judged queries or raise k")
    present = [f for f in FEATURES if f in lists.features]
    single = {f: judged_hits(searcher, queries, qrels, k=k, method=f, level=level) for f in present} \
        if len(present) > 1 else {}
    return fit_calibration(lists, single, encoder=encoder_identity(searcher.snapshot.manifest.get("encoder")),
                           fitted_on={"queries": len({q for q in queries if qrels.get(q)}), "hits": int(len(lists.labels)),
                                      "relevant": pos, "k": k, "method": method, "level": level, **(fitted_on or {})})
