"""Haystack: a retriever ``@component`` over a hybridret index, with Haystack's filter syntax.

>>> from haystack import Pipeline
>>> from hybridret.integrations.haystack import HybridRetHaystackRetriever
>>> pipe = Pipeline()
>>> pipe.add_component("retriever", HybridRetHaystackRetriever("indexes/mine", top_k=5))
>>> pipe.run({"retriever": {"query": "a question",
...                          "filters": {"field": "meta.lang", "operator": "==", "value": "en"}}})

Each result is ``Document(id=hit.id, content=hit.text, meta={**hit.metadata, "title", "scores"},
score=hit.score)``. Filters may be Haystack's (``{"field": "meta.x", "operator": "==", "value": v}``,
``{"operator": "AND"|"OR"|"NOT", "conditions": [...]}``) or hybridret's own Mongo-style ones
(``{"x": v}``, ``{"$and": [...]}``); see :func:`haystack_filter_to_hybridret`.

Grouped (``group_by="parent_id"``, ``group_size=g``: the chunks of the top ``top_k`` documents,
in group order), each chunk's ``meta`` names its document as ``source_id`` (the key Haystack's
``DocumentSplitter`` gives a split's parent) and holds ``group_rank`` and ``group_score``.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..filters import FilterError as _HybridRetFilterError
from ..types import Hit, SearchBackend
from ._common import (
    as_backend,
    finite_scores,
    group_fields,
    grouping,
    hits_per_query,
    location_of,
    open_location,
    require,
)

require("haystack", "haystack", "Haystack")

from haystack import Document, component, default_from_dict, default_to_dict  # noqa: E402
from haystack.document_stores.types import FilterPolicy, apply_filter_policy  # noqa: E402
from haystack.errors import FilterError as _HaystackFilterError  # noqa: E402

__all__ = ["HaystackFilterError", "HybridRetHaystackRetriever", "haystack_filter_to_hybridret", "hit_to_document"]


class HaystackFilterError(_HybridRetFilterError, _HaystackFilterError):
    """A Haystack filter hybridret cannot run (catchable as either library's ``FilterError``)."""


# Document attributes that are not metadata: hybridret filters apply to metadata only
_DOCUMENT_FIELDS = ("id", "content", "blob", "meta", "score", "embedding", "sparse_embedding")
_RANGE = {">": "$gt", ">=": "$gte", "<": "$lt", "<=": "$lte"}
_COMPARISONS = ("==", "!=", *_RANGE, "in", "not in")
_LOGICAL = ("AND", "OR", "NOT")


def hit_to_document(hit: Hit, group: dict[str, Any] | None = None) -> Document:
    """A hybridret :class:`~hybridret.Hit` as a Haystack :class:`Document` (``group``: its group's
    key, rank and score, from a grouped search)."""
    meta = {**hit.metadata, "title": hit.title, "scores": finite_scores(hit.scores)}
    if group:
        meta.update(source_id=group["key"], group_rank=group["rank"], group_score=group["score"])
    return Document(id=hit.id, content=hit.text, meta=meta, score=float(hit.score))


def is_haystack_filter(filters: Any) -> bool:
    """Whether a dict is in Haystack's syntax (a comparison or a logical node), not hybridret's."""
    return isinstance(filters, dict) and "operator" in filters and ("field" in filters or "conditions" in filters)


def _looks_haystack(filters: Any) -> bool:
    """Haystack-shaped but incomplete (so that the error says what is missing): a ``field`` or
    ``conditions`` key, or an ``operator`` that is one of Haystack's."""
    if not isinstance(filters, dict):
        return False
    op = filters.get("operator")
    return "field" in filters or "conditions" in filters or (isinstance(op, str) and op in (*_LOGICAL, *_COMPARISONS))


def _iso_date(value: str) -> bool:
    """A full ISO 8601 date or datetime (``YYYY-MM-DD...``): the strings Haystack orders."""
    if len(value) < 10 or value[4:5] != "-" or value[7:8] != "-":
        return False
    try:
        _dt.datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _value(v: Any, where: str) -> Any:
    if isinstance(v, (_dt.datetime, _dt.date)):
        return v.isoformat()  # hybridret compares ISO dates as strings
    if isinstance(v, (dict, list, tuple, set)):
        raise HaystackFilterError(f"{where}: a {type(v).__name__} value cannot be compared with this operator")
    return v


def _field(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise HaystackFilterError(f"{where}: 'field' must be a non-empty string, got {name!r}")
    if name.startswith("meta."):
        return name[len("meta."):]
    if name in _DOCUMENT_FIELDS:
        raise HaystackFilterError(f"{where}: hybridret filters apply to metadata only; {name!r} is a Document "
                                  "attribute (use 'meta.<key>')")
    return name  # legacy filters name metadata keys without "meta."


def _translate(node: Any, where: str) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise HaystackFilterError(f"{where}: expected a filter dict, got {type(node).__name__}")
    if "operator" not in node:
        raise HaystackFilterError(f"{where}: 'operator' key missing")
    op = node["operator"]
    if "field" not in node:  # logical
        if op in _COMPARISONS:
            raise HaystackFilterError(f"{where}: 'field' key missing (a comparison names the field it compares)")
        if op not in _LOGICAL:
            raise HaystackFilterError(f"{where}: unknown logical operator {op!r} (supported: {', '.join(_LOGICAL)})")
        conds = node.get("conditions")
        if not isinstance(conds, list) or not conds:
            raise HaystackFilterError(f"{where}: {op} needs a non-empty 'conditions' list")
        parts = [_translate(c, f"{where}.conditions[{i}]") for i, c in enumerate(conds)]
        if op == "NOT":  # Haystack: NOT(c1, c2, ...) = not (c1 and c2 and ...)
            return {"$not": parts[0] if len(parts) == 1 else {"$and": parts}}
        return {"$and" if op == "AND" else "$or": parts}
    if op not in _COMPARISONS:
        raise HaystackFilterError(f"{where}: unsupported comparison operator {op!r} "
                                  f"(supported: {', '.join(repr(o) for o in _COMPARISONS)})")
    if "value" not in node:
        raise HaystackFilterError(f"{where}: 'value' key missing")
    key, value = _field(node["field"], where), node["value"]
    if op in ("in", "not in"):
        if not isinstance(value, list):  # Haystack's rule: a list, not any iterable
            raise HaystackFilterError(f"{where}: {op!r} needs a list value, got {type(value).__name__}")
        return {key: {"$in" if op == "in" else "$nin": [_value(v, where) for v in value]}}
    value = _value(value, where)
    if op == "==":  # Haystack: a missing field is None, so "== None" matches it
        return {"$or": [{key: None}, {key: {"$exists": False}}]} if value is None else {key: value}
    if op == "!=":
        return {"$and": [{key: {"$exists": True}}, {key: {"$ne": None}}]} if value is None else {key: {"$ne": value}}
    if value is None:  # Haystack: nothing is ordered against None, so nothing matches
        return {"$and": [{key: {"$exists": True}}, {key: {"$exists": False}}]}
    if isinstance(value, str) and not _iso_date(value):
        raise HaystackFilterError(f"{where}: {op!r} compares numbers, or strings only as ISO dates "
                                  f"('2024-01-31', '2024-01-31T12:00:00'), got {value!r}")
    return {key: {_RANGE[op]: value}}


def haystack_filter_to_hybridret(filters: dict[str, Any] | None) -> dict[str, Any] | None:
    """A Haystack filter as a hybridret (Mongo-style) filter; a hybridret filter is returned as it is.

    ``{"field": "meta.x", "operator": OP, "value": v}`` -> ``==``: ``{"x": v}``, ``!=``:
    ``{"x": {"$ne": v}}``, ``>``/``>=``/``<``/``<=``: ``$gt``/``$gte``/``$lt``/``$lte``, ``in``/``not in``:
    ``$in``/``$nin``; ``"meta.a.b"`` -> ``"a.b"`` (nested); ``== None`` also matches a missing field and
    ``!= None`` needs it present (Haystack reads a missing field as None); a range against ``None``
    matches nothing. ``AND``/``OR`` ->
    ``$and``/``$or``; ``NOT`` (Haystack: not all of the conditions) -> ``{"$not": {"$and": [...]}}``.
    Dates/datetimes become ISO strings. As in Haystack, ranges take numbers or ISO-date strings
    (another string raises), and ``in``/``not in`` take a list (not a tuple). Filters on Document
    attributes (``id``, ``content``, ``score``, ...) and unknown operators raise
    :class:`HaystackFilterError`, as does a node missing its ``operator``, ``field``, ``value`` or
    ``conditions``.
    Differences that remain: on a list-valued field, ``==``/``in`` test membership (hybridret) where
    Haystack compares the whole list; ISO dates compare as strings, so they must share one format
    (and time zone) to order correctly, and ``==`` on a date matches the same spelling only.
    """
    if not filters:
        return None
    if is_haystack_filter(filters) or _looks_haystack(filters):
        return _translate(filters, "filters")  # incomplete Haystack nodes get an error saying what is missing
    return filters


def _is_store(obj: Any) -> bool:
    from .haystack_store import HybridRetDocumentStore

    return isinstance(obj, HybridRetDocumentStore)


@component
class HybridRetHaystackRetriever:
    """Retrieve documents from a hybridret index (a Searcher, a HybridRetriever, a hybridret Client or
    an index directory, which opens a read-only Searcher), or from a
    :class:`~hybridret.integrations.haystack_store.HybridRetDocumentStore` (``document_store=``, as
    Haystack's own retrievers take their store).

    ``top_k``, ``filters`` and ``method`` are the defaults ``run`` uses; ``filter_policy``
    (``REPLACE``: runtime filters replace the init filters; ``MERGE``: both apply) as in Haystack's
    own retrievers. Serialises (``to_dict``) to the index path or the server url (with a store: the
    store's own ``to_dict``). ``group_by`` / ``group_size``: the chunks of the top documents (see the
    module docstring).
    """

    def __init__(self, searcher: SearchBackend | str | Path | None = None, *, top_k: int = 10,
                 method: str = "hybrid", filters: dict[str, Any] | None = None,
                 filter_policy: FilterPolicy | str = FilterPolicy.REPLACE, group_by: str | None = None,
                 group_size: int | None = None, document_store: Any = None) -> None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0:
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        if _is_store(searcher) and document_store is None:
            searcher, document_store = None, searcher
        if (searcher is None) == (document_store is None):
            raise ConfigError("give the retriever a searcher (an index, a HybridRetriever or a Client) or "
                              "document_store=HybridRetDocumentStore(...), one of them")
        if document_store is not None and not _is_store(document_store):
            raise ConfigError(f"document_store must be a HybridRetDocumentStore, got {type(document_store).__name__}; "
                              "pass an index, a HybridRetriever or a Client as the searcher instead")
        self.document_store = document_store
        self.searcher = as_backend(searcher) if document_store is None else document_store.backend
        self.top_k = top_k
        self.method = method
        haystack_filter_to_hybridret(filters)  # fail at construction, not at the first query
        self.filters = filters
        self.filter_policy = (filter_policy if isinstance(filter_policy, FilterPolicy)
                              else FilterPolicy.from_str(filter_policy))
        grouping(group_by, group_size)
        self.group_by, self.group_size = group_by, group_size

    def to_dict(self) -> dict[str, Any]:
        where: dict[str, Any] = ({"document_store": self.document_store.to_dict()} if self.document_store is not None
                                 else {"searcher": location_of(self.searcher)})
        return default_to_dict(self, **where, top_k=self.top_k, method=self.method, filters=self.filters,
                               filter_policy=self.filter_policy.value, group_by=self.group_by,
                               group_size=self.group_size)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HybridRetHaystackRetriever:
        init = dict(data.get("init_parameters", {}))
        if init.get("searcher") is not None:
            init["searcher"] = open_location(init["searcher"])
        if isinstance(init.get("document_store"), dict):
            from .haystack_store import HybridRetDocumentStore

            init["document_store"] = HybridRetDocumentStore.from_dict(init["document_store"])
        return default_from_dict(cls, {**data, "init_parameters": init})

    def _filters(self, filters: dict[str, Any] | None) -> dict[str, Any] | None:
        init, runtime = self.filters, filters
        if self.filter_policy == FilterPolicy.MERGE and init and runtime:
            if is_haystack_filter(init) and is_haystack_filter(runtime):
                return haystack_filter_to_hybridret(apply_filter_policy(self.filter_policy, init, runtime))
            return {"$and": [haystack_filter_to_hybridret(init), haystack_filter_to_hybridret(runtime)]}
        return haystack_filter_to_hybridret(runtime or init)

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None, filters: dict[str, Any] | None = None
            ) -> dict[str, list[Document]]:
        """Search ``query``: ``top_k`` (default: the init value) documents matching ``filters``."""
        k = self.top_k if top_k is None else top_k
        flt = self._filters(filters)
        if self.document_store is not None and self.document_store._unbuilt():
            return {"documents": []}  # nothing written to the store yet
        hits = hits_per_query(self.searcher, [query], k, self.method, flt,
                              group_by=self.group_by, group_size=self.group_size)[0]
        store = self.document_store
        convert = hit_to_document if store is None else store.hit_to_document
        return {"documents": [convert(h, g) for h, g in zip(hits, group_fields(hits))]}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, top_k: int | None = None, filters: dict[str, Any] | None = None
                        ) -> dict[str, list[Document]]:
        """:meth:`run` in a worker thread (AsyncPipeline)."""
        return await asyncio.to_thread(self.run, query, top_k, filters)
