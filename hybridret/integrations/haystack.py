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

Over a :class:`~hybridret.integrations.haystack_store.HybridRetDocumentStore`
(``HybridRetHaystackRetriever(document_store=store)``) each result is the store's Document (its
``meta`` as written) with the hit's ``score`` and ``meta["scores"]``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..types import Hit, SearchBackend
from ._common import (
    as_backend,
    diversity,
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

from .haystack_filters import HaystackFilterError, haystack_filter_to_hybridret, is_haystack_filter  # noqa: E402

__all__ = ["HaystackFilterError", "HybridRetHaystackRetriever", "haystack_filter_to_hybridret", "hit_to_document"]


def hit_to_document(hit: Hit, group: dict[str, Any] | None = None) -> Document:
    """A hybridret :class:`~hybridret.Hit` as a Haystack :class:`Document` (``group``: its group's
    key, rank and score, from a grouped search)."""
    meta = {**hit.metadata, "title": hit.title, "scores": finite_scores(hit.scores)}
    if group:
        meta.update(source_id=group["key"], group_rank=group["rank"], group_score=group["score"])
    return Document(id=hit.id, content=hit.text, meta=meta, score=float(hit.score))


def _is_store(obj: Any) -> bool:
    from .haystack_store import HybridRetDocumentStore  # imports this module's filters, not this module

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
    module docstring). ``diversify`` (MMR's λ in [0, 1]): the hits in maximal-marginal-relevance order,
    fewer near-duplicates (:mod:`hybridret.search.diversify`).
    """

    def __init__(self, searcher: SearchBackend | str | Path | None = None, *, top_k: int = 10,
                 method: str = "hybrid", filters: dict[str, Any] | None = None,
                 filter_policy: FilterPolicy | str = FilterPolicy.REPLACE, group_by: str | None = None,
                 group_size: int | None = None, document_store: Any = None, diversify: float | None = None
                 ) -> None:
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
        self.diversify = diversity(diversify)

    def to_dict(self) -> dict[str, Any]:
        where: dict[str, Any] = ({"document_store": self.document_store.to_dict()} if self.document_store is not None
                                 else {"searcher": location_of(self.searcher)})
        return default_to_dict(self, **where, top_k=self.top_k, method=self.method, filters=self.filters,
                               filter_policy=self.filter_policy.value, group_by=self.group_by,
                               group_size=self.group_size, diversify=self.diversify)

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
                              group_by=self.group_by, group_size=self.group_size, diversify=self.diversify)[0]
        store = self.document_store
        convert = hit_to_document if store is None else store.hit_to_document
        return {"documents": [convert(h, g) for h, g in zip(hits, group_fields(hits))]}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, top_k: int | None = None, filters: dict[str, Any] | None = None
                        ) -> dict[str, list[Document]]:
        """:meth:`run` in a worker thread (AsyncPipeline)."""
        return await asyncio.to_thread(self.run, query, top_k, filters)
