"""One search plan: what a search will do, as pure data, the same over a single index and over shards.

A search is planned once, from its validated arguments and what the index can run
(:func:`plan_search` -> :class:`SearchPlan`: which retrievers, which query representations to
encode, the per-retriever depth, the filter, the fusion settings, which retrievers need collection
statistics); :func:`hybridret.search.run.run_plan` executes it against a
:class:`~hybridret.search.source.CandidateSource`. Nothing here searches, encodes or imports an
executor: numpy, the retriever registry and the fusion settings only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from ..errors import ConfigError
from ..fusion import FUSERS, HYBRID_DEFAULT, FusionConfig, fusion_method
from ..fusion.config import MAX_CANDIDATES
from ..methods import check_method
from ..retrievers import REGISTRY, RETRIEVERS

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from .grouping import GroupSpec
    from .request import SearchRequest
    from .rerank import Reranker

__all__ = ["MAX_CANDIDATES", "PlanResult", "SearchPlan", "default_fusion", "fused_plan", "plan_search", "runnable"]

_COMPONENT = {"dense": "dense", "sparse": "learned-sparse", "bm25": "BM25"}  # names in "has no X component"

@dataclass(frozen=True)
class SearchPlan:
    """What one search will do (built by :func:`plan_search`; pure data).

    ``texts``: every query as given; ``keep``: the positions of the non-blank ones (blank queries
    get no hits and are never encoded). ``label``: the method reported in ``Hits.method``
    (``"hybrid:gqr"`` when ``hybrid`` resolved to GQR). Exactly one of ``single`` (one retriever's
    top-``k``) and ``fusion`` is set. ``retrievers``: those that run; ``needs``: the query
    representations to encode (each used retriever's ``needs`` but ``"text"``); ``depth``: the
    per-retriever depth (``k``, or ``max(k, fusion.depth)``); ``stats``: the used retrievers that
    need collection statistics (``global_stats``); ``vectors``: the fusion needs the candidates'
    dense vectors (GQR). ``offset``: the hits (grouped: groups) skipped before the ``k`` returned;
    ``group``: group the hits (:mod:`hybridret.search.grouping`); ``rerank`` / ``rerank_depth``: rerank the
    first stage's top ``rerank_depth`` (:mod:`hybridret.search.rerank`); any of them runs the plan through
    :func:`hybridret.search.run.execute_stages`. ``diversify``: MMR's λ over the first stage's pool
    (:mod:`hybridret.search.diversify`)."""

    texts: tuple[str, ...]
    keep: tuple[int, ...]
    k: int
    method: str
    label: str
    single: str | None
    fusion: FusionConfig | None
    retrievers: tuple[str, ...]
    needs: frozenset[str]
    depth: int
    filter: Filter | None
    stats: tuple[str, ...]
    vectors: bool
    offset: int = 0
    group: GroupSpec | None = None
    rerank: Reranker | None = None
    rerank_depth: int = 0
    diversify: float | None = None

    @property
    def staged(self) -> bool:
        """Whether the plan groups, reranks, diversifies or pages (run by
        :func:`hybridret.search.run.execute_stages`)."""
        return bool(self.offset) or self.group is not None or self.rerank is not None or self.diversify is not None

    @property
    def width(self) -> int:
        """Columns of the result arrays: ``k`` (grouped: ``k * group.size``)."""
        return self.k * (self.group.size if self.group is not None else 1)

    @property
    def kept_texts(self) -> list[str]:
        """The non-blank query texts, in order: what is encoded and searched."""
        return [self.texts[i] for i in self.keep]


@dataclass
class PlanResult:
    """A planned search's results for every query of the plan (blank ones empty): rows / keys
    ``(n, k)`` (``-1`` padded), scores (``-inf`` padded), each retriever's exact score of each
    hit (``nan`` padded), document ids (``""`` padded) and, when the queries were encoded with a
    learned-sparse head, their vectors placed at every query's position (for hit views)."""

    rows: np.ndarray
    scores: np.ndarray
    components: dict[str, np.ndarray]
    ids: np.ndarray
    query_sparse: sp.csr_matrix | None = None
    group_keys: np.ndarray | None = None  # grouped: (n, k) internal group keys (None padded)
    group_scores: np.ndarray | None = None  # grouped: (n, k) each group's best chunk's score (-inf padded)
    tops: dict[str, np.ndarray] | None = None  # run_plan(tops=True): each retriever's best score per query (n,)


# -- what the index can run, and the fusion defaults --------------------------------------------------
def runnable(parts: Mapping[str, bool], has_head: Callable[[str], bool]) -> dict[str, bool]:
    """Which registered retrievers can run: the index has their parts (``parts[name]``) and the
    encoder has the head their queries need (``has_head(needs)``; text needs none)."""
    return {name: bool(parts.get(name, False)) and (r.needs == "text" or has_head(r.needs))
            for name, r in REGISTRY.items()}


def default_fusion(method: str = "hybrid", fusion: FusionConfig | Mapping[str, Any] | None = None, *,
                   available: Mapping[str, bool], stored: Mapping[str, Any] | None = None) -> FusionConfig | None:
    """The fusion settings for a method: explicit ``fusion`` first, then what ``hybridret tune``
    stored in the index (``stored``), then defaults (``hybrid`` = GQR guided by learned sparse +
    BM25, the best fixed setting measured in docs/fusion.md, its guide weights set per query by the
    retrievers' top-10 agreement), dropping whatever ``available`` says the index lacks. ``None``
    when ``hybrid`` has a single retriever to run (e.g. a sparse-only index without BM25)."""
    if fusion is not None:
        cfg = fusion if isinstance(fusion, FusionConfig) else FusionConfig.from_dict(fusion)
        return cfg if method == "hybrid" else cfg.with_(method=method)
    if stored:
        cfg = FusionConfig.from_dict(stored)
        if method in ("hybrid", cfg.method):
            return cfg
    have = {r: bool(available.get(r, False)) for r in RETRIEVERS}
    usable = tuple(r for r in RETRIEVERS if have[r])
    # ``hybrid`` = GQR with agreement-weighted guides and a share of the guide in the final ranking
    # (fusion.HYBRID_DEFAULT, docs/fusion.md); ``gqr`` keeps fixed weights and the refined dense ranking.
    # Each method cuts its defaults to what the index has (FusionMethod.fit); one that cannot run falls
    # back to linear fusion of what there is
    cfg = HYBRID_DEFAULT if method == "hybrid" else FusionConfig(method=method)
    fitted = fusion_method(cfg.method).fit(cfg, have)
    if fitted is not None:
        return fitted
    if method == "hybrid" and len(usable) == 1:
        return None
    return fusion_method("linear").fit(FusionConfig(method="linear"), have)


# -- planning ------------------------------------------------------------------------------------------
def plan_search(req: SearchRequest, *, available: Mapping[str, bool], stored_fusion: Mapping[str, Any] | None = None,
                require: bool = True, where: str = "this index", num_docs: int | None = None,
                rerank: Reranker | None = None) -> SearchPlan:
    """The plan of one checked search (a :class:`~hybridret.search.request.SearchRequest`) on what
    the index can run: ``available`` (per retriever, see :func:`runnable`) and the ``fusion`` setting
    stored in its manifest or layout (``stored_fusion``). The method is a retriever name or a fusion
    method of this process's registries (checked here: a :class:`ConfigError` names the methods
    there are; ``"hybrid"``: the stored or default fusion, or the one retriever there is);
    ``candidates`` overrides a fused method's per-retriever depth. A retriever the plan uses that is
    not available raises :class:`ConfigError` ("``where`` has no ... component"), unless
    ``require`` is false (an index with no rows, which returns no hits whatever the method).
    ``rerank``: the request's reranker, loaded by the searcher (see :class:`SearchPlan`).

    ``num_docs`` (the live documents searched) bounds the work: ``k`` and every depth beyond it
    are cut to it (a list can hold no more), so memory follows the result, never the argument; a
    fused method ranks at most :data:`MAX_CANDIDATES` per retriever (a larger ``k`` or
    ``candidates`` is a :class:`ConfigError`)."""
    method = check_method(req.method, REGISTRY, FUSERS)  # the registries now: methods registered after import count
    texts, k, fusion, candidates, filt, offset = req.queries, req.k, req.fusion, req.candidates, req.filter, req.offset
    group, rerank_depth = req.group, (req.rerank_depth or 0) if rerank is not None else 0
    if num_docs is not None:
        k = min(k, max(int(num_docs), 1))
        if candidates is not None:
            candidates = min(candidates, max(int(num_docs), 1))
    cfg = None
    single = method if method in REGISTRY else None
    if single is None:
        cfg = default_fusion(method, fusion, available=available, stored=stored_fusion)
        if cfg is None:
            single = next(r for r, ok in available.items() if ok)
        elif candidates is not None:
            cfg = cfg.with_(depth=candidates)
    used: tuple[str, ...] = (single,) if single else cfg.union_retrievers  # type: ignore[union-attr]
    if require:
        for name in sorted(used):
            if not available.get(name, False):
                raise ConfigError(f"{where} has no {_COMPONENT.get(name, name)} component")
    label = method if method != "hybrid" else f"hybrid:{cfg.method if cfg else single}"
    depth = k + offset  # a page needs the hits before it; never more than the index holds
    if num_docs is not None:
        depth = min(depth, max(int(num_docs), 1))
    if cfg is not None:
        if num_docs is not None and cfg.depth > num_docs:
            cfg = cfg.with_(depth=max(int(num_docs), 1))
        if candidates is not None and candidates > MAX_CANDIDATES:
            raise ConfigError(f"candidates is {candidates}; a fused method takes at most {MAX_CANDIDATES} per "
                              "retriever (hybridret.fusion.config.MAX_CANDIDATES)")
        if k + offset > MAX_CANDIDATES:
            raise ConfigError(f"k + offset is {k + offset}; method {method!r} fuses at most {MAX_CANDIDATES} "
                              "candidates per retriever "
                              "(hybridret.fusion.config.MAX_CANDIDATES): ask for fewer, or use one retriever "
                              "(method='dense', 'sparse' or 'bm25') for a deeper list")
        depth = max(depth, cfg.depth)
    return SearchPlan(
        texts=tuple(texts), keep=tuple(i for i, t in enumerate(texts) if t.strip()), k=k, method=method, label=label,
        single=single, fusion=cfg, retrievers=used,
        needs=frozenset(REGISTRY[u].needs for u in used) - {"text"},
        depth=depth, filter=filt,
        stats=tuple(u for u in used if REGISTRY[u].global_stats), vectors=cfg is not None and cfg.vectors,
        offset=offset, group=group, rerank=rerank, rerank_depth=rerank_depth, diversify=req.diversify)


def fused_plan(config: FusionConfig, k: int, texts: Sequence[str], *, filt: Filter | None = None) -> SearchPlan:
    """The plan of one fused search with the settings given as they are (no defaults, no
    availability checks, every query kept): what :func:`fused_search` runs."""
    used = config.union_retrievers
    return SearchPlan(
        texts=tuple(texts), keep=tuple(range(len(texts))), k=k, method=config.method, label=config.method,
        single=None, fusion=config, retrievers=used, needs=frozenset(REGISTRY[u].needs for u in used) - {"text"},
        depth=max(k, config.depth), filter=filt, stats=tuple(u for u in used if REGISTRY[u].global_stats),
        vectors=config.vectors)
