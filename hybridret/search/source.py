"""Where a plan's candidates come from: :class:`CandidateSource`, and :class:`SnapshotSource` over one snapshot.

A source answers the same questions over a single index and over shards
(:class:`~hybridret.distributed.source.ShardedSource`): the collection statistics of the
retrievers that declare them (:attr:`Retriever.global_stats`), one retriever's top-k, and the
candidate union of several retrievers with every retriever's exact scores
(:class:`~hybridret.fusion.scores.Candidates`); grouping and reranking ask it for group keys,
exact scores of given rows and texts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..fusion.gather import gather_candidates, prepare_all
from ..fusion.scores import Candidates
from ..retrievers import REGISTRY, QueryBatch, score_rows, search_rows
from .plan import SearchPlan

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from ..index.snapshot import Snapshot

__all__ = ["NO_DENSE", "CandidateSource", "SnapshotSource", "full_text"]

NO_DENSE = ("diversify compares the candidates' stored dense vectors, and this index has no dense component "
            "(build it with a dense encoder, or search without diversify)")


class CandidateSource(ABC):
    """Where a plan's candidates come from: one snapshot, or shards (rows are then global keys).

    ``snapshot`` is handed to :func:`~hybridret.fusion.config.fuse` (``None`` when there is no single
    snapshot: the candidates then carry everything fusion needs). ``top_chunk``: queries per call
    of :meth:`top` (``None``: the whole batch at once); fused methods go
    :data:`~hybridret.fusion.config.FUSION_CHUNK` at a time. ``threads``: the thread budget every search
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

    # -- what grouping and reranking ask (hybridret.search.run) --
    @property
    def size(self) -> int:
        """How many documents there are to search (the deepest a top list can go)."""
        raise ConfigError(f"{type(self).__name__} cannot group")

    def group_keys(self, rows: np.ndarray, field: str) -> np.ndarray:
        """The group key (:mod:`hybridret.search.grouping`) of each row ``(nq, m)``; ``None`` at ``-1``."""
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

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """The stored dense vectors of rows ``(nq, m)`` -> ``(nq, m, dim)`` (zeros at ``-1``), for
        the diversity stage (:mod:`hybridret.search.diversify`)."""
        raise ConfigError(f"{type(self).__name__} cannot return dense vectors")


class SnapshotSource(CandidateSource):
    """Candidates from one snapshot (what :class:`~hybridret.search.searcher.Searcher` searches)."""

    def __init__(self, snap: Snapshot, *, threads: int | None = None) -> None:
        self.snap: Snapshot = snap  # never None here (CandidateSource.snapshot may be)
        self.snapshot = snap
        self.threads = threads  # every search's thread budget (None: every core)

    def check(self, plan: SearchPlan) -> None:
        """Refuse a filter on a document field that is not metadata, and ``group_by`` on a field no
        document of the snapshot has (each document would be a group of its own: no grouping at all)."""
        snap = self.snap
        columns = [seg.columns for seg in snap.segments]
        if plan.filter is not None:
            plan.filter.check_fields(columns)
        if plan.group is not None and snap.num_docs and all(c.get(plan.group.field) is None for c in columns):
            raise ConfigError(f"group_by: no document of the index has the metadata field {plan.group.field!r}; "
                              "group by a field the documents carry (e.g. 'parent_id' of chunked documents)")
        if plan.diversify is not None and any(seg.part("dense") is None for seg in snap.segments):
            raise ConfigError(NO_DENSE)

    @property
    def empty(self) -> bool:
        return not self.snap.num_docs

    def statistics(self, q: QueryBatch, names: tuple[str, ...]) -> dict[str, Any]:
        return {}  # the snapshot is the whole collection: each retriever prepares its own

    def top(self, name: str, depth: int, q: QueryBatch, *, filt: Filter | None = None,
            stats: Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        snap = self.snap
        ctx = prepare_all((name,), snap, q, stats, threads=self.threads)[name]
        return search_rows(REGISTRY[name], snap, q, depth, filt, ctx, threads=self.threads)

    def gather(self, names: tuple[str, ...], depth: int, q: QueryBatch, *, filt: Filter | None = None,
               stats: Mapping[str, Any] | None = None, vectors: bool = False) -> Candidates:
        return gather_candidates(names, depth, self.snap, q, filt=filt, stats=stats,
                                 vectors=vectors, threads=self.threads)

    def ids(self, rows: np.ndarray) -> np.ndarray:
        snap = self.snap
        out = np.where(rows >= 0, snap.ids[np.maximum(rows, 0)] if snap.num_rows else "", "")
        return out.astype(object)

    @property
    def size(self) -> int:
        return int(self.snap.num_docs)

    def group_keys(self, rows: np.ndarray, field: str) -> np.ndarray:
        from .grouping import keys_of

        return keys_of(self.snap, rows, field)

    def group_members(self, groups: Sequence[Sequence[Any]], field: str, filt: Filter | None) -> np.ndarray:
        from .grouping import members_of

        return members_of(self.snap, groups, field, filt)

    def score(self, name: str, rows: np.ndarray, q: QueryBatch, *, stats: Mapping[str, Any] | None = None
              ) -> np.ndarray:
        snap = self.snap
        ctx = prepare_all((name,), snap, q, stats, threads=self.threads)[name]
        return score_rows(REGISTRY[name], snap, q, rows, ctx, threads=self.threads)

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        from ..retrievers.dense import vectors_of

        return vectors_of(self.snap, np.asarray(rows, dtype=np.int64))

    def texts(self, rows: np.ndarray) -> list[list[str]]:
        return [[full_text(*self.snap.get(int(r))[:2]) if r >= 0 else "" for r in line]
                for line in np.asarray(rows).tolist()]


def full_text(title: str, text: str) -> str:
    """What a reranker reads of a document: its title and text."""
    return f"{title}\n{text}" if title else text
