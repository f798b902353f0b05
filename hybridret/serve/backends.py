"""What the server serves: one index (:class:`LocalBackend`, a :class:`~hybridret.retriever.HybridRetriever`)
or a sharded index on Ray (:class:`ShardedBackend`, a :class:`~hybridret.distributed.searcher.ShardedSearcher`).

The app (:mod:`hybridret.serve.app`) talks to either through the same few methods (:class:`ServeBackend`):
``search`` and ``get`` (the :class:`~hybridret.types.SearchBackend` protocol; ``search`` is thread-safe,
called by the micro-batcher's workers), ``documents`` (a page of the documents matching a filter),
``write`` (add / upsert / delete / compact, one at a time, committed before it returns; a local index
also has ``write_group``: several in one commit), ``health``, ``info``, ``refresh_every``, ``describe`` and ``close``.
Ray is imported only by :meth:`ShardedBackend.open`.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import ConfigError, HybridRetError, StaleSnapshotWarning
from ..filters import Filter
from ..types import Hits, SearchBackend

if TYPE_CHECKING:  # pragma: no cover
    from ..distributed.searcher import ShardedSearcher
    from ..retriever import HybridRetriever
    from ..search.searcher import Searcher

__all__ = ["LocalBackend", "ServeBackend", "ShardedBackend", "is_sharded", "load_backend"]

logger = logging.getLogger(__name__)


@runtime_checkable
class ServeBackend(SearchBackend, Protocol):
    """What the server needs of an index beyond searching: writes, health, info and lifecycle."""

    sharded: bool

    @property
    def searcher(self) -> SearchBackend:
        """What reads go to: a :class:`~hybridret.search.searcher.Searcher` or a sharded one."""

    def documents(self, filter: Filter | Mapping[str, Any] | str | None, *, offset: int,
                  limit: int | None) -> dict[str, Any]: ...

    def write(self, op: str, *args: Any, **kw: Any) -> dict[str, Any]: ...

    def health(self) -> dict[str, Any]: ...

    def info(self) -> dict[str, Any]: ...

    def refresh_every(self, seconds: float) -> None: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


def is_sharded(index: str | Path) -> bool:
    """A sharded index folder (``DIR/shards.json``), as ``hybridret search`` recognises it."""
    return (Path(index) / "shards.json").is_file()


class LocalBackend:
    """One index: reads from the retriever's :class:`~hybridret.search.searcher.Searcher`, writes through the retriever."""

    sharded = False

    def __init__(self, retriever: HybridRetriever) -> None:
        self.retriever = retriever
        self._own_timer = False

    @property
    def searcher(self) -> Searcher:
        return self.retriever.searcher

    def search(self, queries: str | Sequence[str], k: int | None = None, **options: Any) -> Hits:
        """As :meth:`hybridret.search.searcher.Searcher.search` (the options of a ``SearchRequest``)."""
        return self.searcher.search(queries, k, **options)

    def get(self, ids: str | Sequence[str], *, chunks: bool = False) -> list[dict[str, Any] | None]:
        return self.searcher.get(ids, chunks=chunks)

    def documents(self, filter: Filter | Mapping[str, Any] | str | None, *, offset: int,
                  limit: int | None) -> dict[str, Any]:
        """A page of the documents matching ``filter`` (:func:`hybridret.index.listing.list_documents`)
        with the count of all of them and the commit it was read from."""
        from ..search.listing import list_documents

        page = list_documents(self.searcher.current(), filter, offset=offset, limit=limit)
        return {"documents": page.documents, "total": page.total, "offset": page.offset, "commit": page.commit}

    def write(self, op: str, *args: Any, **kw: Any) -> dict[str, Any]:
        out = getattr(self.retriever, op)(*args, **kw).to_dict()
        out["num_docs"] = self.searcher.num_docs
        return out

    def write_group(self, requests: list[Any], cancel: threading.Event | None = None) -> list[Any]:
        """Adds, upserts and deletes by id in one commit (:meth:`HybridRetriever.write_group`): per
        request its result (as :meth:`write` gives it) or the exception that refused it."""
        outcomes = self.retriever.write_group(requests, cancel=cancel, merge=False)
        num_docs = self.searcher.num_docs
        return [o if isinstance(o, BaseException) else {**o.to_dict(), "num_docs": num_docs} for o in outcomes]

    def housekeeping(self) -> None:
        """After a group's answers were sent: merge small segments (see :meth:`HybridRetriever.merge_small`)."""
        self.retriever.merge_small()

    def health(self) -> dict[str, Any]:
        from ..index.parents import document_counts

        snap = self.searcher.current()  # expired documents are not counted
        documents, chunks = document_counts(snap)
        counts = {"num_documents": documents, "num_chunks": chunks} if chunks else {}
        return {"num_docs": snap.num_docs, **counts, "commit": snap.commit}

    def info(self) -> dict[str, Any]:
        from ..index.parents import document_counts
        from ..indexer import parts_across_segments

        searcher = self.searcher
        snap = searcher.current()
        manifest = snap.manifest
        default = searcher.fusion_config("hybrid", None, snap)
        return {
            "index": str(searcher.root), "commit": snap.commit, "saved_at": manifest.get("saved_at"),
            "num_docs": snap.num_docs, "num_documents": document_counts(snap)[0], "num_chunks": document_counts(snap)[1],
            "num_deleted": searcher.snapshot.num_deleted, "num_expired": snap.num_expired,
            "encoder": manifest.get("encoder"), "chunking": manifest.get("chunking"),
            "components": parts_across_segments(snap), "available": searcher.available(snap),
            "fusion": {"stored": manifest.get("fusion"), "hybrid": default.to_dict() if default else None},
            "segments": [{**e, "live": e["num_docs"] - e.get("num_deleted", 0)} for e in manifest.get("segments", [])],
        }

    def refresh_every(self, seconds: float) -> None:
        self.searcher.refresh_every(seconds)
        self._own_timer = True

    def refresh_if_changed(self) -> None:
        """Serve the commits other processes made (a ``stat`` of the manifest per call); when the new
        commit cannot be opened, keep serving the current one and say so."""
        try:
            self.searcher.refresh_if_changed()
        except Exception as exc:
            logger.debug("refreshing %s failed", self.searcher.root, exc_info=True)
            warnings.warn(f"refreshing {self.searcher.root} failed ({type(exc).__name__}: {exc}); still serving "
                          f"commit {self.searcher.snapshot.commit}", StaleSnapshotWarning, stacklevel=2)

    def describe(self) -> str:
        return f"last commit {self.searcher.snapshot.commit}"

    def close(self) -> None:
        if self._own_timer:
            self.searcher.close()


class ShardedBackend:
    """A sharded index: every call goes to the shard actors through one
    :class:`~hybridret.distributed.searcher.ShardedSearcher` (queries and new documents are
    encoded once, here). ``owns``: stop the shard actors on :meth:`close`."""

    sharded = True

    def __init__(self, searcher: ShardedSearcher, *, owns: bool = False) -> None:
        self.searcher = searcher
        self.owns = owns
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    @classmethod
    def open(cls, root: str | Path, *, address: str | None = None, device: str | None = None,
             **options: Any) -> ShardedBackend:
        """Join the Ray cluster at ``address`` (``None``: start a local one, unless Ray is already
        initialised in this process) and start one actor per shard of ``root``."""
        from ..distributed.layout import read_layout

        read_layout(root)  # a folder that is not a sharded index fails here, before Ray starts
        try:
            import ray
        except ImportError:
            raise ConfigError("serving a sharded index needs Ray: pip install 'hybridret[ray]'") from None
        from ..distributed.searcher import ShardedSearcher

        if not ray.is_initialized():
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
                raise HybridRetError(f"could not start or join {where}: {str(exc).splitlines()[0]}") from None
        return cls(ShardedSearcher.open(root, device=device, **options), owns=True)

    @property
    def root(self) -> Path:
        return Path(self.searcher.root)

    def search(self, queries: str | Sequence[str], k: int | None = None, **options: Any) -> Hits:
        return self.searcher.search(queries, k, partial=False, **options)  # a missing shard: ShardUnavailableError

    def get(self, ids: str | Sequence[str], *, chunks: bool = False) -> list[dict[str, Any] | None]:
        if chunks:
            raise ConfigError("chunks=true is not supported on a sharded index (its builds do not chunk documents)")
        return self.searcher.get(ids)

    def documents(self, filter: Filter | Mapping[str, Any] | str | None, *, offset: int,
                  limit: int | None) -> dict[str, Any]:
        raise ConfigError("listing documents (POST /documents/list) is not supported on a sharded index yet; "
                          "list each shard's folder, or search with a filter")

    def write(self, op: str, *args: Any, **kw: Any) -> dict[str, Any]:
        kw.pop("show_progress", None)
        if op not in ("add", "upsert", "delete", "compact", "purge"):
            raise ConfigError(f"unknown write {op!r}")
        rag = [k for k in ("filter", "dry_run", "ttl") if kw.pop(k, None) not in (None, False)]
        if op == "purge" or rag:
            raise ConfigError(f"{op} with {', '.join(rag) or 'expiry'} is not supported on a sharded index yet; "
                              "run it on each shard's folder")
        out = dict(getattr(self.searcher, op)(*args, **kw))
        out["commit"] = None  # a sharded write commits once per touched shard: see "commits"
        out["num_docs"] = self._num_docs()
        return out

    def _num_docs(self) -> int:
        return int(sum(i["num_docs"] for i in self.searcher.shard_infos))

    def health(self) -> dict[str, Any]:  # the pinned state: no call to the shards
        return {"num_docs": self._num_docs(), "commit": None, "commits": self.searcher.commits}

    def info(self) -> dict[str, Any]:
        s = self.searcher
        infos = s.shard_infos
        default = s.fusion_config("hybrid", None)
        return {
            "index": str(s.root), "sharded": True, "commit": None, "commits": s.commits, "saved_at": None,
            "num_docs": self._num_docs(), "num_deleted": int(sum(i.get("num_deleted", 0) for i in infos)),
            "encoder": s.layout.encoder or infos[0]["encoder"], "components": infos[0].get("components", {}),
            "available": s.available(),
            "fusion": {"stored": s.layout.fusion or infos[0].get("fusion"), "hybrid": default.to_dict() if default else None},
            "shards": [{"name": i["name"], "commit": int(i["commit"]), "num_docs": int(i["num_docs"]),
                        "num_deleted": int(i.get("num_deleted", 0)), "segments": i.get("segments")} for i in infos],
            "segments": [],
        }

    def refresh_every(self, seconds: float) -> None:
        """Pick up commits other processes made to the shards every ``seconds`` (a background thread)."""
        if seconds <= 0:
            raise ConfigError(f"refresh interval must be positive, got {seconds}")
        if self._timer is not None:
            raise ConfigError("this server already refreshes on a timer")

        def loop() -> None:
            while not self._stop.wait(seconds):
                try:
                    self.searcher.refresh()
                except Exception:  # keep serving the pinned commits
                    logger.warning("refreshing the shards of %s failed; still serving %s", self.root,
                                   self.searcher.commits, exc_info=True)

        self._timer = threading.Thread(target=loop, name="hybridret-shard-refresh", daemon=True)
        self._timer.start()

    def refresh_if_changed(self) -> None:
        """Nothing per request: the shards live in other processes (use ``refresh_every``)."""

    def describe(self) -> str:
        return f"shard commits {self.searcher.commits}"

    def close(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=5)
            self._timer = None
        if self.owns:
            self.searcher.close()


def load_backend(index: str | Path | SearchBackend) -> LocalBackend | ShardedBackend:
    """A backend for ``index``: a backend (as is), a :class:`~hybridret.retriever.HybridRetriever`,
    a :class:`~hybridret.distributed.searcher.ShardedSearcher` (not closed by the server), or a
    folder (sharded when it holds ``shards.json``, then on the Ray cluster this process joined or a local one)."""
    if isinstance(index, (LocalBackend, ShardedBackend)):
        return index
    from ..retriever import HybridRetriever

    if isinstance(index, HybridRetriever):
        return LocalBackend(index)
    if isinstance(index, (str, Path)):
        if is_sharded(index):
            return ShardedBackend.open(index)
        return LocalBackend(HybridRetriever.load(index, warm=True))
    from ..distributed.searcher import ShardedSearcher  # imports no Ray

    if isinstance(index, ShardedSearcher):
        return ShardedBackend(index, owns=False)
    raise ConfigError(f"cannot serve a {type(index).__name__}: pass an index directory, a HybridRetriever or a "
                      "ShardedSearcher (a Searcher is read-only: the server also writes)")
