"""The server's writes: one commit at a time, concurrent writes grouped into one commit.

Every write request (add, upsert, delete, purge, compact) joins one queue, served in arrival order
by one writer thread. With group commit on (the default), the writer takes, each time it is free,
the adds, upserts and deletes by id waiting at the head of the queue, as many as touch different
documents (:func:`~hybridret.group_commit.conflict_keys`; at most ``max_group`` requests and
``max_group_rows`` documents), and applies them in one commit
(:meth:`~hybridret.retriever.HybridRetriever.write_group`): one encoder pass, one new segment, one
manifest commit, instead of one of each per request. The busier the server, the larger the groups;
an idle server commits each write alone at once (no waiting window). A write that touches a document
of the group being formed, and every other kind of write (delete by filter, dry runs, purge,
compact), waits for the next commit and runs alone, so each request sees every earlier one.

Acknowledgement is unchanged: a request is answered only once the commit holding it is durable and
the searcher serves it (the merge of small segments that follows a commit runs after the answers).
A request refused on its own (a bad document, an id that exists, an unknown id
to delete) gets its own error, and the rest of its group is committed; when the group's encoding or
commit fails, every request of the group gets that error and none of it is committed.

Searches never wait on this queue: they read the last committed snapshot (the writer thread
refreshes the searcher after its commit, and a search that finds a refresh in progress goes on with
the snapshot it has).

Shutdown (:meth:`WriteQueue.begin_shutdown`): new writes get 503; queued and running writes may
finish within the grace period; then the running group is stopped before its commit (between
encoder slices; :class:`~hybridret.errors.WriteCancelledError`, 503) and the queued ones are refused.
The writer thread is a daemon thread: an encoder call that does not return cannot hold the process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import WriteCancelledError

__all__ = ["GroupStats", "WriteQueue"]

logger = logging.getLogger(__name__)

#: ``run_one(op, args, kw) -> result``: one write alone (the backend's ``write``)
RunOne = Callable[[str, tuple, dict], dict]
#: ``run_group(requests, cancel) -> one result or exception per request``
RunGroup = Callable[[list[Any], threading.Event], list[Any]]


@dataclass
class GroupStats:
    """Counters of a :class:`WriteQueue`: the requests written and the commits they took."""

    requests: int = 0
    commits: int = 0
    largest_group: int = 0
    cancelled: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, size: int) -> None:
        with self._lock:
            self.requests += size
            self.commits += 1
            self.largest_group = max(self.largest_group, size)

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "write_calls": self.commits, "largest_group": self.largest_group,
                    "cancelled": self.cancelled,
                    "requests_per_call": round(self.requests / self.commits, 3) if self.commits else None}


@dataclass
class _Write:
    op: str
    args: tuple
    kw: dict[str, Any]
    request: Any  # a WriteRequest, when the write may join a group
    keys: frozenset[str] | None
    rows: int
    future: asyncio.Future[Any]


class WriteQueue:
    """One queue, one writer thread; groups of writes when ``enabled`` and ``run_group`` is given."""

    def __init__(self, run_one: RunOne, run_group: RunGroup | None, *, enabled: bool = True, max_group: int = 256,
                 max_group_rows: int = 4096, housekeeping: Callable[[], None] | None = None) -> None:
        self.run_one = run_one
        self.run_group = run_group
        self.housekeeping = housekeeping  # after a group's answers: e.g. merging small segments
        self.enabled = enabled and run_group is not None
        self.max_group = max_group
        self.max_group_rows = max_group_rows
        self.stats = GroupStats()
        self.cancel = threading.Event()  # set: the running group stops before its commit
        self._pending: deque[_Write] = deque()
        self._running: threading.Thread | None = None
        self._closing = False

    def config(self) -> dict[str, Any]:
        return {"group_commit": self.enabled, "max_group": self.max_group, "max_group_rows": self.max_group_rows}

    async def submit(self, op: str, *args: Any, request: Any = None, keys: frozenset[str] | None = None,
                     rows: int = 1, **kw: Any) -> Any:
        """The result of the write (or its error raised), once its commit is durable. ``request``
        and ``keys``: the write may join a group (see :mod:`hybridret.group_commit`); ``rows``: its
        size, counted against ``max_group_rows``."""
        if self._closing:
            raise WriteCancelledError("the server is shutting down and takes no more writes; nothing was written: "
                                      "send it again when the server is back")
        loop = asyncio.get_running_loop()
        write = _Write(op, args, kw, request, keys if request is not None else None, max(1, rows), loop.create_future())
        self._pending.append(write)
        self._pump()
        return await write.future

    def _take(self) -> list[_Write]:
        while self._pending and self._pending[0].future.done():  # the client went away before it started
            self._pending.popleft()
        if not self._pending:
            return []
        first = self._pending.popleft()
        group = [first]
        if not self.enabled or first.keys is None:
            return group
        keys, rows = set(first.keys), first.rows
        while self._pending and len(group) < self.max_group:
            nxt = self._pending[0]
            if nxt.future.done():
                self._pending.popleft()
                continue
            if nxt.keys is None or not keys.isdisjoint(nxt.keys) or rows + nxt.rows > self.max_group_rows:
                break  # it runs next, after this commit: it sees every earlier write
            self._pending.popleft()
            group.append(nxt)
            keys |= nxt.keys
            rows += nxt.rows
        return group

    def _pump(self) -> None:
        if self._running is not None or self.cancel.is_set():
            return
        group = self._take()
        if not group:
            return
        loop = asyncio.get_running_loop()

        def work() -> None:
            try:
                outcomes = self._execute(group)
                loop.call_soon_threadsafe(self._settle, group, outcomes)  # answered: the commit is durable
                if self.housekeeping is not None and self.enabled and group[0].request is not None \
                        and not self.cancel.is_set():
                    try:
                        self.housekeeping()
                    except Exception:
                        logger.warning("housekeeping after a group commit failed", exc_info=True)
            finally:
                loop.call_soon_threadsafe(self._done)

        self._running = threading.Thread(target=work, name="hybridret-writer", daemon=True)
        self._running.start()

    def _execute(self, group: list[_Write]) -> list[Any]:
        try:
            if self.enabled and group[0].request is not None:
                outcomes = self.run_group([w.request for w in group], self.cancel)
            else:
                w = group[0]
                outcomes = [self.run_one(w.op, w.args, w.kw)]
        except BaseException as exc:  # noqa: BLE001 -- the group's error is each request's outcome
            outcomes = [exc] * len(group)
        self.stats.record(len(group))
        return outcomes

    def _done(self) -> None:
        self._running = None
        self._pump()

    def _settle(self, group: list[_Write], outcomes: list[Any]) -> None:
        for w, out in zip(group, outcomes):
            if w.future.done():
                continue
            if isinstance(out, BaseException):
                w.future.set_exception(out)
            else:
                w.future.set_result(out)

    # -- shutdown --
    def begin_shutdown(self) -> None:
        """Take no more writes; those queued and running go on (see :meth:`stop`)."""
        self._closing = True

    def stop(self) -> None:
        """Stop now: the running group stops before its commit, the queued writes are refused."""
        self._closing = True
        self.cancel.set()
        while self._pending:
            w = self._pending.popleft()
            if not w.future.done():
                self.stats.cancelled += 1
                w.future.set_exception(WriteCancelledError(
                    "the server shut down before this write started; nothing of it was written: send it again"))

    def busy(self) -> bool:
        return self._running is not None or bool(self._pending)

    def join(self, timeout: float) -> bool:
        """Wait (from any thread but the event loop's) for the running write; whether it ended."""
        thread = self._running
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()
