"""Micro-batching of concurrent searches.

Encoding a query costs about as much alone as it does inside a batch of 32 (the transformer's
fixed per-call cost dominates on short texts), so a server answering many clients at once wins by
encoding their queries together. :class:`MicroBatcher` collects the requests that arrive within a
short window (``window_ms``) and share the same search settings (k, method, filter, fusion,
candidates), runs one :meth:`Searcher.search` over all their queries in a worker thread, and hands
each request its own rows of the result. A batch is sealed early when it reaches ``max_batch``
queries; a batch whose window is over but finds every worker busy keeps taking requests until one
is free, so batches grow with the load instead of queueing up small. With ``enabled=False``
every request runs alone (the baseline the batching is measured against; see
``benchmarks/serve_load.py``).

:attr:`MicroBatcher.stats` counts the ``search`` calls made (each encodes its queries in one
encoder call) and the queries they carried, so the effect can be measured on a live server.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchStats", "MicroBatcher"]

logger = logging.getLogger(__name__)

#: ``run(queries, settings) -> one result per query``: what the batcher calls in a worker thread.
RunBatch = Callable[[list[str], dict[str, Any]], list[Any]]


@dataclass
class BatchStats:
    """Counters of a :class:`MicroBatcher` (read them through :meth:`MicroBatcher.snapshot_stats`)."""

    requests: int = 0
    queries: int = 0
    search_calls: int = 0
    largest_batch: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, requests: int, queries: int) -> None:
        with self._lock:
            self.requests += requests
            self.queries += queries
            self.search_calls += 1
            self.largest_batch = max(self.largest_batch, queries)

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "queries": self.queries, "search_calls": self.search_calls,
                    "largest_batch": self.largest_batch,
                    "queries_per_call": round(self.queries / self.search_calls, 3) if self.search_calls else None}


@dataclass
class _Pending:
    settings: dict[str, Any]
    items: list[tuple[list[str], asyncio.Future[list[Any]]]] = field(default_factory=list)
    size: int = 0
    due: bool = False  # window over (or full): send when a worker is free
    timer: asyncio.TimerHandle | None = None


class MicroBatcher:
    """Group concurrent requests with equal settings into one search call.

    At most ``workers`` search calls run at once (in a thread pool: FAISS and tantivy release the
    GIL, torch runs its own threads). A batch is sent when its window has passed or it holds
    ``max_batch`` queries, and a worker is free; while every worker is busy, arriving requests keep
    joining the waiting batch, so the busier the server, the larger its batches. Requests are only
    grouped when their ``key`` (a hashable form of the settings) is equal, so every request gets
    exactly what it would have got alone. When a grouped call fails, each request is retried
    alone, so one bad request never fails the others.
    """

    def __init__(self, run: RunBatch, *, window_ms: float = 3.0, max_batch: int = 32, enabled: bool = True,
                 workers: int = 2) -> None:
        if window_ms < 0:
            raise ValueError(f"batch window must be >= 0 ms, got {window_ms}")
        if max_batch < 1:
            raise ValueError(f"max batch must be >= 1, got {max_batch}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.run = run
        self.window = window_ms / 1000.0
        self.max_batch = max_batch
        self.enabled = enabled
        self.workers = workers
        self.stats = BatchStats()
        self._pool = ThreadPoolExecutor(max_workers=workers,
                                        thread_name_prefix="hybridret-search")
        self._open: dict[Hashable, _Pending] = {}  # per key: the batch that still takes requests
        self._queue: deque[_Pending] = deque()  # batches not yet running, oldest first
        self._busy = 0

    def config(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "window_ms": self.window * 1000.0, "max_batch": self.max_batch,
                "workers": self.workers}

    async def submit(self, queries: Sequence[str], key: Hashable, settings: dict[str, Any]) -> list[Any]:
        """The results of ``queries`` (one per query), searched with ``settings``."""
        queries = list(queries)
        loop = asyncio.get_running_loop()
        if not self.enabled:
            return await loop.run_in_executor(self._pool, self._call, queries, settings, 1)
        fut: asyncio.Future[list[Any]] = loop.create_future()
        batch = self._open.get(key)
        if batch is not None and batch.size + len(queries) > self.max_batch:
            self._seal(key)  # full: it goes at the next free worker; this request starts the next batch
            batch = None
        if batch is None:
            batch = self._open[key] = _Pending(settings)
            batch.timer = loop.call_later(self.window, self._due, batch)
            self._queue.append(batch)
        batch.items.append((queries, fut))
        batch.size += len(queries)
        if batch.size >= self.max_batch:
            self._seal(key)
        self._dispatch()
        return await fut

    def _due(self, batch: _Pending) -> None:
        batch.due = True  # its window is over; it still takes requests until a worker is free
        self._dispatch()

    def _seal(self, key: Hashable) -> None:
        batch = self._open.pop(key)
        batch.due = True
        if batch.timer is not None:
            batch.timer.cancel()

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._busy < self.workers:
            batch = next((b for b in self._queue if b.due), None)
            if batch is None:
                return
            self._queue.remove(batch)
            for key, open_batch in list(self._open.items()):
                if open_batch is batch:
                    del self._open[key]
            if batch.timer is not None:
                batch.timer.cancel()
            self._busy += 1
            loop.create_task(self._execute(batch)).add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._busy -= 1
        self._dispatch()

    async def _execute(self, pending: _Pending) -> None:
        loop = asyncio.get_running_loop()
        items = [(q, f) for q, f in pending.items if not f.cancelled()]
        if not items:
            return
        allq = [q for qs, _ in items for q in qs]
        try:
            results = await loop.run_in_executor(self._pool, self._call, allq, pending.settings, len(items))
        except BaseException as exc:  # noqa: BLE001 -- each request gets its own outcome below
            if len(items) == 1:
                _settle(items[0][1], exc=exc)
                return
            logger.debug("a batch of %d requests failed (%s); retrying each alone", len(items), exc)
            for qs, f in items:
                try:
                    _settle(f, await loop.run_in_executor(self._pool, self._call, qs, pending.settings, 1))
                except BaseException as one:  # noqa: BLE001
                    _settle(f, exc=one)
            return
        start = 0
        for qs, f in items:
            _settle(f, results[start:start + len(qs)])
            start += len(qs)

    def _call(self, queries: list[str], settings: dict[str, Any], requests: int) -> list[Any]:
        out = self.run(queries, settings)
        self.stats.record(requests, len(queries))
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _settle(fut: asyncio.Future[list[Any]], value: list[Any] | None = None, *, exc: BaseException | None = None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)  # type: ignore[arg-type]
