"""LlamaIndex: a vector store over a living hybridret index (ingestion, deletes, queries).

>>> from llama_index.core import StorageContext, VectorStoreIndex
>>> from hybridret import HybridRetriever
>>> from hybridret.integrations.llamaindex import HybridRetLlamaIndexVectorStore, NoEmbedding
>>> store = HybridRetLlamaIndexVectorStore(HybridRetriever.load("indexes/kb"))
>>> index = VectorStoreIndex(nodes, storage_context=StorageContext.from_defaults(vector_store=store),
...                          embed_model=NoEmbedding())
>>> index.as_retriever(similarity_top_k=5).retrieve("a question")
>>> index.delete_ref_doc("doc-1")                       # every node of that document

hybridret encodes text with its own dense + learned-sparse models (and BM25), so the store needs no
LlamaIndex embedding model: ``is_embedding_query`` is ``False`` (queries go by ``query_str``) and
node embeddings are ignored. LlamaIndex still asks for an embed model when it builds an index and
an ``IngestionPipeline`` only writes nodes that carry an embedding, so pass :class:`NoEmbedding`
(``embed_model=NoEmbedding()``, or last in the pipeline's transformations): it computes nothing and
needs no network, where LlamaIndex's default would load OpenAI.

Writes go to a :class:`~hybridret.HybridRetriever` (a fresh one is indexed by the first ``add``) or a
:class:`~hybridret.client.Client`; each ``add`` is an upsert by node id, committed when it returns.
A read-only :class:`~hybridret.Searcher` (or an index path) answers queries and refuses writes.
How nodes are stored (text, metadata, ``ref_doc_id`` in ``parent_id``): see
:mod:`hybridret.integrations._llamaindex_nodes`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, HybridRetWarning
from ..types import SearchBackend
from ._common import FIRST_BUILD as _FIRST_BUILD
from ._common import as_backend, hits_per_query, require
from ._llamaindex_nodes import REF_KEY, node_to_entry, stored_to_node

require("llama_index.core", "llamaindex", "LlamaIndex")

from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from llama_index.core.schema import BaseNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    BasePydanticVectorStore,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from pydantic import PrivateAttr  # noqa: E402

from ._llamaindex_filters import llamaindex_filters_to_hybridret  # noqa: E402

__all__ = ["HybridRetLlamaIndexVectorStore", "NoEmbedding"]

logger = logging.getLogger(__name__)

_GET_BATCH = 200  # ids per get(): a Client sends them in the URL
_EVERYTHING = {"$or": [{REF_KEY: {"$exists": True}}, {REF_KEY: {"$exists": False}}]}  # matches every document
_MODES = {VectorStoreQueryMode.DEFAULT: None, VectorStoreQueryMode.HYBRID: "hybrid",
          VectorStoreQueryMode.SPARSE: "sparse", VectorStoreQueryMode.TEXT_SEARCH: "bm25"}


class NoEmbedding(BaseEmbedding):
    """A LlamaIndex embedding model that computes nothing, for stores that encode text themselves.

    Every text and query gets the vector ``[1.0]``, instantly and offline. Use it where LlamaIndex
    wants an embed model in front of :class:`HybridRetLlamaIndexVectorStore`
    (``VectorStoreIndex(..., embed_model=NoEmbedding())``, ``Settings.embed_model = NoEmbedding()``)
    and as the last transformation of an ``IngestionPipeline``, which writes only nodes that carry an
    embedding. It is no use for a store that searches by vector.
    """

    model_name: str = "hybridret-no-embedding"

    @classmethod
    def class_name(cls) -> str:
        return "HybridRetNoEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return [1.0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return [1.0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return [1.0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return [[1.0] for _ in texts]


class HybridRetLlamaIndexVectorStore(BasePydanticVectorStore):
    """A LlamaIndex ``BasePydanticVectorStore`` over a hybridret index.

    ``index``: a :class:`~hybridret.HybridRetriever` (loaded, or fresh: the first ``add`` builds
    its index, in a temporary directory until ``retriever.save(path)``), a hybridret ``Client``
    (writes through ``hybridret serve``), or a read-only ``Searcher`` / index path (queries only).

    - ``add(nodes)`` upserts: node id = hybridret id, the node's text is encoded and stored; its
      metadata is stored (filterable) and, with ``embed_metadata`` (default, as LlamaIndex embeds
      nodes), its ``MetadataMode.EMBED`` string is encoded with the text as hybridret's title. The
      node's ``ref_doc_id`` goes to metadata field ``ref_doc_id_key`` (``"parent_id"``, the field
      hybridret's own chunking and ``group_by`` use). Nodes are already chunks: hybridret does not
      cut them again. Node embeddings are ignored (a warning says so once when they are real ones).
    - ``delete(ref_doc_id)`` deletes every node of that document (none: nothing happens);
      ``delete_nodes(node_ids=..., filters=...)`` deletes those nodes (unknown ids are skipped);
      ``clear()`` deletes **every** document of the index, the store's or not.
    - ``query(VectorStoreQuery)`` searches ``query_str`` with ``method`` (mode ``default``; ``hybrid``,
      ``sparse`` (learned sparse) and ``text_search`` (BM25) pick a method; ``alpha`` in hybrid mode
      is a linear fusion ``alpha * dense + (1 - alpha) * sparse``), ``similarity_top_k`` (or
      ``hybrid_top_k`` in hybrid mode) results, ``filters`` (see :func:`llamaindex_filters_to_hybridret`)
      and ``doc_ids`` (nodes of those documents). ``vector_store_kwargs={"method": "rrf"}`` picks any
      hybridret method. The nodes come back as they were added, scores in ``similarities``.
    - ``get_nodes(node_ids=..., filters=...)`` reads nodes back (no arguments: every node), from any
      backend (filters go through its document listing, ``documents(filter)``).
    - Refused with an error that says why: ``node_ids`` in a query (hybridret filters metadata, not
      ids), ``sparse_top_k``, the ``mmr``/``svm``/regression/``semantic_hybrid`` modes (hybridret
      exposes no document vectors), and a query without ``query_str``.
    ``persist`` does nothing: every write is already committed to the index directory.
    """

    stores_text: bool = True
    is_embedding_query: bool = False
    method: str = "hybrid"
    ref_doc_id_key: str = REF_KEY
    embed_metadata: bool = True

    _index: Any = PrivateAttr()
    _client_checked: bool = PrivateAttr(default=False)
    _warned_embeddings: bool = PrivateAttr(default=False)
    _limits: dict[str, Any] = PrivateAttr(default_factory=dict)

    def __init__(self, index: SearchBackend | str | Path, *, method: str = "hybrid", ref_doc_id_key: str = REF_KEY,
                 embed_metadata: bool = True, **kwargs: Any) -> None:
        if not isinstance(ref_doc_id_key, str) or not ref_doc_id_key or ref_doc_id_key.startswith("$") \
                or "." in ref_doc_id_key:
            raise ConfigError(f"ref_doc_id_key must be a metadata key (non-empty, no '.', not starting with '$'), "
                              f"got {ref_doc_id_key!r}")
        from ..fusion import FUSERS
        from ..methods import check_method
        from ..retrievers import REGISTRY

        check_method(method, REGISTRY, FUSERS)  # a method hybridret does not have fails here, not at the first query
        super().__init__(method=method, ref_doc_id_key=ref_doc_id_key, embed_metadata=embed_metadata, **kwargs)
        self._index = as_backend(index)
        if _is_retriever(self._index) and not self._index.settings.get("store_text", True):
            raise ConfigError("this HybridRetriever keeps no document text (store_text=False), and a LlamaIndex "
                              "vector store must return its nodes' text: use one built with store_text=True")

    @classmethod
    def class_name(cls) -> str:
        return "HybridRetLlamaIndexVectorStore"

    @property
    def client(self) -> Any:
        """The hybridret backend: the HybridRetriever, Client or Searcher given."""
        return self._index

    # -- writes -----------------------------------------------------------------------------------
    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        """Upsert ``nodes``; returns their ids, in order. ``kwargs`` go to hybridret's ``upsert``
        (e.g. ``ttl=3600``)."""
        backend = self._writable()
        nodes = list(nodes)
        entries = [node_to_entry(n, ref_key=self.ref_doc_id_key, embed_metadata=self.embed_metadata) for n in nodes]
        if not entries:
            return []
        self._note_embeddings(nodes)
        with _FIRST_BUILD:  # two first writes at once: one builds, the other then upserts into it
            built = _is_fresh(backend)
            if built:
                backend.index(_unique(entries), **kwargs)
        if not built and _is_retriever(backend):
            backend.upsert(_unique(entries), chunk_tokens=0, **kwargs)  # nodes are chunks already
        elif not built:
            self._check_client(backend)
            for batch in _batches(_unique(entries), self._write_limit(backend)):
                backend.upsert(batch, **kwargs)
        return [e["id"] for e in entries]

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        return await asyncio.to_thread(self.add, nodes, **kwargs)

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node whose ``ref_doc_id`` is ``ref_doc_id`` (no such node: nothing happens)."""
        _no_kwargs("delete", delete_kwargs)
        if not isinstance(ref_doc_id, str) or not ref_doc_id:
            raise ConfigError(f"ref_doc_id must be a non-empty string, got {ref_doc_id!r}")
        backend = self._writable()
        if not _is_fresh(backend):
            backend.delete(filter={self.ref_doc_id_key: ref_doc_id})

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        await asyncio.to_thread(self.delete, ref_doc_id, **delete_kwargs)

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Delete the nodes with these ids (unknown ones are skipped), or those matching ``filters``,
        or those of ``node_ids`` that match ``filters``; one commit. ``node_ids=[]`` deletes nothing."""
        _no_kwargs("delete_nodes", delete_kwargs)
        if node_ids is None and filters is None:
            raise ConfigError("delete_nodes needs node_ids or filters (clear() deletes every node)")
        backend = self._writable()
        if _is_fresh(backend):
            return
        ids = None if node_ids is None else _ids(node_ids)
        flt = llamaindex_filters_to_hybridret(filters)
        if flt is not None and ids is not None:
            ids = _keep(ids, [d["id"] for d in self._listed(backend, flt)])
        if ids is not None:
            if ids:
                backend.delete(ids, missing="ignore")
        elif flt is not None:
            backend.delete(filter=flt)

    async def adelete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                            **delete_kwargs: Any) -> None:
        await asyncio.to_thread(self.delete_nodes, node_ids, filters, **delete_kwargs)

    def clear(self) -> None:
        """Delete every document of the index (one commit), including any the store did not write."""
        backend = self._writable()
        if not _is_fresh(backend):
            backend.delete(filter=_EVERYTHING)

    async def aclear(self) -> None:
        await asyncio.to_thread(self.clear)

    # -- reads ------------------------------------------------------------------------------------
    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Search ``query.query_str``; see the class docstring for what each field does."""
        method = kwargs.pop("method", None)
        _no_kwargs("query", kwargs)
        text = query.query_str
        if not isinstance(text, str) or not text.strip():
            raise ConfigError("hybridret searches by text: VectorStoreQuery.query_str is empty (a query_embedding "
                              "alone cannot be searched; hybridret encodes the query with its own models)")
        mode = VectorStoreQueryMode(query.mode)
        if mode not in _MODES:
            raise NotImplementedError(f"vector_store_query_mode {mode.value!r} needs document vectors, which "
                                      f"hybridret does not expose; use one of {', '.join(m.value for m in _MODES)}")
        if query.node_ids:
            raise NotImplementedError("hybridret filters by metadata, not by node id: use filters (or doc_ids, "
                                      f"the nodes of some documents) instead of node_ids={query.node_ids[:3]!r}")
        if query.sparse_top_k is not None:
            raise NotImplementedError("sparse_top_k has no hybridret equivalent (fusion fuses each retriever's "
                                      "candidates to similarity_top_k results); leave it unset")
        k = query.similarity_top_k
        if mode == VectorStoreQueryMode.HYBRID and query.hybrid_top_k is not None:
            k = query.hybrid_top_k
        method = method or _MODES[mode] or self.method
        fusion = None
        if query.alpha is not None:
            if mode != VectorStoreQueryMode.HYBRID:
                raise ConfigError(f"alpha weighs dense against sparse in vector_store_query_mode='hybrid', not in "
                                  f"{mode.value!r}")
            method, fusion = "linear", _alpha_fusion(query.alpha)
        flt = self._query_filter(query)
        if _is_fresh(self._index):
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        hits = hits_per_query(self._index, [text], k, method, flt, details=False, fusion=fusion)[0]
        nodes = [stored_to_node(h.id, h.text, h.title, h.metadata, ref_key=self.ref_doc_id_key) for h in hits]
        return VectorStoreQueryResult(nodes=nodes, similarities=[float(h.score) for h in hits], ids=[h.id for h in hits])

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        return await asyncio.to_thread(self.query, query, **kwargs)

    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        """The stored nodes with these ids (unknown ids left out, in the order given), those matching
        ``filters`` (in written order), or with neither every node of the index."""
        backend = self._index
        if _is_fresh(backend):
            return []
        ids = None if node_ids is None else list(dict.fromkeys(_ids(node_ids)))
        flt = llamaindex_filters_to_hybridret(filters)
        if ids is None:
            docs = self._listed(backend, flt)
        elif flt is not None:
            by_id = {d["id"]: d for d in self._listed(backend, flt)}
            docs = [by_id[i] for i in ids if i in by_id]
        else:
            docs = [d for start in range(0, len(ids), _GET_BATCH) for d in backend.get(ids[start:start + _GET_BATCH])
                    if d is not None]
        return [stored_to_node(d["id"], d.get("text") or "", d.get("title") or "", d.get("metadata"),
                               ref_key=self.ref_doc_id_key) for d in docs]

    async def aget_nodes(self, node_ids: list[str] | None = None,
                         filters: MetadataFilters | None = None) -> list[BaseNode]:
        return await asyncio.to_thread(self.get_nodes, node_ids, filters)

    # -- helpers ----------------------------------------------------------------------------------
    def _writable(self) -> Any:
        return as_backend(self._index, writable=True)

    def _query_filter(self, query: VectorStoreQuery) -> dict[str, Any] | None:
        parts = [f for f in (llamaindex_filters_to_hybridret(query.filters),) if f]
        if query.doc_ids:
            parts.append({self.ref_doc_id_key: {"$in": _ids(query.doc_ids)}})
        return None if not parts else parts[0] if len(parts) == 1 else {"$and": parts}

    @staticmethod
    def _listed(backend: Any, flt: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The live documents matching ``flt`` (``None``: all), through the backend's listing."""
        if not callable(getattr(backend, "documents", None)):
            raise ConfigError(f"listing nodes by filter needs a backend that lists documents (a Searcher, "
                              f"HybridRetriever or Client), not a {type(backend).__name__}; "
                              "get_nodes(node_ids=...) works on any backend")
        return list(backend.documents(flt))

    def _note_embeddings(self, nodes: list[BaseNode]) -> None:
        if self._warned_embeddings:
            return
        if any(n.embedding is not None and len(n.embedding) > 1 for n in nodes):
            self._warned_embeddings = True
            warnings.warn("hybridret ignores LlamaIndex node embeddings (it encodes text with its own models); "
                          "pass embed_model=NoEmbedding() (hybridret.integrations.llamaindex) so that "
                          "LlamaIndex does not compute them", HybridRetWarning, stacklevel=3)

    def _check_client(self, backend: Any) -> None:
        """A served index that chunks documents would cut nodes again (and rename them): refuse it."""
        if self._client_checked or not callable(getattr(backend, "info", None)):
            return
        info = backend.info()
        if isinstance(info, dict) and info.get("chunking"):
            raise ConfigError(f"the served index cuts documents into chunks ({info['chunking']}); LlamaIndex nodes "
                              "are chunks already and would be cut and renamed: serve an index built without "
                              "chunk_tokens for the LlamaIndex store")
        self._client_checked = True
        self._limits = info.get("limits", {}) if isinstance(info, dict) else {}

    def _write_limit(self, backend: Any) -> tuple[int, int]:
        limits = self._limits
        return int(limits.get("documents") or 1000), int(limits.get("body_bytes") or 16 * 1024 * 1024)


def _is_retriever(backend: Any) -> bool:
    from ..retriever import HybridRetriever

    return isinstance(backend, HybridRetriever)


def _is_fresh(backend: Any) -> bool:
    """A HybridRetriever with no index yet (the first add builds one)."""
    return _is_retriever(backend) and backend.path is None


def _unique(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last entry of each id (a batch may repeat a node; hybridret refuses repeated ids)."""
    return list({e["id"]: e for e in entries}.values())


def _batches(entries: list[dict[str, Any]], limit: tuple[int, int]) -> list[list[dict[str, Any]]]:
    """Entries in requests of at most ``limit[0]`` documents and about half ``limit[1]`` bytes."""
    import json

    count, body = limit
    out: list[list[dict[str, Any]]] = [[]]
    size = 0
    for e in entries:
        n = len(json.dumps(e, ensure_ascii=False).encode("utf-8"))
        if out[-1] and (len(out[-1]) >= count or size + n > body // 2):
            out.append([])
            size = 0
        out[-1].append(e)
        size += n
    return out


def _ids(node_ids: Any) -> list[str]:
    if isinstance(node_ids, str) or not isinstance(node_ids, (list, tuple)):
        raise ConfigError(f"node_ids / doc_ids must be a list of ids, got {type(node_ids).__name__}")
    bad = [i for i in node_ids if not isinstance(i, str)]
    if bad:
        raise ConfigError(f"node ids are strings, got {bad[0]!r}")
    return list(node_ids)


def _keep(ids: list[str], allowed: list[str]) -> list[str]:
    ok = set(allowed)
    return [i for i in ids if i in ok]


def _alpha_fusion(alpha: Any) -> dict[str, Any]:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or not 0 <= alpha <= 1:
        raise ConfigError(f"alpha must be a number between 0 (sparse only) and 1 (dense only), got {alpha!r}")
    return {"method": "linear", "retrievers": ["dense", "sparse"],
            "weights": {"dense": float(alpha), "sparse": 1.0 - float(alpha)}}


def _no_kwargs(what: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise TypeError(f"HybridRetLlamaIndexVectorStore.{what} got unexpected arguments {sorted(kwargs)}")
