"""Calibrated relevance: a probability in [0, 1] per hit that a fixed threshold can cut.

Fused scores have no fixed scale (they change with the query, the filter and the candidates, and
can be negative), so ``search(..., relevance=True)`` adds ``Hits.relevance`` (``(nq, k)``, NaN
padding) and ``Hit.relevance``, computed in two steps (docs/relevance.md):

1. **Absolute probability** of each hit from features with a fixed scale across queries:
   ``dense`` = the cosine of the normalised vectors; ``sparse`` = the learned-sparse dot product
   divided by the query's self-score ``q . q``; ``bm25`` = the BM25 score divided by what the
   query could score at most, ``sum over its tokens of (1 + k1) idf``. A logistic model per set of
   features present (:class:`LogisticModel`) maps them to ``p``.
2. **Monotone within the query**: ``p`` in the order of the method's score (fused, single
   retriever or reranker) is projected onto non-increasing sequences (isotonic regression, pool
   adjacent violators; equal scores pooled), so a better-ranked hit never has a lower relevance
   and the average ``p`` of the list is kept.

The shipped coefficients (:data:`DEFAULT_CALIBRATION`) were fitted for the packaged models
(``all-MiniLM-L6-v2`` + ``splade-tiny`` + BM25) on the shared test collections
(``benchmarks/relevance.py``). An index with other models has no calibration for its dense and
learned-sparse scores: fit one on judged queries with ``hybridret calibrate`` (stored in the
index's manifest, used before the shipped one), or search with ``method="bm25"`` (BM25's model
holds for any encoder). Import-light: numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ConfigError

__all__ = ["DEFAULT_CALIBRATION", "FEATURES", "Calibration", "LogisticModel", "absolute_probability", "bm25_bounds",
           "calibration_for", "check_relevance", "features_of", "fit_calibration", "fit_logistic", "monotone",
           "relevance_of", "search_relevance", "sparse_self_scores"]

FEATURES: tuple[str, ...] = ("dense", "sparse", "bm25")
"""The retrievers whose scores feed the calibration (a reranker's score orders the hits but is not a feature)."""

_ENCODER_KEYS = ("model", "fingerprint", "normalize", "pooling", "query_prefix", "max_length", "query_top_k")


def check_relevance(relevance: Any) -> bool:
    """The ``relevance`` argument of a search: ``True`` or ``False``, never coerced."""
    if not isinstance(relevance, bool):
        raise ConfigError(f"relevance must be true or false, got {relevance!r}")
    return relevance


@dataclass(frozen=True)
class LogisticModel:
    """``p = 1 / (1 + exp(-(intercept + sum(w_f * x_f))))`` over ``features`` (normalised scores)."""

    features: tuple[str, ...]
    intercept: float
    weights: tuple[float, ...]

    def predict(self, x: Mapping[str, np.ndarray]) -> np.ndarray:
        z = np.full(np.shape(x[self.features[0]]), self.intercept, dtype=np.float64)
        for name, w in zip(self.features, self.weights):
            z = z + w * np.asarray(x[name], dtype=np.float64)
        return 1.0 / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))

    def to_dict(self) -> dict[str, Any]:
        return {"features": list(self.features), "intercept": self.intercept, "weights": list(self.weights)}

    @classmethod
    def from_dict(cls, data: Any) -> LogisticModel:
        if not isinstance(data, Mapping) or set(data) != {"features", "intercept", "weights"}:
            raise ConfigError(f"a relevance model is {{'features', 'intercept', 'weights'}}, got {data!r}")
        feats, weights = data["features"], data["weights"]
        if not isinstance(feats, Sequence) or not feats or any(f not in FEATURES for f in feats) or \
                len(set(feats)) != len(feats):
            raise ConfigError(f"relevance model features must be distinct names of {FEATURES}, got {feats!r}")
        nums = [data["intercept"], *weights] if isinstance(weights, Sequence) else None
        if nums is None or len(weights) != len(feats) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in nums):
            raise ConfigError(f"relevance model needs a finite intercept and one finite weight per feature, got {data!r}")
        order = sorted(range(len(feats)), key=lambda i: FEATURES.index(feats[i]))
        return cls(tuple(feats[i] for i in order), float(data["intercept"]), tuple(float(weights[i]) for i in order))


@dataclass(frozen=True)
class Calibration:
    """Logistic models by the set of features a hit has, and what they hold for: ``encoder`` (the
    dense and learned-sparse models' identity, from the index's encoder config: their scores'
    scale depends on them; ``None``: any) and ``fitted_on`` (a description, for people)."""

    models: dict[tuple[str, ...], LogisticModel]
    encoder: dict[str, dict[str, Any]] | None = None
    fitted_on: dict[str, Any] = field(default_factory=dict)

    def model(self, present: Sequence[str]) -> LogisticModel | None:
        """The model of exactly the features ``present`` (in :data:`FEATURES` order), if fitted."""
        return self.models.get(tuple(f for f in FEATURES if f in present))

    def to_dict(self) -> dict[str, Any]:
        return {"models": [m.to_dict() for m in self.models.values()], "encoder": self.encoder,
                "fitted_on": dict(self.fitted_on)}

    @classmethod
    def from_dict(cls, data: Any) -> Calibration:
        if not isinstance(data, Mapping) or not isinstance(data.get("models"), Sequence) or not data["models"]:
            raise ConfigError(f"a relevance calibration is {{'models': [...], 'encoder', 'fitted_on'}}, got {data!r}")
        unknown = set(data) - {"models", "encoder", "fitted_on"}
        if unknown:
            raise ConfigError(f"unknown relevance calibration fields: {sorted(unknown)}")
        models = [LogisticModel.from_dict(m) for m in data["models"]]
        enc = data.get("encoder")
        if enc is not None and not isinstance(enc, Mapping):
            raise ConfigError(f"a relevance calibration's encoder is a mapping or null, got {enc!r}")
        return cls({m.features: m for m in models}, dict(enc) if enc is not None else None,
                   dict(data.get("fitted_on") or {}))

    def holds_for(self, encoder_config: Mapping[str, Any] | None) -> bool:
        """Whether the dense / learned-sparse models fitted are the index's (same identity)."""
        return self.encoder is None or encoder_identity(encoder_config) == self.encoder


def encoder_identity(config: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """What of an encoder config sets the scale of its dense and learned-sparse scores: per head
    (``"dense"``, ``"sparse"``), its model, fingerprint and query-side settings."""
    config = config or {}
    kind = config.get("type")
    heads: dict[str, Any] = {}
    if kind == "paired":
        heads = {"dense": config.get("dense"), "sparse": config.get("sparse")}
    elif kind == "dense":
        heads = {"dense": config}
    elif kind == "splade":
        heads = {"sparse": config}
    elif kind is not None:
        heads = {"dense": config, "sparse": config}  # one model with both heads (joint)
    return {head: {k: sub.get(k) for k in _ENCODER_KEYS if k in sub}
            for head, sub in heads.items() if isinstance(sub, Mapping)}


def calibration_for(manifest: Mapping[str, Any], present: Sequence[str]) -> Calibration:
    """The calibration a search of this index uses for hits with the features ``present``: the
    one ``hybridret calibrate`` stored in the manifest, else the shipped one when the index has the
    packaged models (or only BM25 is present). Otherwise a :class:`ConfigError` saying what to do."""
    stored = manifest.get("relevance")
    if stored:
        return Calibration.from_dict(stored)
    if DEFAULT_CALIBRATION.holds_for(manifest.get("encoder")) or not set(present) & {"dense", "sparse"}:
        return DEFAULT_CALIBRATION
    enc = encoder_identity(manifest.get("encoder"))
    names = ", ".join(f"{h} {v.get('model')!s}" for h, v in enc.items()) or "unknown models"
    raise ConfigError(f"relevance has no calibration for this index's models ({names}): the shipped one is for "
                      "all-MiniLM-L6-v2 + splade-tiny. Fit one on judged queries with "
                      "`hybridret calibrate INDEX --queries Q --qrels R` (stored in the index), or search with "
                      "method='bm25', whose calibration holds for any encoder")


# -- features ------------------------------------------------------------------------------------------
def sparse_self_scores(query_sparse: Any, n: int) -> np.ndarray:
    """Each query's learned-sparse self-score ``q . q`` (``(n,)``; 0 without a sparse vector)."""
    if query_sparse is None:
        return np.zeros(n)
    q = query_sparse.tocsr()
    return np.asarray(q.multiply(q).sum(axis=1), dtype=np.float64).ravel()


def bm25_bounds(snap: Any, texts: Sequence[str]) -> np.ndarray:
    """What each query could score at most in BM25 on this snapshot: ``sum over its analysed
    tokens (repeats count) of (1 + k1) idf`` (a document's term factor is below ``1 + k1``)."""
    from .index.bm25 import K1, idf
    from .retrievers.bm25 import bm25_tokens, collection_stats

    if not snap.segments or not any(s.part("bm25") is not None for s in snap.segments):
        return np.zeros(len(texts))
    tokens = bm25_tokens(snap, list(texts))
    stats = collection_stats(snap, (t for toks in tokens for t in toks))
    out = np.zeros(len(texts))
    for i, toks in enumerate(tokens):
        df = np.array([stats.df.get(t, 0) for t in toks], dtype=np.float64)
        df = df[df > 0]
        out[i] = float(((1.0 + K1) * idf(df, stats.num_docs)).sum()) if len(df) else 0.0
    return out


def features_of(components: Mapping[str, np.ndarray], scales: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The calibration features of every hit ``(nq, k)``: ``dense`` as is; ``sparse`` and ``bm25``
    divided by the query's scale (``scales[name]``, ``(nq,)``; a query with scale 0 gets 0). NaN
    where the retriever did not score the hit."""
    out: dict[str, np.ndarray] = {}
    for name in FEATURES:
        v = components.get(name)
        if v is None:
            continue
        v = np.asarray(v, dtype=np.float64)
        if name != "dense":
            s = np.asarray(scales[name], dtype=np.float64)[:, None]
            v = np.where(s > 0, v / np.where(s > 0, s, 1.0), np.where(np.isnan(v), np.nan, 0.0))
        out[name] = v
    return out


def absolute_probability(cal: Calibration, feats: Mapping[str, np.ndarray], valid: np.ndarray) -> np.ndarray:
    """Each valid hit's probability from the model of the features it has (NaN elsewhere)."""
    out = np.full(valid.shape, np.nan)
    names = [f for f in FEATURES if f in feats]
    if not names:
        if valid.any():
            raise ConfigError("relevance needs the dense, learned-sparse or BM25 score of the hits; this search "
                              "has none of them")
        return out
    has = np.stack([~np.isnan(feats[f]) for f in names], axis=-1)
    for pattern in {tuple(p) for p in has[valid].tolist()}:
        present = [f for f, on in zip(names, pattern) if on]
        where = valid & np.all(has == np.array(pattern), axis=-1)
        if not present:
            raise ConfigError("relevance needs the dense, learned-sparse or BM25 score of every hit")
        model = cal.model(present)
        if model is None:
            raise ConfigError(f"the relevance calibration has no model for hits scored by {', '.join(present)} "
                              f"(it has: {sorted('+'.join(m) for m in cal.models)})")
        p = model.predict({f: np.nan_to_num(feats[f]) for f in present})
        out[where] = p[where]
    return out


def monotone(scores: np.ndarray, prob: np.ndarray) -> np.ndarray:
    """Per row, ``prob`` made non-increasing in ``scores`` (descending): the least-squares
    isotonic fit (pool adjacent violators), hits with equal scores pooled. NaN ``prob`` stays NaN."""
    out = np.full(prob.shape, np.nan)
    for i in range(prob.shape[0]):
        cols = np.flatnonzero(~np.isnan(prob[i]))
        if not len(cols):
            continue
        s = scores[i, cols].astype(np.float64)
        order = cols[np.argsort(-s, kind="stable")]
        ss = scores[i, order]
        vals: list[float] = []
        weights: list[float] = []
        sizes: list[int] = []
        j = 0
        while j < len(order):  # equal scores: one block
            e = j + 1
            while e < len(order) and ss[e] == ss[j]:
                e += 1
            vals.append(float(prob[i, order[j:e]].mean()))
            weights.append(float(e - j))
            sizes.append(e - j)
            j = e
        bv: list[float] = []
        bw: list[float] = []
        bn: list[int] = []
        for v, w, n in zip(vals, weights, sizes):
            bv.append(v)
            bw.append(w)
            bn.append(n)
            while len(bv) > 1 and bv[-2] < bv[-1]:  # a violation: pool the last two blocks
                w2 = bw[-2] + bw[-1]
                bv[-2] = (bv[-2] * bw[-2] + bv[-1] * bw[-1]) / w2
                bw[-2], bn[-2] = w2, bn[-2] + bn[-1]
                del bv[-1], bw[-1], bn[-1]
        out[i, order] = np.repeat(bv, bn)
    return out


def relevance_of(cal: Calibration, scores: np.ndarray, components: Mapping[str, np.ndarray],
                 scales: Mapping[str, np.ndarray], valid: np.ndarray) -> np.ndarray:
    """The calibrated relevance ``(nq, k)`` of the hits (``valid``: not padding; NaN elsewhere)."""
    prob = absolute_probability(cal, features_of(components, scales), valid)
    return monotone(np.where(valid, scores, -np.inf), prob)


def search_relevance(relevance: bool | Calibration, snap: Any, texts: Sequence[str], res: Any) -> np.ndarray:
    """The relevance of a search's results ``res`` (a :class:`~hybridret.plan.PlanResult`) on the
    snapshot ``snap`` it ran on: ``relevance`` is ``True`` (the index's calibration,
    :func:`calibration_for`) or a :class:`Calibration` to use."""
    valid = res.rows >= 0
    present = [f for f in FEATURES if f in res.components]
    cal = relevance if isinstance(relevance, Calibration) else calibration_for(snap.manifest, present)
    n = len(texts)
    scales = {"sparse": sparse_self_scores(res.query_sparse, n) if "sparse" in present else np.zeros(n),
              "bm25": bm25_bounds(snap, texts) if "bm25" in present and valid.any() else np.zeros(n)}
    return relevance_of(cal, res.scores, res.components, scales, valid)


# -- fitting -------------------------------------------------------------------------------------------
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
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(a @ beta, -60, 60)))
        grad = a.T @ (sw * (p - y)) + reg * beta
        hess = (a * (sw * p * (1 - p))[:, None]).T @ a + np.diag(reg + 1e-9)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(beta[0]), beta[1:]


def fit_calibration(feats: Mapping[str, np.ndarray], labels: np.ndarray, *, weights: np.ndarray | None = None,
                    encoder: dict[str, dict[str, Any]] | None = None,
                    fitted_on: Mapping[str, Any] | None = None) -> Calibration:
    """One logistic model per non-empty subset of the features given (flat arrays of the judged
    hits, every feature present for every hit), so that a search whose hits have fewer
    components (``method="bm25"``, an index without BM25) is calibrated too."""
    names = [f for f in FEATURES if f in feats]
    if not names:
        raise ConfigError(f"fit_calibration needs at least one of the features {FEATURES}")
    y = np.asarray(labels, dtype=np.float64)
    models: dict[tuple[str, ...], LogisticModel] = {}
    for mask in range(1, 1 << len(names)):
        subset = tuple(f for b, f in enumerate(names) if mask >> b & 1)
        x = np.stack([np.asarray(feats[f], dtype=np.float64) for f in subset], axis=1)
        b0, w = fit_logistic(x, y, weights=weights)
        models[subset] = LogisticModel(subset, round(b0, 6), tuple(round(float(v), 6) for v in w))
    return Calibration(models, encoder, dict(fitted_on or {}))


# Fitted by benchmarks/relevance.py (`python benchmarks/relevance.py --fit`) on every shared collection; the
# held-out figures of each collection (fitted without it) are in docs/relevance.md.
_DEFAULT = {
    "models": [
        {"features": ["dense"], "intercept": -2.209436, "weights": [3.327366]},
        {"features": ["sparse"], "intercept": -1.476747, "weights": [2.129264]},
        {"features": ["dense", "sparse"], "intercept": -2.350733, "weights": [2.621704, 1.088146]},
        {"features": ["bm25"], "intercept": -1.385698, "weights": [3.80159]},
        {"features": ["dense", "bm25"], "intercept": -2.450784, "weights": [2.395536, 3.051461]},
        {"features": ["sparse", "bm25"], "intercept": -1.545697, "weights": [0.586827, 3.320402]},
        {"features": ["dense", "sparse", "bm25"], "intercept": -2.414355, "weights": [2.573852, -0.421748, 3.337448]},
    ],
    "encoder": {
        "dense": {
            "fingerprint": "sha256:40cbefb951622326420b083f1aef2e0b74fcd267baffde04fd5e76c26e06a6b7",
            "max_length": 256,
            "model": "all-MiniLM-L6-v2",
            "normalize": True,
            "pooling": "mean",
            "query_prefix": "",
        },
        "sparse": {
            "fingerprint": "sha256:d0884bf9deafabafd89731683a0ee57ff6338b9db9f3256dac4768ed63bbddc1",
            "max_length": 256,
            "model": "splade-tiny",
            "query_top_k": None,
        },
    },
    "fitted_on": {
        "collections": ["adi", "cisi", "cranfield", "medline", "limit-small", "msmarco-dl19-pool"],
        "hits": "hybrid top-10",
        "script": "benchmarks/relevance.py",
    },
}


DEFAULT_CALIBRATION: Calibration = Calibration.from_dict(_DEFAULT)
"""The shipped calibration for the packaged models (see docs/relevance.md for its data and figures)."""
