"""Candidate gathering: each retriever's top ``depth``, their union, every retriever's exact score of it.

What every fused method starts from, on one snapshot (a single index, or one shard of a sharded
one): :func:`gather_lists` (the lists, the union, the exact scores) and :func:`gather_candidates`
(the same as :class:`~hybridret.fusion.scores.Candidates`, with which retriever listed each
candidate and, when the method needs them, the candidates' dense vectors).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..retrievers import REGISTRY, QueryBatch, score_rows, search_rows, vectors_of
from ..retrievers.base import prepare_context
from .scores import Candidates, candidate_union

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from ..index.snapshot import Snapshot

__all__ = ["gather_candidates", "gather_lists", "prepare_all"]


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
