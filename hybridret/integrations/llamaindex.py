"""LlamaIndex: a :class:`BaseRetriever` over a hybridret index.

>>> from hybridret.integrations.llamaindex import HybridRetLlamaIndexRetriever
>>> retriever = HybridRetLlamaIndexRetriever(Searcher("indexes/mine"), similarity_top_k=5)
>>> nodes = retriever.retrieve("a question")            # list[NodeWithScore]; also await aretrieve(...)

Each result is ``NodeWithScore(node=TextNode(id_=hit.id, text=hit.text, metadata={**hit.metadata,
"title", "scores"}), score=hit.score)``; ``scores`` (the exact score of each retriever that took
part) is excluded from the metadata LlamaIndex shows an LLM or an embedding model.

Grouped (``group_by="parent_id"``, ``group_size=g``: the chunks of the top ``similarity_top_k``
documents, in group order), each node's ``SOURCE`` relationship names its document (so
``node.ref_doc_id`` is the group key, as for nodes LlamaIndex parses from a document) and its
metadata holds ``group_rank`` and ``group_score`` (hidden from LLMs and embedders too).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..filters import FilterError
from ..types import Hit, SearchBackend
from ._common import as_backend, finite_scores, group_fields, grouping, hits_per_query, require

require("llama_index.core", "llamaindex", "LlamaIndex")

from llama_index.core.base.base_retriever import BaseRetriever  # noqa: E402
from llama_index.core.callbacks import CallbackManager  # noqa: E402
from llama_index.core.schema import (  # noqa: E402
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

__all__ = ["HybridRetLlamaIndexRetriever", "hit_to_node", "llamaindex_filters_to_hybridret"]

_HIDDEN = ["scores", "group_rank", "group_score"]  # kept out of the text LlamaIndex builds for LLMs and embedders


def hit_to_node(hit: Hit, group: dict[str, Any] | None = None) -> NodeWithScore:
    """A hybridret :class:`~hybridret.Hit` as a LlamaIndex :class:`NodeWithScore` (``group``: its
    group's key, rank and score, from a grouped search: the node's source document)."""
    meta = {**hit.metadata, "title": hit.title, "scores": finite_scores(hit.scores)}
    relationships = {}
    if group:
        meta.update(group_rank=group["rank"], group_score=group["score"])
        relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=str(group["key"]))
    node = TextNode(id_=hit.id, text=hit.text, metadata=meta, excluded_llm_metadata_keys=list(_HIDDEN),
                    excluded_embed_metadata_keys=list(_HIDDEN), relationships=relationships)
    return NodeWithScore(node=node, score=float(hit.score))


_SIMPLE = {FilterOperator.NE: "$ne", FilterOperator.GT: "$gt", FilterOperator.GTE: "$gte",
           FilterOperator.LT: "$lt", FilterOperator.LTE: "$lte", FilterOperator.IN: "$in",
           FilterOperator.NIN: "$nin", FilterOperator.ANY: "$in"}


def _one(f: MetadataFilter) -> dict[str, Any]:
    op, key, value = FilterOperator(f.operator), f.key, f.value
    if op in (FilterOperator.EQ, FilterOperator.CONTAINS):  # equality on a list field is membership
        return {key: value}
    if op == FilterOperator.ALL:
        values = value if isinstance(value, list) else [value]
        return {"$and": [{key: v} for v in values]}
    if op in _SIMPLE:
        if op in (FilterOperator.IN, FilterOperator.NIN, FilterOperator.ANY) and not isinstance(value, list):
            value = [value]
        return {key: {_SIMPLE[op]: value}}
    ok = (FilterOperator.EQ, FilterOperator.CONTAINS, FilterOperator.ALL, *_SIMPLE)
    raise FilterError(f"LlamaIndex filter operator {op.value!r} on {key!r} has no hybridret equivalent "
                      f"(supported: {', '.join(o.value for o in ok)})")


def llamaindex_filters_to_hybridret(filters: MetadataFilters | MetadataFilter | dict[str, Any] | None
                                    ) -> dict[str, Any] | None:
    """LlamaIndex ``MetadataFilters`` as a hybridret filter; a dict is taken as a hybridret filter.

    ``AND``/``OR`` become ``$and``/``$or``; ``NOT`` (LlamaIndex: none of the filters matches) becomes
    ``{"$not": {"$or": [...]}}``; nested ``MetadataFilters`` nest. Operators: ``==`` and
    ``contains`` -> equality (on a list field hybridret's equality is membership), ``!=``, ``>``,
    ``>=``, ``<``, ``<=``, ``in``, ``nin``, ``any`` (-> ``$in``), ``all`` (-> ``$and`` of equalities).
    ``text_match``, ``text_match_insensitive`` and ``is_empty`` raise :class:`~hybridret.FilterError`.
    """
    if filters is None or isinstance(filters, dict):
        return filters or None
    if isinstance(filters, MetadataFilter):
        return _one(filters)
    if not isinstance(filters, MetadataFilters):
        raise FilterError(f"expected MetadataFilters or a hybridret filter dict, got {type(filters).__name__}")
    parts = [llamaindex_filters_to_hybridret(f) if isinstance(f, MetadataFilters) else _one(f)
             for f in filters.filters]
    parts = [p for p in parts if p]
    if not parts:
        return None
    cond = FilterCondition(filters.condition or FilterCondition.AND)
    if cond == getattr(FilterCondition, "NOT", None):  # llama-index-core >= 0.12.x has NOT
        return {"$not": parts[0] if len(parts) == 1 else {"$or": parts}}
    if len(parts) == 1:
        return parts[0]
    return {"$and" if cond == FilterCondition.AND else "$or": parts}


class HybridRetLlamaIndexRetriever(BaseRetriever):
    """A LlamaIndex retriever over a hybridret Searcher, HybridRetriever or Client (or an index path).

    ``similarity_top_k`` hits per query, searched with ``method``; ``filters`` is LlamaIndex
    ``MetadataFilters`` or a hybridret filter dict (see :func:`llamaindex_filters_to_hybridret`).
    ``aretrieve`` runs the search in a worker thread. ``group_by`` / ``group_size``: the chunks of
    the top documents (see the module docstring).
    """

    def __init__(self, searcher: SearchBackend | str | Path, *, similarity_top_k: int = 10, method: str = "hybrid",
                 filters: MetadataFilters | dict[str, Any] | None = None, group_by: str | None = None,
                 group_size: int | None = None, callback_manager: CallbackManager | None = None,
                 verbose: bool = False, **kwargs: Any) -> None:
        self.searcher = as_backend(searcher)
        self.grouping = grouping(group_by, group_size)
        self.similarity_top_k = similarity_top_k
        self.method = method
        self.filters = filters
        llamaindex_filters_to_hybridret(filters)  # a filter hybridret cannot run fails here, not at the first query
        super().__init__(callback_manager=callback_manager, verbose=verbose, **kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = hits_per_query(self.searcher, [query_bundle.query_str], self.similarity_top_k, self.method,
                              llamaindex_filters_to_hybridret(self.filters), **self.grouping)[0]
        return [hit_to_node(h, g) for h, g in zip(hits, group_fields(hits))]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)
