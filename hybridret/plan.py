"""One search plan, run the same way over a single index and over shards.

A search is planned once, from its validated arguments and what the index can run
(:func:`plan_search` -> :class:`SearchPlan`: which retrievers, which query representations to
encode, the per-retriever depth, the filter, the fusion settings, which retrievers need collection
statistics), then executed by :func:`run_plan` against a :class:`CandidateSource`:

* :class:`SnapshotSource`: one :class:`~hybridret.index.snapshot.Snapshot` (a ``Searcher``);
* :class:`~hybridret.distributed.source.ShardedSource`: the shard actors at pinned commits.

A source answers three questions, the same ones on both sides: the collection statistics of the
retrievers that declare them (:attr:`Retriever.global_stats`), one retriever's top-k, and the
candidate union of several retrievers with every retriever's exact scores
(:class:`~hybridret.hybrid.Candidates`). Everything else (blank queries, chunking by
:data:`~hybridret.hybrid.FUSION_CHUNK`, single retriever or :func:`~hybridret.hybrid.fuse`,
placing the results back) is here, once.

Import-light: numpy, scipy and the retriever registry only (no torch, FAISS or Ray at import).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from .errors import ConfigError
from .hybrid import FUSION_CHUNK, HYBRID_DEFAULT, MAX_CANDIDATES, Candidates, FusionConfig, fuse, gather_candidates, prepare_all
from .retrievers import REGISTRY, RETRIEVERS, QueryBatch, score_rows, search_rows

if TYPE_CHECKING:  # pragma: no cover
    from .filters import Filter
    from .grouping import GroupSpec
    from .index.snapshot import Snapshot
    from .rerank import Reranker

__all__ = ["FUSION_BUDGET_BYTES", "MAX_CANDIDATES", "CandidateSource", "PlanResult", "SearchPlan", "SnapshotSource",
           "default_fusion", "execute", "fused_plan", "fused_search", "fusion_chunk", "plan_search", "run_plan",
           "runnable"]

logger = logging.getLogger(__name__)

_COMPONENT = {"dense": "dense", "sparse": "learned-sparse", "bm25": "BM25"}  # names in "has no X component"

Encode = Callable[[list[str], set[str]], QueryBatch]

FUSION_BUDGET_BYTES = 256 << 20
"""About how much a chunk of fused queries may hold in candidate vectors: deep candidate lists are
fused fewer queries at a time (down to one), so memory follows the result, never the batch."""


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
    ``group``: group the hits (:mod:`hybridret.grouping`); ``rerank`` / ``rerank_depth``: rerank the
    first stage's top ``rerank_depth`` (:mod:`hybridret.rerank`); any of them runs the plan through
    :func:`hybridret.stages.execute_stages`."""

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

    @property
    def staged(self) -> bool:
        """Whether the plan groups, reranks or pages (run by :func:`hybridret.stages.execute_stages`)."""
        return bool(self.offset) or self.group is not None or self.rerank is not None

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
    # (hybrid.HYBRID_DEFAULT, docs/fusion.md); ``gqr`` keeps fixed weights and the refined dense ranking
    cfg = HYBRID_DEFAULT if method == "hybrid" else FusionConfig(method=method)
    if cfg.method == "gqr":
        guide = {r: w for r, w in cfg.guide.items() if have.get(r)}
        if have.get("dense") and guide:
            return cfg.with_(guide=guide) if guide != dict(cfg.guide) else cfg
        if method == "hybrid" and len(usable) == 1:
            return None
        cfg = FusionConfig(method="linear")
    retrievers = usable[:max(2, len(cfg.retrievers))]
    return cfg.with_(retrievers=retrievers) if retrievers != cfg.retrievers else cfg


# -- planning ------------------------------------------------------------------------------------------
def plan_search(texts: Sequence[str], k: int, method: str, *, available: Mapping[str, bool],
                stored_fusion: Mapping[str, Any] | None = None, fusion: FusionConfig | Mapping[str, Any] | None = None,
                candidates: int | None = None, filt: Filter | None = None, require: bool = True,
                where: str = "this index", num_docs: int | None = None, offset: int = 0,
                group: GroupSpec | None = None, rerank: Reranker | None = None, rerank_depth: int = 0
                ) -> SearchPlan:
    """The plan of one search, from arguments already validated
    (:func:`~hybridret.searcher.check_search`) and what the index can run: ``available`` (per
    retriever, see :func:`runnable`) and the ``fusion`` setting stored in its manifest or layout
    (``stored_fusion``). ``method`` is a retriever name or a fusion method (``"hybrid"``: the
    stored or default fusion, or the one retriever there is); ``candidates`` overrides a fused
    method's per-retriever depth. A retriever the plan uses that is not available raises
    :class:`ConfigError` ("``where`` has no ... component"), unless ``require`` is false (an index
    with no rows, which returns no hits whatever the method). ``offset``, ``group``, ``rerank``
    and ``rerank_depth``: see :class:`SearchPlan` (validated by the caller).

    ``num_docs`` (the live documents searched) bounds the work: ``k`` and every depth beyond it
    are cut to it (a list can hold no more), so memory follows the result, never the argument; a
    fused method ranks at most :data:`MAX_CANDIDATES` per retriever (a larger ``k`` or
    ``candidates`` is a :class:`ConfigError`)."""
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
                              "retriever (hybridret.plan.MAX_CANDIDATES)")
        if k + offset > MAX_CANDIDATES:
            raise ConfigError(f"k + offset is {k + offset}; method {method!r} fuses at most {MAX_CANDIDATES} "
                              "candidates per retriever "
                              "(hybridret.plan.MAX_CANDIDATES): ask for fewer, or use one retriever "
                              "(method='dense', 'sparse' or 'bm25') for a deeper list")
        depth = max(depth, cfg.depth)
    return SearchPlan(
        texts=tuple(texts), keep=tuple(i for i, t in enumerate(texts) if t.strip()), k=k, method=method, label=label,
        single=single, fusion=cfg, retrievers=used,
        needs=frozenset(REGISTRY[u].needs for u in used) - {"text"},
        depth=depth, filter=filt,
        stats=tuple(u for u in used if REGISTRY[u].global_stats), vectors=cfg is not None and cfg.method == "gqr",
        offset=offset, group=group, rerank=rerank, rerank_depth=rerank_depth)


def fused_plan(config: FusionConfig, k: int, texts: Sequence[str], *, filt: Filter | None = None) -> SearchPlan:
    """The plan of one fused search with the settings given as they are (no defaults, no
    availability checks, every query kept): what :func:`fused_search` runs."""
    used = config.union_retrievers
    return SearchPlan(
        texts=tuple(texts), keep=tuple(range(len(texts))), k=k, method=config.method, label=config.method,
        single=None, fusion=config, retrievers=used, needs=frozenset(REGISTRY[u].needs for u in used) - {"text"},
        depth=max(k, config.depth), filter=filt, stats=tuple(u for u in used if REGISTRY[u].global_stats),
        vectors=config.method == "gqr")


# -- sources -------------------------------------------------------------------------------------------
class CandidateSource(ABC):
    """Where a plan's candidates come from: one snapshot, or shards (rows are then global keys).

    ``snapshot`` is handed to :func:`~hybridret.hybrid.fuse` (``None`` when there is no single
    snapshot: the candidates then carry everything fusion needs). ``top_chunk``: queries per call
    of :meth:`top` (``None``: the whole batch at once); fused methods go
    :data:`~hybridret.hybrid.FUSION_CHUNK` at a time. ``threads``: the thread budget every search
    and fusion step of the plan gets (``None``: every core)."""

    snapshot: Snapshot | None = None
    top_chunk: int | None = None
    threads: int | None = None

    def check(self, plan: SearchPlan) -> None:
        """Refuse a plan this source cannot run exactly, before anything is encoded (default: none)."""
        return None

    @property
    def empty(self) -> bool:
        """Whether there is nothing to search (queries are then not even encoded)."""
        return False

    @abstractmethod
    def statistics(self, q: QueryBatch, names: tuple[str, ...]) -> dict[str, Any]:
        """The collection statistics of the retrievers ``names`` (those with ``global_stats``) for
        ``q``, by name: what each retriever's ``prepare(..., stats=)`` receives. A retriever left
        out uses its snapshot's own (a single index leaves out all of them)."""

    @abstractmethod
    def top(self, name: str, depth: int, q: QueryBatch, *, filt: Filter | None = None,
            stats: Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Retriever ``name``'s top ``depth`` (pre-filtered): rows ``(nq, depth)`` and scores."""

    @abstractmethod
    def gather(self, names: tuple[str, ...], depth: int, q: QueryBatch, *, filt: Filter | None = None,
               stats: Mapping[str, Any] | None = None, vectors: bool = False) -> Candidates:
        """The union of the top ``depth`` of each retriever in ``names`` with every one's exact
        score of every candidate (and, with ``vectors``, their dense vectors)."""

    @abstractmethod
    def ids(self, rows: np.ndarray) -> np.ndarray:
        """The document ids of rows this source returned (``""`` for ``-1``), as an object array."""

    # -- what grouping and reranking ask (hybridret.stages) --
    @property
    def size(self) -> int:
        """How many documents there are to search (the deepest a top list can go)."""
        raise ConfigError(f"{type(self).__name__} cannot group")

    def group_keys(self, rows: np.ndarray, field: str) -> np.ndarray:
        """The group key (:mod:`hybridret.grouping`) of each row ``(nq, m)``; ``None`` at ``-1``."""
        raise ConfigError(f"{type(self).__name__} cannot group")

    def group_members(self, groups: Sequence[Sequence[Any]], field: str, filt: Filter | None) -> np.ndarray:
        """Per query, every live row matching ``filt`` whose group is in its ``groups`` (``-1`` padded)."""
        raise ConfigError(f"{type(self).__name__} cannot group")

    def score(self, name: str, rows: np.ndarray, q: QueryBatch, *, stats: Mapping[str, Any] | None = None
              ) -> np.ndarray:
        """Retriever ``name``'s exact scores of rows ``(nq, m)`` (``0`` at ``-1``)."""
        raise ConfigError(f"{type(self).__name__} cannot score given rows")

    def texts(self, rows: np.ndarray) -> list[list[str]]:
        """The text (title and text) of each row ``(nq, m)`` (``""`` at ``-1``), for a reranker."""
        raise ConfigError(f"{type(self).__name__} cannot return texts")


class SnapshotSource(CandidateSource):
    """Candidates from one snapshot (what :class:`~hybridret.searcher.Searcher` searches)."""

    def __init__(self, snap: Snapshot, *, threads: int | None = None) -> None:
        self.snapshot = snap
        self.threads = threads  # every search's thread budget (None: every core)

    def check(self, plan: SearchPlan) -> None:
        """Refuse a filter on a document field that is not metadata, and ``group_by`` on a field no
        document of the snapshot has (each document would be a group of its own: no grouping at all)."""
        snap: Snapshot = self.snapshot  # type: ignore[assignment]
        columns = [seg.columns for seg in snap.segments]
        if plan.filter is not None:
            plan.filter.check_fields(columns)
        if plan.group is not None and snap.num_docs and all(c.get(plan.group.field) is None for c in columns):
            raise ConfigError(f"group_by: no document of the index has the metadata field {plan.group.field!r}; "
                              "group by a field the documents carry (e.g. 'parent_id' of chunked documents)")

    @property
    def empty(self) -> bool:
        return not self.snapshot.num_docs  # type: ignore[union-attr]

    def statistics(self, q: QueryBatch, names: tuple[str, ...]) -> dict[str, Any]:
        return {}  # the snapshot is the whole collection: each retriever prepares its own

    def top(self, name: str, depth: int, q: QueryBatch, *, filt: Filter | None = None,
            stats: Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        snap = self.snapshot
        ctx = prepare_all((name,), snap, q, stats, threads=self.threads)[name]  # type: ignore[arg-type]
        return search_rows(REGISTRY[name], snap, q, depth, filt, ctx, threads=self.threads)  # type: ignore[arg-type]

    def gather(self, names: tuple[str, ...], depth: int, q: QueryBatch, *, filt: Filter | None = None,
               stats: Mapping[str, Any] | None = None, vectors: bool = False) -> Candidates:
        return gather_candidates(names, depth, self.snapshot, q, filt=filt, stats=stats,  # type: ignore[arg-type]
                                 vectors=vectors, threads=self.threads)

    def ids(self, rows: np.ndarray) -> np.ndarray:
        snap = self.snapshot
        out = np.where(rows >= 0, snap.ids[np.maximum(rows, 0)] if snap.num_rows else "", "")  # type: ignore[union-attr]
        return out.astype(object)

    @property
    def size(self) -> int:
        return int(self.snapshot.num_docs)  # type: ignore[union-attr]

    def group_keys(self, rows: np.ndarray, field: str) -> np.ndarray:
        from .grouping import keys_of

        return keys_of(self.snapshot, rows, field)  # type: ignore[arg-type]

    def group_members(self, groups: Sequence[Sequence[Any]], field: str, filt: Filter | None) -> np.ndarray:
        from .grouping import members_of

        return members_of(self.snapshot, groups, field, filt)  # type: ignore[arg-type]

    def score(self, name: str, rows: np.ndarray, q: QueryBatch, *, stats: Mapping[str, Any] | None = None
              ) -> np.ndarray:
        snap = self.snapshot
        ctx = prepare_all((name,), snap, q, stats, threads=self.threads)[name]  # type: ignore[arg-type]
        return score_rows(REGISTRY[name], snap, q, rows, ctx, threads=self.threads)  # type: ignore[arg-type]

    def texts(self, rows: np.ndarray) -> list[list[str]]:
        return [[full_text(*self.snapshot.get(int(r))[:2]) if r >= 0 else "" for r in line]  # type: ignore[union-attr]
                for line in np.asarray(rows).tolist()]


def full_text(title: str, text: str) -> str:
    """What a reranker reads of a document: its title and text."""
    return f"{title}\n{text}" if title else text


# -- execution -----------------------------------------------------------------------------------------
def fusion_chunk(plan: SearchPlan) -> int:
    """Queries fused at a time: :data:`~hybridret.hybrid.FUSION_CHUNK`, fewer when the candidate
    lists are deep (their vectors, up to 1024 dims assumed, stay within :data:`FUSION_BUDGET_BYTES`)."""
    per_query = max(len(plan.retrievers), 1) * max(plan.depth, 1) * 1024 * 4
    return max(1, min(FUSION_CHUNK, FUSION_BUDGET_BYTES // per_query))


def execute(plan: SearchPlan, source: CandidateSource, q: QueryBatch
            ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Run ``plan`` on encoded queries ``q`` (one per entry of ``plan.keep``): rows ``(len(q), k)``,
    scores and each retriever's exact scores of the rows. One retriever: its top-k; fused: the
    candidates gathered from ``source`` and :func:`~hybridret.hybrid.fuse`, a
    :data:`~hybridret.hybrid.FUSION_CHUNK` of queries at a time (memory bounded for any batch)."""
    k = plan.k
    step = (source.top_chunk or max(len(q), 1)) if plan.single else fusion_chunk(plan)
    parts = []
    for a in range(0, len(q), step):
        sub = q if step >= len(q) else q.slice(a, a + step)
        stats = source.statistics(sub, plan.stats) if plan.stats else {}
        if plan.single is not None:
            rows, scores = source.top(plan.single, plan.depth, sub, filt=plan.filter, stats=stats)
            parts.append((rows, scores, {plan.single: scores}))
            continue
        cands = source.gather(plan.retrievers, plan.depth, sub, filt=plan.filter, stats=stats, vectors=plan.vectors)
        parts.append(fuse(plan.fusion, cands, k, source.snapshot, sub, filt=plan.filter,  # type: ignore[arg-type]
                          threads=source.threads))
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return np.full((0, k), -1, np.int64), np.full((0, k), -np.inf, np.float32), {}
    names = parts[0][2]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            {n: np.concatenate([p[2][n] for p in parts]) for n in names})


def run_plan(plan: SearchPlan, source: CandidateSource, encode: Encode) -> PlanResult:
    """The one search function of :class:`~hybridret.searcher.Searcher` and
    :class:`~hybridret.distributed.searcher.ShardedSearcher`: check the plan against the source,
    encode the non-blank queries (``encode(texts, plan.needs)``), :func:`execute`, and place the
    results back at every query's position (blank queries: no hits)."""
    source.check(plan)
    n, k, keep = len(plan.texts), plan.width, list(plan.keep)
    rows = np.full((n, k), -1, dtype=np.int64)
    scores = np.full((n, k), -np.inf, dtype=np.float32)
    comps: dict[str, np.ndarray] = {}
    gkeys = np.full((n, plan.k), None, dtype=object) if plan.group is not None else None
    gscores = np.full((n, plan.k), -np.inf, dtype=np.float32) if plan.group is not None else None
    qs = None
    if keep and not source.empty:
        q = encode(plan.kept_texts, set(plan.needs))
        if plan.staged:
            from .stages import execute_stages

            r, s, c, gk, gs = execute_stages(plan, source, q)
            if gkeys is not None:
                gkeys[keep], gscores[keep] = gk, gs  # type: ignore[index]
        else:
            r, s, c = execute(plan, source, q)
        rows[keep], scores[keep] = r, s
        for name, v in c.items():
            comps[name] = np.full((n, k), np.nan, dtype=np.float32)
            comps[name][keep] = v
        if q.sparse is not None:  # rows of the blank queries stay empty
            place = sp.csr_matrix((np.ones(len(keep), np.float32), (keep, np.arange(len(keep)))), shape=(n, len(keep)))
            qs = (place @ q.sparse).tocsr()
    return PlanResult(rows=rows, scores=scores, components=comps, ids=source.ids(rows), query_sparse=qs,
                      group_keys=gkeys, group_scores=gscores)


def fused_search(config: FusionConfig, k: int, snap: Snapshot, q: QueryBatch, *, filt: Filter | None = None,
                 threads: int | None = None) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """One fused method over one snapshot for queries already encoded (blank ones included): rows
    ``(nq, k)``, fused scores, and each retriever's exact scores of those rows; the plan's executor
    (:func:`execute`), so queries are fused :data:`~hybridret.hybrid.FUSION_CHUNK` at a time."""
    return execute(fused_plan(config, k, q.texts, filt=filt), SnapshotSource(snap, threads=threads), q)
