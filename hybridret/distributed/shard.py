"""One shard: an ordinary index directory served by one process (a Ray actor in a cluster).

:class:`ShardServer` is plain Python (``ray.remote`` wraps it, see :func:`shard_actor_class`): it
holds a read-only :class:`~hybridret.search.searcher.Searcher` over its directory (whose encoder is never
loaded: queries arrive encoded by the coordinator) and answers the coordinator's phases:

* ``stats``: the shard's collection statistics for a query batch, of every asked retriever that
  declares them (:meth:`Retriever.statistics`; BM25's document count, length and frequencies);
* ``search``: each retriever's top rows (pre-filtered), and optionally the union of those rows and
  every retriever's exact score of it, computed by the same code as a single index's
  (:class:`~hybridret.search.source.SnapshotSource`, :func:`~hybridret.fusion.gather.gather_lists`), each
  retriever prepared with the coordinator's summed statistics;
* ``vectors`` / ``docs``: stored dense vectors (for GQR) and hit views of given rows.

Every read names the commit the coordinator pinned; the shard keeps the last few snapshots open so
that a query started before a refresh finishes on the same state. Writes go through an
:class:`~hybridret.indexer.IndexWriter` fed with encodings made by the coordinator.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, HybridRetError
from ..filters import Filter
from ..fusion.gather import gather_lists
from ..index.snapshot import Snapshot
from ..retrievers import REGISTRY, QueryBatch, vectors_of
from ..search.source import SnapshotSource
from .stage_reads import StageReads

__all__ = ["KEPT_SNAPSHOTS", "ShardServer", "ShardStaleError", "ShardUnavailableError", "shard_actor_class"]

logger = logging.getLogger(__name__)

KEPT_SNAPSHOTS = 4  # snapshots a shard keeps open for queries pinned to an older commit


class ShardUnavailableError(HybridRetError):
    """A shard could not answer (its actor died and could not be restarted, or it keeps failing).
    ``shards`` names the shards concerned."""

    def __init__(self, message: str, shards: list[str]) -> None:
        super().__init__(message)
        self.shards = shards


class ShardStaleError(HybridRetError):
    """A read named a commit the shard no longer holds (e.g. after a restart): refresh and retry."""


class ShardServer(StageReads):
    """Serve one shard directory to a coordinator (see the module docstring; grouping and
    reranking reads: :class:`~hybridret.distributed.stage_reads.StageReads`)."""

    def __init__(self, root: str, name: str, device: str | None = None, extensions: Sequence[Any] = ()) -> None:
        from ..retrievers import register
        from ..search.searcher import EncoderSlot, Searcher

        for retriever in extensions:  # the coordinator's registered retrievers, before any part is opened
            register(retriever, replace=True)
        self.root = Path(root)
        self.name = name
        self.searcher = Searcher(self.root, device=device, encoder=EncoderSlot(None, None, device))
        self._snaps: OrderedDict[int, Snapshot] = OrderedDict()
        self._keep(self.searcher.snapshot)
        logger.info("%s: serving %s (commit %d, %d documents)", name, root, self.searcher.snapshot.commit,
                    self.searcher.num_docs)

    def _keep(self, snap: Snapshot) -> None:
        self._snaps[snap.commit] = snap
        self._snaps.move_to_end(snap.commit)
        while len(self._snaps) > KEPT_SNAPSHOTS:
            self._snaps.popitem(last=False)

    def _snap(self, commit: int | None) -> Snapshot:
        """The snapshot of ``commit`` (``None``: the current one) as seen now: expired documents masked."""
        if commit is None:
            return self.searcher.current()
        snap = self._snaps.get(commit)
        if snap is None:
            raise ShardStaleError(f"{self.name}: commit {commit} is no longer open here (current commit "
                                  f"{self.searcher.snapshot.commit}); refresh and retry")
        return snap.at(self.searcher.clock())

    # -- state ----------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        snap = self.searcher.snapshot
        m = snap.manifest
        available = {name: r.available(snap) for name, r in REGISTRY.items()}
        metrics = sorted({s.dense.metric for s in snap.segments if s.dense is not None})
        return {"name": self.name, "commit": snap.commit, "num_docs": snap.num_docs, "num_deleted": snap.num_deleted,
                "segments": len(snap.segments), "saved_at": m.get("saved_at"), "encoder": m.get("encoder"),
                "components": m.get("components", {}), "fusion": m.get("fusion"), "available": available,
                "dense_metrics": metrics, "representations": m.get("representations"), "settings": m.get("settings")}

    def refresh(self) -> int:
        self.searcher.refresh()
        self._keep(self.searcher.snapshot)
        return self.searcher.snapshot.commit

    # -- reads ----------------------------------------------------------------------------------
    def stats(self, commit: int | None, q: QueryBatch, names: tuple[str, ...]) -> dict[str, Any]:
        """This shard's collection statistics for ``q`` of each retriever in ``names`` (those
        declaring ``global_stats``), by name; the coordinator sums them over shards."""
        snap = self._snap(commit)
        return {name: REGISTRY[name].statistics(snap, q) for name in names}

    def search(self, commit: int | None, q: QueryBatch, names: tuple[str, ...], depth: int, filt: Filter | None,
               stats: dict[str, Any] | None = None, union: bool = False) -> dict[str, Any]:
        """Top ``depth`` ``(rows, scores)`` of each retriever in ``names`` (``"lists"``) and the id
        of every row listed (``"ids"``); with ``union``, also the union of the lists (``"union"``)
        and every retriever's exact scores of it (``"exact"``). ``stats``: the summed collection
        statistics by retriever (see :meth:`stats`)."""
        snap = self._snap(commit)
        out: dict[str, Any] = {"commit": snap.commit}
        if union:
            lists, out["union"], out["exact"] = gather_lists(names, depth, snap, q, filt=filt, stats=stats)
        else:
            src = SnapshotSource(snap)
            lists = {name: src.top(name, depth, q, filt=filt, stats=stats) for name in names}
        out["lists"] = lists
        every = np.unique(np.concatenate([r.ravel() for r, _ in lists.values()] or [np.zeros(0, np.int64)]))
        every = every[every >= 0]
        out["ids"] = dict(zip(every.tolist(), snap.ids[every].tolist())) if len(every) else {}
        return out

    def vectors(self, commit: int | None, rows: np.ndarray) -> np.ndarray:
        return vectors_of(self._snap(commit), np.asarray(rows, dtype=np.int64))

    def docs(self, commit: int | None, rows: list[int]) -> list[dict[str, Any]]:
        """Stored id, title, text, metadata and learned-sparse vector of each row (for hit views)."""
        snap = self._snap(commit)
        out = []
        for row in rows:
            title, text, meta = snap.get(int(row))
            seg, local = snap.locate(np.array([row]))
            part = snap.segments[int(seg[0])].part("sparse")
            vec = part.forward[int(local[0])] if part is not None else None
            out.append({"id": str(snap.ids[int(row)]), "title": title, "text": text, "metadata": meta,
                        "sparse": None if vec is None else (vec.indices.copy(), vec.data.copy())})
        return out

    def get(self, ids: list[str]) -> list[dict[str, Any] | None]:
        return self.searcher.get(ids)

    def contains(self, ids: list[str]) -> list[bool]:
        snap = self.searcher.snapshot
        return [i in snap for i in ids]

    # -- writes ---------------------------------------------------------------------------------
    def write(self, documents: list[Any], mode: str, shape: dict[str, Any], table: dict[str, Any],
              chunk_size: int = 1024) -> dict[str, Any]:
        """``add`` / ``upsert`` documents whose encodings (by full text) the coordinator computed."""
        from ..indexer import IndexWriter
        from .encoding import PrecomputedEncoder

        if mode not in ("add", "upsert"):
            raise ConfigError(f"a shard takes add or upsert writes, got {mode!r}")
        enc = PrecomputedEncoder(shape, table, what=self.name)
        with IndexWriter(self.root, encoder=enc) as writer:
            result = writer.write(documents, mode=mode, chunk_size=chunk_size, show_progress=False)
            writer.merge_small()
        self.refresh()
        return result.to_dict()

    def delete(self, ids: list[str], missing: str = "error") -> dict[str, Any]:
        from ..indexer import IndexWriter

        with IndexWriter(self.root) as writer:
            result = writer.delete(ids, missing=missing)
        self.refresh()
        return result.to_dict()

    def compact(self) -> dict[str, Any]:
        """Merge this shard's segments into one and drop its deleted documents (nothing re-encoded)."""
        from ..indexer import IndexWriter

        with IndexWriter(self.root) as writer:
            result = writer.compact(show_progress=False)
        self.refresh()
        return result.to_dict()


def shard_actor_class() -> Any:
    """:class:`ShardServer` as a Ray actor class (``ray`` is imported only here)."""
    import ray

    return ray.remote(ShardServer)
