"""Per-document metadata: validation, storage (``metadata.jsonl``) and columns for filtering.

Metadata is any JSON object per document. Rules (checked at the library boundary, so the CLI and
the library refuse the same things):

* keys are non-empty strings that neither start with ``$`` (reserved for filter operators) nor
  contain ``.`` (dots address nested objects in filters: ``{"author.name": "Ada"}``);
* values are strings, finite numbers, booleans, ``null``, lists of those, or nested objects,
  nested at most :data:`MAX_DEPTH` deep;
* the serialised object is at most :data:`MAX_BYTES` bytes.

On disk a segment holds ``metadata.jsonl``: one JSON object per row, in row order (absent when no
document of the segment has metadata). It is parsed once when the segment is opened, into
:class:`MetadataColumns`: one typed column per field path, so a filter costs a few vectorised
comparisons per field rather than a Python loop over documents.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, IndexFormatError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MetadataColumns", "MetadataError", "MetadataWriter", "check_metadata",
           "read_metadata"]

MAX_BYTES = 65_536
MAX_DEPTH = 8
FILE = "metadata.jsonl"


class MetadataError(ConfigError):
    """A document's metadata breaks the rules above; ``field`` names the offending key path."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


MAX_INT = 2**53  # integers beyond this are not exact as the float64 that filters compare


def _check_value(value: Any, path: str, depth: int) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise MetadataError(f"metadata field {path!r} is an integer beyond ±2**53, which filters cannot compare "
                            "exactly; store it as a string", path)
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MetadataError(f"metadata field {path!r} is {value}; only finite numbers are allowed", path)
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, (list, tuple, Mapping)):
                raise MetadataError(f"metadata field {path!r}: lists may hold only strings, numbers, booleans "
                                    "and nulls", path)
            _check_value(item, path, depth)
        return
    if isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            raise MetadataError(f"metadata field {path!r} is nested deeper than {MAX_DEPTH} levels", path)
        for key, sub in value.items():
            _check_key(key, path)
            _check_value(sub, f"{path}.{key}", depth + 1)
        return
    raise MetadataError(f"metadata field {path!r} has a {type(value).__name__}; expected a JSON value", path)


def _check_key(key: Any, parent: str | None) -> None:
    where = f"{parent}." if parent else ""
    if not isinstance(key, str) or not key:
        raise MetadataError(f"metadata keys must be non-empty strings, got {key!r} in {where or 'the top level'}",
                            parent)
    if key.startswith("$") or "." in key:
        raise MetadataError(f"metadata key {where}{key!r} may not start with '$' or contain '.'", f"{where}{key}")


def check_metadata(metadata: Any) -> dict[str, Any]:
    """Validate one document's metadata and return it as a plain ``dict`` (``None`` -> ``{}``)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise MetadataError(f"metadata must be a JSON object (dict), got {type(metadata).__name__}", "metadata")
    for key, value in metadata.items():
        _check_key(key, None)
        _check_value(value, key, 1)
    try:
        size = len(json.dumps(metadata, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise MetadataError(f"metadata cannot be stored as JSON: {exc}", "metadata") from None
    if size > MAX_BYTES:
        raise MetadataError(f"metadata is {size} bytes as JSON; the limit is {MAX_BYTES}", "metadata")
    return json.loads(json.dumps(metadata))  # plain dicts/lists: tuples become lists, as they read back


class MetadataWriter:
    """Appends one metadata object per row; writes the file only if some row has metadata."""

    def __init__(self, root: str | Path) -> None:
        self.path = Path(root) / FILE
        self.rows: list[str] = []
        self.any = False

    def add(self, items: list[dict[str, Any]]) -> None:
        for meta in items:
            self.any = self.any or bool(meta)
            self.rows.append(json.dumps(meta, ensure_ascii=False, sort_keys=True))

    def close(self) -> None:
        if not self.any:
            return
        with open(self.path, "w", encoding="utf-8", newline="\n") as fh:
            fh.write("".join(f"{r}\n" for r in self.rows))
            fh.flush()
            os.fsync(fh.fileno())


def read_metadata(root: str | Path, n: int) -> list[dict[str, Any]] | None:
    """The metadata of every row of a segment, or ``None`` when it has none."""
    path = Path(root) / FILE
    if not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh]
    except (ValueError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"corrupt metadata file {path}: {exc}") from exc
    if len(rows) != n:
        raise IndexFormatError(f"{path} has {len(rows)} rows, the segment has {n} documents")
    return rows


def _leaves(meta: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every field path: leaves with their values, and nested objects themselves (for ``$exists``)."""
    for key, value in meta.items():
        path = f"{prefix}{key}"
        yield path, value
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{path}.")


class Column:
    """One field path over ``n`` rows, split by JSON type so comparisons stay type-strict
    (``1`` never equals ``true`` or ``"1"``)."""

    def __init__(self, n: int) -> None:
        self.present = np.zeros(n, dtype=bool)
        self.num = np.full(n, np.nan)  # ints and floats (not booleans)
        self.is_num = np.zeros(n, dtype=bool)
        self.str = np.full(n, None, dtype=object)
        self.is_str = np.zeros(n, dtype=bool)
        self.bool = np.zeros(n, dtype=bool)
        self.is_bool = np.zeros(n, dtype=bool)
        self.is_null = np.zeros(n, dtype=bool)
        self.lists: dict[int, list[Any]] = {}  # row -> list value (membership semantics)

    def set(self, row: int, value: Any) -> None:
        self.present[row] = True
        if isinstance(value, bool):
            self.bool[row] = value
            self.is_bool[row] = True
        elif isinstance(value, (int, float)):
            self.num[row] = float(value)
            self.is_num[row] = True
        elif isinstance(value, str):
            self.str[row] = value
            self.is_str[row] = True
        elif value is None:
            self.is_null[row] = True
        elif isinstance(value, list):
            self.lists[row] = value
        # an object is only present: it equals nothing and has no order


class MetadataColumns:
    """Typed columns of every field path of one segment's metadata (built once, then read-only)."""

    def __init__(self, rows: list[dict[str, Any]] | None, n: int) -> None:
        self.n = n
        self.columns: dict[str, Column] = {}
        for i, meta in enumerate(rows or ()):
            for path, value in _leaves(meta):
                col = self.columns.get(path)
                if col is None:
                    col = self.columns[path] = Column(n)
                col.set(i, value)

    def get(self, path: str) -> Column | None:
        return self.columns.get(path)
