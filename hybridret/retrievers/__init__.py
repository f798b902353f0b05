"""The retriever registry: every ranking signal, by name. Adding one (ColBERT, RM3, ...) is one
module with a :class:`Retriever` subclass plus one line here; the search methods
(:data:`hybridret.searcher.METHODS`), fusion validation, defaults and candidate gathering all derive
from :data:`REGISTRY` (the CLI's ``--method`` choices are a literal, kept equal by a test, so that
``hybridret --help`` need not import the engine)."""

from __future__ import annotations

from .base import QueryBatch, Retriever, score_rows, search_rows
from .bm25 import BM25Retriever
from .dense import DenseRetriever, vectors_of
from .sparse import SparseRetriever

__all__ = ["REGISTRY", "RETRIEVERS", "QueryBatch", "Retriever", "get", "score_rows", "search_rows", "vectors_of"]

REGISTRY: dict[str, Retriever] = {r.name: r for r in (DenseRetriever(), SparseRetriever(), BM25Retriever())}
RETRIEVERS: tuple[str, ...] = tuple(REGISTRY)


def get(name: str) -> Retriever:
    from ..errors import ConfigError

    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown retriever {name!r}; expected one of {', '.join(RETRIEVERS)}") from None
