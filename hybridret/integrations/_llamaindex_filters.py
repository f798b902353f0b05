"""LlamaIndex ``MetadataFilters`` as hybridret filters (the retriever's and the vector store's)."""

from __future__ import annotations

from typing import Any

from ..filters import FilterError
from ._common import require

require("llama_index.core", "llamaindex", "LlamaIndex")

from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

__all__ = ["llamaindex_filters_to_hybridret"]

_TEXT_KEYS = ("text", "content")  # text_match on these keys: the node's text, not a metadata field

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
    if op in (FilterOperator.TEXT_MATCH, getattr(FilterOperator, "TEXT_MATCH_INSENSITIVE", FilterOperator.TEXT_MATCH)):
        if key in _TEXT_KEYS:  # the node's own text: hybridret's full-text filter (analysed words in a row)
            if not isinstance(value, str):
                raise FilterError(f"LlamaIndex filter {op.value!r} on {key!r}: expected a string, got {value!r}")
            return {"$text": {"phrase": value}}
        raise FilterError(f"LlamaIndex filter operator {op.value!r} on the metadata field {key!r}: hybridret matches "
                          f"words in a document's text only; use the key 'text' (MetadataFilter(key='text', "
                          f"value=..., operator={op.value!r})) or a hybridret filter {{\"$text\": {{\"phrase\": ...}}}}")
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
    ``text_match`` / ``text_match_insensitive`` on the key ``"text"`` (or ``"content"``) -> the
    full-text filter ``{"$text": {"phrase": value}}`` (the value's analysed words, in a row, in the
    node's text: lowercased and stemmed, so both operators mean the same; not a substring match);
    on a metadata key they raise :class:`~hybridret.FilterError`, as ``is_empty`` does.
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
