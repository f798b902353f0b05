"""LangChain: a :class:`BaseRetriever` and a :class:`VectorStore` over a hybridret index.

>>> from hybridret import Searcher
>>> from hybridret.integrations.langchain import HybridRetLangChainRetriever
>>> retriever = HybridRetLangChainRetriever(searcher=Searcher("indexes/mine"), k=5)
>>> docs = retriever.invoke("a question")                       # or invoke(q, k=3, filter={...})
>>> many = retriever.batch(["q1", "q2"])                        # one batched hybridret search

Each result is a ``Document(id=hit.id, page_content=hit.text, metadata={**hit.metadata, "id",
"score", "scores", "title"})``: ``score`` is the method's score, ``scores`` the exact score of each
retriever that took part (``dense``/``sparse``/``bm25``; a retriever that did not score the hit is
left out). These four keys win over document metadata fields of the same name. A search with
relevance (``HybridRetVectorStore.similarity_search_with_relevance_scores``, a retriever with
``score_threshold``) adds ``"relevance"``: the calibrated probability in [0, 1] that the hit is
relevant (:mod:`hybridret.search.relevance`).

Grouped (``group_by="parent_id"``, ``group_size=g``: the top ``k`` documents, each with its best
``g`` chunks, in group order), each chunk's metadata also holds ``"group"`` (its document's key:
the ``group_by`` value), ``"group_rank"`` and ``"group_score"``, as LangChain's parent-document
retrievers link a chunk to its parent through metadata.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..types import Hit, SearchBackend
from ._common import as_backend, diversity, finite_scores, group_fields, grouping, hits_per_query, require

require("langchain_core", "langchain", "LangChain")

from langchain_core.callbacks import (  # noqa: E402
    AsyncCallbackManagerForRetrieverRun,
    CallbackManager,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langchain_core.runnables.config import get_config_list, run_in_executor  # noqa: E402
from langchain_core.vectorstores import VectorStore  # noqa: E402
from pydantic import ConfigDict, field_validator, model_validator  # noqa: E402

__all__ = ["HybridRetLangChainRetriever", "HybridRetVectorStore", "hit_to_document"]


def check_threshold(value: Any) -> float | None:
    """A ``score_threshold``: ``None`` or a number in [0, 1] (a calibrated relevance)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"score_threshold is a relevance in [0, 1] (hybridret's calibrated relevance), got {value!r}")
    return float(value)


def hit_to_document(hit: Hit, group: dict[str, Any] | None = None) -> Document:
    """A hybridret :class:`~hybridret.Hit` as a LangChain :class:`Document` (``group``: its
    group's key, rank and score, from a grouped search)."""
    meta = {**hit.metadata, "id": hit.id, "score": float(hit.score), "scores": finite_scores(hit.scores),
            "title": hit.title}
    if hit.relevance is not None:
        meta["relevance"] = float(hit.relevance)
    if group:
        meta.update(group=group["key"], group_rank=group["rank"], group_score=group["score"])
    return Document(id=hit.id, page_content=hit.text, metadata=meta)


class HybridRetLangChainRetriever(BaseRetriever):
    """A LangChain retriever over a hybridret Searcher, HybridRetriever or Client (or an index path).

    ``k``, ``filter`` (hybridret's Mongo-style metadata filter) and ``method`` are defaults;
    ``invoke(query, k=..., filter=..., method=...)`` overrides them for one call (a filter given
    replaces the default one; ``{}`` means no filter), and they are pydantic fields, so
    ``configurable_fields(k=ConfigurableField(id="k"))`` makes them settable from a RunnableConfig.
    ``batch`` runs one batched search for all its inputs; ``ainvoke``/``abatch`` run the search in a
    thread executor (hybridret searches release the GIL in FAISS and tantivy). ``group_by`` /
    ``group_size``: return the chunks of the top ``k`` documents (see the module docstring).
    ``score_threshold`` (in [0, 1]): search with relevance and return only the hits whose calibrated
    relevance is at least that (``metadata["relevance"]``; docs/relevance.md). ``diversify`` (MMR's λ
    in [0, 1]): the hits in maximal-marginal-relevance order, fewer near-duplicates
    (:mod:`hybridret.search.diversify`).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    searcher: Any  # a SearchBackend after _check_searcher (Any: pydantic would need get() on every backend)
    """A Searcher, HybridRetriever, hybridret Client, or an index directory (opens a Searcher)."""
    k: int = 10
    method: str = "hybrid"
    filter: dict[str, Any] | None = None
    group_by: str | None = None
    group_size: int | None = None
    score_threshold: float | None = None
    diversify: float | None = None

    @field_validator("searcher", mode="before")
    @classmethod
    def _check_searcher(cls, value: Any) -> SearchBackend:
        return as_backend(value)

    @field_validator("score_threshold", mode="before")
    @classmethod
    def _check_threshold(cls, value: Any) -> float | None:
        return check_threshold(value)

    @field_validator("diversify", mode="before")
    @classmethod
    def _check_diversify(cls, value: Any) -> float | None:
        return diversity(value)

    @model_validator(mode="after")
    def _check_grouping(self) -> HybridRetLangChainRetriever:
        grouping(self.group_by, self.group_size)  # bad grouping fails here, not at the first query
        return self

    def _search(self, queries: list[str], *, k: int | None = None, filter: dict[str, Any] | None = None,
                method: str | None = None) -> list[list[Document]]:
        t = self.score_threshold
        hits = hits_per_query(self.searcher, queries, self.k if k is None else k, method or self.method,
                              self.filter if filter is None else filter,
                              **grouping(self.group_by, self.group_size), relevance=True if t is not None else None,
                              diversify=self.diversify)
        return [[hit_to_document(h, g) for h, g in zip(per_query, group_fields(per_query))
                 if t is None or (h.relevance is not None and h.relevance >= t)] for per_query in hits]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, filter: dict[str, Any] | None = None,
                                method: str | None = None) -> list[Document]:
        return self._search([query], k=k, filter=filter, method=method)[0]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        return await run_in_executor(None, self._get_relevant_documents, query, run_manager=run_manager.get_sync(),
                                     **kwargs)

    def batch(self, inputs: list[str], config: RunnableConfig | list[RunnableConfig] | None = None, *,
              return_exceptions: bool = False, **kwargs: Any) -> list[Any]:
        """All inputs in one hybridret search (``kwargs``: ``k``, ``filter``, ``method`` for all);
        callbacks see one retriever run per input, as with ``invoke``."""
        if not inputs:
            return []
        configs = get_config_list(config, len(inputs))
        runs = []
        for query, cfg in zip(inputs, configs):
            manager = CallbackManager.configure(
                cfg.get("callbacks"), None, verbose=False, inheritable_tags=cfg.get("tags"), local_tags=self.tags,
                inheritable_metadata={**(cfg.get("metadata") or {}), **self._get_ls_params(**kwargs)},
                local_metadata=self.metadata)
            runs.append(manager.on_retriever_start(None, query, name=cfg.get("run_name") or self.get_name(),
                                                   run_id=cfg.get("run_id")))
        try:
            results = self._search(list(inputs), **kwargs)
        except Exception as exc:
            for run in runs:
                run.on_retriever_error(exc)
            if return_exceptions:
                return [exc] * len(inputs)
            raise
        for run, docs in zip(runs, results):
            run.on_retriever_end(docs)
        return results

    async def abatch(self, inputs: list[str], config: RunnableConfig | list[RunnableConfig] | None = None, *,
                     return_exceptions: bool = False, **kwargs: Any) -> list[Any]:
        """:meth:`batch` in a thread executor."""
        return await run_in_executor(None, self.batch, inputs, config, return_exceptions=return_exceptions, **kwargs)


class HybridRetVectorStore(VectorStore):
    """A LangChain vector store over a living hybridret index (a HybridRetriever or a Client).

    hybridret encodes with its own dense + learned-sparse models, so there is no ``Embeddings``
    object: ``embeddings`` is ``None`` and ``from_texts``/``from_documents`` require
    ``embedding=None`` and build a new index with :meth:`HybridRetriever.from_models`.

    - ``add_documents``/``add_texts`` **upsert** (LangChain's "add or update"); ids come from
      ``ids=``, else ``Document.id``, else ``metadata["id"]``, else a new UUID4. ``metadata["title"]``
      becomes the hybridret title; every other metadata key is stored as metadata.
    - ``delete(ids)`` deletes (``missing="ignore"`` skips unknown ids; ``delete()`` with no ids, i.e.
      "delete everything", is refused).
    - ``similarity_search(query, k=4, filter=None, method=None)`` and ``similarity_search_with_score``
      search (hybrid by default); ``get_by_ids`` reads stored documents (in-process or through a Client).
    - ``similarity_search_with_relevance_scores(query, k, score_threshold=None, filter=None,
      method=None)`` and ``as_retriever(search_type="similarity_score_threshold",
      search_kwargs={"score_threshold": t})``: the score is hybridret's calibrated ``relevance``
      (a probability in [0, 1], non-increasing down the list; docs/relevance.md), never a mapped
      raw score; hits below the threshold are dropped.
    - Not supported, with a NotImplementedError that says why: searching by vector and MMR (hybridret
      exposes no document vectors).
    A read-only Searcher works for searching; writes then raise :class:`~hybridret.ConfigError`.
    """

    def __init__(self, index: SearchBackend | str | Path, *, method: str = "hybrid") -> None:
        self.index = as_backend(index)
        self.method = method

    @property
    def embeddings(self) -> Embeddings | None:
        return None

    # -- writes ---------------------------------------------------------------------------------
    def add_documents(self, documents: list[Document], *, ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Upsert ``documents``; returns their ids. ``kwargs`` go to hybridret's ``upsert``."""
        backend = as_backend(self.index, writable=True)
        documents = list(documents)
        if ids is not None and len(ids) != len(documents):
            raise ValueError(f"got {len(ids)} ids for {len(documents)} documents")
        docs = self._entries(documents)
        for i, entry in enumerate(docs):
            if ids is not None and ids[i]:
                entry["id"] = str(ids[i])
        if docs:
            backend.upsert(docs, **kwargs)
        return [entry["id"] for entry in docs]

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete documents by id (``missing="ignore"``: unknown ids are skipped, else they raise
        :class:`~hybridret.DocumentNotFoundError` and nothing is deleted)."""
        if ids is None:
            raise ValueError("HybridRetVectorStore.delete needs the ids to delete (deleting everything is not supported)")
        backend = as_backend(self.index, writable=True)
        ids = [ids] if isinstance(ids, str) else list(ids)
        if ids:
            backend.delete(ids, **kwargs)
        return True

    # -- reads ----------------------------------------------------------------------------------
    def similarity_search_with_score(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                                     method: str | None = None, **kwargs: Any) -> list[tuple[Document, float]]:
        """``(Document, score)`` pairs, best first; the score is the method's (higher is better)."""
        if kwargs:
            raise TypeError(f"unexpected arguments {sorted(kwargs)} (HybridRetVectorStore takes k, filter, method)")
        hits = hits_per_query(self.index, [query], k, method or self.method, filter)[0]
        return [(hit_to_document(h), float(h.score)) for h in hits]

    def similarity_search(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                          method: str | None = None, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter, method, **kwargs)]

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The stored documents with these ids (unknown ids are left out, repeated ids given once), from
        any backend: a Searcher, a HybridRetriever or a :class:`~hybridret.client.Client` (``GET /documents``)."""
        wanted = [str(i) for i in dict.fromkeys(ids)]
        if not wanted:
            return []
        out = []
        for doc in self.index.get(wanted):
            if doc is None:
                continue
            meta = dict(doc.get("metadata") or {})
            out.append(Document(id=doc["id"], page_content=doc.get("text") or "",
                                metadata={**meta, "id": doc["id"], "title": doc.get("title") or ""}))
        return out

    def similarity_search_with_relevance_scores(self, query: str, k: int = 4, **kwargs: Any
                                                ) -> list[tuple[Document, float]]:
        """``(Document, relevance)`` pairs, best first: hybridret's calibrated relevance in [0, 1]
        (also in ``metadata["relevance"]``). ``score_threshold`` (a number in [0, 1]) keeps the hits
        whose relevance is at least that; ``filter`` and ``method`` as in :meth:`similarity_search`."""
        check_threshold(kwargs.get("score_threshold"))
        return super().similarity_search_with_relevance_scores(query, k, **kwargs)

    def _similarity_search_with_relevance_scores(self, query: str, k: int = 4, filter: dict[str, Any] | None = None,
                                                 method: str | None = None, **kwargs: Any
                                                 ) -> list[tuple[Document, float]]:
        if kwargs:
            raise TypeError(f"unexpected arguments {sorted(kwargs)} (HybridRetVectorStore takes k, filter, method, "
                            "score_threshold)")
        hits = hits_per_query(self.index, [query], k, method or self.method, filter, relevance=True)[0]
        if any(h.relevance is None for h in hits):
            raise ConfigError(f"{type(self.index).__name__} returned hits without relevance; it needs a hybridret "
                              "search with relevance=True (a Searcher, HybridRetriever or Client)")
        return [(hit_to_document(h), float(h.relevance)) for h in hits]  # type: ignore[arg-type]

    def _select_relevance_score_fn(self) -> Any:
        raise NotImplementedError("hybridret's relevance is calibrated per hit from every retriever's score, not "
                                  "mapped from one raw score; use similarity_search_with_relevance_scores")

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, **kwargs: Any) -> list[Document]:
        raise NotImplementedError("hybridret searches by text (dense + learned sparse + BM25 need the query text); "
                                  "use similarity_search")

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      **kwargs: Any) -> list[Document]:
        raise NotImplementedError("MMR needs document vectors, which hybridret's search API does not return")

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, **kwargs: Any) -> list[Document]:
        raise NotImplementedError("MMR needs document vectors, which hybridret's search API does not return")

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None = None,
                   metadatas: list[dict[str, Any]] | None = None, *, ids: list[str] | None = None,
                   path: str | Path | None = None, dense_model: str | None = None, sparse_model: str | None = None,
                   device: str | None = None, encoder: Any = None, method: str = "hybrid",
                   overwrite: bool = False, **settings: Any) -> HybridRetVectorStore:
        """Build a new index of ``texts`` with hybridret's models (``dense_model``/``sparse_model``:
        ``None`` = the packaged MiniLM + SPLADE-tiny), in ``path`` (default: a temporary directory,
        removed with the store) and return a store over it; ``encoder`` (a hybridret encoder, e.g.
        an already loaded ``PairedEncoder``) replaces the two model names. ``embedding`` must be ``None``:
        hybridret cannot use a LangChain ``Embeddings`` object. ``settings`` go to
        :class:`~hybridret.HybridRetriever` (e.g. ``faiss_factory``)."""
        from ..retriever import HybridRetriever

        if embedding is not None:
            raise ValueError("hybridret encodes with its own dense + sparse models: pass embedding=None and, to "
                             "choose them, dense_model=/sparse_model=")
        texts = list(texts)
        if metadatas is not None and len(metadatas) != len(texts):
            raise ValueError(f"got {len(metadatas)} metadatas for {len(texts)} texts")
        if encoder is not None:
            retriever = HybridRetriever(encoder, device=device, **settings)
        else:
            retriever = HybridRetriever.from_models(dense_model, sparse_model, device=device, **settings)
        store = cls(retriever, method=method)
        docs = [Document(id=(ids[i] if ids else None), page_content=t, metadata=dict(metadatas[i]) if metadatas else {})
                for i, t in enumerate(texts)]
        entries = store._entries(docs)
        retriever.index(entries, workdir=path, overwrite=overwrite)
        return store

    def _entries(self, documents: Iterable[Document]) -> list[dict[str, Any]]:
        out = []
        for doc in documents:
            meta = dict(doc.metadata or {})
            doc_id = doc.id or meta.get("id") or str(uuid.uuid4())
            meta.pop("id", None)
            title = meta.pop("title", "")
            entry: dict[str, Any] = {"id": str(doc_id), "text": doc.page_content, "metadata": meta}
            if title:
                entry["title"] = str(title)
            out.append(entry)
        return out
