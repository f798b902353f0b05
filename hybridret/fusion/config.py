"""What a fused search is set up with: :class:`FusionConfig` (and GQR's :class:`GQRConfig`), and the
table of fusion methods a config can name (:data:`FUSERS`).

Every fusion method works the same way: each retriever in the union contributes its top ``depth``
rows; every candidate then gets the *exact* score of every retriever (dense from the vector store,
learned sparse from the forward store, BM25 restricted to the candidates), so a document found by
one side is never fused with a missing score from the other (:mod:`hybridret.fusion.gather`).

A fusion method is a :class:`FusionMethod`: it says what it needs (which retrievers form the union,
whether it needs the candidates' dense vectors or the snapshot itself) and ranks gathered
candidates. :func:`fuse` runs the one :data:`FUSERS` holds for ``config.method``. The built-in ones
(:mod:`hybridret.fusion.builtin`: linear, RRF and :mod:`~hybridret.fusion.gqr`) are installed when
the package is imported; one from outside is a subclass plus :func:`register_fusion`, after which
it is a search method of :meth:`Searcher.search` like the built-in ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError, check_fields
from ..methods import FUSION_METHODS, HYBRID
from ..retrievers import REGISTRY, RETRIEVERS
from .scores import NORMALISATIONS, Candidates, FusedRows

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from ..index.snapshot import Snapshot
    from ..retrievers import QueryBatch

__all__ = ["FUSERS", "FUSION_CHUNK", "GUIDE_WEIGHTINGS", "MAX_CANDIDATES", "FusionConfig", "FusionMethod", "GQRConfig",
           "fuse", "fusion_method", "register_fusion", "unregister_fusion"]

GUIDE_WEIGHTINGS = ("fixed", "agreement")
FUSION_CHUNK = 256  # queries fused at a time: bounds GQR's (queries, candidates, dim) block
MAX_CANDIDATES = 10_000
"""The most candidates a fused method takes from each retriever (its ``depth``, ``candidates``, and
so the largest ``k`` a fused search ranks): fusion scores every candidate exactly, with its vector."""

FINAL_MODES = ("rerank", "research", "fuse")


@dataclass(frozen=True)
class GQRConfig:
    """GQR settings. Defaults were checked on the shared collections (see docs/benchmarks.md)."""

    alpha: float = 0.5  # weight of the guide in the target; 0 leaves the dense ranking unchanged
    t_dense: float = 0.1  # temperature of the dense (cosine) scores
    t_guide: float = 1.0  # temperature of the (normalised) guide scores
    guide_norm: str = "zscore"  # none | minmax | zscore, applied to guide scores over U
    steps: int = 50
    lr: float = 1e-3
    final: str = "rerank"  # rerank U | research the dense index | fuse refined dense with guide
    # with final="rerank": rank by z(refined dense) + final_guide * z(guide) over U (0: refined dense alone)
    final_guide: float = 0.0

    def __post_init__(self) -> None:
        import math

        for name in ("alpha", "t_dense", "t_guide", "lr", "final_guide"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"GQR {name} must be a finite number, got {value!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int):
            raise ConfigError(f"GQR steps must be an integer, got {self.steps!r}")
        if not isinstance(self.final, str) or not isinstance(self.guide_norm, str):
            raise ConfigError(f"GQR final and guide_norm are names, got {self.final!r} and {self.guide_norm!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"GQR alpha must be in [0, 1], got {self.alpha}")
        if self.t_dense <= 0 or self.t_guide <= 0:
            raise ConfigError("GQR temperatures must be positive")
        if self.steps < 0 or self.lr <= 0:
            raise ConfigError("GQR needs steps >= 0 and lr > 0")
        if self.final not in FINAL_MODES:
            raise ConfigError(f"GQR final must be one of {', '.join(FINAL_MODES)}, got {self.final!r}")
        if not (isinstance(self.final_guide, (int, float)) and 0.0 <= float(self.final_guide) < float("inf")):
            raise ConfigError(f"GQR final_guide must be a number >= 0, got {self.final_guide!r}")
        if self.final_guide and self.final != "rerank":
            raise ConfigError(f"GQR final_guide only applies with final='rerank' (got final={self.final!r})")
        if self.guide_norm not in ("none", "minmax", "zscore"):
            raise ConfigError(f"GQR guide_norm must be none, minmax or zscore, got {self.guide_norm!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GQRConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(f"GQR settings must be an object of settings, got {type(data).__name__}")
        check_fields(cls, data, "GQR")
        return cls(**data)


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
    query by how much its top 10 agrees with the other retrievers' top 10s (:func:`hybridret.fusion.gqr.agreement`),
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

        method = fusion_method(self.method)
        if isinstance(self.retrievers, (str, bytes, Mapping)) or not isinstance(self.retrievers, (list, tuple)):
            raise ConfigError(f"fusion retrievers must be a list of retriever names, got {self.retrievers!r}")
        object.__setattr__(self, "retrievers", tuple(self.retrievers))
        if not self.retrievers and method.fuses_retrievers:
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
                              f"(hybridret.fusion.config.MAX_CANDIDATES), got {self.depth}")
        if not isinstance(self.normalisation, str) or self.normalisation not in NORMALISATIONS:
            raise ConfigError(f"unknown fusion normalisation {self.normalisation!r}; expected one of "
                              f"{', '.join(NORMALISATIONS)}")
        if isinstance(self.rrf_k, bool) or not isinstance(self.rrf_k, (int, float)) or not math.isfinite(self.rrf_k) \
                or self.rrf_k <= 0:
            raise ConfigError(f"fusion rrf_k must be a finite number > 0, got {self.rrf_k!r}")
        if not isinstance(self.guide_weighting, str) or self.guide_weighting not in GUIDE_WEIGHTINGS:
            raise ConfigError(f"unknown guide_weighting {self.guide_weighting!r}; expected one of "
                              f"{', '.join(GUIDE_WEIGHTINGS)}")
        if isinstance(self.gqr, Mapping):
            object.__setattr__(self, "gqr", GQRConfig.from_dict(dict(self.gqr)))
        elif not isinstance(self.gqr, GQRConfig):
            raise ConfigError(f"fusion gqr must be an object of GQR settings, got {self.gqr!r}")
        method.check(self)

    @property
    def union_retrievers(self) -> tuple[str, ...]:
        """The retrievers whose top lists form the candidate union (the method's :meth:`FusionMethod.union`)."""
        return fusion_method(self.method).union(self)

    @property
    def vectors(self) -> bool:
        """Whether the method reads the candidates' dense vectors (:attr:`FusionMethod.vectors`)."""
        return fusion_method(self.method).vectors

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


# -- the fusion methods -------------------------------------------------------------------------------
class FusionMethod(ABC):
    """One fusion method: what it needs from candidate gathering, and how it ranks the candidates.

    ``name``: the method name (a search method of :meth:`Searcher.search`, a ``FusionConfig.method``).
    ``vectors``: it reads the candidates' dense vectors (gathered with them; on shards, asked of
    the owning shards), which then must score by inner product. ``fuses_retrievers``: it fuses
    ``config.retrievers`` (so that list may not be empty); a method with a union of its own says so
    in :meth:`union`."""

    name: str = ""
    vectors: bool = False
    fuses_retrievers: bool = True

    def union(self, config: FusionConfig) -> tuple[str, ...]:
        """The retrievers whose top lists form the candidate union (default: ``config.retrievers``)."""
        return config.retrievers

    def check(self, config: FusionConfig) -> None:
        """Refuse settings this method cannot run (after the checks every config gets; default: none)."""
        return None

    def snapshot_setting(self, config: FusionConfig) -> str | None:
        """The setting of ``config`` that makes fusing read the snapshot itself, beyond the candidates
        (e.g. ``"final='research'"``; not available on shards), or ``None``."""
        return None

    def fit(self, config: FusionConfig, have: Mapping[str, bool]) -> FusionConfig | None:
        """The default ``config`` cut to the retrievers an index has (``have``); ``None`` when this
        method cannot run there. Default: the first ``max(2, len(config.retrievers))`` built-in
        retrievers the index has."""
        usable = tuple(r for r in RETRIEVERS if have.get(r))
        retrievers = usable[:max(2, len(config.retrievers))]
        return config.with_(retrievers=retrievers) if retrievers != config.retrievers else config

    @abstractmethod
    def fuse(self, config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
             filt: Filter | None = None, threads: int | None = None) -> FusedRows:
        """The top ``k`` of gathered candidates: rows, fused scores, each retriever's exact scores."""


_FUSERS: dict[str, FusionMethod] = {}
FUSERS: Mapping[str, FusionMethod] = MappingProxyType(_FUSERS)
"""Fusion method name -> :class:`FusionMethod` (read-only; :func:`register_fusion` adds one)."""


def install_builtin(*methods: FusionMethod) -> None:
    """Install the built-in methods (:mod:`hybridret.fusion.builtin`, once, when the package loads)."""
    for m in methods:
        assert m.name in FUSION_METHODS, m.name  # methods.FUSION_METHODS, import-light, names them for the CLI
        _FUSERS[m.name] = m


def register_fusion(method: FusionMethod, *, replace: bool = False) -> FusionMethod:
    """Add ``method`` (an instance of a :class:`FusionMethod` subclass) to :data:`FUSERS` under its
    ``name``: from then on ``FusionConfig(method=name)`` is valid and ``name`` is a search method of
    :meth:`Searcher.search` (and of a sharded searcher). The name must be identifier-like and not
    ``hybrid``, a retriever's or, unless ``replace``, a registered method's. Returns the method."""
    if not isinstance(method, FusionMethod):
        raise ConfigError(f"register_fusion() takes a FusionMethod instance, got {type(method).__name__}")
    name = method.name
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise ConfigError(f"a fusion method name must be a non-empty identifier (letters, digits, _), got {name!r}")
    if name == HYBRID or name in REGISTRY:
        raise ConfigError(f"{name!r} is already a search method (hybrid or a retriever); choose another name")
    if name in FUSION_METHODS:
        raise ConfigError(f"{name!r} is a built-in fusion method and cannot be replaced")
    if name in _FUSERS and not replace:
        raise ConfigError(f"a fusion method named {name!r} is registered already; pass replace=True to replace it")
    _FUSERS[name] = method
    return method


def unregister_fusion(name: str) -> FusionMethod:
    """Remove a method added with :func:`register_fusion` (tests, plugins that unload); returns it."""
    if name in FUSION_METHODS:
        raise ConfigError(f"{name!r} is a built-in fusion method and cannot be unregistered")
    try:
        return _FUSERS.pop(name)
    except KeyError:
        raise ConfigError(f"no fusion method named {name!r} is registered") from None


def fusion_method(name: Any) -> FusionMethod:
    """The :class:`FusionMethod` called ``name``, or a :class:`ConfigError` naming those there are."""
    method = _FUSERS.get(name) if isinstance(name, str) else None
    if method is None:
        raise ConfigError(f"unknown fusion method {name!r}; expected one of {', '.join(_FUSERS)}")
    return method


def fuse(config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
         filt: Filter | None = None, threads: int | None = None) -> FusedRows:
    """Apply ``config``'s fusion method to gathered candidates (lets tuning reuse one candidate set).

    ``snap`` may be ``None`` when ``cands.vectors`` is set (or for linear / RRF): everything but
    what :meth:`FusionMethod.snapshot_setting` names is then computed from the candidates and the
    queries alone."""
    return fusion_method(config.method).fuse(config, cands, k, snap, q, filt=filt, threads=threads)
