"""A client for ``hybridret serve``: the :class:`~hybridret.search.searcher.Searcher` interface over HTTP
(a :class:`~hybridret.types.SearchBackend`).

>>> from hybridret.client import Client
>>> with Client("http://127.0.0.1:8000", api_key=None) as client:
...     hits = client.search(["a question"], k=5, method="hybrid", filter={"source": "wiki"})
...     hits.ids, hits.scores, hits[0][0].title
...     client.add([{"id": "n1", "text": "..."}])

Errors the server reports come back as the library's own exceptions (:class:`ConfigError`,
:class:`~hybridret.filters.FilterError`, :class:`DocumentNotFoundError` with ``.ids``,
:class:`CorpusFormatError`, :class:`IndexLockedError`) carrying the server's message; anything else
is a :class:`ServerError` (``.status``, ``.type``). Needs ``httpx`` (the ``serve`` extra).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import numpy as np

from .errors import (
    ConfigError,
    CorpusFormatError,
    DocumentNotFoundError,
    HybridRetError,
    IndexExistsError,
    IndexLockedError,
    IndexReadOnlyError,
)
from .filters import Filter, FilterError
from .index.expiry import check_ttl
from .types import Group, Hit, MatchedTerm, Snippet

if TYPE_CHECKING:  # pragma: no cover
    from .search.request import SearchRequest

__all__ = ["AuthenticationError", "Client", "ClientClosedError", "RemoteHits", "ServerError", "ServerUnavailableError"]

logger = logging.getLogger(__name__)


class ServerError(HybridRetError):
    """The server answered with an error the library has no class for."""

    def __init__(self, message: str, *, status: int, type: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type


class AuthenticationError(ServerError, PermissionError):
    """The server wants a (different) API key."""


class ServerUnavailableError(HybridRetError, ConnectionError):
    """The server could not be reached, or did not answer in time."""


class ClientClosedError(HybridRetError, RuntimeError):
    """A request was made through a :class:`Client` after :meth:`Client.close`."""


_LIST_PAGE = 1000  # documents per POST /documents/list (the server's MAX_LIST)
_LIST_ATTEMPTS = 3

_BY_TYPE: dict[str, type[HybridRetError]] = {
    "ConfigError": ConfigError, "FilterError": FilterError, "CorpusFormatError": CorpusFormatError,
    "IndexLockedError": IndexLockedError, "IndexExistsError": IndexExistsError, "IndexReadOnlyError": IndexReadOnlyError,
    "validation_error": ConfigError,
}


@dataclass
class RemoteHits:
    """Search results from a server, shaped like :class:`~hybridret.types.Hits`: ``ids`` (object
    array, ``""`` padding) and ``scores`` (``-inf`` padding) of shape ``(nq, k)``,
    ``components`` (per-retriever scores: ``-inf`` padding, NaN for a hit that retriever did not
    score), ``relevance`` (``search(..., relevance=True)``: ``(nq, k)``, NaN padding; else
    ``None``), ``answerability`` (with relevance: ``(nq,)``, the probability that the index holds a
    relevant document for each query) and ``hits[i]`` -> list of :class:`Hit`."""

    queries: list[str]
    method: str
    ids: np.ndarray
    scores: np.ndarray
    components: dict[str, np.ndarray] = field(default_factory=dict)
    _views: list[list[Hit]] = field(default_factory=list, repr=False)
    offset: int = 0
    group_size: int = 0
    group_keys: np.ndarray | None = None  # grouped: (nq, k) group keys (None padding)
    group_scores: np.ndarray | None = None  # grouped: (nq, k) group scores (-inf padding)
    _groups: list[list[Group]] | None = field(default=None, repr=False)
    relevance: np.ndarray | None = None
    answerability: np.ndarray | None = None  # with relevance: (nq,) per query, NaN for a blank one

    def __len__(self) -> int:
        return len(self._views)

    def __getitem__(self, i: int) -> list[Hit]:
        return self._views[i]

    def __iter__(self) -> Iterator[list[Hit]]:
        return iter(self._views)

    def groups(self, i: int) -> list[Group]:
        """Query ``i``'s groups, best first (grouped searches only), as :meth:`Hits.groups`."""
        if self._groups is None:
            raise ValueError("these hits are not grouped: search with group_by=...")
        return self._groups[i]

    @classmethod
    def from_response(cls, data: Mapping[str, Any], k: int, *, group_size: int = 0, offset: int = 0) -> RemoteHits:
        results = data["results"]
        n = len(results)
        grouped = any(r.get("groups") is not None for r in results)
        groups_k = k
        if grouped:
            k = k * max(group_size, 1)
        ids = np.full((n, k), "", dtype=object)
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        comps: dict[str, np.ndarray] = {}
        views: list[list[Hit]] = []
        for i, res in enumerate(results):
            view = []
            for j, h in enumerate(res["hits"][:k]):
                hit = _hit(h)
                view.append(hit)
                ids[i, j] = hit.id
                scores[i, j] = hit.score
                for name, v in hit.scores.items():
                    comps.setdefault(name, np.full((n, k), -np.inf, dtype=np.float32))[i, j] = v
            views.append(view)
        for name, arr in comps.items():  # as in Hits: -inf pads, NaN marks a hit this retriever did not score
            for i, view in enumerate(views):
                for j, hit in enumerate(view):
                    if name not in hit.scores:
                        arr[i, j] = np.nan
        out = cls(queries=[r["query"] for r in results], method=data.get("resolved", data.get("method", "")),
                  ids=ids, scores=scores, components=comps, _views=views, offset=offset)
        if any(h.relevance is not None for view in views for h in view):
            out.relevance = _relevance_grid(views, (n, k), [list(range(len(v))) for v in views])
        if any("answerability" in r for r in results):
            out.answerability = np.array([np.nan if r.get("answerability") is None else float(r["answerability"])
                                          for r in results])
        if grouped:
            out._place_groups(results, groups_k, max(group_size, 1))
        return out

    def _place_groups(self, results: list[Mapping[str, Any]], k: int, g: int) -> None:
        """Grouped results: the hits at their group's columns, and the :class:`Group` objects."""
        n = len(results)
        self.group_size = g
        self.group_keys = np.full((n, k), None, dtype=object)
        self.group_scores = np.full((n, k), -np.inf, dtype=np.float32)
        ids, scores = np.full(self.ids.shape, "", dtype=object), np.full(self.scores.shape, -np.inf, np.float32)
        comps = {name: np.full(v.shape, -np.inf, np.float32) for name, v in self.components.items()}
        self._groups = []
        columns: list[list[int]] = []
        for i, res in enumerate(results):
            view, at, groups = self._views[i], 0, []
            columns.append([])
            for j, gr in enumerate((res.get("groups") or [])[:k]):
                size = int(gr["size"])
                hits = view[at:at + size]
                score = float("nan") if gr.get("score") is None else float(gr["score"])
                groups.append(Group(key=gr["key"], rank=int(gr["rank"]), score=score, hits=hits))
                self.group_keys[i, j], self.group_scores[i, j] = gr["key"], score
                for c, h in enumerate(hits[:g]):
                    columns[i].append(j * g + c)
                    ids[i, j * g + c], scores[i, j * g + c] = h.id, h.score
                    for name, arr in comps.items():
                        arr[i, j * g + c] = h.scores.get(name, np.nan)
                at += size
            self._groups.append(groups)
        self.ids, self.scores, self.components = ids, scores, comps
        if self.relevance is not None:
            self.relevance = _relevance_grid(self._views, ids.shape, columns)


def _relevance_grid(views: list[list[Hit]], shape: tuple[int, ...], columns: list[list[int]]) -> np.ndarray:
    """The hits' relevance placed at their columns (NaN padding)."""
    out = np.full(shape, np.nan, dtype=np.float64)
    for i, (view, cols) in enumerate(zip(views, columns)):
        for h, j in zip(view, cols):
            if h.relevance is not None:
                out[i, j] = h.relevance
    return out


def _hit(h: Mapping[str, Any]) -> Hit:
    score = h.get("score")
    return Hit(id=h["id"], rank=int(h["rank"]), score=float("nan") if score is None else float(score),
               scores={k: float(v) for k, v in (h.get("scores") or {}).items()},
               title=h.get("title") or "", text=h.get("text") or "",
               matched_terms=[MatchedTerm(term=m["term"], query_weight=m["query_weight"], doc_weight=m["doc_weight"],
                                          expansion=bool(m["expansion"])) for m in h.get("matched_terms") or []],
               metadata=dict(h.get("metadata") or {}),
               snippets=[Snippet(text=x["text"], start=int(x["start"]), end=int(x["end"]),
                                 highlights=tuple((int(a), int(b)) for a, b in x.get("highlights") or ()))
                         for x in h.get("snippets") or []],
               group=h.get("group"),
               relevance=None if h.get("relevance") is None else float(h["relevance"]))


class Client:
    """HTTP client of one ``hybridret serve`` server. Thread-safe (one connection pool); use it as a
    context manager or call :meth:`close`.

    A drop-in for a :class:`~hybridret.search.searcher.Searcher`: arguments are checked here the way the
    searcher checks them (the same :class:`ConfigError` / :class:`CorpusFormatError` before any
    request), and a client pickles (as its URL, key and timeout; the copy opens its own
    connections), so it goes wherever a searcher goes (worker processes, Ray tasks)."""

    def __init__(self, url: str = "http://127.0.0.1:8000", api_key: str | None = None, *, timeout: float = 60.0,
                 transport: Any = None) -> None:
        import httpx

        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"the server URL must start with http:// or https://, got {url!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self._api_key = api_key
        self._timeout = float(timeout)
        self._custom_transport = transport is not None
        self._closed = False
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as the URL, the key and the timeout; the unpickled client connects anew."""
        if self._custom_transport:
            raise ConfigError("a Client made with a custom transport cannot be pickled (the transport stays in this "
                              "process); make it with the server's URL only")
        return {"url": self.url, "api_key": self._api_key, "timeout": self._timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state.get("api_key"), timeout=state.get("timeout", 60.0))  # type: ignore[misc]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._http.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"  # never the key

    # -- plumbing --
    def _request(self, method: str, path: str, body: Any = None) -> Any:
        import httpx

        if self._closed:
            raise ClientClosedError(f"this client of {self.url} is closed; make a new Client")
        try:
            resp = self._http.request(method, path, json=body)
        except httpx.TimeoutException as exc:
            raise ServerUnavailableError(f"{self.url}{path}: no answer in time ({exc})") from None
        except httpx.TransportError as exc:
            raise ServerUnavailableError(f"{self.url}{path}: cannot reach the server ({exc})") from None
        try:
            data = resp.json()
        except ValueError:
            data = None
        if resp.is_success:
            return data
        err = data.get("error", {}) if isinstance(data, dict) else {}
        kind = str(err.get("type", "http_error"))
        message = str(err.get("message") or f"HTTP {resp.status_code}")
        if kind == "DocumentNotFoundError":
            raise DocumentNotFoundError(message, list(err.get("ids") or []))
        if resp.status_code == 401:
            raise AuthenticationError(message, status=401, type=kind)
        cls = _BY_TYPE.get(kind)
        if cls is not None:
            exc = cls(message)
            exc.status = resp.status_code  # type: ignore[attr-defined]
            raise exc
        raise ServerError(message, status=resp.status_code, type=kind)

    # -- reads --
    def search(self, queries: str | Sequence[str] | SearchRequest, k: int | None = None, *, with_text: bool = True,
               **options: Any) -> RemoteHits:
        """As :meth:`Searcher.search` (the :class:`~hybridret.types.SearchBackend` signature, plus
        ``with_text``): ``(len(queries), k)`` results, run on the server. The options are those of
        a :class:`~hybridret.search.request.SearchRequest`, checked here as the searcher checks them
        (the method name by the server, which knows its retrievers). ``offset``, ``group_by`` /
        ``group_size`` as in the library (grouped: ``hits.groups(i)``, arrays ``(nq, k * group_size)``);
        ``rerank=True`` reranks with the cross-encoder the server was started with
        (``hybridret serve --rerank DIR``), ``rerank_depth`` hits deep; ``relevance=True``: each hit's
        calibrated relevance in [0, 1] (``hits.relevance``, ``Hit.relevance``), computed by the server;
        ``diversify=λ``: the hits in MMR order (:mod:`hybridret.search.diversify`), computed by the server.
        ``threads`` is the server's setting, not a request's."""
        from .search.request import SearchRequest

        req = SearchRequest.of(queries, k, **options)
        if not isinstance(with_text, bool):
            raise ConfigError(f"with_text must be true or false, got {with_text!r}")
        body = {**req.body(), "with_text": with_text}
        texts, k, method = list(req.queries), req.k, req.method
        keep = [i for i, t in enumerate(texts) if t.strip()]  # blank queries get no hits, as in a Searcher
        if len(keep) == 1 and isinstance(queries, str):
            del body["queries"]
            body["query"] = queries
        else:
            body["queries"] = [texts[i] for i in keep]
        if keep:
            data = self._request("POST", "/search", body)
        else:  # nothing to search; the width follows the index, as a Searcher's does
            data = {"method": method, "resolved": method, "results": [],
                    "k": max(1, int(self.health().get("num_docs", k) or 0))}
        found, searched = iter(data["results"]), set(keep)
        data = {**data, "results": [next(found) if i in searched else {"query": t, "hits": []}
                                    for i, t in enumerate(texts)]}
        out = RemoteHits.from_response(data, min(k, int(data.get("k", k))), group_size=req.group_size or 0,
                                       offset=req.offset)
        if req.relevance and out.relevance is None:  # asked for, no hits: all padding, as in Hits
            out.relevance = np.full(out.ids.shape, np.nan)
        return out

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health")

    def wait_ready(self, timeout: float = 120.0, *, interval: float = 0.2) -> dict[str, Any]:
        """Poll ``/health`` until the server answers (it loads its models first); returns the answer.
        Raises :class:`ServerUnavailableError` after ``timeout`` seconds."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.health()
            except ServerUnavailableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(interval)

    def info(self) -> dict[str, Any]:
        return self._request("GET", "/info")

    def get(self, ids: Iterable[str] | str, *, chunks: bool = False) -> list[dict[str, Any] | None]:
        """Stored documents by id (``{"id", "title", "text", "metadata"}``; ``None`` where absent),
        as :meth:`hybridret.Searcher.get`: in an index of chunks a document's id gives it
        re-assembled, with its chunks when ``chunks=True``."""
        ids = _check_ids(ids, strings_only=True)
        if not ids:
            return []
        query = [("ids", i) for i in ids] + ([("chunks", "true")] if chunks else [])
        return self._request("GET", "/documents?" + urlencode(query))["documents"]

    def documents(self, filter: Filter | Mapping[str, Any] | str | None = None, *, offset: int = 0,
                  limit: int | None = None) -> list[dict[str, Any]]:
        """Every document matching ``filter`` (``None``: all), as :meth:`hybridret.Searcher.documents`:
        ``{"id", "title", "text", "metadata"}`` in written order, from ``offset`` on, at most ``limit``
        (``None``: all). Read a page at a time through ``POST /documents/list``; when a commit lands
        between two pages the listing starts again, so the documents returned are those of one commit."""
        from .search.listing import check_page

        offset, limit = check_page(offset, limit)
        body = self._list_body(filter)
        for _ in range(_LIST_ATTEMPTS):
            out: list[dict[str, Any]] = []
            commit = None
            at = offset
            while limit is None or len(out) < limit:
                want = _LIST_PAGE if limit is None else min(_LIST_PAGE, limit - len(out))
                page = self._request("POST", "/documents/list", {**body, "offset": at, "limit": want})
                if commit is not None and page["commit"] != commit:
                    break  # the index changed between two pages: start again on the new commit
                commit = page["commit"]
                out += page["documents"]
                at += len(page["documents"])
                if not page["documents"] or at >= page["total"]:
                    return out
            else:
                return out
        raise ServerError(f"{self.url}: the index changed between every two pages of {_LIST_ATTEMPTS} listings; "
                          "list with a narrower filter or pause the writers", status=409, type="IndexChanged")

    def count(self, filter: Filter | Mapping[str, Any] | str | None = None) -> int:
        """How many documents match ``filter`` (``None``: all live documents), as :meth:`hybridret.Searcher.count`."""
        return int(self._request("POST", "/documents/list", {**self._list_body(filter), "limit": 0})["total"])

    @staticmethod
    def _list_body(filter: Filter | Mapping[str, Any] | str | None) -> dict[str, Any]:
        if filter is None:
            return {}
        if isinstance(filter, Filter):
            return {"filter": dict(filter.spec)}
        from .filters import parse_filter

        parse_filter(filter)  # the searcher's checks, here, before any request
        return {"filter": filter if isinstance(filter, str) else dict(filter)}

    # -- writes (each answered after its commit) --
    def add(self, documents: Iterable[Mapping[str, Any]], *, ttl: float | None = None) -> dict[str, Any]:
        """Add documents (``{"id", "text", "title"?, "metadata"?}``, :class:`~hybridret.types.Document`
        or ``(id, text)`` / ``(id, title, text)``, checked as :meth:`HybridRetriever.add` checks
        them); an existing id is an error. ``ttl``: documents without an ``expires_at`` expire that
        many seconds from now."""
        body: dict[str, Any] = {"documents": _documents(documents)}
        if ttl is not None:
            body["ttl"] = check_ttl(ttl)  # the library's check, before any request
        return self._request("POST", "/documents", body)

    def upsert(self, documents: Iterable[Mapping[str, Any]], *, ttl: float | None = None) -> dict[str, Any]:
        """Add documents or replace those with the same ids (``ttl`` as in :meth:`add`)."""
        body: dict[str, Any] = {"documents": _documents(documents), "upsert": True}
        if ttl is not None:
            body["ttl"] = check_ttl(ttl)  # the library's check, before any request
        return self._request("POST", "/documents", body)

    def delete(self, ids: Iterable[str] | str | None = None, *, filter: Mapping[str, Any] | str | None = None,
               missing: str = "error", dry_run: bool = False) -> dict[str, Any]:
        """Delete by id (a chunked document's id deletes its chunks), or every document matching
        ``filter``, in one commit; ``["deleted"]`` is the count. Unknown ids raise
        :class:`DocumentNotFoundError` (nothing deleted) unless ``missing="ignore"``.
        ``dry_run``: nothing is deleted; ``["matched"]`` lists the ids that would be."""
        if missing not in ("error", "ignore"):
            raise ConfigError(f"missing must be 'error' or 'ignore', got {missing!r}")
        if (ids is None) == (filter is None):
            raise ConfigError("delete needs ids or a filter (one of them, not both)")
        body: dict[str, Any] = {"ignore_missing": missing == "ignore"}
        if ids is not None:
            body["ids"] = _check_ids(ids)
        else:
            body["filter"] = filter if isinstance(filter, str) else dict(filter)
        if dry_run:
            body["dry_run"] = True
        return self._request("DELETE", "/documents", body)

    def purge(self) -> dict[str, Any]:
        """Delete the documents whose ``expires_at`` has passed (one commit)."""
        return self._request("POST", "/purge")

    def compact(self) -> dict[str, Any]:
        return self._request("POST", "/compact")


def _documents(documents: Any) -> list[dict[str, Any]]:
    """Documents validated by the library's own rules (:func:`~hybridret.indexer.as_document`), as
    the server's JSON objects. A single document (a string, a mapping) is refused, never iterated."""
    from .data import Document
    from .indexer import as_document

    if isinstance(documents, (str, bytes, Mapping, Document)) or documents is None or \
            not hasattr(documents, "__iter__"):
        raise CorpusFormatError("documents must be an iterable of documents (a list of dicts, Documents or "
                                f"(id, text) tuples), not a single {type(documents).__name__}")
    out = []
    for i, item in enumerate(documents):
        doc = as_document(item, i)
        entry: dict[str, Any] = {"id": doc.id, "text": doc.text}
        if doc.title:
            entry["title"] = doc.title
        if doc.metadata:
            entry["metadata"] = dict(doc.metadata)
        out.append(entry)
    return out


def _check_ids(ids: Any, *, strings_only: bool = False) -> list[str]:
    """Document ids as the searcher and the writer take them: one id, or an iterable of ids."""
    if isinstance(ids, str) or (not strings_only and isinstance(ids, int) and not isinstance(ids, bool)):
        return [str(ids)]
    if ids is None or isinstance(ids, (bytes, Mapping)) or not hasattr(ids, "__iter__"):
        raise ConfigError(f"ids must be a string or a list of strings, got {type(ids).__name__}")
    out = []
    for i in ids:
        ok = isinstance(i, str) or (not strings_only and isinstance(i, int) and not isinstance(i, bool))
        if not ok:
            raise ConfigError(f"document ids are strings, got {i!r}")
        out.append(str(i))
    return out
