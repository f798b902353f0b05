"""Arrow and Parquet input: documents from Parquet files (one file, or a folder of them), and from
``pyarrow`` tables and record batches given to the library.

Parquet is read one row group at a time, in record batches of :data:`BATCH_ROWS` rows, and only
the columns the mapping uses, so memory holds one batch whatever the file's size. The columns:

* **id**: ``_id`` or ``id`` (default), a string or integer column; a null id is an error.
* **text**: ``text`` or ``contents`` (default), a string column; a null text reads as empty.
* **title**: ``title`` when the table has one, a string column; null reads as empty.
* **metadata**: every other column (default), or the columns named; a ``metadata`` column holding a
  struct, a map or a JSON object string is merged in, as the ``"metadata"`` field of a JSON Lines
  corpus is. A null value is left out (a column store's way of saying "absent"); dates and times
  become ISO strings, decimals floats.

Errors are :class:`~hybridret.errors.CorpusFormatError` naming the file, the row group and the row
(for a table given to the library, the batch and the row), and the column at fault. pyarrow is the
``parquet`` extra; without it reading raises :class:`~hybridret.errors.MissingDependencyError`.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, CorpusFormatError, MissingDependencyError

__all__ = ["BATCH_ROWS", "PARQUET_SUFFIXES", "ColumnMap", "ParquetCorpus", "arrow_documents", "is_arrow",
           "parquet_files", "require_pyarrow"]

#: Rows per record batch read from a Parquet row group (memory holds one batch of the used columns).
BATCH_ROWS = 1024
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
_ID_COLUMNS = ("_id", "id")
_TEXT_COLUMNS = ("text", "contents")
_ARROW_KINDS = ("Table", "RecordBatch", "RecordBatchReader")


def require_pyarrow() -> Any:
    """The ``pyarrow`` module, or :class:`MissingDependencyError` naming the extra that installs it."""
    try:
        import pyarrow
    except ImportError as exc:
        raise MissingDependencyError("reading Parquet or Arrow input needs pyarrow, which is not installed: "
                                     f"pip install 'hybridret[parquet]' ({exc})") from exc
    return pyarrow


def is_arrow(obj: Any) -> bool:
    """Whether ``obj`` is a pyarrow ``Table``, ``RecordBatch`` or ``RecordBatchReader`` (checked
    without importing pyarrow)."""
    kind = type(obj)
    return kind.__module__.startswith("pyarrow") and kind.__name__ in _ARROW_KINDS


@dataclass(frozen=True)
class ColumnMap:
    """Which columns hold a document's id, title, text and metadata (``None``: the defaults; see
    the module docstring). ``metadata``: the columns that become metadata, ``()`` for none."""

    id: str | None = None
    text: str | None = None
    title: str | None = None
    metadata: tuple[str, ...] | None = None

    @classmethod
    def of(cls, value: ColumnMap | Mapping[str, Any] | None) -> ColumnMap:
        """A :class:`ColumnMap` from itself, ``None`` or a mapping with the keys ``id``, ``text``,
        ``title``, ``metadata``."""
        if value is None:
            return cls()
        if isinstance(value, ColumnMap):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"columns must be a mapping such as {{'id': 'doc_id', 'text': 'body'}}, "
                              f"got {type(value).__name__}")
        unknown = set(value) - {"id", "text", "title", "metadata"}
        if unknown:
            raise ConfigError(f"unknown keys in columns: {sorted(unknown)} (expected id, text, title, metadata)")
        for key in ("id", "text", "title"):
            v = value.get(key)
            if v is not None and (not isinstance(v, str) or not v):
                raise ConfigError(f"columns[{key!r}] must be a column name, got {v!r}")
        meta = value.get("metadata")
        if meta is not None:
            if isinstance(meta, str) or not isinstance(meta, Iterable) or \
                    not all(isinstance(m, str) and m for m in meta):
                raise ConfigError(f"columns['metadata'] must be a list of column names, got {meta!r}")
            meta = tuple(meta)
        return cls(value.get("id"), value.get("text"), value.get("title"), meta)

    def resolve(self, names: Sequence[str], where: str) -> _Resolved:
        """The columns of a table with these ``names``; :class:`CorpusFormatError` naming ``where``
        when a column is missing."""
        have = set(names)
        listed = ", ".join(names) or "none"

        def pick(given: str | None, defaults: tuple[str, ...], what: str, flag: str, required: bool) -> str | None:
            if given is not None:
                if given not in have:
                    raise CorpusFormatError(f"no {what} column {given!r} (the columns are: {listed})", path=where,
                                            field=given)
                return given
            found = next((c for c in defaults if c in have), None)
            if found is None and required:
                raise CorpusFormatError(f"no {what} column (expected {' or '.join(map(repr, defaults))}; the columns "
                                        f"are: {listed}); name it with {flag}", path=where, field=defaults[0])
            return found

        id_ = pick(self.id, _ID_COLUMNS, "id", "--id-column (library: columns={'id': ...})", True)
        text = pick(self.text, _TEXT_COLUMNS, "text", "--text-column (library: columns={'text': ...})", True)
        title = pick(self.title, ("title",), "title", "--title-column", False)
        taken = {id_, text, title}
        if self.metadata is None:
            meta = [c for c in names if c not in taken and c != "metadata"]
            merged = "metadata" if "metadata" in have and "metadata" not in taken else None
        else:
            missing = [c for c in self.metadata if c not in have]
            if missing:
                raise CorpusFormatError(f"no metadata column {missing[0]!r} (the columns are: {listed})", path=where,
                                        field=missing[0])
            clash = [c for c in self.metadata if c in taken]
            if clash:
                raise CorpusFormatError(f"column {clash[0]!r} is the id, title or text; it cannot be metadata too",
                                        path=where, field=clash[0])
            meta = [c for c in self.metadata if c != "metadata"]
            merged = "metadata" if "metadata" in self.metadata else None
        return _Resolved(id_, text, title, tuple(meta), merged)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Resolved:
    id: str
    text: str
    title: str | None
    metadata: tuple[str, ...]
    merged: str | None  # a struct / map / JSON-string column merged into the metadata

    @property
    def columns(self) -> list[str]:
        out = [self.id, self.text, *([self.title] if self.title else []), *self.metadata]
        return out + ([self.merged] if self.merged else [])


def _check_types(schema: Any, cols: _Resolved, where: str) -> None:
    """Refuse an id column that is not string or integer, a text or title column that is not string."""
    pa = require_pyarrow()
    types = pa.types

    def text_like(t: Any) -> bool:
        return types.is_string(t) or types.is_large_string(t) or getattr(types, "is_string_view", lambda _: False)(t) \
            or types.is_null(t)

    t = schema.field(cols.id).type
    if not (text_like(t) and not types.is_null(t) or types.is_integer(t)):
        raise CorpusFormatError(f"the id column {cols.id!r} has type {t}; ids must be strings or integers",
                                path=where, field=cols.id)
    for name in (cols.text, cols.title):
        if name is not None and not text_like(schema.field(name).type):
            raise CorpusFormatError(f"the column {name!r} has type {schema.field(name).type}; it must hold strings",
                                    path=where, field=name)
    if cols.merged is not None:
        t = schema.field(cols.merged).type
        if not (types.is_struct(t) or types.is_map(t) or text_like(t)):
            raise CorpusFormatError(f"the column 'metadata' has type {t}; it must be a struct, a map or JSON object "
                                    "strings", path=where, field="metadata")


def _json_value(value: Any, column: str) -> Any:
    """An Arrow value as JSON: dates and times as ISO strings, decimals as floats, maps as objects."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"column {column!r} holds {value}, which JSON metadata cannot store")
        return value
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _json_value(v, column) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(x, tuple) and len(x) == 2 for x in value) \
            and _is_map_list(value):
        return {str(k): _json_value(v, column) for k, v in value}
    if isinstance(value, (list, tuple)):
        return [_json_value(v, column) for v in value]
    if isinstance(value, (bytes, bytearray)):
        raise ValueError(f"column {column!r} holds binary data, which metadata cannot store (leave it out with "
                         "--metadata-columns, library: columns={'metadata': [...]})")
    raise ValueError(f"column {column!r} holds a {type(value).__name__}, which metadata cannot store")


def _is_map_list(value: list[Any]) -> bool:
    return all(isinstance(k, str) for k, _ in value)


def _merged(value: Any, column: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"column {column!r} is not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(value, dict):
            raise ValueError(f"column {column!r} must hold a JSON object, got {type(value).__name__}")
        return value
    out = _json_value(value, column)
    if not isinstance(out, dict):
        raise ValueError(f"column {column!r} must hold an object, got {type(out).__name__}")
    return {k: v for k, v in out.items() if v is not None}  # a struct's absent fields read as null


def batch_documents(batch: Any, cols: _Resolved, where: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(row, {"id", "title", "text", "metadata"})`` for every row of one record batch (what
    :class:`~hybridret.data.Document` holds); ``where(row)`` names a row in errors."""
    from .index.metadata import check_metadata

    n = batch.num_rows
    names = batch.schema.names
    data = {c: batch.column(names.index(c)).to_pylist() for c in cols.columns}
    ids, texts = data[cols.id], data[cols.text]
    titles = data[cols.title] if cols.title else None
    for r in range(n):
        doc_id = ids[r]
        if doc_id is None:
            raise CorpusFormatError(f"{where(r)}: the id ({cols.id!r}) is null", field=cols.id)
        doc_id = str(doc_id)
        if not doc_id.strip() or "\n" in doc_id or "\r" in doc_id:
            raise CorpusFormatError(f"{where(r)}: invalid id {doc_id!r} in column {cols.id!r} (blank or holds a line "
                                    "break)", field=cols.id)
        text = texts[r] or ""
        title = (titles[r] or "") if titles is not None else ""
        meta: dict[str, Any] = {}
        try:
            if cols.merged is not None:
                meta.update(_merged(data[cols.merged][r], cols.merged))
            for c in cols.metadata:
                v = data[c][r]
                if v is None:
                    continue
                if c in meta and meta[c] != _json_value(v, c):
                    raise ValueError(f"column {c!r} is given both as a column and inside 'metadata'")
                meta[c] = _json_value(v, c)
            meta = check_metadata(meta)
        except ValueError as exc:  # MetadataError too
            field = getattr(exc, "field", None) or "metadata"
            raise CorpusFormatError(f"{where(r)} (id {doc_id!r}): {exc}", field=field) from None
        yield r, {"id": doc_id, "title": title, "text": text, "metadata": meta}


def _batches_of(obj: Any) -> Iterator[Any]:
    """The record batches of a Table, RecordBatch or RecordBatchReader."""
    kind = type(obj).__name__
    if kind == "RecordBatch":
        yield obj
    elif kind == "Table":
        yield from obj.to_batches(max_chunksize=BATCH_ROWS)
    else:
        yield from obj


def arrow_documents(data: Any, columns: ColumnMap | Mapping[str, Any] | None = None, *, label: str = "table"
                    ) -> Iterator[dict[str, Any]]:
    """The documents (``{"id", "title", "text", "metadata"}``) of a pyarrow ``Table``,
    ``RecordBatch``, ``RecordBatchReader``, or an iterable of those (streamed: one batch at a
    time). Errors name the batch and the row."""
    require_pyarrow()
    cmap = ColumnMap.of(columns)
    items = [data] if is_arrow(data) else data
    batch_no = 0
    offset = 0
    resolved: tuple[Any, _Resolved] | None = None
    for item in items:
        if not is_arrow(item):
            raise CorpusFormatError(f"{label}: expected pyarrow Tables or RecordBatches, got {type(item).__name__}")
        for batch in _batches_of(item):
            if resolved is None or resolved[0] != batch.schema:
                cols = cmap.resolve(batch.schema.names, label)
                _check_types(batch.schema, cols, label)
                resolved = (batch.schema, cols)
            cols = resolved[1]
            base, b = offset, batch_no

            def where(r: int, base: int = base, b: int = b) -> str:
                return f"{label}: batch {b}, row {r} (row {base + r} overall, counting from 0)"

            for _, doc in batch_documents(batch, cols, where):
                yield doc
            offset += batch.num_rows
            batch_no += 1


def flatten_arrow(documents: Iterable[Any], columns: ColumnMap | Mapping[str, Any] | None = None) -> Iterator[Any]:
    """``documents`` with every pyarrow Table / RecordBatch among them (or the whole, if it is one)
    replaced by its documents; other items pass through as they are."""
    if is_arrow(documents):
        yield from arrow_documents(documents, columns)
        return
    for i, item in enumerate(documents):
        if is_arrow(item):
            yield from arrow_documents(item, columns, label=f"documents[{i}] (a {type(item).__name__})")
        else:
            yield item


# --------------------------------------------------------------------------- Parquet files


def parquet_files(path: Path) -> list[Path]:
    """``path`` itself, or the Parquet files under a folder (recursively, in name order; files whose
    name starts with ``_`` or ``.``, such as ``_SUCCESS`` or ``_metadata``, are left out)."""
    if not path.is_dir():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in PARQUET_SUFFIXES
                  and not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts))


class ParquetCorpus:
    """The Parquet files of a corpus path, their footers read and their columns checked against
    ``columns`` at construction (before any model loads): a missing column, a wrong type or a
    file that is not Parquet fails here, naming the file."""

    def __init__(self, path: Path, columns: ColumnMap | Mapping[str, Any] | None = None) -> None:
        require_pyarrow()
        import pyarrow.parquet as pq

        self.path = path
        self.columns = ColumnMap.of(columns)
        self.files = parquet_files(path)
        if not self.files:
            raise CorpusFormatError("the folder holds no Parquet files (*.parquet)", path=str(path))
        self.num_rows = 0
        self._resolved: list[_Resolved] = []
        for f in self.files:
            try:
                meta = pq.read_metadata(f)
                schema = pq.read_schema(f)
            except OSError as exc:
                raise CorpusFormatError(f"not a readable Parquet file ({exc})", path=str(f)) from None
            except Exception as exc:  # pyarrow's ArrowInvalid for a file that is not Parquet
                raise CorpusFormatError(f"not a readable Parquet file ({exc})", path=str(f)) from None
            cols = self.columns.resolve(schema.names, str(f))
            _check_types(schema, cols, str(f))
            self._resolved.append(cols)
            self.num_rows += int(meta.num_rows)

    def read_columns(self) -> list[str]:
        """The columns a read needs (the same in every file)."""
        return self._resolved[0].columns

    def describe(self, loc: tuple[int, int, int, int]) -> str:
        """A row's place, from the location :meth:`records` gives: file, row group, row."""
        f, g, r, row = loc
        return f"{self.files[f]}: row group {g}, row {r} (row {row} of the file, counting from 0)"

    def records(self) -> Iterator[tuple[tuple[int, int, int, int], dict[str, Any]]]:
        """``(location, {"id", "title", "text", "metadata"})`` per row, file after file, row group after row group, in batches
        (:meth:`describe` turns a location into words)."""
        import pyarrow.parquet as pq

        for i, (f, cols) in enumerate(zip(self.files, self._resolved)):
            name = str(f)
            try:
                pf = pq.ParquetFile(f)
            except Exception as exc:
                raise CorpusFormatError(f"not a readable Parquet file ({exc})", path=name) from None
            start = 0
            for g in range(pf.num_row_groups):
                offset = 0
                try:
                    for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=cols.columns):
                        base = offset

                        def where(r: int, base: int = base, start: int = start, g: int = g, i: int = i) -> str:
                            return self.describe((i, g, base + r, start + base + r))

                        for r, doc in batch_documents(batch, cols, where):
                            yield (i, g, base + r, start + base + r), doc
                        offset += batch.num_rows
                except CorpusFormatError:
                    raise
                except OSError as exc:
                    raise CorpusFormatError(f"row group {g} cannot be read ({exc})", path=name) from None
                except Exception as exc:  # ArrowInvalid / ArrowTypeError on a corrupt page
                    raise CorpusFormatError(f"row group {g} cannot be read ({type(exc).__name__}: {exc})",
                                            path=name) from None
                start += pf.metadata.row_group(g).num_rows
