"""One search, its arguments checked once: :class:`SearchRequest`.

Every way into a search builds or forwards one: :meth:`Searcher.search` and
:meth:`ShardedSearcher.search` (``search(queries, k, **options)`` builds it),
:meth:`HybridRetriever.search` and the serve backends (forward the options),
:meth:`Client.search` (builds it, then sends :meth:`SearchRequest.body`). A request is pure data:
what the method name means (a retriever or fusion method of this process's registries) is checked
where the search is planned (:func:`hybridret.search.plan.plan_search`), so a client can name a
method only its server knows.

A new search option is one field here plus its entry in :data:`CHECKS` (and the code that acts on
it); docs/architecture.md counts the places.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..filters import Filter, parse_filter
from ..fusion import FusionConfig
from ..retrievers.base import check_threads
from .diversify import check_diversify
from .grouping import GroupSpec, check_group
from .relevance import Calibration, check_relevance
from .rerank import check_rerank

__all__ = ["CHECKS", "MAX_OFFSET", "SearchRequest", "check_k", "check_offset", "check_queries"]

MAX_OFFSET = 100_000


def check_queries(queries: Any) -> tuple[str, ...]:
    """A query or a list of queries, validated: strings only, never coerced."""
    if isinstance(queries, str):
        queries = [queries]
    if isinstance(queries, (bytes, Mapping)) or not isinstance(queries, Sequence):
        raise ConfigError(f"queries must be a string or a list of strings, got {type(queries).__name__}")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise ConfigError(f"query #{i} is a {type(q).__name__}, not a string")
        try:
            q.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"query #{i} is not valid Unicode (a lone surrogate?)") from None
    return tuple(queries)


def check_k(k: Any, name: str = "k") -> int:
    """A positive integer (``k``, ``candidates``), never coerced from a bool or a string."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ConfigError(f"{name} must be a positive integer, got {k!r}")
    if k < 1:
        raise ConfigError(f"{name} must be positive, got {k}")
    return int(k)


def check_offset(offset: Any) -> int:
    """A page's offset: a non-negative integer (hits, or groups when grouped, skipped)."""
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or not 0 <= offset <= MAX_OFFSET:
        raise ConfigError(f"offset must be an integer from 0 to {MAX_OFFSET}, got {offset!r}")
    return int(offset)


def _method(method: Any) -> str:
    if not isinstance(method, str):
        raise ConfigError(f"method must be a string, got {type(method).__name__}")
    return method


def _fusion(fusion: Any) -> FusionConfig | None:
    if fusion is None or isinstance(fusion, FusionConfig):
        return fusion
    return FusionConfig.from_dict(fusion)


def _candidates(candidates: Any) -> int | None:
    return None if candidates is None else check_k(candidates, "candidates")


def _relevance(relevance: Any) -> bool | Calibration:
    return relevance if isinstance(relevance, Calibration) else check_relevance(relevance)


def _rerank(rerank: Any) -> Any:
    return None if rerank is False else rerank  # False: no reranker (the client's spelling of "none")


#: field -> its check: takes the value given, returns the value kept (or raises ConfigError naming
#: the problem). Checks that read two fields (group_size with group_by, rerank_depth with rerank) run
#: in :meth:`SearchRequest.__post_init__` after these.
CHECKS: dict[str, Callable[[Any], Any]] = {
    "queries": check_queries, "k": check_k, "method": _method, "filter": parse_filter, "fusion": _fusion,
    "candidates": _candidates, "threads": check_threads, "offset": check_offset, "rerank": _rerank,
    "relevance": _relevance, "diversify": check_diversify,
}


@dataclass(frozen=True)
class SearchRequest:
    """One search (its fields are the options of every ``search``; each checked on construction).

    ``queries``: the query texts (one string: a batch of one; blank ones get no hits). ``k``: hits
    per query. ``method``: ``"hybrid"``, a retriever or a fusion method (see :mod:`hybridret.methods`).
    ``filter``: metadata filter (:mod:`hybridret.filters`), applied before top-k. ``fusion``: fusion
    settings (:class:`~hybridret.fusion.config.FusionConfig` or its dict). ``candidates``: a fused
    method's per-retriever depth. ``threads``: the call's thread budget (``None``: the searcher's).
    ``offset``: hits (grouped: groups) skipped. ``group_by`` / ``group_size``: group chunks by a
    metadata field (:mod:`~hybridret.search.grouping`). ``rerank`` / ``rerank_depth``: a
    :class:`~hybridret.search.rerank.Reranker` or cross-encoder folder over the first stage's top
    ``rerank_depth`` (``True`` through a server: the server's). ``relevance``: each hit's calibrated
    relevance (``True``, or a :class:`~hybridret.search.relevance.Calibration` to use). ``diversify``:
    MMR's λ in ``[0, 1]`` (1: pure relevance, lower: less alike hits or, grouped, documents; see
    :mod:`~hybridret.search.diversify`)."""

    queries: tuple[str, ...]
    k: int = 10
    method: str = "hybrid"
    filter: Filter | None = None
    fusion: FusionConfig | None = None
    candidates: int | None = None
    threads: int | None = None
    offset: int = 0
    group_by: str | None = None
    group_size: int | None = None
    rerank: Any = None
    rerank_depth: int | None = None
    relevance: bool | Calibration = False
    diversify: float | None = None

    def __post_init__(self) -> None:
        for name, check in CHECKS.items():
            object.__setattr__(self, name, check(getattr(self, name)))
        group = check_group(self.group_by, self.group_size)
        object.__setattr__(self, "group_size", group.size if group is not None else None)
        depth = check_rerank(self.rerank, self.rerank_depth)
        object.__setattr__(self, "rerank_depth", depth if self.rerank is not None else None)

    @classmethod
    def of(cls, queries: Any, k: Any = None, **options: Any) -> SearchRequest:
        """The request of ``search(queries, k, **options)``: ``queries`` may be a request already
        (``k`` and ``options`` then replace its fields). An option that is no field of a request is
        a :class:`ConfigError` naming the options there are."""
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise ConfigError(f"unknown search option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                              f"the options are {', '.join(sorted(OPTIONS))}")
        if k is not None:
            options["k"] = k
        if isinstance(queries, SearchRequest):
            return replace(queries, **options) if options else queries
        return cls(queries, **options)

    @property
    def group(self) -> GroupSpec | None:
        """The grouping (``None``: none)."""
        if self.group_by is None or self.group_size is None:
            return None
        return GroupSpec(self.group_by, self.group_size)

    def options(self) -> dict[str, Any]:
        """The fields set to something else than their default, by name (``queries`` and ``k`` aside)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("queries", "k") and getattr(self, f.name) != f.default}

    def body(self) -> dict[str, Any]:
        """The request as ``POST /search`` takes it (every field not at its default, in JSON form;
        ``queries`` as ``"queries"``). ``threads`` and a reranker object do not travel."""
        out: dict[str, Any] = {"k": self.k, "method": self.method, "queries": list(self.queries)}
        for name, value in self.options().items():
            if name == "threads":
                raise ConfigError("threads is a setting of the server, not of a request")
            if name == "filter":
                value = dict(value.spec)
            elif name == "fusion":
                value = value.to_dict()
            elif name == "rerank" and value is not True:
                raise ConfigError(f"rerank must be true or false through a server (it reranks with the folder the "
                                  f"server was started with), got {value!r}")
            elif name == "relevance" and value is not True:
                raise ConfigError("relevance through a server is true or false (the server's calibration)")
            out[name] = value
        if "rerank_depth" in out and out["rerank_depth"] is None:
            del out["rerank_depth"]
        return out


OPTIONS = frozenset(f.name for f in fields(SearchRequest)) - {"queries", "k"}
"""The keyword options of every ``search(queries, k, **options)``."""
