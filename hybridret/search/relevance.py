"""Calibrated relevance: a probability in [0, 1] per hit that a fixed threshold can cut.

Fused scores have no fixed scale (they change with the query, the filter and the candidates, and
can be negative), so ``search(..., relevance=True)`` adds ``Hits.relevance`` (``(nq, k)``, NaN
padding) and ``Hit.relevance``, computed in two steps (docs/relevance.md):

1. **A probability per hit** from a logistic model (:class:`LogisticModel`) of inputs with a fixed
   scale across queries: ``dense`` = the cosine of the normalised vectors; ``sparse`` = the
   learned-sparse dot product divided by the query's self-score ``q . q``; ``bm25`` = the BM25
   score divided by what the query could score at most, ``sum over its tokens of (1 + k1) idf``;
   ``log_rank`` = the natural log of the hit's rank in the list. For the default ``hybrid``
   fusion, its own score (z-scored over its candidates) times the dense cosine (``fused_dense``)
   replaces the rank: used only when the search ran exactly the fusion the model was fitted for.
2. **Monotone within the query**: the probabilities in the order of the method's score (fused,
   single retriever or reranker) are projected onto non-increasing sequences (isotonic regression,
   pool adjacent violators; equal scores pooled), so a better-ranked hit never has a lower
   relevance and the average of the list is kept.

The shipped coefficients (:data:`DEFAULT_CALIBRATION`, :func:`default_calibration`: the checksummed
JSON file ``hybridret/resources/relevance.json``, read on first use) were fitted for the packaged models
(``all-MiniLM-L6-v2`` + ``splade-tiny`` + BM25) on the shared test collections
(``benchmarks/relevance.py``). An index with other models has no calibration for its dense and
learned-sparse scores: fit one on judged queries with ``hybridret calibrate``
(:mod:`hybridret.search.calibrate`; stored in the index's manifest, used before the shipped one), or
search with ``method="bm25"`` (BM25's model holds for any encoder). Import-light: numpy only.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["DEFAULT_CALIBRATION", "FEATURES", "FUSED_INPUTS", "INPUTS", "TOPS", "Calibration", "HitInputs",
           "LogisticModel", "RESOURCE", "answerability", "bm25_bounds", "calibration_file", "calibration_for",
           "checksum", "default_calibration", "load_calibration", "check_relevance", "features_of",
           "fusion_key", "hit_inputs", "hit_ranks", "monotone", "probability", "relevance_of", "search_relevance",
           "sparse_self_scores", "top_name"]

FEATURES: tuple[str, ...] = ("dense", "sparse", "bm25")
"""The retrievers whose scores feed the calibration (a reranker's score orders the hits but is not an input)."""

TOPS: tuple[str, ...] = tuple(f"top_{f}" for f in FEATURES)
"""The query-level inputs: each retriever's best normalised score over the whole (filtered) index for
the query (``top_dense``: the best cosine; ``top_sparse`` / ``top_bm25``: the best score over the same
scale as ``sparse`` / ``bm25``), the same for every hit, page, ``k``, grouping and reranker
(:func:`hybridret.search.run.leg_tops`). They say how well the index can answer the query at all:
an off-topic query's best document scores low on every leg."""

INPUTS: tuple[str, ...] = (*FEATURES, *TOPS, "log_rank", "score", "fused_dense")
"""Every input a model may use: the retrievers' normalised scores, the query-level :data:`TOPS`, the
log of the hit's rank and, for a model fitted for one fusion setting, that fusion's score (``score``)
or that score times the hit's dense cosine clipped at 0 (``fused_dense``: the relative fused score
gated by an absolute one)."""

FUSED_INPUTS = frozenset({"score", "fused_dense"})
"""The inputs that hold for one fusion setting only."""

_ENCODER_KEYS = ("model", "fingerprint", "normalize", "pooling", "query_prefix", "max_length", "query_top_k")


def top_name(feature: str) -> str:
    """The retriever a feature is about (``"top_dense"`` -> ``"dense"``), or the feature itself."""
    return feature[4:] if feature in TOPS else feature


def check_relevance(relevance: Any) -> bool:
    """The ``relevance`` argument of a search: ``True`` or ``False``, never coerced."""
    if not isinstance(relevance, bool):
        raise ConfigError(f"relevance must be true or false, got {relevance!r}")
    return relevance


def fusion_key(config: Any) -> dict[str, Any] | None:
    """The settings of a :class:`~hybridret.fusion.config.FusionConfig` that a model's ``score`` holds
    for: its JSON form without ``depth`` (``candidates``, cut to the index size on a small index;
    docs/relevance.md measures a shallower depth); ``None`` for ``None``."""
    if config is None:
        return None
    return {k: v for k, v in json.loads(json.dumps(config.to_dict(), sort_keys=True)).items() if k != "depth"}


@dataclass(frozen=True)
class LogisticModel:
    """``p = 1 / (1 + exp(-(intercept + sum(w_f * x_f))))`` over ``features`` (names of
    :data:`INPUTS`, at least one retriever's). ``fusion``: with a fused input (``score``,
    ``fused_dense``), the fusion settings (:func:`fusion_key`) whose score it is; the model serves
    only searches that ran them."""

    features: tuple[str, ...]
    intercept: float
    weights: tuple[float, ...]
    fusion: dict[str, Any] | None = None

    @property
    def retrievers(self) -> tuple[str, ...]:
        """The retrievers the model reads a score of, per hit or per query (in :data:`FEATURES` order)."""
        return tuple(f for f in FEATURES if f in self.features or f"top_{f}" in self.features)

    @property
    def key(self) -> tuple[tuple[str, ...], bool]:
        """What the model serves: hits scored by :attr:`retrievers`, of a fused score (``True``) or not."""
        return self.retrievers, self.fusion is not None

    def predict(self, x: Mapping[str, np.ndarray]) -> np.ndarray:
        z = np.full(np.shape(x[self.features[0]]), self.intercept, dtype=np.float64)
        for name, w in zip(self.features, self.weights):
            z = z + w * np.asarray(x[name], dtype=np.float64)
        return 1.0 / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"features": list(self.features), "intercept": self.intercept, "weights": list(self.weights)}
        if self.fusion is not None:
            out["fusion"] = self.fusion
        return out

    @classmethod
    def from_dict(cls, data: Any) -> LogisticModel:
        if not isinstance(data, Mapping) or not {"features", "intercept", "weights"} <= set(data) <= \
                {"features", "intercept", "weights", "fusion"}:
            raise ConfigError(f"a relevance model is {{'features', 'intercept', 'weights'[, 'fusion']}}, got {data!r}")
        feats, weights = data["features"], data["weights"]
        if not isinstance(feats, Sequence) or isinstance(feats, str) or \
                not any(f in FEATURES or f in TOPS for f in feats) or \
                any(f not in INPUTS for f in feats) or len(set(feats)) != len(feats):
            raise ConfigError(f"relevance model features must be distinct names of {INPUTS}, one of {FEATURES + TOPS} "
                              f"at least, got {feats!r}")
        nums = [data["intercept"], *weights] if isinstance(weights, Sequence) else None
        if nums is None or len(weights) != len(feats) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in nums):
            raise ConfigError(f"relevance model needs a finite intercept and one finite weight per feature, got {data!r}")
        fusion = data.get("fusion")
        if bool(FUSED_INPUTS & set(feats)) != (fusion is not None) or (fusion is not None and not (
                isinstance(fusion, Mapping) and isinstance(fusion.get("method"), str))):
            raise ConfigError("a relevance model with a fused feature (score, fused_dense) needs the fusion settings it "
                              f"holds for ('fusion': a fusion config), and only such a model has them; got {data!r}")
        order = sorted(range(len(feats)), key=lambda i: INPUTS.index(feats[i]))
        return cls(tuple(feats[i] for i in order), float(data["intercept"]), tuple(float(weights[i]) for i in order),
                   json.loads(json.dumps(fusion, sort_keys=True)) if fusion is not None else None)


@dataclass(frozen=True)
class Calibration:
    """Logistic models by what they serve (:attr:`LogisticModel.key`: the retrievers that scored the
    hit, a fused score or not), and what they hold for: ``encoder`` (the dense and learned-sparse
    models' identity, from the index's encoder config: their scores' scale depends on them;
    ``None``: any) and ``fitted_on`` (a description, for people)."""

    models: dict[tuple[tuple[str, ...], bool], LogisticModel]
    encoder: dict[str, dict[str, Any]] | None = None
    fitted_on: dict[str, Any] = field(default_factory=dict)
    answer: dict[tuple[str, ...], LogisticModel] = field(default_factory=dict)
    """Answerability models by the retrievers that ran (:attr:`LogisticModel.retrievers`): the
    probability that the index holds any relevant document for the query, from :data:`TOPS` only."""

    def answer_model(self, ran: Sequence[str]) -> LogisticModel | None:
        """The answerability model for a search that ran exactly the retrievers ``ran``, if fitted."""
        return self.answer.get(tuple(f for f in FEATURES if f in ran))

    def model(self, present: Sequence[str], fusion: Mapping[str, Any] | None = None) -> LogisticModel | None:
        """The model for hits scored by exactly the retrievers ``present``: the one with the fused
        score of ``fusion`` (:func:`fusion_key` of the search's fusion; ``None``: a single
        retriever's or a reranked list) when fitted for that very setting, else the one without a
        fused score, if fitted."""
        retrievers = tuple(f for f in FEATURES if f in present)
        fused = self.models.get((retrievers, True)) if fusion is not None else None
        if fused is not None and fused.fusion == fusion:
            return fused
        return self.models.get((retrievers, False))

    def to_dict(self) -> dict[str, Any]:
        out = {"models": [m.to_dict() for m in self.models.values()], "encoder": self.encoder,
               "fitted_on": dict(self.fitted_on)}
        if self.answer:
            out["answerability"] = [m.to_dict() for m in self.answer.values()]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Calibration:
        if not isinstance(data, Mapping) or not isinstance(data.get("models"), Sequence) or not data["models"]:
            raise ConfigError(f"a relevance calibration is {{'models': [...], 'encoder', 'fitted_on'}}, got {data!r}")
        unknown = set(data) - {"models", "encoder", "fitted_on", "answerability"}
        if unknown:
            raise ConfigError(f"unknown relevance calibration fields: {sorted(unknown)}")
        models = [LogisticModel.from_dict(m) for m in data["models"]]
        if len({m.key for m in models}) != len(models):
            raise ConfigError("a relevance calibration has one model per set of retrievers (and one with a fused "
                              f"score per set), got two for the same: {[m.to_dict() for m in models]}")
        enc = data.get("encoder")
        if enc is not None and not isinstance(enc, Mapping):
            raise ConfigError(f"a relevance calibration's encoder is a mapping or null, got {enc!r}")
        answer = data.get("answerability") or []
        if not isinstance(answer, Sequence) or isinstance(answer, str):
            raise ConfigError(f"a relevance calibration's answerability is a list of models, got {answer!r}")
        amodels = [LogisticModel.from_dict(m) for m in answer]
        for m in amodels:
            if any(f not in TOPS for f in m.features):
                raise ConfigError(f"an answerability model reads only the query-level inputs {TOPS}, got {m.features}")
        if len({m.retrievers for m in amodels}) != len(amodels):
            raise ConfigError("a relevance calibration has one answerability model per set of retrievers")
        return cls({m.key: m for m in models}, dict(enc) if enc is not None else None,
                   dict(data.get("fitted_on") or {}), {m.retrievers: m for m in amodels})

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
    if default_calibration().holds_for(manifest.get("encoder")) or not set(present) & {"dense", "sparse"}:
        return default_calibration()
    enc = encoder_identity(manifest.get("encoder"))
    names = ", ".join(f"{h} {v.get('model')!s}" for h, v in enc.items()) or "unknown models"
    raise ConfigError(f"relevance has no calibration for this index's models ({names}): the shipped one is for "
                      "all-MiniLM-L6-v2 + splade-tiny. Fit one on judged queries with "
                      "`hybridret calibrate INDEX --queries Q --qrels R` (stored in the index), or search with "
                      "method='bm25', whose calibration holds for any encoder")


# -- inputs --------------------------------------------------------------------------------------------
def sparse_self_scores(query_sparse: Any, n: int) -> np.ndarray:
    """Each query's learned-sparse self-score ``q . q`` (``(n,)``; 0 without a sparse vector)."""
    if query_sparse is None:
        return np.zeros(n)
    q = query_sparse.tocsr()
    return np.asarray(q.multiply(q).sum(axis=1), dtype=np.float64).ravel()


def bm25_bounds(snap: Any, texts: Sequence[str]) -> np.ndarray:
    """What each query could score at most in BM25 on this snapshot: ``sum over its analysed
    tokens (repeats count) of (1 + k1) idf`` (a document's term factor is below ``1 + k1``)."""
    from ..index.bm25 import K1, idf
    from ..retrievers.bm25 import bm25_tokens, collection_stats

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
    """The retrievers' features of every hit ``(nq, k)``: ``dense`` as is; ``sparse`` and ``bm25``
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


def hit_ranks(scores: np.ndarray, valid: np.ndarray, before: int = 0) -> np.ndarray:
    """Each valid hit's rank by ``scores`` within its row (1 = best; equal scores share the best
    rank), plus ``before`` (the hits of the pages before); NaN for padding."""
    out = np.full(scores.shape, np.nan)
    for i in range(scores.shape[0]):
        cols = np.flatnonzero(valid[i])
        if len(cols):
            s = np.asarray(scores[i, cols], dtype=np.float64)
            desc = -np.sort(-s)
            out[i, cols] = 1 + before + np.searchsorted(-desc, -s, side="left")
    return out


@dataclass
class HitInputs:
    """A search's model inputs: ``features`` (each of :data:`INPUTS` it has, ``(nq, k)``: NaN
    where a retriever did not score the hit, and for padding), ``valid`` (not padding),
    ``fusion`` (:func:`fusion_key` of the fusion whose score ``features["score"]`` is; ``None``
    for a single retriever's list or a reranked one) and ``query`` (the :data:`TOPS` of each
    query, ``(nq,)``, for every retriever that ran)."""

    features: dict[str, np.ndarray]
    valid: np.ndarray
    fusion: dict[str, Any] | None
    query: dict[str, np.ndarray] = field(default_factory=dict)  # the TOPS per query (nq,): NaN = nothing found


def hit_inputs(snap: Any, plan: Any, res: Any) -> HitInputs:
    """The model inputs of a search's results ``res`` (a :class:`~hybridret.search.plan.PlanResult` of the
    :class:`~hybridret.search.plan.SearchPlan` ``plan`` on the snapshot ``snap``)."""
    texts = list(plan.texts)
    valid = res.rows >= 0
    n = len(texts)
    legs = set(res.components) | set(getattr(res, "tops", None) or {})
    scales = {"sparse": sparse_self_scores(res.query_sparse, n) if "sparse" in legs else np.zeros(n),
              "bm25": bm25_bounds(snap, texts) if "bm25" in legs and valid.any() else np.zeros(n)}
    feats = features_of(res.components, scales)
    before = plan.offset * (plan.group.size if plan.group is not None else 1)  # grouped: at most that many
    feats["log_rank"] = np.log(hit_ranks(res.scores, valid, before))
    feats["score"] = np.where(valid, np.asarray(res.scores, dtype=np.float64), np.nan)
    if "dense" in feats:
        feats["fused_dense"] = feats["score"] * np.clip(feats["dense"], 0.0, None)
    tops = getattr(res, "tops", None) or {}
    if tops:
        best = features_of({name: np.asarray(v, dtype=np.float64)[:, None] for name, v in tops.items()}, scales)
        for name, v in best.items():
            feats[f"top_{name}"] = np.where(valid, v, np.nan)
    fused = plan.fusion is not None and plan.rerank is None
    return HitInputs(feats, valid, fusion_key(plan.fusion) if fused else None,
                     {f"top_{name}": v[:, 0] for name, v in best.items()} if tops else {})


# -- the mapping ---------------------------------------------------------------------------------------
def probability(cal: Calibration, inputs: HitInputs) -> np.ndarray:
    """Each valid hit's probability from the model for the retrievers that scored it (with the
    fused score when the calibration has a model for the search's fusion); NaN elsewhere."""
    valid = inputs.valid
    feats = inputs.features
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
        model = cal.model(present, inputs.fusion)
        if model is None:
            raise ConfigError(f"the relevance calibration has no model for hits scored by {', '.join(present)} "
                              f"(it has: {sorted('+'.join(m.features) for m in cal.models.values())})")
        missing = [f for f in model.features if f not in feats]
        if missing:
            raise ConfigError(f"the relevance model {'+'.join(model.features)} needs {', '.join(missing)}, which this "
                              "search did not compute (query-level inputs come with relevance=True)")
        p = model.predict({f: np.nan_to_num(feats[f]) for f in model.features})
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


def relevance_of(cal: Calibration, scores: np.ndarray, inputs: HitInputs) -> np.ndarray:
    """The calibrated relevance ``(nq, k)`` of the hits (NaN for padding): :func:`probability`
    made non-increasing in ``scores`` (:func:`monotone`)."""
    return monotone(np.where(inputs.valid, scores, -np.inf), probability(cal, inputs))


def answerability(cal: Calibration, inputs: HitInputs, blank: np.ndarray | None = None) -> np.ndarray | None:
    """Each query's answerability ``(nq,)``: the probability that the index holds a relevant
    document for it, from the calibration's model for the retrievers that ran (their :data:`TOPS`;
    a retriever that found nothing counts 0); NaN for ``blank`` queries. ``None`` when the
    calibration has no model for those retrievers (e.g. one fitted by ``hybridret calibrate`` on
    judged queries only, for other models than the packaged ones)."""
    ran = [top_name(f) for f in inputs.query]
    model = cal.answer_model(ran) if ran else None
    if model is None:
        return None
    p = model.predict({f: np.nan_to_num(inputs.query[f]) for f in model.features})
    return np.where(blank, np.nan, p) if blank is not None else p


def search_relevance(relevance: bool | Calibration, snap: Any, plan: Any, res: Any
                     ) -> tuple[np.ndarray, np.ndarray | None]:
    """The relevance ``(nq, k)`` of a search's results ``res`` (a
    :class:`~hybridret.search.plan.PlanResult` of ``plan``) on the snapshot ``snap`` it ran on, and
    each query's :func:`answerability` ``(nq,)`` (``None`` without a model): ``relevance`` is
    ``True`` (the index's calibration, :func:`calibration_for`) or a :class:`Calibration` to use."""
    inputs = hit_inputs(snap, plan, res)
    present = [f for f in FEATURES if f in res.components]
    cal = relevance if isinstance(relevance, Calibration) else calibration_for(snap.manifest, present)
    if relevance is True and not cal.answer and default_calibration().holds_for(snap.manifest.get("encoder")):
        # a calibration stored by `hybridret calibrate` (judged queries only): the shipped answerability
        cal = Calibration(cal.models, cal.encoder, cal.fitted_on, default_calibration().answer)
    blank = np.array([not str(t).strip() for t in plan.texts], dtype=bool)
    return relevance_of(cal, res.scores, inputs), answerability(cal, inputs, blank)


RESOURCE = "relevance.json"
"""The shipped calibration's file in ``hybridret/resources``: JSON (never pickle) with the models,
the answerability models, the encoder identity they hold for, what they were fitted on and a
``"sha256"`` of the rest (its canonical JSON: sorted keys, no spaces), checked on load."""


def checksum(data: Mapping[str, Any]) -> str:
    """The ``sha256`` of a calibration file's content: its canonical JSON without ``"sha256"``."""
    body = {k: v for k, v in data.items() if k != "sha256"}
    return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load_calibration(path: Any = None) -> Calibration:
    """A calibration file (default: the shipped :data:`RESOURCE`), its checksum checked: a file that
    does not match its ``"sha256"`` (edited or damaged) is a :class:`ConfigError`, never used."""
    if path is None:
        from importlib.resources import files

        text = files("hybridret").joinpath("resources").joinpath(RESOURCE).read_text(encoding="utf-8")
        where = f"hybridret/resources/{RESOURCE}"
    else:
        text, where = Path(path).read_text(encoding="utf-8"), str(path)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where} is not JSON: {exc}") from None
    if not isinstance(data, Mapping) or data.get("sha256") != checksum(data):
        raise ConfigError(f"{where}: the relevance calibration does not match its sha256 (edited or damaged); "
                          "write it with hybridret.search.relevance.calibration_file")
    return Calibration.from_dict({k: v for k, v in data.items() if k != "sha256"})


def calibration_file(cal: Calibration) -> str:
    """A calibration as the JSON text of a calibration file (with its ``"sha256"``)."""
    data = cal.to_dict()
    return json.dumps({**data, "sha256": checksum(data)}, indent=1, sort_keys=True) + "\n"


@lru_cache(maxsize=1)
def default_calibration() -> Calibration:
    """The shipped calibration for the packaged models (read once, on first use; see
    docs/relevance.md for its data and figures)."""
    return load_calibration()


def __getattr__(name: str) -> Any:
    if name == "DEFAULT_CALIBRATION":  # read on first use, not at import
        return default_calibration()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
