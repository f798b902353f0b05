"""LlamaIndex: a :class:`BaseRetriever` over a hybridret index.

>>> from hybridret.integrations.llamaindex import HybridRetLlamaIndexRetriever
>>> retriever = HybridRetLlamaIndexRetriever(Searcher("indexes/mine"), similarity_top_k=5)
>>> nodes = retriever.retrieve("a question")            # list[NodeWithScore]; also await aretrieve(...)

Each result is ``NodeWithScore(node=TextNode(id_=hit.id, text=hit.text, metadata={**hit.metadata,
"title", "scores"}), score=hit.score)``; ``scores`` (the exact score of each retriever that took
part) is excluded from the metadata LlamaIndex shows an LLM or an embedding model.

A chunk (metadata ``parent_id``, as hybridret's chunking writes it) names its document in its
``SOURCE`` relationship, so ``node.ref_doc_id`` is the document id, as for nodes LlamaIndex parses
from a document. Grouped (``group_by="parent_id"``, ``group_size=g``: the chunks of the top
``similarity_top_k`` documents, in group order), ``SOURCE`` is the group key and the metadata also
holds ``group_rank`` and ``group_score`` (hidden from LLMs and embedders too).

Nodes written by :class:`~hybridret.integrations.llamaindex_store.HybridRetLlamaIndexVectorStore`
come back as they were written (class, metadata, relationships), with ``scores`` added (hidden).
The store and :class:`NoEmbedding` are importable from here too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..types import Hit, SearchBackend
from ._common import as_backend, diversity, finite_scores, group_fields, grouping, hits_per_query, require
from ._llamaindex_nodes import NODE_KEY, REF_KEY, stored_to_node

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
from llama_index.core.vector_stores.types import MetadataFilters  # noqa: E402

from ._llamaindex_filters import llamaindex_filters_to_hybridret  # noqa: E402
from .llamaindex_store import HybridRetLlamaIndexVectorStore, NoEmbedding  # noqa: E402

__all__ = ["HybridRetLlamaIndexRetriever", "HybridRetLlamaIndexVectorStore", "NoEmbedding", "hit_to_node",
           "llamaindex_filters_to_hybridret"]

_HIDDEN = ["scores", "group_rank", "group_score"]  # kept out of the text LlamaIndex builds for LLMs and embedders


def hit_to_node(hit: Hit, group: dict[str, Any] | None = None) -> NodeWithScore:
    """A hybridret :class:`~hybridret.Hit` as a LlamaIndex :class:`NodeWithScore` (``group``: its
    group's key, rank and score, from a grouped search: the node's source document)."""
    extra = {"scores": finite_scores(hit.scores)}
    if group:
        extra.update(group_rank=group["rank"], group_score=group["score"])
    if isinstance(hit.metadata.get(NODE_KEY), str):  # written by the LlamaIndex store: the node as it was
        node = stored_to_node(hit.id, hit.text, hit.title, hit.metadata)
        node.metadata.update(extra)
        for keys in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
            keys.extend(k for k in extra if k not in keys)
    else:
        meta = {**hit.metadata, "title": hit.title, **extra}
        relationships = {}
        parent = hit.metadata.get(REF_KEY)
        if isinstance(parent, str) and parent:
            relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=parent)
        node = TextNode(id_=hit.id, text=hit.text, metadata=meta, excluded_llm_metadata_keys=list(_HIDDEN),
                        excluded_embed_metadata_keys=list(_HIDDEN), relationships=relationships)
    if group:
        node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=str(group["key"]))
    return NodeWithScore(node=node, score=float(hit.score))


class HybridRetLlamaIndexRetriever(BaseRetriever):
    """A LlamaIndex retriever over a hybridret Searcher, HybridRetriever or Client (or an index path).

    ``similarity_top_k`` hits per query, searched with ``method``; ``filters`` is LlamaIndex
    ``MetadataFilters`` or a hybridret filter dict (see :func:`llamaindex_filters_to_hybridret`).
    ``aretrieve`` runs the search in a worker thread. ``group_by`` / ``group_size``: the chunks of
    the top documents (see the module docstring). ``diversify`` (MMR's λ in [0, 1]): the hits in
    maximal-marginal-relevance order, fewer near-duplicates (:mod:`hybridret.search.diversify`).
    """

    def __init__(self, searcher: SearchBackend | str | Path, *, similarity_top_k: int = 10, method: str = "hybrid",
                 filters: MetadataFilters | dict[str, Any] | None = None, group_by: str | None = None,
                 group_size: int | None = None, diversify: float | None = None, callback_manager: CallbackManager | None = None,
                 verbose: bool = False, **kwargs: Any) -> None:
        self.searcher = as_backend(searcher)
        self.grouping = grouping(group_by, group_size)
        self.diversify = diversity(diversify)
        self.similarity_top_k = similarity_top_k
        self.method = method
        self.filters = filters
        llamaindex_filters_to_hybridret(filters)  # a filter hybridret cannot run fails here, not at the first query
        super().__init__(callback_manager=callback_manager, verbose=verbose, **kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = hits_per_query(self.searcher, [query_bundle.query_str], self.similarity_top_k, self.method,
                              llamaindex_filters_to_hybridret(self.filters), details=False, **self.grouping,
                              diversify=self.diversify)[0]
        return [hit_to_node(h, g) for h, g in zip(hits, group_fields(hits))]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)

