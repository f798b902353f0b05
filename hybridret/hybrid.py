"""Fused search over a candidate union with exact scores: linear, RRF and GQR.

Every method here works the same way: each retriever in the union contributes its top ``depth``
rows; every candidate then gets the *exact* score of every retriever (dense from the vector store,
learned sparse from the forward store, BM25 from tantivy restricted to the candidates), so a
document found by one side is never fused with a missing score from the other.

:func:`fuse` dispatches through :data:`FUSERS` (method name -> function with :class:`Fuser`'s
signature): linear and RRF are the small functions here, GQR is :func:`hybridret.refine.fuse_gqr`.
A new fusion method is one function and one entry of that table, plus its name in the import-light
:data:`hybridret.methods.FUSION_METHODS` (which the CLI reads without importing this module).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .errors import ConfigError, check_fields
from .fusion import Candidates, FusedRows, candidate_union, linear_fusion, rrf_fusion, select
from .methods import FUSION_METHODS
from .refine import GQRConfig, fuse_gqr
from .retrievers import REGISTRY, RETRIEVERS, QueryBatch, score_rows, search_rows, vectors_of
from .retrievers.base import prepare_context

if TYPE_CHECKING:  # pragma: no cover
    from .filters import Filter
    from .index.snapshot import Snapshot

__all__ = ["FUSERS", "FUSION_CHUNK", "MAX_CANDIDATES", "FUSION_METHODS", "GUIDE_WEIGHTINGS", "HYBRID_DEFAULT", "RETRIEVERS",
           "Candidates", "FusedRows", "Fuser", "FusionConfig", "fuse", "fuse_linear", "fuse_rrf",
           "gather_candidates", "gather_lists", "prepare_all", "select"]

GUIDE_WEIGHTINGS = ("fixed", "agreement")
FUSION_CHUNK = 256  # queries fused at a time: bounds GQR's (queries, candidates, dim) block
MAX_CANDIDATES = 10_000
"""The most candidates a fused method takes from each retriever (its ``depth``, ``candidates``, and
so the largest ``k`` a fused search ranks): fusion scores every candidate exactly, with its vector."""


def _weights(value: Any, what: str, retrievers: tuple[str, ...] | None = None) -> None:
    """Refuse a weight table that is not ``{retriever name: finite number >= 0}``."""
    import math

    if not isinstance(value, Mapping):
        raise ConfigError(f"fusion {what} must map retriever names to numbers, e.g. {{\"dense\": 0.5, "
                          f"\"sparse\": 0.5}}; got {value!r}")
    for name, w in value.items():
        if not isinstance(name, str) or name not in REGISTRY:
            raise ConfigError(f"fusion {what}: unknown retriever {name!r}; expected some of {', '.join(REGISTRY)}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ConfigError(f"fusion {what}[{name!r}] must be a finite number >= 0, got {w!r}")
        if retrievers is not None and name not in retrievers:
            raise ConfigError(f"fusion {what} names {name!r}, which is not among the fused retrievers "
                              f"{list(retrievers)}")


@dataclass(frozen=True)
class FusionConfig:
    """How ``hybrid`` / ``linear`` / ``rrf`` / ``gqr`` search combines retrievers.

    ``retrievers`` form the candidate union and, for linear and RRF, are the signals fused, with
    ``weights`` (default equal). For GQR the dense retriever is primary and ``guide`` gives the
    weights of the guide mixture (each guide's scores z-scored over the candidates, then summed);
    the default guide mixes learned sparse and BM25 equally (on indexes without BM25 text,
    :meth:`HybridRetriever.fusion_config` falls back to the sparse guide alone).

    ``guide_weighting="agreement"`` (what ``hybrid`` uses by default) scales each guide's weight per
    query by how much its top 10 agrees with the other retrievers' top 10s (:func:`hybridret.refine.agreement`),
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
        import math

        from .fusion import NORMALISATIONS

        if not isinstance(self.method, str) or self.method not in FUSION_METHODS:
            raise ConfigError(f"unknown fusion method {self.method!r}; expected one of {', '.join(FUSION_METHODS)}")
        if isinstance(self.retrievers, (str, bytes, Mapping)) or not isinstance(self.retrievers, (list, tuple)):
            raise ConfigError(f"fusion retrievers must be a list of retriever names, got {self.retrievers!r}")
        object.__setattr__(self, "retrievers", tuple(self.retrievers))
        if not self.retrievers and self.method != "gqr":
            raise ConfigError(f"fusion retrievers is empty; {self.method} fusion needs at least one retriever, "
                              f"e.g. [\"dense\", \"sparse\"] (some of {', '.join(REGISTRY)})")
        bad = [r for r in self.retrievers if not isinstance(r, str) or r not in REGISTRY]
        if bad:
            raise ConfigError(f"unknown retrievers {bad} in fusion retrievers; expected some of {', '.join(REGISTRY)}")
        if self.weights is not None:
            _weights(self.weights, "weights", self.retrievers)
            if not self.weights:  # {} fuses with the default (equal) weights: one spelling of that
                object.__setattr__(self, "weights", None)
        _weights(self.guide, "guide")
        if isinstance(self.depth, bool) or not isinstance(self.depth, (int, np.integer)):
            raise ConfigError(f"fusion depth must be an integer, got {self.depth!r}")
        if not 1 <= self.depth <= MAX_CANDIDATES:
            raise ConfigError(f"fusion depth must be between 1 and {MAX_CANDIDATES} "
                              f"(hybridret.hybrid.MAX_CANDIDATES), got {self.depth}")
        if not isinstance(self.normalisation, str) or self.normalisation not in NORMALISATIONS:
            raise ConfigError(f"unknown fusion normalisation {self.normalisation!r}; expected one of "
                              f"{', '.join(NORMALISATIONS)}")
        if isinstance(self.rrf_k, bool) or not isinstance(self.rrf_k, (int, float)) or not math.isfinite(self.rrf_k) \
                or self.rrf_k <= 0:
            raise ConfigError(f"fusion rrf_k must be a finite number > 0, got {self.rrf_k!r}")
        if self.method == "gqr" and not self.guide:
            raise ConfigError("GQR needs at least one guide retriever (sparse and/or bm25)")
        if self.method == "gqr" and "dense" in self.guide:
            raise ConfigError("GQR optimises the dense query: dense cannot also be its guide")
        if not isinstance(self.guide_weighting, str) or self.guide_weighting not in GUIDE_WEIGHTINGS:
            raise ConfigError(f"unknown guide_weighting {self.guide_weighting!r}; expected one of "
                              f"{', '.join(GUIDE_WEIGHTINGS)}")
        if isinstance(self.gqr, Mapping):
            object.__setattr__(self, "gqr", GQRConfig.from_dict(dict(self.gqr)))
        elif not isinstance(self.gqr, GQRConfig):
            raise ConfigError(f"fusion gqr must be an object of GQR settings, got {self.gqr!r}")

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
        if not isinstance(data, Mapping):
            raise ConfigError(f"fusion settings must be an object of settings, got {type(data).__name__}")
        check_fields(cls, data, "fusion")
        kw = dict(data)
        try:
            if "gqr" in kw and isinstance(kw["gqr"], Mapping):
                kw["gqr"] = GQRConfig.from_dict(dict(kw["gqr"]))
            if isinstance(kw.get("retrievers"), list):
                kw["retrievers"] = tuple(kw["retrievers"])
            return cls(**kw)
        except TypeError as exc:  # e.g. {"depth": "a"}: a setting of the wrong type
            raise ConfigError(f"invalid fusion settings {dict(data)!r}: {exc}") from None

    def with_(self, **changes: Any) -> FusionConfig:
        return replace(self, **changes)


class Fuser(Protocol):
    """A fusion method: the top ``k`` of gathered candidates (see :func:`fuse`)."""

    def __call__(self, config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
                 filt: Filter | None = None, threads: int | None = None) -> FusedRows: ...


def fuse_linear(config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
                filt: Filter | None = None, threads: int | None = None) -> FusedRows:
    """Weighted sum of the retrievers' normalised exact scores (``config.normalisation``)."""
    fused = linear_fusion({r: cands.exact[r] for r in config.retrievers}, cands.valid, config.weights,
                          config.normalisation)
    return select(cands.rows, fused, cands.exact, k)


def fuse_rrf(config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
             filt: Filter | None = None, threads: int | None = None) -> FusedRows:
    """Reciprocal rank fusion over the retrievers whose own list holds each candidate."""
    fused = rrf_fusion({r: cands.exact[r] for r in config.retrievers}, cands.listed, config.rrf_k, config.weights)
    return select(cands.rows, fused, cands.exact, k)


FUSERS: Mapping[str, Fuser] = MappingProxyType({"linear": fuse_linear, "rrf": fuse_rrf, "gqr": fuse_gqr})
"""Fusion method name -> the function :func:`fuse` runs for it (read-only)."""
# methods.FUSION_METHODS (import-light, read by the CLI) names exactly these (tests/test_hybrid.py)


HYBRID_FINAL_GUIDE = 0.25  # picked on 6 of 7 leave-one-collection-out folds of a sweep (docs/fusion.md)
HYBRID_DEFAULT = FusionConfig(method="gqr", guide_weighting="agreement", gqr=GQRConfig(final_guide=HYBRID_FINAL_GUIDE))
"""What ``method="hybrid"`` runs on an index with dense, learned sparse and BM25: GQR with the guide
weighted per query by top-10 agreement, ranking by the z-scored refined dense score plus a quarter
of the z-scored guide."""


def prepare_all(names: tuple[str, ...], snap: Snapshot, q: QueryBatch, stats: Mapping[str, Any] | None = None, *,
                threads: int | None = None) -> dict[str, Any]:
    """Each retriever's per-call context (:meth:`Retriever.prepare`), with the collection
    statistics ``stats`` names for it (summed over shards; absent: the snapshot's own)."""
    stats = stats or {}
    return {name: prepare_context(REGISTRY[name], snap, q, stats.get(name), threads=threads)
            for name in dict.fromkeys(names)}


def gather_lists(names: tuple[str, ...], depth: int, snap: Snapshot, q: QueryBatch, *, filt: Filter | None = None,
                 score_all: tuple[str, ...] = (), stats: Mapping[str, Any] | None = None, threads: int | None = None
                 ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray, dict[str, np.ndarray]]:
    """What candidate gathering computes on one snapshot (a single index, or one shard of a sharded
    one): each retriever's top ``depth`` ``(rows, scores)`` (pre-filtered), their union (first-seen
    order), and every retriever in ``names + score_all``'s exact scores of the union (``0`` at
    padding). ``threads``: the thread budget of every search (``None``: every core)."""
    ctx = prepare_all((*names, *score_all), snap, q, stats, threads=threads)
    lists = {name: search_rows(REGISTRY[name], snap, q, depth, filt, ctx[name], threads=threads) for name in names}
    union = candidate_union(*(rows for rows, _ in lists.values()))
    exact = {name: score_rows(REGISTRY[name], snap, q, union, ctx[name], threads=threads) for name in ctx}
    return lists, union, exact


def gather_candidates(names: tuple[str, ...], depth: int, snap: Snapshot, q: QueryBatch, *,
                      filt: Filter | None = None, score_all: tuple[str, ...] = (), vectors: bool = False,
                      stats: Mapping[str, Any] | None = None, threads: int | None = None) -> Candidates:
    """Top ``depth`` of each retriever in ``names`` (pre-filtered), their union, and exact scores
    from every retriever in ``names + score_all``; with ``vectors``, the rows' dense vectors too.
    ``stats``: collection statistics by retriever (see :func:`prepare_all`)."""
    lists, union, exact = gather_lists(names, depth, snap, q, filt=filt, score_all=score_all, stats=stats,
                                       threads=threads)
    if "dense" in exact:  # padding scores -inf, as the dense index does
        exact["dense"] = np.where(union >= 0, exact["dense"], -np.inf).astype(np.float32)
    listed = {name: _member(union, rows) for name, (rows, _) in lists.items()}
    return Candidates(rows=union, exact=exact, listed=listed, vectors=vectors_of(snap, union) if vectors else None)


def _member(union: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = np.zeros(union.shape, dtype=bool)
    for i in range(union.shape[0]):
        out[i] = np.isin(union[i], rows[i][rows[i] >= 0]) & (union[i] >= 0)
    return out


def fuse(config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
         filt: Filter | None = None, threads: int | None = None) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Apply one fusion method to gathered candidates (lets tuning reuse one candidate set): the
    function :data:`FUSERS` holds for ``config.method``.

    ``snap`` may be ``None`` when ``cands.vectors`` is set (or for linear / RRF): everything but
    GQR's ``final="research"`` is then computed from the candidates and the queries alone."""
    fuser = FUSERS.get(config.method)
    if fuser is None:  # FusionConfig checks the method: only a config built around its checks gets here
        raise ConfigError(f"unknown fusion method {config.method!r}; expected one of {', '.join(FUSERS)}")
    return fuser(config, cands, k, snap, q, filt=filt, threads=threads)
