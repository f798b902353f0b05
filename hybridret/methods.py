"""The search methods, by name: the one list the CLI, ``POST /search`` and :class:`~hybridret.Searcher` read.

A method is ``"hybrid"`` (the index's tuned fusion, else the default GQR), the name of a retriever
in :data:`hybridret.retrievers.REGISTRY` (``dense``, ``sparse``, ``bm25`` and any registered at run
time with :func:`hybridret.retrievers.register`), or a fusion method (the built-in
:data:`FUSION_METHODS`, and any registered with :func:`hybridret.fusion.register_fusion`).

The retriever names are passed in (``method_names(REGISTRY)``) and read at call time, so a
retriever registered after import is a method everywhere at once. This module imports nothing but
:mod:`hybridret.errors` (no numpy, torch, FAISS or tantivy): ``hybridret --help`` builds its
``--method`` choices from it without loading the engine, and the retriever registry, which sits
above it, validates new names with :func:`check_retriever_name`.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import ConfigError

__all__ = ["FUSION_METHODS", "HYBRID", "RESERVED", "check_method", "check_retriever_name", "method_names"]

HYBRID = "hybrid"
FUSION_METHODS: tuple[str, ...] = ("linear", "rrf", "gqr")
#: Method names that are not retrievers; a retriever may not take one of them.
RESERVED: tuple[str, ...] = (HYBRID, *FUSION_METHODS)


def method_names(retrievers: Iterable[str], fusions: Iterable[str] = FUSION_METHODS) -> tuple[str, ...]:
    """Every search method: ``hybrid``, then the retrievers given (in order), then the fusion
    methods. ``retrievers`` is the registry's names, e.g. ``method_names(REGISTRY)``; ``fusions``
    the fusion methods' (default: the built-in ones; all now: ``hybridret.fusion.FUSERS``)."""
    return (HYBRID, *retrievers, *fusions)


def check_method(method: object, retrievers: Iterable[str], fusions: Iterable[str] = FUSION_METHODS) -> str:
    """``method`` if it is a search method over ``retrievers`` and ``fusions``, else
    :class:`ConfigError` naming the methods there are."""
    names = method_names(retrievers, fusions)
    if not isinstance(method, str) or method not in names:
        raise ConfigError(f"unknown method {method!r}; expected one of {', '.join(names)}")
    return method


def check_retriever_name(name: object) -> str:
    """A name a new retriever may take: a non-empty identifier-like string (letters, digits and
    ``_``, not starting with a digit; it appears in CLI choices, JSON keys and score columns)
    that is not ``hybrid`` or a fusion method. Whether it is already taken is the registry's check."""
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise ConfigError(f"a retriever name must be a non-empty identifier (letters, digits, _), got {name!r}")
    if name in RESERVED:
        raise ConfigError(f"{name!r} is a search method ({', '.join(RESERVED)} are not retriever names); "
                          "choose another retriever name")
    return name
