"""What a shard answers for grouping and reranking (:mod:`hybridret.search.run`): a mixin of
:class:`~hybridret.distributed.shard.ShardServer`, computed by the same code as a single index's
(:class:`~hybridret.search.source.SnapshotSource`), on the commit the coordinator pinned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..search.source import SnapshotSource

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from ..index.snapshot import Snapshot
    from ..retrievers import QueryBatch

__all__ = ["StageReads"]


class StageReads:
    """Group keys, group members, exact scores of given rows and texts of one shard."""

    def _snap(self, commit: int | None) -> Snapshot:  # pragma: no cover - ShardServer's
        raise NotImplementedError

    def group_keys(self, commit: int | None, rows: np.ndarray, field: str) -> np.ndarray:
        """The group key of each local row ``(nq, m)`` (``None`` at ``-1``)."""
        return SnapshotSource(self._snap(commit)).group_keys(np.asarray(rows, dtype=np.int64), field)

    def group_members(self, commit: int | None, groups: Sequence[Sequence[Any]], field: str,
                      filt: Filter | None) -> dict[str, Any]:
        """This shard's live rows matching ``filt`` of each query's groups (``"rows"``, ``-1``
        padded) and their ids (``"ids"``: row -> id)."""
        snap = self._snap(commit)
        rows = SnapshotSource(snap).group_members(groups, field, filt)
        every = np.unique(rows[rows >= 0])
        return {"rows": rows, "ids": dict(zip(every.tolist(), snap.ids[every].tolist())) if len(every) else {}}

    def score(self, commit: int | None, q: QueryBatch, name: str, rows: np.ndarray,
              stats: dict[str, Any] | None = None) -> np.ndarray:
        """Retriever ``name``'s exact scores of local rows ``(nq, m)`` (``0`` at ``-1``), prepared
        with the coordinator's summed statistics."""
        return SnapshotSource(self._snap(commit)).score(name, np.asarray(rows, dtype=np.int64), q, stats=stats)

    def texts(self, commit: int | None, rows: np.ndarray) -> list[list[str]]:
        """Title and text of each local row ``(nq, m)`` (``""`` at ``-1``), for a reranker."""
        return SnapshotSource(self._snap(commit)).texts(np.asarray(rows, dtype=np.int64))
