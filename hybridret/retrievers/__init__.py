"""The retriever registry: every ranking signal, by name. Adding one (ColBERT, RM3, ...) is one
module with a :class:`Retriever` subclass plus one :func:`register` call (or a line in
:data:`REGISTRY` for a built-in one); the search methods (:func:`hybridret.methods.method_names`,
which the CLI's ``--method`` choices, ``POST /search`` and :meth:`Searcher.search` read at call
time), fusion validation, defaults and candidate gathering all derive from :data:`REGISTRY`."""

from __future__ import annotations

from ..methods import check_retriever_name
from .base import QueryBatch, Retriever, score_rows, search_rows
from .bm25 import BM25Retriever
from .dense import DenseRetriever, vectors_of
from .sparse import SparseRetriever

__all__ = ["REGISTRY", "RETRIEVERS", "QueryBatch", "Retriever", "get", "register", "score_rows", "search_rows",
           "unregister", "vectors_of"]

REGISTRY: dict[str, Retriever] = {r.name: r for r in (DenseRetriever(), SparseRetriever(), BM25Retriever())}
RETRIEVERS: tuple[str, ...] = tuple(REGISTRY)  # the built-in retrievers (REGISTRY also holds registered ones)


def register(retriever: Retriever, *, replace: bool = False) -> Retriever:
    """Add ``retriever`` (an instance of a :class:`Retriever` subclass) to :data:`REGISTRY` under
    its ``name``; from then on it is a search method of :meth:`Searcher.search`, the CLI's
    ``--method`` and ``POST /search``. The name must be identifier-like, not ``hybrid`` or a fusion
    method, and not registered already unless ``replace``. Returns the retriever."""
    from ..errors import ConfigError

    if not isinstance(retriever, Retriever):
        raise ConfigError(f"register() takes a Retriever instance, got {type(retriever).__name__}")
    name = check_retriever_name(getattr(retriever, "name", None))
    if name in REGISTRY and not replace:
        raise ConfigError(f"a retriever named {name!r} is registered already; pass replace=True to replace it")
    REGISTRY[name] = retriever
    return retriever


def unregister(name: str) -> Retriever:
    """Remove a retriever added with :func:`register` (tests, plugins that unload); returns it.
    The built-in retrievers cannot be removed."""
    from ..errors import ConfigError

    if name in RETRIEVERS:
        raise ConfigError(f"{name!r} is a built-in retriever and cannot be unregistered")
    try:
        return REGISTRY.pop(name)
    except KeyError:
        raise ConfigError(f"no retriever named {name!r} is registered") from None


def get(name: str) -> Retriever:
    from ..errors import ConfigError

    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown retriever {name!r}; expected one of {', '.join(REGISTRY)}") from None
