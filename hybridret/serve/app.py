"""The HTTP server: ``hybridret serve DIR``.

Built on FastAPI + uvicorn because that is the Python ecosystem's default ASGI stack (what RAG
frameworks and their users already run), the request/response models below are Pydantic models
that FastAPI both validates and publishes as OpenAPI (interactive docs at ``/docs`` for free), and
uvicorn brings a production-grade HTTP/1.1 server with graceful shutdown on SIGTERM/SIGINT.

Reads go to the index's :class:`~hybridret.search.searcher.Searcher` (thread-safe), through the
:class:`~hybridret.serve.batching.MicroBatcher`. Writes go through the one
:class:`~hybridret.retriever.HybridRetriever` of the process, one commit at a time, concurrent
adds, upserts and deletes grouped into one commit (:mod:`hybridret.serve.writes`); each is
committed atomically before it is acknowledged, and the searcher moves to the new commit before the
response is sent, so a client that got its acknowledgement finds its documents in the next search.
A write's documents are counted (rows, tokens) and refused with 413 over the server's limits before
anything is encoded (:mod:`hybridret.serve.limits`). On SIGTERM/SIGINT the server stops accepting,
lets running work finish for half of ``shutdown_timeout``, then stops a write still encoding before
its commit (503 to its clients), and exits 0 within about ``shutdown_timeout`` seconds.
A sharded index (``DIR/shards.json``, ``hybridret serve DIR --ray``) is served the same way through a
:class:`~hybridret.distributed.searcher.ShardedSearcher` (see :mod:`hybridret.serve.backends`); a shard
that cannot answer gets a 503 naming it.

Errors are JSON ``{"error": {"type": ..., "message": ...}}`` with a 4xx status for bad input
(422 malformed request, 400 rejected by the library, 401 API key, 404 unknown ids, 409 an id that
exists already or the index locked by another process, 413 body or work over a limit, 503 a shard that
cannot answer or a write stopped by a shutdown); a 500 only for a server fault, never with a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_serializer,
    model_validator,
)
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._version import __version__
from ..errors import (
    ConfigError,
    CorpusFormatError,
    DocumentNotFoundError,
    HybridRetError,
    IndexExistsError,
    IndexLockedError,
    IndexReadOnlyError,
    WorkLimitError,
    WriteCancelledError,
)
from ..filters import parse_filter
from ..fusion.config import FusionConfig
from ..index.expiry import check_ttl
from ..methods import check_method, method_names
from ..retrievers import REGISTRY
from ..search.request import check_queries
from ..types import SearchBackend, result_json
from .auth import key_matches
from .backends import ServeBackend, load_backend
from .batching import MicroBatcher
from .docs import install_docs
from .limits import DEFAULT_MAX_CHUNKS, DEFAULT_MAX_TOKENS, WorkCounter, check_work
from .writes import WriteQueue

if TYPE_CHECKING:  # pragma: no cover
    from ..retriever import HybridRetriever

__all__ = ["MAX_BODY_BYTES", "ServeConfig", "create_app", "serve"]

logger = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_K = 1000
MAX_QUERY_CHARS = 4096
MAX_QUERIES = 256
MAX_DOCUMENTS = 10_000
MAX_IDS = 100_000
MAX_LIST = 1000  # documents per page of POST /documents/list


def _method_enum(schema: dict[str, Any]) -> None:
    """The OpenAPI schema of ``method``: the methods there are when the schema is generated."""
    schema["enum"] = list(method_names(REGISTRY))


@dataclass
class ServeConfig:
    """Server settings (the ``hybridret serve`` options)."""

    api_key: str | None = None
    protect_reads: bool = False
    batching: bool = True
    batch_window_ms: float = 3.0
    max_batch: int = 32
    refresh_every: float | None = None
    # before each read, a stat of the manifest: a commit by another process (the CLI, a script) is served
    # from the next request on; False: only the server's own writes (and refresh_every) change what it serves
    auto_refresh: bool = True
    max_body_bytes: int = MAX_BODY_BYTES
    search_threads: int = 2
    rerank: str | None = None  # a local cross-encoder folder requests may ask for (``"rerank": true``)
    # writes: concurrent adds / upserts / deletes by id grouped into one commit (False: one commit each)
    group_commit: bool = True
    max_group: int = 256  # requests per group commit
    max_group_rows: int = 4096  # documents (chunks) per group commit; a larger request commits alone
    # per-request work (checked before anything is encoded; 413 over either)
    max_request_chunks: int = DEFAULT_MAX_CHUNKS  # rows one write request makes: chunks, or documents
    max_request_tokens: int = DEFAULT_MAX_TOKENS  # tokens the encoder reads for one write request
    shutdown_timeout: float = 10.0  # seconds from SIGTERM to exit: writes get half of it to commit

    def __post_init__(self) -> None:
        flags = {"max_batch": "--max-batch", "max_request_chunks": "--max-request-chunks",
                 "max_request_tokens": "--max-request-tokens", "max_body_bytes": "--max-body-mb",
                 "shutdown_timeout": "--shutdown-timeout"}

        def named(name: str) -> str:
            return f"server setting {name}" + (f" (hybridret serve {flags[name]})" if name in flags else "")

        for name in ("max_batch", "max_group", "max_group_rows", "max_request_chunks", "max_request_tokens",
                     "max_body_bytes", "search_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{named(name)} must be a positive integer, got {value!r}")
        if not (isinstance(self.shutdown_timeout, (int, float)) and 0 < self.shutdown_timeout <= 3600):
            raise ConfigError(f"{named('shutdown_timeout')} must be in (0, 3600] seconds, got {self.shutdown_timeout!r}")


# -- request / response models ---------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchRequest(_Strict):
    """One query (``query``) or a batch (``queries``), and how to search."""

    query: StrictStr | None = Field(None, max_length=MAX_QUERY_CHARS, description="one query")
    queries: list[StrictStr] | None = Field(None, min_length=1, max_length=MAX_QUERIES,
                                            description=f"a batch of up to {MAX_QUERIES} queries")
    k: StrictInt = Field(10, ge=1, le=MAX_K, description="hits per query")
    method: StrictStr = Field("hybrid", json_schema_extra=_method_enum,
                              description="hybrid (the index's tuned fusion, else GQR), a retriever (dense, sparse, "
                                          "bm25, or one registered in the server's process) or a fusion method "
                                          "(linear, rrf, gqr)")
    filter: Union[dict[str, Any], StrictStr, None] = Field(
        None, description='metadata filter applied before top-k, e.g. {"source": "wiki", "year": {"$gte": 2020}}')
    fusion: dict[str, Any] | None = Field(None, description="fusion settings (see hybridret.fusion.config.FusionConfig)")
    candidates: StrictInt | None = Field(None, ge=1, le=10_000, description="per-retriever depth of fused methods")
    with_text: StrictBool = Field(True, description="return titles and texts with the hits")
    offset: StrictInt = Field(0, ge=0, le=10_000, description="hits (grouped: groups) skipped: pages")
    group_by: StrictStr | None = Field(None, min_length=1, description="group hits by this metadata field (e.g. "
                                                                       "parent_id) and return the top-k groups")
    group_size: StrictInt | None = Field(None, ge=1, le=100, description="with group_by: chunks per group (3)")
    rerank: StrictBool = Field(False, description="rerank with the server's cross-encoder (serve --rerank DIR)")
    rerank_depth: StrictInt | None = Field(None, ge=1, le=1000, description="with rerank: hits reranked (50)")
    relevance: StrictBool = Field(False, description="also each hit's calibrated relevance in [0, 1], thresholdable "
                                                     "(docs/relevance.md)")
    diversify: float | None = Field(None, ge=0, le=1, strict=True, description="MMR's lambda: reorder the hits (grouped: the "
                                    "documents) so they are less alike; 1 = pure relevance, 0.5-0.9 typical")

    def stage_options(self, reranker: str | None) -> dict[str, Any]:
        """The library's page / grouping / rerank keywords of this request."""
        if self.rerank and reranker is None:
            raise ConfigError("this server has no reranker: start it with hybridret serve --rerank DIR")
        if self.rerank_depth is not None and not self.rerank:
            raise ConfigError("rerank_depth goes with \"rerank\": true")
        out = {"offset": self.offset, "group_by": self.group_by, "group_size": self.group_size,
               "rerank": reranker if self.rerank else None, "rerank_depth": self.rerank_depth}
        if self.relevance:  # only when asked: a backend without relevance still serves the rest
            out["relevance"] = True
        if self.diversify is not None:
            out["diversify"] = self.diversify
        return out

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        return check_method(value, REGISTRY)  # the registry now: retrievers registered after import count

    @model_validator(mode="after")
    def _one_of(self) -> SearchRequest:
        if (self.query is None) == (self.queries is None):
            raise ValueError("give either 'query' (one string) or 'queries' (a list of strings)")
        for i, q in enumerate(self.texts()):
            if not q.strip():
                raise ValueError("the query is empty" if self.query is not None else f"query #{i} is empty")
            if len(q) > MAX_QUERY_CHARS:
                raise ValueError(f"query #{i} is longer than {MAX_QUERY_CHARS} characters")
        return self

    def texts(self) -> list[str]:
        return [self.query] if self.query is not None else list(self.queries or [])


class MatchedTermOut(BaseModel):
    term: str
    query_weight: float
    doc_weight: float
    contribution: float
    expansion: bool = Field(description="the term is absent from the document's text (a SPLADE expansion)")
    share: float = Field(0.0, description="contribution / the hit's learned-sparse score (the sum of every matched "
                                          "term's contribution); the page shows expansion terms of share >= 0.05")


class SnippetOut(BaseModel):
    text: str
    start: int = Field(description="offset of the snippet in the hit's text")
    end: int
    highlights: list[list[int]] = Field(description="[start, end] of each matched word, within the snippet")


class HitOut(BaseModel):
    id: str
    rank: int
    score: float | None = Field(description="the fused (or single retriever's) score")
    scores: dict[str, float] = Field(description="each retriever's exact score of this hit")
    title: str | None = None
    text: str | None = None
    metadata: dict[str, Any] = {}
    matched_terms: list[MatchedTermOut] = []
    snippets: list[SnippetOut] = Field([], description="the best window of the text, matched words marked")
    group: Union[StrictStr, StrictInt, float, StrictBool, None] = Field(None, description="grouped: the hit's group")
    relevance: float | None = Field(None, description="only with \"relevance\": true: the calibrated probability "
                                                      "that the hit is relevant, in [0, 1]")

    @model_serializer(mode="wrap")
    def _without_absent_relevance(self, handler: SerializerFunctionWrapHandler):  # no return type: keeps the schema
        """A hit of a search that did not ask for relevance has no ``"relevance"`` key (not ``null``)."""
        out = handler(self)
        if out.get("relevance") is None:
            out.pop("relevance", None)
        return out


class GroupOut(BaseModel):
    key: Union[StrictStr, StrictInt, float, StrictBool]
    rank: int
    score: float | None
    size: int = Field(description="how many of the hits (which follow in group order) are this group's")


class QueryResult(BaseModel):
    query: str
    hits: list[HitOut]
    groups: list[GroupOut] | None = Field(None, description="grouped searches: the groups, best first")
    answerability: float | None = Field(None, description="only with \"relevance\": true: the calibrated probability "
                                                          "that the index holds any relevant document for the query, "
                                                          "in [0, 1] (low: nothing relevant here; docs/relevance.md)")

    @model_serializer(mode="wrap")
    def _without_absent_answerability(self, handler: SerializerFunctionWrapHandler):  # no return type: keeps the schema
        """A search that did not ask for relevance has no ``"answerability"`` key (not ``null``)."""
        out = handler(self)
        if out.get("answerability") is None:
            out.pop("answerability", None)
        return out


class SearchResponse(BaseModel):
    method: str
    resolved: str = Field(description="what ran, e.g. hybrid:gqr")
    k: int = Field(description="hits per query at most: the k asked for, cut to the live documents")
    results: list[QueryResult] = Field(description="one entry per query, in the order given")
    took_ms: float


class DocumentIn(_Strict):
    id: StrictStr | StrictInt = Field(description="unique document id")
    text: StrictStr
    title: StrictStr | None = None
    metadata: dict[str, Any] | None = None

    def to_library(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "text": self.text}
        if self.title is not None:
            out["title"] = self.title
        if self.metadata is not None:
            out["metadata"] = self.metadata
        return out


class DocumentsRequest(_Strict):
    documents: list[DocumentIn] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    upsert: StrictBool = Field(False, description="replace documents whose id exists (else that is an error)")
    ttl: Any = Field(None, description="documents without an expires_at expire this many seconds from now (a "
                                       "positive, finite number)")

    @field_validator("ttl", mode="before")
    @classmethod
    def _ttl(cls, value: Any) -> float | None:
        return check_ttl(value)  # the library's check: "5", true, NaN or Infinity are refused alike


class DeleteRequest(_Strict):
    ids: list[StrictStr] | None = Field(None, min_length=1, max_length=MAX_IDS,
                                        description="document ids (a chunked document's id deletes its chunks)")
    filter: Union[dict[str, Any], StrictStr, None] = Field(
        None, description='delete every document matching this metadata filter, e.g. {"source": "old-wiki"}')
    dry_run: StrictBool = Field(False, description="delete nothing; 'deleted' and 'matched' say what would go")
    ignore_missing: StrictBool = Field(False, description="delete the known ids, report the unknown ones")

    @model_validator(mode="after")
    def _ids_or_filter(self) -> DeleteRequest:
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give either 'ids' or 'filter'")
        return self


class ListRequest(_Strict):
    """Every stored document matching a filter (not the top-k of a query), a page at a time."""

    filter: Union[dict[str, Any], StrictStr, None] = Field(
        None, description='metadata filter, e.g. {"source": "wiki"}; none: every document')
    offset: StrictInt = Field(0, ge=0, description="matching documents skipped (in written order)")
    limit: StrictInt = Field(100, ge=0, le=MAX_LIST, description=f"documents in this page, at most {MAX_LIST}; "
                                                                  "0: only the count")


class StoredDocumentOut(BaseModel):
    id: str
    title: str
    text: str
    metadata: dict[str, Any]


class ListResponse(BaseModel):
    documents: list[StoredDocumentOut] = Field(description="this page, in the order the documents were written")
    total: int = Field(description="every document matching the filter (pages: offset += limit while below it)")
    offset: int
    commit: int = Field(description="the commit listed: a page of another commit means the index changed between pages")


class WriteResponse(BaseModel):
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    skipped_empty: int = 0
    encoded: int = 0
    missing: list[str] = []
    matched: list[str] | None = Field(None, description="a dry-run delete: the ids it would delete")
    documents: dict[str, int] = Field({}, description="in an index of chunks: the counts above in documents "
                                                      "(added, updated, unchanged, deleted)")
    commit: int | None = None
    commits: dict[str, int | None] | None = Field(None, description="sharded index: the commit each touched shard wrote")
    num_docs: int = Field(description="live documents after this write")
    took_ms: float


class HealthResponse(BaseModel):
    status: str
    num_docs: int = Field(description="live rows: documents, or chunks in an index of chunks")
    num_documents: int | None = Field(None, description="in an index of chunks: the documents they belong to")
    num_chunks: int | None = Field(None, description="in an index of chunks: the live chunks")
    commit: int | None
    commits: dict[str, int] | None = Field(None, description="sharded index: each shard's commit")


class ErrorBody(BaseModel):
    type: str
    message: str
    ids: list[str] | None = None
    shards: list[str] | None = Field(None, description="the shards that could not answer (503)")


class ErrorResponse(BaseModel):
    error: ErrorBody


_ERRORS = {400: {"model": ErrorResponse}, 401: {"model": ErrorResponse}, 413: {"model": ErrorResponse},
           422: {"model": ErrorResponse}}


# -- errors ----------------------------------------------------------------------------------------
class ApiError(Exception):
    def __init__(self, status: int, type: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.type, self.message, self.extra = status, type, message, extra


def _error(status: int, type: str, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"type": type, "message": message, **extra}}, status_code=status, headers=headers)


def _shard_error(exc: HybridRetError) -> bool:
    """A shard that could not answer (imported only once the distributed path was loaded)."""
    import sys

    shard = sys.modules.get("hybridret.distributed.shard")
    return shard is not None and isinstance(exc, (shard.ShardUnavailableError, shard.ShardStaleError))


def _status_of(exc: HybridRetError) -> int:
    if _shard_error(exc):
        return 503
    if isinstance(exc, DocumentNotFoundError):
        return 404
    if isinstance(exc, WorkLimitError):
        return 413
    if isinstance(exc, WriteCancelledError):
        return 503
    if isinstance(exc, (IndexLockedError, IndexExistsError)):
        return 409  # another process writes the index / the document id exists (use upsert)
    if isinstance(exc, IndexReadOnlyError):
        return 503
    if isinstance(exc, (ConfigError, CorpusFormatError)):
        return 400
    return 500


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = [str(x) for x in err.get("loc", ())][1:] if err.get("loc", ("",))[0] == "body" else \
            [str(x) for x in err.get("loc", ())]
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        kind = err.get("type")
        if kind == "json_invalid":
            where = f" at position {loc[0]}" if loc else ""
            msg, loc = f"the request body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')}{where})", []
        elif kind == "missing" and not loc:
            msg = "the request needs a JSON body (Content-Type: application/json)"
        elif kind in ("model_attributes_type", "dict_type", "model_type") and not loc:
            msg = "the request body must be a JSON object (sent with Content-Type: application/json)"
        parts.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f" (and {more} more problems)" if more > 0 else "")


# -- body size limit -------------------------------------------------------------------------------
class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413 before the app sees it."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reject(send, 400, "bad_request", "the Content-Length header is not a number")
                    return
                if declared > self.limit:
                    await self._too_large(send)
                    return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Callable[[Any], Awaitable[None]]) -> None:
        await self._reject(send, 413, "payload_too_large",
                           f"the request body is larger than {self.limit} bytes ({self.limit / 2**20:.0f} MiB); "
                           "send fewer documents per request")

    async def _reject(self, send: Callable[[Any], Awaitable[None]], status: int, type: str, message: str) -> None:
        body = json.dumps({"error": {"type": type, "message": message}}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


# -- the service -----------------------------------------------------------------------------------
class Service:
    """The state behind the app: the backend (one index or a sharded one: reads and writes), the batcher."""

    def __init__(self, backend: ServeBackend, config: ServeConfig) -> None:
        self.backend = backend
        self.config = config
        self.write_lock = threading.Lock()
        self.batcher = MicroBatcher(self._run, window_ms=config.batch_window_ms, max_batch=config.max_batch,
                                    enabled=config.batching, workers=config.search_threads)
        self.started = time.time()
        self.writes = 0
        group = getattr(backend, "write_group", None)
        self.queue = WriteQueue(self._write_one, group if callable(group) else None, enabled=config.group_commit,
                                max_group=config.max_group, max_group_rows=config.max_group_rows,
                                housekeeping=getattr(backend, "housekeeping", None))
        self._work: WorkCounter | None = None

    @property
    def retriever(self) -> HybridRetriever | None:
        """The :class:`~hybridret.retriever.HybridRetriever` of a single index (``None`` when sharded)."""
        return getattr(self.backend, "retriever", None)

    @property
    def searcher(self) -> SearchBackend:
        """The backend's searcher: a :class:`~hybridret.search.searcher.Searcher` or a sharded one."""
        return self.backend.searcher

    def fresh(self) -> None:
        """Before a read: pick up other processes' commits (``auto_refresh``; one ``stat`` when nothing changed)."""
        if self.config.auto_refresh:
            check = getattr(self.backend, "refresh_if_changed", None)
            if check is not None:
                check()

    def expand_ids(self, values: list[str]) -> list[str]:
        """``GET /documents`` ids: each value, split at commas (``ids=a,b``) unless the whole value is a
        stored id (ids may hold commas)."""
        out: list[str] = []
        for value in values:
            if "," in value and self.backend.get([value])[0] is None:
                out += [part.strip() for part in value.split(",") if part.strip()]
            else:
                out.append(value)
        return out

    def _run(self, queries: list[str], settings: dict[str, Any]) -> list[dict[str, Any]]:
        self.fresh()
        with_text = settings["with_text"]
        hits = self.backend.search(queries, settings["k"], method=settings["method"], filter=settings["filter"],
                                   fusion=settings["fusion"], candidates=settings["candidates"],
                                   **settings.get("stages", {}))
        # k cut to the live documents, as Hits are (grouped: the groups)
        width = int(hits.ids.shape[1] if hits.group_keys is None else hits.group_keys.shape[1])
        return [{"resolved": hits.method, "k": width, **result_json(hits, i, with_text=with_text)}
                for i in range(len(hits))]

    def _write_one(self, op: str, args: tuple, kw: dict[str, Any]) -> dict[str, Any]:
        with self.write_lock:  # one writer; the commit is atomic, and the searcher refreshes inside
            return self.backend.write(op, *args, **kw)

    async def write(self, op: str, *args: Any, request: Any = None, keys: frozenset[str] | None = None,
                    rows: int = 1, **kw: Any) -> dict[str, Any]:
        """Queue a write (grouped with others when ``request`` is given) and answer once it is committed."""
        start = time.perf_counter()
        out = dict(await self.queue.submit(op, *args, request=request, keys=keys, rows=rows, **kw))
        self.writes += 1
        out["took_ms"] = round((time.perf_counter() - start) * 1000, 3)
        logger.info("%s: %s", op, {k: v for k, v in out.items() if v and k not in ("missing", "took_ms")})
        return out

    def check_work(self, docs: list[Any]) -> int:
        """The rows ``docs`` make (chunks or documents); :class:`WorkLimitError` over a limit."""
        if self._work is None:
            retriever = self.retriever
            chunking = retriever.manifest.get("chunking") if retriever is not None else None
            self._work = WorkCounter(retriever.encoder if retriever is not None else None, chunking)
        work = check_work(self._work, docs, max_chunks=self.config.max_request_chunks,
                          max_tokens=self.config.max_request_tokens)
        return work.rows

    def close(self) -> None:
        """After the HTTP server stopped: stop the writes still running (before their commit) and the searches."""
        if self.queue.busy():
            self.queue.stop()
            if not self.queue.join(timeout=5.0):
                logger.warning("a write was still encoding at shutdown; it stopped without a commit (the index "
                               "keeps its last commit)")
        with self.write_lock:
            self.batcher.close()


def create_app(index: str | Path | SearchBackend, config: ServeConfig | None = None) -> FastAPI:
    """The FastAPI app over an index directory (sharded when it holds ``shards.json``), an already
    loaded :class:`~hybridret.retriever.HybridRetriever` (e.g. to share its models between apps), or
    a :class:`~hybridret.distributed.searcher.ShardedSearcher` / :mod:`~hybridret.serve.backends` backend."""
    config = config or ServeConfig()
    backend = load_backend(index)
    service = Service(backend, config)
    if config.refresh_every is not None:
        backend.refresh_every(config.refresh_every)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        await run_in_threadpool(service.close)
        await run_in_threadpool(backend.close)
        logger.info("server stopped; %s", backend.describe())

    app = FastAPI(title="hybridret", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Hybrid dense + learned-sparse retrieval over one index. Search page at `/`.")
    install_docs(app, title="hybridret")  # /docs from local files: FastAPI's loads Swagger UI from a CDN
    app.state.service = service
    bearer = HTTPBearer(auto_error=False, description="the key in the server's --api-key-file")

    def _check(creds: HTTPAuthorizationCredentials | None, needed: bool) -> None:
        if not needed or config.api_key is None:
            return
        header = f"{creds.scheme} {creds.credentials}" if creds is not None else None
        if not key_matches(header, config.api_key):
            raise ApiError(401, "unauthorized", "a valid API key is required: send the header 'Authorization: "
                                                "Bearer KEY' with the key from the server's --api-key-file")

    def read_auth(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        _check(creds, config.protect_reads)

    def write_auth(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        _check(creds, True)

    # -- error handlers --
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _error(exc.status, exc.type, exc.message, headers=headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "validation_error", _validation_message(exc))

    @app.exception_handler(HybridRetError)
    async def _library(request: Request, exc: HybridRetError) -> JSONResponse:
        status = _status_of(exc)
        if status >= 500:
            logger.error("%s %s failed: %s", request.method, request.url.path, exc)
        extra: dict[str, Any] = {"ids": list(exc.ids)} if isinstance(exc, DocumentNotFoundError) else {}
        if getattr(exc, "shards", None):
            extra["shards"] = list(exc.shards)  # type: ignore[attr-defined]
        cause = getattr(exc, "cause", None)  # an error raised inside a shard actor: its own message, no remote traceback
        kind, message = (type(cause).__name__, str(cause)) if isinstance(cause, HybridRetError) else \
            (type(exc).__name__, str(exc))
        return _error(status, kind, message.replace("\n", " "), **extra)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = f"no such endpoint: {request.method} {request.url.path}" if exc.status_code == 404 else \
            f"{request.method} is not allowed on {request.url.path}" if exc.status_code == 405 else str(exc.detail)
        return _error(exc.status_code, kind, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("%s %s: internal error", request.method, request.url.path)
        return _error(500, "internal_error", "internal server error (see the server's log)")

    # -- reads --
    @app.post("/search", response_model=SearchResponse, responses=_ERRORS, dependencies=[Depends(read_auth)],
              summary="search with one query or a batch")
    async def search(req: SearchRequest) -> dict[str, Any]:
        start = time.perf_counter()
        texts = check_queries(req.texts())  # lone surrogates from JSON escapes -> ConfigError (400)
        filt = parse_filter(req.filter)
        fusion = None
        if req.fusion is not None:
            try:
                fusion = FusionConfig.from_dict(req.fusion)
            except HybridRetError:
                raise
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                raise ConfigError(f"invalid fusion settings: {exc}") from None
        stages = req.stage_options(config.rerank)
        key = (req.k, req.method, json.dumps(req.filter, sort_keys=True), json.dumps(req.fusion, sort_keys=True),
               req.candidates, req.with_text, json.dumps(stages, sort_keys=True))
        settings = {"k": req.k, "method": req.method, "filter": filt, "fusion": fusion,
                    "candidates": req.candidates, "with_text": req.with_text, "stages": stages}
        results = await service.batcher.submit(texts, key, settings)
        resolved = results[0]["resolved"] if results else req.method
        width = min([int(r.get("k", req.k)) for r in results] or [req.k])
        return {"method": req.method, "resolved": resolved, "k": width,
                "results": [{"query": q, **{n: v for n, v in r.items() if n not in ("resolved", "k")}}
                            for q, r in zip(texts, results)],
                "took_ms": round((time.perf_counter() - start) * 1000, 3)}

    @app.get("/health", response_model=HealthResponse, response_model_exclude_unset=True,
             summary="liveness (never needs a key)")
    async def health() -> dict[str, Any]:
        await run_in_threadpool(service.fresh)
        return {"status": "ok", **backend.health()}

    @app.get("/info", dependencies=[Depends(read_auth)], responses=_ERRORS,
             summary="counts, encoders, fusion configuration, segments, batching statistics")
    async def info() -> dict[str, Any]:
        await run_in_threadpool(service.fresh)
        return {
            "version": __version__, **backend.info(), "methods": list(method_names(REGISTRY)),
            "batching": {**service.batcher.config(), **service.batcher.stats.to_dict()},
            "writes_grouped": {**service.queue.config(), **service.queue.stats.to_dict()},
            "auth": {"writes": config.api_key is not None, "reads": config.api_key is not None and config.protect_reads},
            "limits": {"k": MAX_K, "query_chars": MAX_QUERY_CHARS, "queries": MAX_QUERIES,
                       "documents": MAX_DOCUMENTS, "list_page": MAX_LIST, "body_bytes": config.max_body_bytes,
                       "request_chunks": config.max_request_chunks, "request_tokens": config.max_request_tokens},
            "writes": service.writes, "uptime_s": round(time.time() - service.started, 3),
        }

    @app.get("/documents", dependencies=[Depends(read_auth)], responses=_ERRORS,
             summary="stored documents by id (null for ids not in the index): /documents?ids=a&ids=b or ?ids=a,b")
    async def get_documents(ids: list[str] = Query(..., description="document ids, repeated (ids=a&ids=b) or "
                                                                    "comma-separated (ids=a,b); a value that is "
                                                                    "itself a stored id is taken whole"),
                            chunks: bool = Query(False, description="in an index of chunks: a document (given by "
                                                                    "its id, re-assembled) with its chunks as stored")
                            ) -> dict[str, Any]:
        def lookup() -> list[dict[str, Any] | None]:
            service.fresh()
            wanted = service.expand_ids(ids)
            if len(wanted) > MAX_DOCUMENTS:
                raise ApiError(400, "invalid_request", f"at most {MAX_DOCUMENTS} ids per request, got {len(wanted)}")
            return backend.get(wanted, chunks=True) if chunks else backend.get(wanted)

        return {"documents": await run_in_threadpool(lookup)}

    @app.post("/documents/list", response_model=ListResponse, dependencies=[Depends(read_auth)], responses=_ERRORS,
              summary="every document matching a metadata filter (not a search: no query, no top-k), a page at a time")
    async def list_documents(req: ListRequest) -> dict[str, Any]:
        filt = parse_filter(req.filter)  # a malformed filter: 400 naming where

        def page() -> dict[str, Any]:
            service.fresh()
            return backend.documents(filt, offset=req.offset, limit=req.limit)

        return await run_in_threadpool(page)

    # -- writes --
    @app.post("/documents", response_model=WriteResponse, response_model_exclude_unset=True, responses=_ERRORS,
              dependencies=[Depends(write_auth)],
              summary="add documents (or upsert them); answered after the commit")
    async def add_documents(req: DocumentsRequest) -> dict[str, Any]:
        from ..group_commit import WriteRequest, conflict_keys

        rows = await run_in_threadpool(service.check_work, req.documents)  # 413 before anything is encoded
        docs = [d.to_library() for d in req.documents]
        op = "upsert" if req.upsert else "add"
        extra = {"ttl": req.ttl} if req.ttl is not None else {}
        return await service.write(op, docs, show_progress=False, **extra,
                                   request=WriteRequest(op, documents=docs, ttl=req.ttl),
                                   keys=conflict_keys([d.id for d in req.documents]), rows=rows)

    @app.delete("/documents", response_model=WriteResponse, response_model_exclude_unset=True,
                dependencies=[Depends(write_auth)],
                responses={**_ERRORS, 404: {"model": ErrorResponse}},
                summary="delete documents by id (unknown ids: 404 and nothing deleted, unless ignore_missing) "
                        "or every document matching a filter; one commit, 'deleted' is the count")
    async def delete_documents(req: DeleteRequest) -> dict[str, Any]:
        from ..group_commit import WriteRequest, conflict_keys

        missing = "ignore" if req.ignore_missing else "error"
        if req.filter is None and not req.dry_run:
            return await service.write("delete", req.ids, missing=missing,
                                       request=WriteRequest("delete", ids=list(req.ids or []), missing=missing),
                                       keys=conflict_keys(req.ids or []), rows=len(req.ids or []))
        return await service.write("delete", req.ids, filter=req.filter, dry_run=req.dry_run, missing=missing)

    @app.post("/purge", response_model=WriteResponse, response_model_exclude_unset=True, responses=_ERRORS,
              dependencies=[Depends(write_auth)],
              summary="delete the documents whose expires_at has passed (searches never return them anyway)")
    async def purge() -> dict[str, Any]:
        return await service.write("purge")

    @app.post("/compact", response_model=WriteResponse, response_model_exclude_unset=True, responses=_ERRORS,
              dependencies=[Depends(write_auth)],
              summary="merge segments and drop deleted documents (every shard's, on a sharded index)")
    async def compact() -> dict[str, Any]:
        return await service.write("compact", show_progress=False)

    # -- the search page --
    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    return app


def serve(index: str | Path | SearchBackend, *, host: str = "127.0.0.1", port: int = 8000, config: ServeConfig | None = None,
          log_level: str = "info") -> None:
    """Load the index and its models, then serve until SIGINT/SIGTERM. Shutting down, the server takes
    no new connections or writes, lets in-flight requests finish (writes: for half of
    ``config.shutdown_timeout``, then a write still encoding stops before its commit and its clients
    get 503), and returns within about ``shutdown_timeout`` seconds; on SIGTERM it returns normally
    (``hybridret serve`` exits 0); after SIGINT, uvicorn raises the interrupt again once the same shutdown is done."""
    import uvicorn

    config = config or ServeConfig()
    if config.api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s without --api-key-file: anyone who can reach it can change the index", host)
    app = create_app(index, config)
    service: Service = app.state.service
    logger.info("serving %s%s on http://%s:%d (search page /, API docs /docs; batching %s; group commit %s)",
                getattr(index, "root", index),
                " (sharded, on Ray)" if getattr(service.backend, "sharded", False) else "",
                host if ":" not in host else f"[{host}]", port,
                f"on, {config.batch_window_ms:g} ms window, up to {config.max_batch}" if config.batching else "off",
                "on" if service.queue.enabled else "off")

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            """Stop accepting; writes get half the timeout to commit, then the running one stops before its
            commit and the queued ones are refused (503); then uvicorn's own shutdown, in the time left."""
            loop = asyncio.get_running_loop()
            deadline = loop.time() + config.shutdown_timeout
            for listener in self.servers:
                listener.close()
            queue = service.queue
            queue.begin_shutdown()  # new writes: 503
            while queue.busy() and loop.time() < deadline - config.shutdown_timeout / 2:
                await asyncio.sleep(0.05)
            if queue.busy():
                logger.info("shutting down: stopping the writes still running or queued (nothing of them is committed)")
                queue.stop()
                while queue.busy() and loop.time() < deadline - 0.5:
                    await asyncio.sleep(0.05)
            self.config.timeout_graceful_shutdown = max(1, round(deadline - loop.time()))
            await super().shutdown(sockets)

    server = Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                   timeout_graceful_shutdown=max(1, round(config.shutdown_timeout)), lifespan="on"))
    terminated: list[int] = []

    def on_sigterm(sig: int, frame: Any) -> None:  # uvicorn raises the signal again after its shutdown: it ends here
        terminated.append(sig)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main else None
    try:
        asyncio.run(server.serve())
    except SystemExit as exc:
        # in a Ray driver (a sharded index) Ray's handler may turn SIGTERM into exit status 15, but the shutdown
        # was complete (the shard actors were stopped): return normally
        if not (getattr(service.backend, "sharded", False) and exc.code == signal.SIGTERM):
            raise
        terminated.append(signal.SIGTERM)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    if terminated:
        logger.info("stopped on SIGTERM")
