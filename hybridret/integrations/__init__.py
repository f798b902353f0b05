"""Adapters for LangChain, LlamaIndex and Haystack.

Each adapter wraps anything with hybridret's ``search(queries, k, method=..., filter=...) -> Hits``
signature: a :class:`~hybridret.Searcher` (read-only, thread-safe), a
:class:`~hybridret.HybridRetriever` (a living index) or a ``hybridret.client.Client`` (a running
``hybridret serve``); an index path (``str``/``Path``) opens a Searcher. Nothing here is imported by
``import hybridret``, and a framework is imported only when its adapter is first used::

    from hybridret.integrations import HybridRetLangChainRetriever       # pip install 'hybridret[langchain]'
    from hybridret.integrations import HybridRetVectorStore              # pip install 'hybridret[langchain]'
    from hybridret.integrations import HybridRetLlamaIndexRetriever      # pip install 'hybridret[llamaindex]'
    from hybridret.integrations import HybridRetLlamaIndexVectorStore    # pip install 'hybridret[llamaindex]'
    from hybridret.integrations import HybridRetHaystackRetriever        # pip install 'hybridret[haystack]'
    from hybridret.integrations import HybridRetDocumentStore            # pip install 'hybridret[haystack]'
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "HybridRetDocumentStore",
    "HybridRetHaystackRetriever",
    "HybridRetLangChainRetriever",
    "HybridRetLlamaIndexRetriever",
    "HybridRetLlamaIndexVectorStore",
    "HybridRetVectorStore",
    "haystack_filter_to_hybridret",
    "llamaindex_filters_to_hybridret",
]

_WHERE = {
    "HybridRetLangChainRetriever": "langchain",
    "HybridRetVectorStore": "langchain",
    "HybridRetLlamaIndexRetriever": "llamaindex",
    "HybridRetLlamaIndexVectorStore": "llamaindex",
    "llamaindex_filters_to_hybridret": "llamaindex",
    "HybridRetHaystackRetriever": "haystack",
    "HybridRetDocumentStore": "haystack_store",
    "haystack_filter_to_hybridret": "haystack",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
