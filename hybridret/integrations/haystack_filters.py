"""Haystack's filter syntax translated into hybridret's (Mongo-style) filters, with Haystack's rules.

Shared by the retriever (:mod:`hybridret.integrations.haystack`) and the document store
(:mod:`hybridret.integrations.haystack_store`); see :func:`haystack_filter_to_hybridret`.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from ..filters import FilterError as _HybridRetFilterError
from ._common import require

require("haystack", "haystack", "Haystack")

from haystack.errors import FilterError as _HaystackFilterError  # noqa: E402

__all__ = ["HaystackFilterError", "haystack_filter_to_hybridret", "is_haystack_filter"]


class HaystackFilterError(_HybridRetFilterError, _HaystackFilterError):
    """A Haystack filter hybridret cannot run (catchable as either library's ``FilterError``)."""


# Document attributes that are not metadata: hybridret filters apply to metadata only
_DOCUMENT_FIELDS = ("id", "content", "blob", "meta", "score", "embedding", "sparse_embedding")
_RANGE = {">": "$gt", ">=": "$gte", "<": "$lt", "<=": "$lte"}
_COMPARISONS = ("==", "!=", *_RANGE, "in", "not in")
_LOGICAL = ("AND", "OR", "NOT")


def is_haystack_filter(filters: Any) -> bool:
    """Whether a dict is in Haystack's syntax (a comparison or a logical node), not hybridret's."""
    return isinstance(filters, dict) and "operator" in filters and ("field" in filters or "conditions" in filters)


def _looks_haystack(filters: Any) -> bool:
    """Haystack-shaped but incomplete (so that the error says what is missing): a ``field`` or
    ``conditions`` key, or an ``operator`` that is one of Haystack's."""
    if not isinstance(filters, dict):
        return False
    op = filters.get("operator")
    return "field" in filters or "conditions" in filters or (isinstance(op, str) and op in (*_LOGICAL, *_COMPARISONS))


def _iso_date(value: str) -> bool:
    """A full ISO 8601 date or datetime (``YYYY-MM-DD...``): the strings Haystack orders."""
    if len(value) < 10 or value[4:5] != "-" or value[7:8] != "-":
        return False
    try:
        _dt.datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _value(v: Any, where: str) -> Any:
    if isinstance(v, (_dt.datetime, _dt.date)):
        return v.isoformat()  # hybridret compares ISO dates as strings
    if isinstance(v, (dict, list, tuple, set)):
        raise HaystackFilterError(f"{where}: a {type(v).__name__} value cannot be compared with this operator")
    return v


def _field(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise HaystackFilterError(f"{where}: 'field' must be a non-empty string, got {name!r}")
    if name.startswith("meta."):
        return name[len("meta."):]
    if name in _DOCUMENT_FIELDS:
        hint = ("; Haystack's filters have no full-text operator: to filter on the words of the content pass a "
                'hybridret filter such as {"$text": {"phrase": "..."}} or {"$text": {"all": [...]}}'
                if name == "content" else "")
        raise HaystackFilterError(f"{where}: hybridret filters apply to metadata only; {name!r} is a Document "
                                  f"attribute (use 'meta.<key>'){hint}")
    return name  # legacy filters name metadata keys without "meta."


def _translate(node: Any, where: str) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise HaystackFilterError(f"{where}: expected a filter dict, got {type(node).__name__}")
    if "operator" not in node:
        raise HaystackFilterError(f"{where}: 'operator' key missing")
    op = node["operator"]
    if "field" not in node:  # logical
        if op in _COMPARISONS:
            raise HaystackFilterError(f"{where}: 'field' key missing (a comparison names the field it compares)")
        if op not in _LOGICAL:
            raise HaystackFilterError(f"{where}: unknown logical operator {op!r} (supported: {', '.join(_LOGICAL)})")
        conds = node.get("conditions")
        if not isinstance(conds, list) or not conds:
            raise HaystackFilterError(f"{where}: {op} needs a non-empty 'conditions' list")
        parts = [_translate(c, f"{where}.conditions[{i}]") for i, c in enumerate(conds)]
        if op == "NOT":  # Haystack: NOT(c1, c2, ...) = not (c1 and c2 and ...)
            return {"$not": parts[0] if len(parts) == 1 else {"$and": parts}}
        return {"$and" if op == "AND" else "$or": parts}
    if op not in _COMPARISONS:
        raise HaystackFilterError(f"{where}: unsupported comparison operator {op!r} "
                                  f"(supported: {', '.join(repr(o) for o in _COMPARISONS)})")
    if "value" not in node:
        raise HaystackFilterError(f"{where}: 'value' key missing")
    key, value = _field(node["field"], where), node["value"]
    if op in ("in", "not in"):
        if not isinstance(value, list):  # Haystack's rule: a list, not any iterable
            raise HaystackFilterError(f"{where}: {op!r} needs a list value, got {type(value).__name__}")
        return {key: {"$in" if op == "in" else "$nin": [_value(v, where) for v in value]}}
    value = _value(value, where)
    if op == "==":  # Haystack: a missing field is None, so "== None" matches it
        return {"$or": [{key: None}, {key: {"$exists": False}}]} if value is None else {key: value}
    if op == "!=":
        return {"$and": [{key: {"$exists": True}}, {key: {"$ne": None}}]} if value is None else {key: {"$ne": value}}
    if value is None:  # Haystack: nothing is ordered against None, so nothing matches
        return {"$and": [{key: {"$exists": True}}, {key: {"$exists": False}}]}
    if isinstance(value, str) and not _iso_date(value):
        raise HaystackFilterError(f"{where}: {op!r} compares numbers, or strings only as ISO dates "
                                  f"('2024-01-31', '2024-01-31T12:00:00'), got {value!r}")
    return {key: {_RANGE[op]: value}}


def haystack_filter_to_hybridret(filters: dict[str, Any] | None) -> dict[str, Any] | None:
    """A Haystack filter as a hybridret (Mongo-style) filter; a hybridret filter is returned as it is.

    ``{"field": "meta.x", "operator": OP, "value": v}`` -> ``==``: ``{"x": v}``, ``!=``:
    ``{"x": {"$ne": v}}``, ``>``/``>=``/``<``/``<=``: ``$gt``/``$gte``/``$lt``/``$lte``, ``in``/``not in``:
    ``$in``/``$nin``; ``"meta.a.b"`` -> ``"a.b"`` (nested); ``== None`` also matches a missing field and
    ``!= None`` needs it present (Haystack reads a missing field as None); a range against ``None``
    matches nothing. ``AND``/``OR`` ->
    ``$and``/``$or``; ``NOT`` (Haystack: not all of the conditions) -> ``{"$not": {"$and": [...]}}``.
    Dates/datetimes become ISO strings. As in Haystack, ranges take numbers or ISO-date strings
    (another string raises), and ``in``/``not in`` take a list (not a tuple). Filters on Document
    attributes (``id``, ``content``, ``score``, ...) and unknown operators raise
    :class:`HaystackFilterError`, as does a node missing its ``operator``, ``field``, ``value`` or
    ``conditions``.
    Differences that remain: on a list-valued field, ``==``/``in`` test membership (hybridret) where
    Haystack compares the whole list; ISO dates compare as strings, so they must share one format
    (and time zone) to order correctly, and ``==`` on a date matches the same spelling only.
    """
    if not filters:
        return None
    if is_haystack_filter(filters) or _looks_haystack(filters):
        return _translate(filters, "filters")  # incomplete Haystack nodes get an error saying what is missing
    return filters
