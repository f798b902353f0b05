"""Fused search over a candidate union with exact scores: linear, RRF and GQR.

Every method here works the same way: each retriever in the union contributes its top ``depth``
rows; every candidate then gets the *exact* score of every retriever (dense from the vector store,
learned sparse from the forward store, BM25 from tantivy restricted to the candidates), so a
document found by one side is never fused with a missing score from the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ConfigError, check_fields
from .fusion import candidate_union, linear_fusion, rrf_fusion
from .refine import GQRConfig, adaptive_guide, gqr_scores, guide_signal
from .retrievers import REGISTRY, RETRIEVERS, QueryBatch, score_rows, search_rows, vectors_of
from .retrievers.base import prepare_context

if TYPE_CHECKING:  # pragma: no cover
    from .filters import Filter
    from .index.snapshot import Snapshot

__all__ = ["FUSION_CHUNK", "FUSION_METHODS", "GUIDE_WEIGHTINGS", "HYBRID_DEFAULT", "RETRIEVERS", "Candidates",
           "FusionConfig", "fuse", "fused_search", "gather_candidates", "guide_scores", "guide_weights"]

FUSION_METHODS = ("linear", "rrf", "gqr")
GUIDE_WEIGHTINGS = ("fixed", "agreement")
FUSION_CHUNK = 256  # queries fused at a time: bounds GQR's (queries, candidates, dim) block


@dataclass(frozen=True)
class FusionConfig:
    """How ``hybrid`` / ``linear`` / ``rrf`` / ``gqr`` search combines retrievers.

    ``retrievers`` form the candidate union and, for linear and RRF, are the signals fused, with
    ``weights`` (default equal). For GQR the dense retriever is primary and ``guide`` gives the
    weights of the guide mixture (each guide's scores z-scored over the candidates, then summed);
    the default guide mixes learned sparse and BM25 equally (on indexes without BM25 text,
    :meth:`HybridRetriever.fusion_config` falls back to the sparse guide alone).

    ``guide_weighting="agreement"`` (what ``hybrid`` uses by default) scales each guide's weight per
    query by how much its top 10 agrees with the other retrievers' top 10s (:mod:`hybridret.qpp`),
    so a guide that is off on a query (BM25 on a paraphrased MS MARCO question) pulls less;
    ``"fixed"`` (the default of an explicit config, and of configs stored before it existed) uses
    ``guide`` as given.
    """

    method: str = "linear"
    retrievers: tuple[str, ...] = ("dense", "sparse")
    weights: Mapping[str, float] | None = None
    normalisation: str = "minmax"
    rrf_k: float = 60.0
    depth: int = 100
    guide: Mapping[str, float] = field(default_factory=lambda: {"sparse": 0.5, "bm25": 0.5})
    gqr: GQRConfig = field(default_factory=GQRConfig)
    guide_weighting: str = "fixed"

    def __post_init__(self) -> None:
        if self.method not in FUSION_METHODS:
            raise ConfigError(f"unknown fusion method {self.method!r}; expected one of {', '.join(FUSION_METHODS)}")
        object.__setattr__(self, "retrievers", tuple(self.retrievers))
        bad = [r for r in (*self.retrievers, *self.guide, *(self.weights or {})) if r not in RETRIEVERS]
        if bad:
            raise ConfigError(f"unknown retrievers {bad}; expected some of {', '.join(RETRIEVERS)}")
        if self.depth < 1:
            raise ConfigError(f"fusion depth must be positive, got {self.depth}")
        if self.method == "gqr" and not self.guide:
            raise ConfigError("GQR needs at least one guide retriever (sparse and/or bm25)")
        if self.method == "gqr" and "dense" in self.guide:
            raise ConfigError("GQR optimises the dense query: dense cannot also be its guide")
        if self.guide_weighting not in GUIDE_WEIGHTINGS:
            raise ConfigError(f"unknown guide_weighting {self.guide_weighting!r}; expected one of "
                              f"{', '.join(GUIDE_WEIGHTINGS)}")
        if isinstance(self.gqr, Mapping):
            object.__setattr__(self, "gqr", GQRConfig.from_dict(dict(self.gqr)))

    @property
    def union_retrievers(self) -> tuple[str, ...]:
        if self.method == "gqr":
            return ("dense", *[r for r in self.guide if r != "dense"])
        return self.retrievers

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["retrievers"] = list(self.retrievers)
        out["weights"] = dict(self.weights) if self.weights else None
        out["guide"] = dict(self.guide)
        out["gqr"] = self.gqr.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FusionConfig:
        check_fields(cls, data, "fusion")
        kw = dict(data)
        if "gqr" in kw and isinstance(kw["gqr"], Mapping):
            kw["gqr"] = GQRConfig.from_dict(dict(kw["gqr"]))
        try:
            if "retrievers" in kw:
                kw["retrievers"] = tuple(kw["retrievers"])
            return cls(**kw)
        except TypeError as exc:  # e.g. {"depth": "a"}: a setting of the wrong type
            raise ConfigError(f"invalid fusion settings {dict(data)!r}: {exc}") from None

    def with_(self, **changes: Any) -> FusionConfig:
        return replace(self, **changes)


HYBRID_FINAL_GUIDE = 0.25  # picked on 6 of 7 leave-one-collection-out folds of a sweep (docs/fusion.md)
HYBRID_DEFAULT = FusionConfig(method="gqr", guide_weighting="agreement", gqr=GQRConfig(final_guide=HYBRID_FINAL_GUIDE))
"""What ``method="hybrid"`` runs on an index with dense, learned sparse and BM25: GQR with the guide
weighted per query by top-10 agreement, ranking by the z-scored refined dense score plus a quarter
of the z-scored guide."""


@dataclass
class Candidates:
    """The union of the retrievers' top lists with every retriever's exact scores.

    ``vectors`` (optional) holds the stored dense vectors of the rows (zeros for ``-1``): with it,
    :func:`fuse` needs no snapshot for any method but GQR's ``final="research"``, so a coordinator
    can fuse a union gathered from shards."""

    rows: np.ndarray  # (nq, m), -1 padded
    exact: dict[str, np.ndarray]  # retriever -> (nq, m) exact scores
    listed: dict[str, np.ndarray]  # retriever -> (nq, m) bool: candidate is in that retriever's own list
    vectors: np.ndarray | None = None  # (nq, m, dim) float32 dense vectors of the rows

    @property
    def valid(self) -> np.ndarray:
        return self.rows >= 0


def gather_candidates(names: tuple[str, ...], depth: int, snap: Snapshot, q: QueryBatch, *,
                      filt: Filter | None = None, score_all: tuple[str, ...] = (), vectors: bool = False,
                      threads: int | None = None) -> Candidates:
    """Top ``depth`` of each retriever in ``names`` (pre-filtered), their union, and exact scores
    from every retriever in ``names + score_all``; with ``vectors``, the rows' dense vectors too.
    ``threads``: the thread budget of every search (``None``: every core)."""
    ctx = {name: prepare_context(REGISTRY[name], snap, q, threads=threads) for name in dict.fromkeys((*names, *score_all))}
    lists = {name: search_rows(REGISTRY[name], snap, q, depth, filt, ctx[name], threads=threads)[0] for name in names}
    union = candidate_union(*lists.values())
    exact = {name: score_rows(REGISTRY[name], snap, q, union, ctx[name], threads=threads) for name in ctx}
    if "dense" in exact:  # padding scores -inf, as the dense index does
        exact["dense"] = np.where(union >= 0, exact["dense"], -np.inf).astype(np.float32)
    listed = {name: _member(union, rows) for name, rows in lists.items()}
    return Candidates(rows=union, exact=exact, listed=listed, vectors=vectors_of(snap, union) if vectors else None)


def _member(union: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = np.zeros(union.shape, dtype=bool)
    for i in range(union.shape[0]):
        out[i] = np.isin(union[i], rows[i][rows[i] >= 0]) & (union[i] >= 0)
    return out


def guide_weights(config: FusionConfig, cands: Candidates) -> dict[str, float | np.ndarray]:
    """GQR's guide weights for these candidates (see :func:`hybridret.refine.adaptive_guide`)."""
    if config.guide_weighting == "fixed":
        return dict(config.guide)
    return adaptive_guide(config.guide, cands.exact, cands.listed, config.union_retrievers)


def guide_scores(cands: Candidates, guide: Mapping[str, float]) -> np.ndarray:
    """A single guide signal: one retriever's raw scores, or a weighted sum of z-scored scores."""
    return guide_signal(cands.exact, cands.valid, guide)


def fused_search(config: FusionConfig, k: int, snap: Snapshot, q: QueryBatch, *, filt: Filter | None = None,
                 threads: int | None = None) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Rows ``(nq, k)``, fused scores, and each retriever's exact scores of those rows; queries are
    fused :data:`FUSION_CHUNK` at a time so memory stays bounded for any batch. ``threads``: the
    thread budget of every search (``None``: every core)."""
    parts = []
    for a in range(0, len(q), FUSION_CHUNK):
        sub = q.slice(a, a + FUSION_CHUNK)
        cands = gather_candidates(config.union_retrievers, max(k, config.depth), snap, sub, filt=filt, threads=threads)
        parts.append(fuse(config, cands, k, snap, sub, filt=filt, threads=threads))
    if len(parts) == 1:
        return parts[0]
    names = parts[0][2]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            {n: np.concatenate([p[2][n] for p in parts]) for n in names})


def fuse(config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
         filt: Filter | None = None, threads: int | None = None) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Apply one fusion method to gathered candidates (lets tuning reuse one candidate set).

    ``snap`` may be ``None`` when ``cands.vectors`` is set (or for linear / RRF): everything but
    GQR's ``final="research"`` is then computed from the candidates and the queries alone."""
    valid = cands.valid
    if config.method == "linear":
        fused = linear_fusion({r: cands.exact[r] for r in config.retrievers}, valid, config.weights,
                              config.normalisation)
        return select(cands.rows, fused, cands.exact, k)
    if config.method == "rrf":
        fused = rrf_fusion({r: cands.exact[r] for r in config.retrievers}, cands.listed, config.rrf_k, config.weights)
        return select(cands.rows, fused, cands.exact, k)
    # GQR: refine the dense query towards the guide, then rank with it
    if snap is not None:
        metrics = {seg.dense.metric for seg in snap.segments if seg.dense is not None}
        if not REGISTRY["dense"].available(snap) or metrics != {"ip"}:
            raise ConfigError("GQR needs a dense index with inner-product scores (faiss_metric='ip')")
    gqr = config.gqr
    if gqr.final == "research" and snap is None:
        raise ConfigError("GQR with final='research' searches the dense index again: it needs the snapshot")
    if cands.vectors is not None:
        docs = cands.vectors
    elif snap is not None:
        docs = vectors_of(snap, cands.rows)
    else:
        raise ConfigError("GQR needs the candidates' dense vectors: gather them with vectors=True or pass the snapshot")
    if q.dense is None:
        raise ConfigError("GQR needs the queries' dense vectors")
    refined, refined_scores, g = gqr_scores(gqr, guide_weights(config, cands), cands.exact, valid, q.dense, docs)
    if gqr.final == "research":
        dense = REGISTRY["dense"]
        rq = q.with_(dense=refined)
        rows, scores = search_rows(dense, snap, rq, k, filt, threads=threads)  # type: ignore[arg-type]
        comps = {"dense": np.where(rows >= 0, score_rows(dense, snap, q, rows, threads=threads),  # type: ignore[arg-type]
                                   np.nan).astype(np.float32)}
        return rows, scores, comps
    exact = dict(cands.exact)
    exact["dense_refined"] = refined_scores
    if gqr.final_guide:  # a share of the guide kept in the final ranking (the ``hybrid`` default)
        fused = linear_fusion({"dense_refined": refined_scores, "guide": g}, valid,
                              {"dense_refined": 1.0, "guide": gqr.final_guide}, "zscore")
        return select(cands.rows, fused, exact, k)
    if gqr.final == "fuse":
        fused = linear_fusion({"dense_refined": refined_scores, "guide": g}, valid,
                              {"dense_refined": 1.0 - gqr.alpha, "guide": gqr.alpha}, "minmax")
        return select(cands.rows, fused, exact, k)
    return select(cands.rows, refined_scores, exact, k)


def select(union: np.ndarray, fused: np.ndarray, exact: Mapping[str, np.ndarray], k: int
           ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Top-k of fused candidate scores (ties by position), carrying each retriever's exact score."""
    order = np.argsort(-np.where(union >= 0, fused, -np.inf), axis=1, kind="stable")[:, :k]
    rows = np.take_along_axis(union, order, axis=1)
    scores = np.take_along_axis(np.asarray(fused, dtype=np.float64), order, axis=1)
    comps = {name: np.take_along_axis(np.asarray(v, dtype=np.float64), order, axis=1) for name, v in exact.items()}
    if rows.shape[1] < k:
        pad = k - rows.shape[1]
        rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
        scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        comps = {n: np.pad(v, ((0, 0), (0, pad)), constant_values=np.nan) for n, v in comps.items()}
    invalid = rows < 0
    scores = np.where(invalid, -np.inf, scores)
    comps = {n: np.where(invalid, np.nan, v).astype(np.float32) for n, v in comps.items()}
    return rows, scores.astype(np.float32), comps
