"""What every adapter shares: the backend check, hit fields, the missing-framework error."""

from __future__ import annotations

import importlib
import math
import threading
from pathlib import Path
from typing import Any, cast

from ..errors import ConfigError
from ..types import Hit, SearchBackend

__all__ = ["FIRST_BUILD", "as_backend", "finite_scores", "group_fields", "grouping", "hits_per_query", "location_of",
           "open_location", "require"]


# Held by a framework store while it checks whether its index exists and, if not, builds it with the
# first write: two first writes at once must not build two indexes (one of them lost)
FIRST_BUILD = threading.Lock()


def require(module: str, extra: str, framework: str) -> Any:
    """Import a framework module, or say which pip extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"hybridret's {framework} adapter needs {framework}: pip install 'hybridret[{extra}]' "
                          f"(could not import {module}: {exc})") from exc


def as_backend(obj: SearchBackend | str | Path, *, writable: bool = False) -> SearchBackend:
    """A Searcher, HybridRetriever, Client or anything else with hybridret's ``search`` signature
    (:class:`~hybridret.types.SearchBackend`; only ``search`` is required here, ``get`` where a
    framework asks for documents by id); an index directory (``str``/``Path``) opens a read-only
    :class:`~hybridret.Searcher`."""
    if isinstance(obj, (str, Path)):
        from ..search.searcher import Searcher

        obj = Searcher(obj)
    if not callable(getattr(obj, "search", None)):
        raise ConfigError(f"expected a hybridret Searcher, HybridRetriever or Client (anything with "
                          f"search(queries, k, method=, filter=)), got {type(obj).__name__}")
    if writable:
        missing = [m for m in ("upsert", "delete") if not callable(getattr(obj, m, None))]
        if missing:
            raise ConfigError(f"{type(obj).__name__} cannot write (no {', '.join(missing)}): a Searcher is "
                              "read-only; pass HybridRetriever.load(path) or a hybridret Client")
    return cast(SearchBackend, obj)


def hits_per_query(backend: SearchBackend, queries: list[str], k: int, method: str, filter: Any, *,
                   details: bool = True, **options: Any) -> list[list[Hit]]:
    """One batched search; the hits of each query as :class:`~hybridret.Hit` lists. ``options``
    (``group_by``, ``group_size``, ``fusion``, ``diversify``) go to the search only when set (any backend takes the
    rest). ``details=False``: hits without matched terms and snippets where the results can leave
    them out (:meth:`Hits.plain <hybridret.types.Hits.plain>`; a Client's come with them)."""
    if isinstance(filter, dict) and not filter:
        filter = None  # {} means "no filter" in every framework
    options = {name: v for name, v in options.items() if v is not None}
    hits = backend.search(queries, k, method=method, filter=filter, **options)
    view = hits.plain if not details and callable(getattr(hits, "plain", None)) else hits.__getitem__
    return [list(view(i)) for i in range(len(queries))]


def grouping(group_by: Any, group_size: Any) -> dict[str, Any]:
    """An adapter's grouping settings, checked now (not at the first query)."""
    from ..search.grouping import check_group

    check_group(group_by, group_size)
    return {"group_by": group_by, "group_size": group_size}


def diversity(diversify: Any) -> float | None:
    """An adapter's ``diversify`` (MMR's λ in [0, 1], :mod:`hybridret.search.diversify`), checked now."""
    from ..search.diversify import check_diversify

    return check_diversify(diversify)


def group_fields(hits: list[Hit]) -> list[dict[str, Any]]:
    """Per hit of a grouped search, its group's ``key``, ``rank`` and ``score`` (the score of the
    group's best chunk, which comes first); ``{}`` for hits of an ungrouped search."""
    best: dict[Any, float] = {}
    out = []
    for h in hits:
        if h.group is None:
            out.append({})
            continue
        best.setdefault(h.group, float(h.score))
        out.append({"key": h.group, "rank": h.rank, "score": best[h.group]})
    return out


def finite_scores(scores: dict[str, float]) -> dict[str, float]:
    """Per-retriever scores without the NaNs of retrievers that did not score this hit."""
    return {name: float(v) for name, v in scores.items() if not math.isnan(v)}


def location_of(backend: SearchBackend) -> dict[str, str]:
    """Where a backend can be reopened from: ``{"index": path}`` or ``{"url": url}``."""
    url = getattr(backend, "url", None) or getattr(backend, "base_url", None)
    if isinstance(url, str) and not isinstance(backend, (str, Path)):
        return {"url": url}
    root = getattr(backend, "root", None) or getattr(backend, "path", None)
    if isinstance(root, (str, Path)):
        return {"index": str(root)}
    raise ConfigError(f"cannot serialise a {type(backend).__name__}: it has neither an index directory "
                      "(root/path) nor a server url")


def open_location(where: Any) -> SearchBackend:
    """The backend :func:`location_of` described (an index path string opens a Searcher)."""
    if isinstance(where, (str, Path)):
        return as_backend(where)
    if isinstance(where, dict) and "url" in where:
        try:
            client = importlib.import_module("hybridret.client")
        except ImportError as exc:
            raise ConfigError(f"cannot reopen {where['url']}: hybridret.client is not available ({exc})") from exc
        return cast(SearchBackend, client.Client(where["url"]))
    if isinstance(where, dict) and "index" in where:
        return as_backend(where["index"])
    raise ConfigError(f"expected an index path, {{'index': path}} or {{'url': url}}, got {where!r}")
