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
from .sparse import SparseApproxRetriever, SparseRetriever

__all__ = ["BUILTIN", "REGISTRY", "RETRIEVERS", "QueryBatch", "Retriever", "get", "register", "score_rows", "search_rows",
           "registered", "unregister", "vectors_of"]

REGISTRY: dict[str, Retriever] = {r.name: r for r in (DenseRetriever(), SparseRetriever(), BM25Retriever(),
                                                     SparseApproxRetriever())}
#: The built-in retrievers that fused methods use by default (REGISTRY also holds registered ones).
RETRIEVERS: tuple[str, ...] = ("dense", "sparse", "bm25")
#: Every built-in retriever: those, and the opt-in approximate learned sparse (never fused by default).
BUILTIN: tuple[str, ...] = (*RETRIEVERS, "sparse_approx")


def register(retriever: Retriever, *, replace: bool = False) -> Retriever:
    """Add ``retriever`` (an instance of a :class:`Retriever` subclass) to :data:`REGISTRY` under
    its ``name``; from then on it is a search method of :meth:`Searcher.search`, the CLI's
    ``--method`` and ``POST /search``, and a retriever fused methods can name. Its ``part_type``
    (a segment part format of its own) and ``representation`` (one no encoder makes), when set,
    are registered too: indexes built from then on write that part in every segment, and writes
    and queries make that representation. The name must be identifier-like, not ``hybrid`` or a fusion
    method, and not registered already unless ``replace``. Returns the retriever."""
    from ..errors import ConfigError

    if not isinstance(retriever, Retriever):
        raise ConfigError(f"register() takes a Retriever instance, got {type(retriever).__name__}")
    name = check_retriever_name(getattr(retriever, "name", None))
    if name in REGISTRY and not replace:
        raise ConfigError(f"a retriever named {name!r} is registered already; pass replace=True to replace it")
    if retriever.part_type is not None:  # a part format of its own: every index built from now on writes it
        from ..index.parts import check_name, register_part_type

        check_name(retriever.part_name)
        register_part_type(retriever.part_type, replace=True)
    if retriever.representation is not None:  # a representation no encoder makes
        from ..encoders.reps import register_representation

        if retriever.representation.name != retriever.needs:
            raise ConfigError(f"retriever {name!r} needs {retriever.needs!r} but brings representation "
                              f"{retriever.representation.name!r}")
        register_representation(retriever.representation, replace=True)
    REGISTRY[name] = retriever
    return retriever


def unregister(name: str) -> Retriever:
    """Remove a retriever added with :func:`register` (tests, plugins that unload); returns it.
    The built-in retrievers cannot be removed."""
    from ..errors import ConfigError

    if name in BUILTIN:
        raise ConfigError(f"{name!r} is a built-in retriever and cannot be unregistered")
    try:
        retriever = REGISTRY.pop(name)
    except KeyError:
        raise ConfigError(f"no retriever named {name!r} is registered") from None
    if retriever.representation is not None and not any(r.representation is retriever.representation
                                                        for r in REGISTRY.values()):
        from ..encoders.reps import unregister_representation

        unregister_representation(retriever.representation.name)
    return retriever


def registered() -> list[Retriever]:
    """The retrievers added with :func:`register` (the built-in ones aside), in registration order."""
    return [r for name, r in REGISTRY.items() if name not in BUILTIN]


def get(name: str) -> Retriever:
    from ..errors import ConfigError

    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown retriever {name!r}; expected one of {', '.join(REGISTRY)}") from None
