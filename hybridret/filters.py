"""Metadata filters: the syntax vector databases use (MongoDB-style), parsed once, evaluated as row masks.

Syntax (a JSON object; several keys in one object are ANDed)::

    {"source": "wiki"}                         equality (on a list field: the list contains the value)
    {"source": {"$ne": "wiki"}}                not equal (documents without the field match)
    {"lang": {"$in": ["en", "de"]}}            one of ($nin: none of; missing fields match $nin)
    {"year": {"$gte": 2020, "$lt": 2024}}      ranges: $gt $gte $lt $lte on numbers, or on strings
                                               (ISO dates compare correctly as strings)
    {"url": {"$exists": true}}                 the field is present (null counts as present)
    {"$and": [F, ...]}  {"$or": [F, ...]}  {"$not": F}
    {"author.name": "Ada"}                     dots address nested objects
    {"$text": {"phrase": "error code 0x80070005"}}               full text: these words in a row
    {"$text": {"all": ["a", "b"], "any": [...], "none": ["c"]}}  every / one of / none of these words

Comparisons are type-strict: ``1`` matches neither ``true`` nor ``"1"``; integers and floats compare
as numbers. A filter is applied *before* top-k in every retriever (see :mod:`hybridret.retrievers`):
exact retrievers (Flat dense, learned sparse, BM25) return the exact top-k of the matching documents
(learned sparse and BM25 never return a document that scores 0); HNSW/IVF segments return the
matching documents their graph or lists reach (docs/filters.md measures the recall).

``$text`` matches the document's own text (title and text), not metadata: every word or phrase is
analysed by the analyzer BM25 uses (lowercase, English stop words dropped, stemmed), and a document
passes when the analysed tokens of its text hold each entry's tokens consecutively (an entry of one
token: that token anywhere). Its keys (``phrase``, ``all``, ``any``, ``none``) are ANDed; the
segment answers it (:mod:`hybridret.index.textmatch`), so :meth:`Filter.mask` takes the segment.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from .errors import ConfigError, FilterError, TextUnavailable
from .index.metadata import MAX_INT, Column, MetadataColumns

__all__ = ["DOCUMENT_FIELDS", "MAX_IN_VALUES", "TEXT_KEYS", "Filter", "FilterError", "TextUnavailable", "parse_filter"]

_FIELD_OPS = ("$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists")
_RANGE = ("$gt", "$gte", "$lt", "$lte")
_MAX_NODES = 1024
_MAX_DEPTH = 32
MAX_IN_VALUES = 10_000  # values of one $in / $nin list: each is compared with the column once
# a document's own fields: not metadata, so a filter on them would match as if no document had them
DOCUMENT_FIELDS = ("id", "_id", "title", "text", "contents")


@dataclass(frozen=True)
class _Cond:
    path: str
    op: str
    value: Any


@dataclass(frozen=True)
class _Text:
    """``$text``: each entry is the analysed token sequence of one word or phrase (with where it was given)."""

    phrase: tuple[tuple[tuple[str, ...], str], ...]  # every one must be held
    all: tuple[tuple[tuple[str, ...], str], ...]
    any: tuple[tuple[tuple[str, ...], str], ...]  # at least one (when given)
    none: tuple[tuple[tuple[str, ...], str], ...]  # none of them
    where: str


@dataclass(frozen=True)
class _Bool:
    op: str  # $and | $or | $not
    children: tuple[Node, ...]


Node = Union[_Cond, _Bool, _Text]
TEXT_KEYS = ("phrase", "all", "any", "none")
MAX_TEXT_CHARS = 10_000  # one word or phrase of a $text filter


def _scalar(value: Any, where: str) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise FilterError(f"{where}: the integer {value} is beyond ±2**53 (metadata cannot hold it)")
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise FilterError(f"{where}: expected a string, number, boolean or null, got {value!r}")


def _parse_field(path: str, spec: Any, where: str) -> list[Node]:
    if not path or path.startswith("$"):
        raise FilterError(f"{where}: unknown operator {path!r} (expected $and, $or, $not, $text or a field name)")
    if not isinstance(spec, Mapping) or not any(str(k).startswith("$") for k in spec):
        if isinstance(spec, (list, tuple)):
            raise FilterError(f"{where}: a list needs an operator, e.g. {{{json.dumps(path)}: {{\"$in\": [...]}}}}")
        return [_Cond(path, "$eq", _scalar(spec, where))]
    out: list[Node] = []
    for op, value in spec.items():
        at = f"{where}.{op}"
        if op not in _FIELD_OPS:
            raise FilterError(f"{at}: unknown operator (expected one of {', '.join(_FIELD_OPS)})")
        if op in ("$in", "$nin"):
            if not isinstance(value, (list, tuple)):
                raise FilterError(f"{at}: expected a list of values")
            if len(value) > MAX_IN_VALUES:
                raise FilterError(f"{at}: {len(value)} values; a list holds at most {MAX_IN_VALUES} "
                                  "(hybridret.filters.MAX_IN_VALUES; group documents under a metadata field instead)")
            value = tuple(_scalar(v, f"{at}[{i}]") for i, v in enumerate(value))
        elif op == "$exists":
            if not isinstance(value, bool):
                raise FilterError(f"{at}: expected true or false")
        elif op in _RANGE:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (
                    isinstance(value, float) and not math.isfinite(value)):
                raise FilterError(f"{at}: expected a number or a string, got {value!r}")
            if isinstance(value, int) and abs(value) > MAX_INT:
                raise FilterError(f"{at}: the integer {value} is beyond ±2**53 (metadata cannot hold it)")
        else:
            value = _scalar(value, at)
        out.append(_Cond(path, op, value))
    return out


def _analyzed(value: Any, where: str, analyzer: Any) -> tuple[tuple[str, ...], str]:
    if not isinstance(value, str) or not value.strip():
        raise FilterError(f"{where}: expected a non-empty string (a word or a phrase), got {value!r}")
    if len(value) > MAX_TEXT_CHARS:
        raise FilterError(f"{where}: {len(value)} characters; a word or phrase has at most {MAX_TEXT_CHARS}")
    tokens = tuple(analyzer.analyze(value))
    if not tokens:
        raise FilterError(f"{where}: {value!r} has no searchable word: the analyzer drops English stop words "
                          "(the, of, in, ...) and words over 40 characters, so it would match nothing; leave it out "
                          "or name a content word")
    return tokens, where


def _parse_text(spec: Any, where: str, count: list[int]) -> _Text:
    if not isinstance(spec, Mapping) or not spec:
        raise FilterError(f"{where}: expected an object with one or more of {', '.join(TEXT_KEYS)}, e.g. "
                          '{"$text": {"phrase": "error code 0x80070005"}}')
    from .index.analysis import bm25_analyzer

    analyzer = bm25_analyzer()
    parts: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {key: () for key in TEXT_KEYS}
    for key, value in spec.items():
        at = f"{where}.{key}"
        if key not in TEXT_KEYS:
            raise FilterError(f"{at}: unknown $text key (expected {', '.join(TEXT_KEYS)})")
        if key == "phrase" and isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not value:
            want = "a string or a non-empty list of strings" if key == "phrase" else 'a non-empty list of words, e.g. ["a", "b"]'
            raise FilterError(f"{at}: expected {want}, got {value!r}")
        if len(value) > MAX_IN_VALUES:
            raise FilterError(f"{at}: {len(value)} entries; at most {MAX_IN_VALUES}")
        count[0] += len(value)
        if count[0] > _MAX_NODES:
            raise FilterError(f"filter has more than {_MAX_NODES} conditions")
        parts[key] = tuple(_analyzed(v, f"{at}[{i}]" if len(value) > 1 or key != "phrase" else at, analyzer)
                           for i, v in enumerate(value))
    return _Text(parts["phrase"], parts["all"], parts["any"], parts["none"], where)


def _parse(spec: Any, where: str, count: list[int], depth: int = 0) -> Node:
    count[0] += 1
    if count[0] > _MAX_NODES:
        raise FilterError(f"filter has more than {_MAX_NODES} conditions")
    if depth > _MAX_DEPTH:
        raise FilterError(f"filter is nested more than {_MAX_DEPTH} levels deep")
    if not isinstance(spec, Mapping):
        raise FilterError(f"{where}: expected a JSON object, got {type(spec).__name__}")
    if not spec:
        raise FilterError(f"{where}: empty filter object")
    nodes: list[Node] = []
    for key, value in spec.items():
        if not isinstance(key, str):
            raise FilterError(f"{where}: keys must be strings, got {key!r}")
        at = f"{where}.{key}"
        if key in ("$and", "$or"):
            if not isinstance(value, (list, tuple)) or not value:
                raise FilterError(f"{at}: expected a non-empty list of filters")
            nodes.append(_Bool(key, tuple(_parse(v, f"{at}[{i}]", count, depth + 1) for i, v in enumerate(value))))
        elif key == "$not":
            nodes.append(_Bool("$not", (_parse(value, at, count, depth + 1),)))
        elif key == "$text":
            nodes.append(_parse_text(value, at, count))
        else:
            nodes.extend(_parse_field(key, value, at))
    return nodes[0] if len(nodes) == 1 else _Bool("$and", tuple(nodes))


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _eq(col: Column, value: Any) -> np.ndarray:
    if value is None:
        out = col.is_null.copy()
    elif isinstance(value, bool):
        out = col.is_bool & (col.bool == value)
    elif _num(value):
        out = col.is_num & (col.num == float(value))
    else:
        out = col.is_str & (col.str == value)
    for row, items in col.lists.items():  # list fields: membership, type-strict
        out[row] = any(_same(x, value) for x in items)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _num(a) and _num(b):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


def _range(col: Column, op: str, value: Any) -> np.ndarray:
    if _num(value):
        base, vals, bound = col.is_num, col.num, float(value)
    else:
        base, vals, bound = col.is_str, col.str, value
    out = np.zeros(col.present.shape, dtype=bool)
    idx = np.flatnonzero(base)
    if len(idx):
        sub = vals[idx]
        cmp = {"$gt": sub > bound, "$gte": sub >= bound, "$lt": sub < bound, "$lte": sub <= bound}[op]
        out[idx] = np.asarray(cmp, dtype=bool)
    for row, items in col.lists.items():
        out[row] = any(_cmp(x, op, value) for x in items)
    return out


def _cmp(x: Any, op: str, value: Any) -> bool:
    if not ((_num(x) and _num(value)) or (isinstance(x, str) and isinstance(value, str))):
        return False
    return {"$gt": x > value, "$gte": x >= value, "$lt": x < value, "$lte": x <= value}[op]


def _text_mask(node: _Text, n: int, text: Any) -> np.ndarray:
    def held(entry: tuple[tuple[str, ...], str]) -> np.ndarray:
        try:
            return text.mask(entry[0])
        except TextUnavailable as exc:
            raise FilterError(f"{entry[1]}: {exc}") from None

    if text is None:
        raise FilterError(f"{node.where}: full-text conditions are checked against a segment's text; "
                          "this evaluation was given metadata only")
    out = np.ones(n, dtype=bool)
    for entry in node.phrase + node.all:
        out &= held(entry)
    if node.any:
        some = np.zeros(n, dtype=bool)
        for entry in node.any:
            some |= held(entry)
        out &= some
    for entry in node.none:
        out &= ~held(entry)
    return out


def _eval(node: Node, cols: MetadataColumns, text: Any = None) -> np.ndarray:
    n = cols.n
    if isinstance(node, _Text):
        return _text_mask(node, n, text)
    if isinstance(node, _Bool):
        parts = [_eval(c, cols, text) for c in node.children]
        if node.op == "$not":
            return ~parts[0]
        out = parts[0].copy()
        for p in parts[1:]:
            out = (out & p) if node.op == "$and" else (out | p)
        return out
    col = cols.get(node.path)
    if col is None:  # no document of this segment has the field
        return np.full(n, node.op in ("$ne", "$nin") or (node.op == "$exists" and not node.value), dtype=bool)
    if node.op == "$exists":
        return col.present.copy() if node.value else ~col.present
    if node.op == "$eq":
        return _eq(col, node.value)
    if node.op == "$ne":
        return ~_eq(col, node.value)
    if node.op in ("$in", "$nin"):
        out = np.zeros(n, dtype=bool)
        for v in node.value:
            out |= _eq(col, v)
        return out if node.op == "$in" else ~out
    return _range(col, node.op, node.value)


class Filter:
    """A parsed, validated filter; :meth:`mask` evaluates it over one segment's metadata."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec
        self.root = _parse(spec, "filter", [0])
        self._has_text = self._find_text()

    def conditions(self) -> Iterator[tuple[str, str]]:
        """Every condition of the filter as ``(field path, operator)``."""
        stack: list[Node] = [self.root]
        while stack:
            node = stack.pop()
            if isinstance(node, _Bool):
                stack.extend(node.children)
            elif isinstance(node, _Cond):
                yield node.path, node.op

    def check_fields(self, columns: Iterable[MetadataColumns]) -> None:
        """Refuse a condition on a document's own field (``id``, ``_id``, ``title``, ``text``,
        ``contents``: :data:`DOCUMENT_FIELDS`) that no metadata of ``columns`` (one per segment)
        holds: filters match metadata only, so it would narrow the answer to nothing (or, under
        ``$ne`` / ``$exists: false``, to everything) without a word. A metadata field of that name
        (``{"metadata": {"title": ...}}``) is filtered as usual."""
        suspect = {path for path, _ in self.conditions() if path.split(".", 1)[0] in DOCUMENT_FIELDS}
        if not suspect:
            return
        for cols in columns:
            suspect = {path for path in suspect if cols.get(path) is None}
            if not suspect:
                return
        path = sorted(suspect)[0]
        top = path.split(".", 1)[0]
        what = "the document id" if top in ("id", "_id") else f"the document's {top}"
        hint = ("; to act on given ids pass them by id (delete(ids=[...]), get)" if top in ("id", "_id") else
                '; to filter on the words of the text use {"$text": {"phrase": ...}} or {"$text": {"all": [...]}}')
        raise FilterError(f"filter.{path}: {top!r} is {what}, not a metadata field; filters match metadata only "
                          f"and no document has a metadata field {path!r}{hint}")

    @property
    def has_text(self) -> bool:
        """Whether the filter has a ``$text`` condition (so :meth:`mask` needs the segment's text)."""
        return self._has_text

    def _find_text(self) -> bool:
        stack: list[Node] = [self.root]
        while stack:
            node = stack.pop()
            if isinstance(node, _Text):
                return True
            if isinstance(node, _Bool):
                stack.extend(node.children)
        return False

    def mask(self, columns: MetadataColumns, text: Any = None) -> np.ndarray:
        """Boolean mask over the segment's rows: ``True`` where the document matches. ``text``: the
        segment's :class:`~hybridret.index.textmatch.TextMatcher` (``segment.text``), needed by
        ``$text`` conditions."""
        return _eval(self.root, columns, text)

    def segment_mask(self, segment: Any) -> np.ndarray:
        """:meth:`mask` of an opened :class:`~hybridret.index.segment.Segment`."""
        return _eval(self.root, segment.columns, segment.text if self.has_text else None)

    def __repr__(self) -> str:
        return f"Filter({json.dumps(self.spec, sort_keys=True)})"


def parse_filter(spec: Filter | Mapping[str, Any] | str | None) -> Filter | None:
    """A :class:`Filter` from a dict, a JSON string (CLI ``--filter``) or ``None`` (no filter)."""
    if spec is None or isinstance(spec, Filter):
        return spec
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except (ValueError, RecursionError) as exc:
            raise FilterError(f"filter is not valid JSON: {exc}") from None
    if isinstance(spec, Sequence) or not isinstance(spec, Mapping):
        raise FilterError(f"filter must be a JSON object, got {type(spec).__name__}")
    return Filter(spec)
