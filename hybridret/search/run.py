"""Running a search plan: :func:`run_plan`, the one search function of both searchers.

:func:`run_plan` checks the plan against its :class:`~hybridret.search.source.CandidateSource`,
encodes the non-blank queries once, runs the plan and places the results back at every query's
position (blank queries: no hits). :func:`execute` runs a plain plan (one retriever's top-k, or
the candidates gathered and fused by :func:`~hybridret.fusion.config.fuse`, a chunk of queries at a time);
:func:`execute_stages` runs one that groups, reranks or pages, in this order:

1. **first stage**: the plan's retriever or fusion. Grouped without a reranker, it is run by the
   deepening of :mod:`hybridret.search.grouping` (exact groups for single retrievers); with a
   reranker, it is the plain top ``rerank_depth`` (at least ``offset + k`` hits);
2. **rerank** (optional): the :class:`~hybridret.search.rerank.Reranker` scores the first stage's top
   ``rerank_depth`` chunks against the query; its score becomes the hit's score and the
   component ``"rerank"``, and the order follows it (ties: the first stage's order). Grouped, the
   groups are then formed from those ``rerank_depth`` reranked chunks;
3. **diversify** (optional, ``diversify=λ``): the first stage's (reranked) pool of hits, or of
   groups, reordered by maximal marginal relevance over the candidates' dense vectors
   (:mod:`hybridret.search.diversify`); the order over the whole pool, then cut;
4. **page**: hits (or groups) ``offset .. offset + k`` of the full ranking; a page is a slice of
   the unpaginated list of the same snapshot (for fused methods while ``offset + k`` stays within
   the fusion depth, which then does not change with the page).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from ..fusion.config import FUSION_CHUNK, FusionConfig, fuse
from ..retrievers import REGISTRY, QueryBatch
from ..types import Hits
from .diversify import DIVERSIFY_POOL, mmr_order
from .grouping import best_of_groups, first_groups, key_values, next_depth, start_depth
from .plan import PlanResult, SearchPlan, fused_plan
from .rerank import check_scores
from .source import CandidateSource, SnapshotSource

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from ..index.snapshot import Snapshot

__all__ = ["FUSION_BUDGET_BYTES", "Encode", "StageResult", "execute", "execute_stages", "fused_search", "fusion_chunk",
           "hits_of", "leg_tops", "run_plan"]

Encode = Callable[[list[str], set[str]], QueryBatch]

StageResult = tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], "np.ndarray | None", "np.ndarray | None"]


def _take(q: QueryBatch, idx: np.ndarray) -> QueryBatch | None:
    """The queries ``idx`` of ``q`` (``None`` when a representation cannot be indexed so)."""
    reps = {}
    for name, v in q.reps.items():
        if isinstance(v, np.ndarray) or sp.issparse(v):
            reps[name] = v[idx]
        else:
            return None
    return QueryBatch([q.texts[i] for i in idx.tolist()], reps)


def _pad(a: np.ndarray, width: int, value: Any) -> np.ndarray:
    if a.shape[1] >= width:
        return a[:, :width]
    return np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=value)


def _ranked(plan: SearchPlan, source: CandidateSource, q: QueryBatch, depth: int, stats: dict[str, Any]
            ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """The first stage's ranking of its top ``depth`` (fused: the whole candidate union) and
    whether each query's list is complete (nothing deeper could be found)."""
    if plan.single is not None:
        rows, scores = source.top(plan.single, depth, q, filt=plan.filter, stats=stats)
        return rows, scores, {plan.single: scores}, rows[:, -1] < 0 if rows.shape[1] else np.ones(len(q), bool)
    cands = source.gather(plan.retrievers, depth, q, filt=plan.filter, stats=stats, vectors=plan.vectors)
    width = max(int(cands.rows.shape[1]), 1)
    rows, scores, comps = fuse(plan.fusion, cands, width, source.snapshot, q, filt=plan.filter,  # type: ignore[arg-type]
                               threads=source.threads)
    complete = np.ones(len(q), dtype=bool)
    for listed in cands.listed.values():
        complete &= listed.sum(axis=1) < depth
    return rows, scores, comps, complete


def _grouped_first_stage(plan: SearchPlan, source: CandidateSource, q: QueryBatch, need: int | None = None,
                         keep: int | None = None) -> StageResult:
    """Groups by deepening the first stage until ``need`` (default ``offset + k``) groups are certain
    (see :mod:`hybridret.search.grouping`), keeping up to ``keep`` (default ``need``) groups of the
    final list; single retrievers then score every member of those groups."""
    spec, nq = plan.group, len(q)
    need = plan.offset + plan.k if need is None else need
    keep = max(need, keep or need)
    assert spec is not None
    cap = max(source.size, 1)
    depth = start_depth(need, cap) if plan.single is not None else min(max(plan.depth, start_depth(need, cap)), cap)
    got: list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], np.ndarray] | None] = [None] * nq
    groups: list[list[Any]] = [[] for _ in range(nq)]
    todo = np.arange(nq)
    sub: QueryBatch | None = q
    while len(todo):
        run = todo if sub is not None else np.arange(nq)
        batch = sub if sub is not None else q
        stats = source.statistics(batch, plan.stats) if plan.stats else {}
        rows, scores, comps, complete = _ranked(plan, source, batch, depth, stats)
        keys = source.group_keys(rows, spec.field)
        found = first_groups(rows, scores, keys, keep)
        left = []
        for a, i in enumerate(run.tolist()):
            if got[i] is not None:
                continue
            if len(found[a]) >= need or complete[a] or depth >= cap:
                groups[i] = found[a]
                got[i] = (rows[a], scores[a], {n: v[a] for n, v in comps.items()}, keys[a])
            else:
                left.append(i)
        todo = np.array(left, dtype=np.int64)
        if len(todo):
            depth = next_depth(depth, cap)
            sub = _take(q, todo)
    if plan.single is not None:  # every member of the chosen groups, scored exactly
        name = plan.single
        stats = source.statistics(q, plan.stats) if plan.stats else {}
        members = source.group_members(groups, spec.field, plan.filter)
        scores = source.score(name, members, q, stats=stats).astype(np.float32)
        if REGISTRY[name].positive_only:
            scores = np.where(scores > 0, scores, -np.inf)
        scores = np.where(members >= 0, scores, -np.inf).astype(np.float32)
        keys = source.group_keys(members, spec.field)
        return best_of_groups(groups, members, scores, {name: scores}, keys, spec.size, resort=True)
    width = max(len(g[0]) for g in got if g is not None)  # type: ignore[index]
    rows = np.stack([_pad(g[0][None], width, -1)[0] for g in got])  # type: ignore[index]
    scores = np.stack([_pad(g[1][None], width, -np.inf)[0] for g in got])  # type: ignore[index]
    names = list(got[0][2]) if got and got[0] is not None else []
    comps = {n: np.stack([_pad(g[2][n][None], width, np.nan)[0] for g in got]) for n in names}  # type: ignore[index]
    keys = np.stack([_pad(g[3][None].astype(object), width, None)[0] for g in got])  # type: ignore[index]
    return best_of_groups(groups, rows, scores, comps, keys, spec.size, resort=False)


def _rerank(plan: SearchPlan, source: CandidateSource, q: QueryBatch, rows: np.ndarray, scores: np.ndarray,
            comps: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Reorder each query's first-stage list by the reranker's scores (ties: the first stage's order)."""
    texts = source.texts(rows)
    new = np.full(rows.shape, -np.inf, dtype=np.float32)
    for i in range(rows.shape[0]):
        valid = np.flatnonzero(rows[i] >= 0)
        if len(valid):
            got = plan.rerank.scores(q.texts[i], [texts[i][j] for j in valid.tolist()])  # type: ignore[union-attr]
            new[i, valid] = check_scores(plan.rerank, got, len(valid))  # type: ignore[arg-type]
    order = np.argsort(-new.astype(np.float64), axis=1, kind="stable")
    comps = {n: np.take_along_axis(v, order, axis=1) for n, v in comps.items()}
    comps["rerank"] = np.where(np.take_along_axis(rows, order, axis=1) >= 0, np.take_along_axis(new, order, axis=1),
                               np.nan).astype(np.float32)
    return np.take_along_axis(rows, order, axis=1), np.take_along_axis(new, order, axis=1), comps


def _top(plan: SearchPlan, source: CandidateSource, q: QueryBatch, k: int
         ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The first stage's top ``k``: the retriever's, or the fusion's over the candidates of depth
    ``max(k, plan.depth)`` (what :func:`execute` runs for a plan of that ``k``)."""
    stats = source.statistics(q, plan.stats) if plan.stats else {}
    if plan.single is not None:
        rows, scores = source.top(plan.single, k, q, filt=plan.filter, stats=stats)
        return rows, scores, {plan.single: scores}
    cands = source.gather(plan.retrievers, max(k, plan.depth), q, filt=plan.filter, stats=stats,
                          vectors=plan.vectors)
    return fuse(plan.fusion, cands, k, source.snapshot, q, filt=plan.filter,  # type: ignore[arg-type]
                threads=source.threads)


def _chunk(plan: SearchPlan, source: CandidateSource, q: QueryBatch) -> StageResult:
    if plan.diversify is not None:
        return _diversified(plan, source, q)
    spec, need = plan.group, plan.offset + plan.k
    if plan.rerank is None:
        if spec is not None:
            return _grouped_first_stage(plan, source, q)
        rows, scores, comps = _top(plan, source, q, need)
        return rows, scores, comps, None, None
    rows, scores, comps = _top(plan, source, q, max(plan.rerank_depth, need))
    rows, scores, comps = _rerank(plan, source, q, rows, scores, comps)
    if spec is None:
        return rows, scores, comps, None, None
    keys = source.group_keys(rows, spec.field)
    groups = first_groups(rows, scores, keys, need)
    return best_of_groups(groups, rows, scores, comps, keys, spec.size, resort=False)


def _diversified(plan: SearchPlan, source: CandidateSource, q: QueryBatch) -> StageResult:
    """The first stage's pool (and reranking), in MMR order (:mod:`hybridret.search.diversify`): its
    first ``offset + k`` hits or groups."""
    spec, need, lam = plan.group, plan.offset + plan.k, float(plan.diversify)  # type: ignore[arg-type]
    pool = max(need, DIVERSIFY_POOL)
    if plan.rerank is not None:
        rows, scores, comps = _top(plan, source, q, max(plan.rerank_depth, need))
        rows, scores, comps = _rerank(plan, source, q, rows, scores, comps)
        if spec is not None:
            keys = source.group_keys(rows, spec.field)
            rows, scores, comps, gkeys, gscores = best_of_groups(first_groups(rows, scores, keys, pool), rows, scores,
                                                                 comps, keys, spec.size, resort=False)
    elif spec is not None:  # a fused method's scores depend on its depth: deepened as the plain search is
        rows, scores, comps, gkeys, gscores = (  # type: ignore[misc]
            _grouped_first_stage(plan, source, q, pool) if plan.single is not None
            else _grouped_first_stage(plan, source, q, need, keep=pool))
    else:
        stats = source.statistics(q, plan.stats) if plan.stats else {}
        depth = min(pool, max(source.size, 1)) if plan.single is not None else plan.depth
        rows, scores, comps, _ = _ranked(plan, source, q, depth, stats)
    if spec is None:
        order = mmr_order(scores, source.vectors(rows), (rows >= 0) & np.isfinite(scores), lam, need)
        return (_along(rows, order, -1), _along(scores, order, -np.inf),
                {n: _along(v, order, np.nan) for n, v in comps.items()}, None, None)
    g = spec.size
    best = rows[:, ::g]  # each group's best chunk: its vector is the group's
    ok = np.array([[k is not None for k in line] for line in gkeys], dtype=bool).reshape(gkeys.shape)
    order = mmr_order(gscores, source.vectors(best), ok & np.isfinite(gscores) & (best >= 0), lam, need)
    cols = np.where(order[:, :, None] >= 0, order[:, :, None] * g + np.arange(g), -1).reshape(len(order), -1)
    return (_along(rows, cols, -1), _along(scores, cols, -np.inf), {n: _along(v, cols, np.nan) for n, v in comps.items()},
            _along(gkeys, order, None), _along(gscores, order, -np.inf))


def _along(a: np.ndarray, idx: np.ndarray, fill: Any) -> np.ndarray:
    """``a[i, idx[i, j]]``, ``fill`` where ``idx`` is ``-1``."""
    got = np.take_along_axis(a, np.maximum(idx, 0), axis=1)
    if a.dtype == object:
        got = got.copy()
        got[idx < 0] = fill
        return got
    return np.where(idx >= 0, got, fill).astype(a.dtype)


def execute_stages(plan: SearchPlan, source: CandidateSource, q: QueryBatch) -> StageResult:
    """Run a plan with grouping, a reranker or an offset: rows / scores / components of shape
    ``(len(q), k)`` (grouped: ``(len(q), k * group_size)``, group ``j``'s chunks at columns
    ``j * group_size ..``), and for grouped plans the group keys and scores ``(len(q), k)``."""
    k, off = plan.k, plan.offset
    g = plan.group.size if plan.group is not None else 1
    parts = []
    for a in range(0, len(q), FUSION_CHUNK):
        sub = q if FUSION_CHUNK >= len(q) else q.slice(a, a + FUSION_CHUNK)
        rows, scores, comps, gkeys, gscores = _chunk(plan, source, sub)
        lo, hi = off * g, (off + k) * g
        rows, scores = _pad(rows[:, lo:], hi - lo, -1), _pad(scores[:, lo:], hi - lo, -np.inf)
        comps = {n: _pad(v[:, lo:], hi - lo, np.nan).astype(np.float32) for n, v in comps.items()}
        if gkeys is not None:
            gkeys, gscores = _pad(gkeys[:, off:], k, None), _pad(gscores[:, off:], k, -np.inf)  # type: ignore[index]
        parts.append((rows, scores.astype(np.float32), comps, gkeys, gscores))
    if len(parts) == 1:
        return parts[0]
    names = parts[0][2] if parts else {}
    cat = (lambda i: np.concatenate([p[i] for p in parts])) if parts else None
    if cat is None:
        width = k * g
        empty_keys = np.full((0, k), None, dtype=object) if plan.group is not None else None
        return (np.full((0, width), -1, np.int64), np.full((0, width), -np.inf, np.float32), {}, empty_keys,
                np.full((0, k), -np.inf, np.float32) if plan.group is not None else None)
    return (cat(0), cat(1), {n: np.concatenate([p[2][n] for p in parts]) for n in names},
            cat(3) if plan.group is not None else None, cat(4) if plan.group is not None else None)


FUSION_BUDGET_BYTES = 256 << 20
"""About how much a chunk of fused queries may hold in candidate vectors: deep candidate lists are
fused fewer queries at a time (down to one), so memory follows the result, never the batch."""


# -- execution -----------------------------------------------------------------------------------------
def fusion_chunk(plan: SearchPlan) -> int:
    """Queries fused at a time: :data:`~hybridret.fusion.config.FUSION_CHUNK`, fewer when the candidate
    lists are deep (their vectors, up to 1024 dims assumed, stay within :data:`FUSION_BUDGET_BYTES`)."""
    per_query = max(len(plan.retrievers), 1) * max(plan.depth, 1) * 1024 * 4
    return max(1, min(FUSION_CHUNK, FUSION_BUDGET_BYTES // per_query))


def execute(plan: SearchPlan, source: CandidateSource, q: QueryBatch
            ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Run ``plan`` on encoded queries ``q`` (one per entry of ``plan.keep``): rows ``(len(q), k)``,
    scores and each retriever's exact scores of the rows. One retriever: its top-k; fused: the
    candidates gathered from ``source`` and :func:`~hybridret.fusion.config.fuse`, a
    :data:`~hybridret.fusion.config.FUSION_CHUNK` of queries at a time (memory bounded for any batch)."""
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


def leg_tops(plan: SearchPlan, source: CandidateSource, q: QueryBatch) -> dict[str, np.ndarray]:
    """Each of the plan's retrievers' best exact score per query over the (filtered) index, ``(len(q),)``
    (NaN: nothing found): the query-level inputs of relevance and answerability
    (:mod:`hybridret.search.relevance`), the same for every page, ``k``, grouping or reranker."""
    names = plan.retrievers if plan.single is None else (plan.single,)
    out = {name: np.full(len(q), np.nan) for name in names}
    step = source.top_chunk or max(len(q), 1)
    for a in range(0, len(q), step):
        sub = q if step >= len(q) else q.slice(a, a + step)
        stats = source.statistics(sub, plan.stats) if plan.stats else {}
        for name in names:
            rows, scores = source.top(name, 1, sub, filt=plan.filter, stats=stats)
            if rows.shape[1]:
                best = scores[:, 0].astype(np.float64)
                out[name][a:a + len(sub)] = np.where((rows[:, 0] >= 0) & np.isfinite(best), best, np.nan)
    return out


def run_plan(plan: SearchPlan, source: CandidateSource, encode: Encode, *, tops: bool = False) -> PlanResult:
    """The one search function of :class:`~hybridret.search.searcher.Searcher` and
    :class:`~hybridret.distributed.searcher.ShardedSearcher`: check the plan against the source,
    encode the non-blank queries (``encode(texts, plan.needs)``), :func:`execute`, and place the
    results back at every query's position (blank queries: no hits). ``tops``: also
    :func:`leg_tops` (``PlanResult.tops``; NaN for blank queries)."""
    source.check(plan)
    n, k, keep = len(plan.texts), plan.width, list(plan.keep)
    rows = np.full((n, k), -1, dtype=np.int64)
    scores = np.full((n, k), -np.inf, dtype=np.float32)
    comps: dict[str, np.ndarray] = {}
    gkeys = np.full((n, plan.k), None, dtype=object) if plan.group is not None else None
    gscores = np.full((n, plan.k), -np.inf, dtype=np.float32) if plan.group is not None else None
    qs = None
    best = {name: np.full(n, np.nan) for name in (plan.retrievers if plan.single is None else (plan.single,))} \
        if tops else None
    if keep and not source.empty:
        q = encode(plan.kept_texts, set(plan.needs))
        if plan.staged:
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
        if best is not None:
            for name, v in leg_tops(plan, source, q).items():
                best[name][keep] = v
    return PlanResult(rows=rows, scores=scores, components=comps, ids=source.ids(rows), query_sparse=qs,
                      group_keys=gkeys, group_scores=gscores, tops=best)


def fused_search(config: FusionConfig, k: int, snap: Snapshot, q: QueryBatch, *, filt: Filter | None = None,
                 threads: int | None = None) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """One fused method over one snapshot for queries already encoded (blank ones included): rows
    ``(nq, k)``, fused scores, and each retriever's exact scores of those rows; the plan's executor
    (:func:`execute`), so queries are fused :data:`~hybridret.fusion.config.FUSION_CHUNK` at a time."""
    return execute(fused_plan(config, k, q.texts, filt=filt), SnapshotSource(snap, threads=threads), q)


def hits_of(plan: SearchPlan, res: PlanResult, source: Any, *, relevance: np.ndarray | None = None,
            answerability: np.ndarray | None = None) -> Hits:
    """The :class:`~hybridret.types.Hits` of a planned search, local and sharded alike; ``source``
    gives the hit views (texts, metadata, matched terms) from the snapshot or shards searched."""
    group = plan.group
    return Hits(queries=list(plan.texts), method=plan.label, ids=res.ids, rows=res.rows, scores=res.scores,
                components=res.components, query_sparse=res.query_sparse, offset=plan.offset,
                group_by=group.field if group else None, group_size=group.size if group else 0,
                group_keys=key_values(res.group_keys), group_scores=res.group_scores, relevance=relevance,
                answerability=answerability,
                _source=source)
