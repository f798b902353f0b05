"""Readers for corpora, queries and relevance judgments.

Supported inputs (any file may be gzip-compressed; compression is detected by a ``.gz`` suffix):

* **JSON Lines** corpora (``*.jsonl``, ``*.json``): one object per line with an id (``"_id"`` or
  ``"id"``), an optional ``"title"`` and a ``"text"`` (or pyserini's ``"contents"``).
* **BEIR folders**: a directory holding ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.
* **TSV** corpora such as MS MARCO ``collection.tsv``: ``id<TAB>text`` or ``id<TAB>title<TAB>text``.
* **Parquet**: a ``*.parquet`` file or a folder of them, read a row group at a time, with a column
  mapping for id, title, text and metadata (:mod:`hybridret.arrow`; needs the ``parquet`` extra).
* Queries as BEIR ``queries.jsonl`` or ``qid<TAB>text`` TSV files.
* Qrels as BEIR TSV (``query-id corpus-id score``, optional header) or TREC (``qid 0 docid grade``).

Every reader streams line by line and reports malformed input as
:class:`~hybridret.errors.CorpusFormatError` carrying the file, the 1-based line number and the
field at fault.

Streams: every reader also accepts ``"-"`` for standard input, and named pipes or other
non-regular files (``/dev/stdin``). Such inputs can be read only once. Gzip data is recognised by
a ``.gz`` suffix or, for any input, by its magic bytes, so a compressed stream needs no suffix.

Limits: a line may hold at most :data:`MAX_LINE_BYTES` bytes (64 MiB; the ``max_line_bytes``
argument of each reader overrides it). A longer line, a truncated or corrupt gzip member, invalid
UTF-8, or a string with a lone UTF-16 surrogate (``"\\ud800"`` in JSON) is a
:class:`~hybridret.errors.CorpusFormatError` naming the file and line, never a crash or unbounded
memory use.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import json
import logging
import os
import re
import stat
import sys
import threading
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar, Union

from hybridret.errors import ConfigError, CorpusFormatError

__all__ = [
    "MAX_LINE_BYTES",
    "STDIN",
    "CorpusReader",
    "Document",
    "detect_corpus_format",
    "is_stream",
    "iter_batches",
    "iter_corpus",
    "load_beir",
    "load_qrels",
    "load_queries",
]

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")

#: Longest accepted input line in bytes (line ending included). Longer lines raise
#: :class:`CorpusFormatError` instead of growing memory without bound (``/dev/zero`` has no newline).
MAX_LINE_BYTES = 64 * 1024 * 1024
#: The path that means standard input.
STDIN = "-"
_GZIP_MAGIC = b"\x1f\x8b"
_ASCII_INT = re.compile(r"[+-]?[0-9]{1,18}")
_GRADE_RANGE = (-(2**31), 2**31 - 1)  # what trec_eval / pytrec_eval store grades in

CORPUS_FORMATS = ("jsonl", "beir", "tsv", "parquet")
_ON_EMPTY = ("skip", "error")
# First-line values recognised as a TSV header (first column) and skipped.
_DOC_HEADER_IDS = frozenset({"id", "_id", "docid", "doc_id", "doc-id", "pid", "corpus-id"})
_QUERY_HEADER_IDS = frozenset({"id", "_id", "qid", "query_id", "query-id", "topic", "topic_id"})


@dataclass(frozen=True)
class Document:
    """One corpus document."""

    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)  # any JSON object; stored, returned, never encoded

    @property
    def full_text(self) -> str:
        """``title + " " + text`` when the title is non-blank, else ``text``; stripped."""
        title = self.title.strip()
        if title:
            return f"{title} {self.text.strip()}".strip()
        return self.text.strip()


# --------------------------------------------------------------------------- low-level helpers


def _strip_gz(path: Path) -> str:
    """Lower-cased file name without a trailing ``.gz``."""
    name = path.name.lower()
    return name[:-3] if name.endswith(".gz") else name


def is_stream(path: PathLike) -> bool:
    """True for ``"-"`` (standard input) and for existing paths that are not regular files or
    directories (named pipes, ``/dev/stdin``, character devices): inputs that can be read only once
    and whose size is unknown."""
    if str(path) == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _display(path: Path) -> str:
    return "<stdin>" if str(path) == STDIN else str(path)


WAIT_NOTICE_S = 3.0  # a named pipe with no writer (or no data) yet is reported after this long


def _wait_notice(path: Path) -> threading.Timer | None:
    """For a named pipe: a timer that says, once, that the read is waiting for a writer."""
    try:
        if str(path) == STDIN or not stat.S_ISFIFO(os.stat(path).st_mode):
            return None
    except OSError:
        return None
    timer = threading.Timer(WAIT_NOTICE_S, logger.warning, ("waiting for input on %s (a named pipe: nothing has "
                                                            "been written to it yet)", _display(path)))
    timer.daemon = True
    timer.start()
    return timer


@contextlib.contextmanager
def _open_binary(path: Path) -> Iterator[IO[bytes]]:
    """``path`` opened for binary reading, decompressed when it is gzip (by suffix or magic bytes)."""
    notice = _wait_notice(path)
    try:
        if str(path) == STDIN:
            raw: IO[bytes] = sys.stdin.buffer
            owned = contextlib.nullcontext(raw)
        else:
            raw = open(path, "rb")  # a named pipe blocks here until a writer opens it
            owned = raw  # type: ignore[assignment]
        if not isinstance(raw, io.BufferedReader):
            raw = io.BufferedReader(raw)  # type: ignore[arg-type]
        try:
            magic = raw.peek(2)[:2]  # ... and here until it writes
        except BaseException:
            if str(path) != STDIN:
                raw.close()
            raise
    finally:
        if notice is not None:
            notice.cancel()
    with owned:
        gz = path.name.lower().endswith(".gz") or magic == _GZIP_MAGIC
        if gz:
            with gzip.GzipFile(fileobj=raw, mode="rb") as fh:
                yield fh  # type: ignore[misc]
        else:
            yield raw


def _iter_lines(path: Path, *, max_line_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for each line of ``path`` (1-based, line ending removed).

    ``path`` may be ``"-"`` (standard input) or a pipe. Gzip is used for a ``.gz`` name or gzip
    magic bytes. Lines longer than ``max_line_bytes`` (default :data:`MAX_LINE_BYTES`), invalid
    UTF-8 and truncated or corrupt gzip data raise :class:`CorpusFormatError` naming the file and
    line; memory stays bounded by one line. A UTF-8 byte-order mark on line 1 is dropped. One
    ``\\n`` and a ``\\r`` before it end a line (LF or CRLF files).
    """
    limit = MAX_LINE_BYTES if max_line_bytes is None else int(max_line_bytes)
    if limit < 1:
        raise ConfigError(f"max_line_bytes must be positive, got {max_line_bytes!r}")
    name = _display(path)
    lineno = 0
    try:
        with _open_binary(path) as fh:
            while True:
                raw = fh.readline(limit + 1)
                if not raw:
                    break
                lineno += 1
                if len(raw) > limit and not raw.endswith(b"\n"):
                    raise CorpusFormatError(
                        f"line is longer than the maximum of {limit} bytes "
                        "(hybridret.data.MAX_LINE_BYTES; is this a text file?)", path=name, line=lineno,
                    )
                if raw.endswith(b"\n"):
                    raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise CorpusFormatError(
                        f"invalid UTF-8 at byte {exc.start} of the line", path=name, line=lineno
                    ) from None
                if lineno == 1 and text.startswith("\ufeff"):
                    text = text[1:]
                yield lineno, text
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        what = "truncated" if isinstance(exc, EOFError) else "corrupt"
        raise CorpusFormatError(
            f"{what} gzip data ({exc}) after {lineno} complete lines", path=name, line=lineno + 1
        ) from None


def _require_file(path: PathLike, what: str) -> Path:
    if str(path) == STDIN:
        return Path(STDIN)
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} not found: {p}")
    if p.is_dir():
        raise CorpusFormatError(f"expected a {what} file, got a directory", path=str(p))
    return p


def _check_encodable(value: str, field: str, path: Path, line: int) -> str:
    """Refuse strings that cannot be written as UTF-8 (lone surrogates from ``\\ud800`` escapes)."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CorpusFormatError(
                f"field {field!r} holds a lone UTF-16 surrogate {value[exc.start]!r} at character {exc.start} "
                "(not valid Unicode text)", path=_display(path), line=line, field=field,
            ) from None
    return value


def _coerce_id(value: Any, field: str, path: Path, line: int) -> str:
    # bool is an int subclass but never a sensible id.
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise CorpusFormatError(
            f"field {field!r} must be a string or integer, got {type(value).__name__}",
            path=_display(path), line=line, field=field,
        )
    out = str(value)
    if not out.strip():
        raise CorpusFormatError(f"field {field!r} is empty", path=_display(path), line=line, field=field)
    if "\n" in out or "\r" in out:
        raise CorpusFormatError(f"field {field!r} holds a line break ({out!r}); an id is one line",
                                path=_display(path), line=line, field=field)
    return _check_encodable(out, field, path, line)


def _parse_json_object(text: str, path: Path, line: int) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorpusFormatError(
            f"invalid JSON ({exc.msg} at column {exc.colno}){_json_lines_hint(text, line)}", path=_display(path),
            line=line) from None
    except ValueError as exc:  # e.g. an integer with more digits than int() accepts
        raise CorpusFormatError(f"invalid JSON ({exc})", path=_display(path), line=line) from None
    except RecursionError:
        raise CorpusFormatError("invalid JSON (nested too deeply)", path=_display(path), line=line) from None
    if not isinstance(obj, dict):
        hint = ("; this looks like a JSON array: JSON Lines holds one object per line (convert with "
                "jq -c '.[]' FILE)") if isinstance(obj, list) else ""
        raise CorpusFormatError(
            f"expected a JSON object per line (JSON Lines), got {type(obj).__name__}{hint}",
            path=_display(path), line=line,
        )
    return obj


def _json_lines_hint(text: str, line: int) -> str:
    """A hint for the first line of a pretty-printed JSON document (``[`` or ``{`` alone)."""
    head = text.strip()
    if line == 1 and head in ("[", "{", "[{", "[ {"):
        what = "a JSON array" if head.startswith("[") else "a JSON object spread over several lines"
        return (f"; this looks like {what}: the input must be JSON Lines, one object per line "
                "(convert with jq -c '.[]' FILE)")
    return ""


def _json_id(obj: dict[str, Any], path: Path, line: int) -> str:
    for key in ("_id", "id"):
        if obj.get(key) is not None:
            return _coerce_id(obj[key], key, path, line)
    raise CorpusFormatError("missing id (expected '_id' or 'id')", path=_display(path), line=line, field="_id")


def _json_str(obj: dict[str, Any], keys: tuple[str, ...], path: Path, line: int,
              *, required: bool) -> str:
    """Return the first of ``keys`` present in ``obj`` as a string ('' if optional and absent/null)."""
    for key in keys:
        if key in obj:
            value = obj[key]
            if value is None and not required:
                return ""
            if not isinstance(value, str):
                raise CorpusFormatError(
                    f"field {key!r} must be a string, got {type(value).__name__}",
                    path=_display(path), line=line, field=key,
                )
            return _check_encodable(value, key, path, line)
    if required:
        alts = " or ".join(repr(k) for k in keys)
        raise CorpusFormatError(f"missing field {alts}", path=_display(path), line=line, field=keys[0])
    return ""


_QUOTED_TAB = re.compile(r'(?:^|\t)"[^"\t]*\t[^"]*"(?:\t|$)')  # a field in quotes that holds a tab
_DOC_FIELDS = frozenset({"_id", "id", "title", "text", "contents", "metadata"})


def _json_metadata(obj: dict[str, Any], path: Path, line: int) -> dict[str, Any]:
    """Every field other than id/title/text, merged with a ``metadata`` object if there is one."""
    from .index.metadata import MetadataError, check_metadata

    meta = obj.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise CorpusFormatError(f"field 'metadata' must be a JSON object, got {type(meta).__name__}",
                                path=str(path), line=line, field="metadata")
    out = dict(meta or {})
    for key, value in obj.items():
        if key in _DOC_FIELDS:
            continue
        if key in out and out[key] != value:
            raise CorpusFormatError(f"field {key!r} is given both at the top level and inside 'metadata'",
                                    path=str(path), line=line, field=key)
        out[key] = value
    try:
        return check_metadata(out)
    except MetadataError as exc:
        raise CorpusFormatError(str(exc), path=str(path), line=line, field=exc.field or "metadata") from None


def _duplicate(kind: str, id_: str, first: int, path: Path, line: int, field: str) -> CorpusFormatError:
    return CorpusFormatError(
        f"duplicate {kind} id {id_!r} on lines {first} and {line}",
        path=_display(path), line=line, field=field,
    )


# --------------------------------------------------------------------------- corpus


def detect_corpus_format(path: PathLike) -> str:
    """Guess the corpus format of ``path``: ``"jsonl"``, ``"beir"`` or ``"tsv"``.

    A directory holding ``corpus.jsonl`` (or ``corpus.jsonl.gz``) is ``"beir"``, one holding
    Parquet files ``"parquet"``; ``*.jsonl``, ``*.json`` are ``"jsonl"``; ``*.tsv`` is ``"tsv"``
    (each optionally ``.gz``); ``*.parquet`` (``.pq``) is ``"parquet"``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CorpusFormatError: the format cannot be determined.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"corpus not found: {p}")
    if p.is_dir():
        if _beir_corpus_file(p) is not None:
            return "beir"
        from .arrow import parquet_files

        if parquet_files(p):
            return "parquet"
        raise CorpusFormatError(
            "directory is neither a BEIR folder (no corpus.jsonl or corpus.jsonl.gz inside) nor a folder of Parquet "
            "files (*.parquet)", path=str(p)
        )
    name = _strip_gz(p)
    if name.endswith((".parquet", ".pq", ".parq")):
        return "parquet"
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".tsv"):
        return "tsv"
    raise CorpusFormatError(
        "cannot detect corpus format from the file name (expected .jsonl, .json or .tsv, "
        "optionally .gz, .parquet, a BEIR folder or a folder of Parquet files); pass format= explicitly",
        path=str(p),
    )


def _beir_corpus_file(folder: Path) -> Path | None:
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        candidate = folder / name
        if candidate.is_file():
            return candidate
    return None


def _sniff_format(text: str) -> str:
    """Format of a stream without a telling name, from its first non-blank line."""
    return "jsonl" if text.lstrip().startswith("{") else "tsv"


class CorpusReader:
    """A re-iterable stream of :class:`Document` from a corpus file, a BEIR folder or Parquet.

    Args:
        path: a ``.jsonl``/``.json``/``.tsv`` file (optionally ``.gz``), a BEIR folder, or a stream:
            ``"-"`` for standard input, a named pipe, ``/dev/stdin``. A stream can be iterated only
            once; when its name does not tell the format (and ``format`` is ``None``), the first
            non-blank line does: JSON Lines if it starts with ``{``, else TSV.
        format: ``"jsonl"``, ``"beir"``, ``"tsv"`` or ``"parquet"``; detected from ``path`` when ``None``.
        on_empty: what to do with documents whose title and text are both blank: ``"skip"``
            (count them and log one warning at the end of the pass) or ``"error"``.
        max_line_bytes: longest accepted line (default :data:`MAX_LINE_BYTES`).
        columns: Parquet only: which columns hold the id, text, title and metadata, a
            :class:`~hybridret.arrow.ColumnMap` or a mapping such as ``{"id": "doc_id", "text":
            "body", "metadata": ["source"]}`` (default: ``_id``/``id``, ``text``/``contents``,
            ``title``, every other column as metadata).

    Attributes (updated by each pass; final once a pass has been fully consumed):
        path: the path as given.
        format: the resolved format (``None`` for a stream until its first line has been read).
        stream: whether ``path`` is a stream (read once; its size is unknown).
        file: the data file actually read (``corpus.jsonl`` inside a BEIR folder; for Parquet the
            file or folder given).
        num_rows: Parquet only: the rows of every file, from their footers (else ``None``).
        n_read: documents yielded so far in the current/last pass.
        skipped_empty: empty documents skipped so far in the current/last pass.

    Duplicate ids are detected while streaming, which keeps one ``id -> line`` entry per
    document in memory for the duration of a pass.

    Raises (at construction):
        FileNotFoundError: ``path`` does not exist.
        ConfigError: ``format``, ``on_empty`` or ``max_line_bytes`` is not a recognised value.
        CorpusFormatError: the format cannot be detected or does not fit ``path``.
    Raises (while iterating): :class:`CorpusFormatError` for malformed input (see the module
    docstring), ``OSError`` when the input cannot be read, :class:`ConfigError` when a stream
    is iterated a second time.
    """

    def __init__(self, path: PathLike, format: str | None = None, on_empty: str = "skip", *,
                 max_line_bytes: int | None = None, columns: Any = None) -> None:
        if on_empty not in _ON_EMPTY:
            raise ConfigError(f"on_empty must be one of {_ON_EMPTY}, got {on_empty!r}")
        if format is not None and format not in CORPUS_FORMATS:
            raise ConfigError(f"format must be one of {CORPUS_FORMATS} or None, got {format!r}")
        if max_line_bytes is not None and (isinstance(max_line_bytes, bool) or not isinstance(max_line_bytes, int)
                                           or max_line_bytes < 1):
            raise ConfigError(f"max_line_bytes must be a positive integer, got {max_line_bytes!r}")
        self.max_line_bytes = max_line_bytes
        self.path = Path(path)
        self.stream = is_stream(path)
        self._consumed = False
        if not self.stream and not self.path.exists():
            raise FileNotFoundError(f"corpus not found: {self.path}")
        if format is None and self.stream:
            name = _strip_gz(self.path)
            # None: decided by the first line
            format = "jsonl" if name.endswith((".jsonl", ".json")) else "tsv" if name.endswith(".tsv") else None
        elif format is None:
            format = detect_corpus_format(self.path)
        self.format: str | None = format
        self.on_empty = on_empty
        self.num_rows: int | None = None
        self._parquet: Any = None
        if columns is not None and self.format != "parquet":
            raise ConfigError(f"a column mapping (columns=; CLI --id-column, --text-column, --title-column, "
                              f"--metadata-columns) applies to Parquet input only; {_display(self.path)} is read as "
                              f"{self.format}")
        if self.stream:
            if self.format in ("beir", "parquet"):
                what = "a directory" if self.format == "beir" else "a file (Parquet is not read from a stream)"
                raise CorpusFormatError(f"format {self.format!r} needs {what}, got a stream", path=_display(self.path))
            self.file = self.path
        elif self.format == "parquet":
            from .arrow import ParquetCorpus

            self._parquet = ParquetCorpus(self.path, columns)  # footers and columns checked now
            self.file = self.path
            self.num_rows = self._parquet.num_rows
        elif self.format == "beir":
            if not self.path.is_dir():
                raise CorpusFormatError("format 'beir' needs a directory", path=str(self.path))
            found = _beir_corpus_file(self.path)
            if found is None:
                raise CorpusFormatError(
                    "BEIR folder has no corpus.jsonl or corpus.jsonl.gz", path=str(self.path)
                )
            self.file = found
        else:
            if self.path.is_dir():
                raise CorpusFormatError(
                    f"format {self.format!r} needs a file, got a directory", path=str(self.path)
                )
            self.file = self.path
        self.n_read = 0
        self.skipped_empty = 0
        self.quoted_tabs = 0  # TSV lines where a "quoted" field holds a tab (warned about)

    def __repr__(self) -> str:
        return f"CorpusReader({str(self.path)!r}, format={self.format!r}, on_empty={self.on_empty!r})"

    def __iter__(self) -> Iterator[Document]:
        if self.stream:
            if self._consumed:
                raise ConfigError(f"{_display(self.path)} is a stream (pipe or standard input) and can be read only "
                                  "once; write it to a file to read it again")
            self._consumed = True
        return self._iter_docs()

    def _lines(self) -> Iterator[tuple[int, Document]]:
        """``(line number, document)`` of a JSON Lines or TSV corpus."""
        name = _display(self.file)
        first = True  # the first non-blank line, where a TSV header may be
        for lineno, text in _iter_lines(self.file, max_line_bytes=self.max_line_bytes):
            if not text.strip():
                continue
            if self.format is None:
                self.format = _sniff_format(text)
                logger.info("reading %s as %s (from its first line; pass format= to choose)", name, self.format)
            doc = self._parse_tsv(text, lineno, first) if self.format == "tsv" else self._parse_jsonl(text, lineno)
            first = False
            if doc is not None:  # None: a header line
                yield lineno, doc

    def _where(self, loc: Any) -> str:
        """A document's place in words: ``line N`` or, for Parquet, file, row group and row."""
        return self._parquet.describe(loc) if self._parquet is not None else f"line {loc}"

    def _iter_docs(self) -> Iterator[Document]:
        self.n_read = 0
        self.skipped_empty = 0
        self.quoted_tabs = 0
        seen: dict[str, Any] = {}
        first_empty: Any = None
        path = self.file
        name = _display(path)
        records = ((loc, Document(**rec)) for loc, rec in self._parquet.records()) if self._parquet is not None \
            else self._lines()
        for loc, doc in records:
            prev = seen.get(doc.id)
            if prev is not None:
                if self._parquet is None:
                    raise _duplicate("document", doc.id, prev, path, loc, "id")
                raise CorpusFormatError(f"duplicate document id {doc.id!r}: at {self._where(prev)} and at "
                                        f"{self._where(loc)}", field="id")
            seen[doc.id] = loc
            if not doc.title.strip() and not doc.text.strip():
                if self.on_empty == "error":
                    if self._parquet is not None:
                        raise CorpusFormatError(f"{self._where(loc)}: document {doc.id!r} has empty title and text",
                                                field="text")
                    raise CorpusFormatError(
                        f"document {doc.id!r} has empty title and text", path=name,
                        line=loc, field="text",
                    )
                self.skipped_empty += 1
                if first_empty is None:
                    first_empty = loc
                continue
            self.n_read += 1
            yield doc
        if self.quoted_tabs > 1:
            logger.warning('%d lines of %s have a "quoted" field holding a tab (split at the tab)', self.quoted_tabs,
                           name)
        if self.skipped_empty:
            logger.warning("skipped %d empty documents in %s (first at %s)", self.skipped_empty, name,
                           self._where(first_empty))
        logger.debug("read %d documents from %s", self.n_read, name)

    def _parse_jsonl(self, text: str, lineno: int) -> Document:
        obj = _parse_json_object(text, self.file, lineno)
        doc_id = _json_id(obj, self.file, lineno)
        body = _json_str(obj, ("text", "contents"), self.file, lineno, required=True)
        title = _json_str(obj, ("title",), self.file, lineno, required=False)
        return Document(id=doc_id, text=body, title=title, metadata=_json_metadata(obj, self.file, lineno))

    def _parse_tsv(self, text: str, lineno: int, first: bool = False) -> Document | None:
        cols = text.split("\t")
        quoted = '"' in text and _QUOTED_TAB.search(text) is not None
        if len(cols) not in (2, 3):
            hint = ('; a "quoted" field holds a tab, but TSV has no quoting here (replace tabs inside fields by '
                    'spaces)') if quoted else ""
            raise CorpusFormatError(
                f"expected 2 columns (id, text) or 3 columns (id, title, text), got {len(cols)}{hint}",
                path=_display(self.file), line=lineno,
            )
        if quoted:
            self.quoted_tabs += 1
            if self.quoted_tabs == 1:
                logger.warning('%s:%d: a "quoted" field holds a tab; TSV has no quoting here, so the tab splits '
                               "the field (replace tabs inside fields by spaces)", _display(self.file), lineno)
        doc_id = cols[0].strip()
        if first and doc_id.lower() in _DOC_HEADER_IDS:
            return None
        if not doc_id:
            raise CorpusFormatError("empty id", path=_display(self.file), line=lineno, field="id")
        if len(cols) == 2:
            return Document(id=doc_id, text=cols[1])
        return Document(id=doc_id, text=cols[2], title=cols[1])


def iter_corpus(path: PathLike, format: str | None = None, *,
                on_empty: str = "skip", max_line_bytes: int | None = None, columns: Any = None) -> Iterator[Document]:
    """Stream the documents of a corpus; see :class:`CorpusReader` for formats and errors.

    Use :class:`CorpusReader` directly to read ``skipped_empty`` / ``n_read`` afterwards.
    """
    return iter(CorpusReader(path, format=format, on_empty=on_empty, max_line_bytes=max_line_bytes,
                             columns=columns))


# --------------------------------------------------------------------------- queries and qrels


def load_queries(path: PathLike, *, max_line_bytes: int | None = None) -> dict[str, str]:
    """Load queries as ``{qid: text}`` from BEIR ``queries.jsonl`` or a ``qid<TAB>text`` TSV.

    JSON Lines is used for ``.jsonl``/``.json`` names (optionally ``.gz``), TSV otherwise; for
    ``"-"`` (standard input) or a pipe without such a name, JSON Lines if the first non-blank line
    starts with ``{``. A TSV first non-blank line whose first column is a header name such as ``qid`` or
    ``query-id`` is skipped.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CorpusFormatError: malformed line, duplicate id, or empty query text.
    """
    p = _require_file(path, "queries")
    name = _display(p)
    stripped = _strip_gz(p)
    is_json: bool | None = stripped.endswith((".jsonl", ".json"))
    if not is_json and is_stream(path) and not stripped.endswith(".tsv"):
        is_json = None  # decided by the first line
    queries: dict[str, str] = {}
    lines: dict[str, int] = {}
    first = True  # the first non-blank line, where a TSV header may be
    for lineno, text in _iter_lines(p, max_line_bytes=max_line_bytes):
        if not text.strip():
            continue
        was_first, first = first, False
        if is_json is None:
            is_json = _sniff_format(text) == "jsonl"
        if is_json:
            obj = _parse_json_object(text, p, lineno)
            qid = _json_id(obj, p, lineno)
            qtext = _json_str(obj, ("text",), p, lineno, required=True)
            field = "text"
        else:
            cols = text.split("\t")
            if len(cols) != 2:
                raise CorpusFormatError(
                    f"expected 2 tab-separated columns (qid, text), got {len(cols)}",
                    path=name, line=lineno,
                )
            qid, qtext = cols[0].strip(), cols[1]
            if was_first and qid.lower() in _QUERY_HEADER_IDS:
                continue
            if not qid:
                raise CorpusFormatError("empty query id", path=name, line=lineno, field="qid")
            field = "text"
        if not qtext.strip():
            raise CorpusFormatError(f"query {qid!r} has empty text", path=name, line=lineno,
                                    field=field)
        if qid in lines:
            raise _duplicate("query", qid, lines[qid], p, lineno, "id")
        lines[qid] = lineno
        queries[qid] = qtext
    logger.debug("read %d queries from %s", len(queries), name)
    return queries


def _parse_int(value: str) -> int | None:
    """An optionally signed run of ASCII digits (not ``int()``'s underscores or other scripts' digits)."""
    if not _ASCII_INT.fullmatch(value):
        return None
    return int(value)


_QRELS_HEADER_WORDS = frozenset({"score", "grade", "relevance", "rel", "label", "judgment", "judgement"})


def _qrels_header(cols: list[str]) -> bool:
    """Whether a qrels file's first line is a header (``query-id corpus-id score``): its last column
    is no number and it names columns; a data line (even the only one) is never dropped."""
    last = cols[-1]
    try:
        float(last)
        return False
    except ValueError:
        pass
    return cols[0].lower() in _QUERY_HEADER_IDS or last.lower() in _QRELS_HEADER_WORDS


def load_qrels(path: PathLike, *, max_line_bytes: int | None = None) -> dict[str, dict[str, int]]:
    """Load relevance judgments as ``{qid: {docid: grade}}``.

    Accepts lines with either 3 columns (BEIR: ``query-id corpus-id score``) or 4 columns (TREC:
    ``qid iteration docid grade``; MS MARCO ``qrels.*.tsv``). Lines that contain a tab are split
    on tabs only, so ids may contain spaces (BEIR's LIMIT uses people's names); other lines are
    split on any whitespace (TREC qrels). The column count
    must be the same on every line. A first line that names columns (its last column is no
    number, and it starts with a query-id name such as ``query-id`` / ``qid`` or ends with
    ``score`` / ``relevance``) is a header and skipped; any other line is data. Grades are kept as
    given, including 0 and negatives; they must be ASCII integers in the 32-bit range trec_eval
    uses. An exact repeated judgment is ignored (with one warning); a conflicting repeat is
    an error. ``"-"`` reads standard input.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CorpusFormatError: wrong column count, empty id, non-integer or out-of-range grade, or
            conflicting duplicate.
    """
    p = _require_file(path, "qrels")
    name = _display(p)
    qrels: dict[str, dict[str, int]] = {}
    where: dict[tuple[str, str], int] = {}
    ncols: int | None = None
    first_data = True
    repeated = 0
    for lineno, text in _iter_lines(p, max_line_bytes=max_line_bytes):
        cols = [c.strip() for c in text.split("\t")] if "\t" in text else text.split()
        if not cols or not any(cols):
            continue
        if first_data:
            first_data = False
            if _qrels_header(cols):
                logger.debug("treating line %d of %s as a header: %r", lineno, name, text)
                continue
        if len(cols) not in (3, 4):
            raise CorpusFormatError(
                f"expected 3 columns (query-id corpus-id score) or 4 columns "
                f"(qid iteration docid grade), got {len(cols)}",
                path=name, line=lineno,
            )
        if ncols is None:
            ncols = len(cols)
        elif len(cols) != ncols:
            raise CorpusFormatError(
                f"expected {ncols} columns like the earlier lines, got {len(cols)}",
                path=name, line=lineno,
            )
        qid, docid = cols[0], cols[1] if ncols == 3 else cols[2]
        for value, name_ in ((qid, "query-id"), (docid, "corpus-id")):
            if not value:
                raise CorpusFormatError(f"empty {name_}", path=name, line=lineno, field=name_)
        grade = _parse_int(cols[-1])
        if grade is None:
            raise CorpusFormatError(
                f"relevance grade must be an integer, got {cols[-1]!r}",
                path=name, line=lineno, field="score",
            )
        if not _GRADE_RANGE[0] <= grade <= _GRADE_RANGE[1]:
            raise CorpusFormatError(
                f"relevance grade {grade} is outside the 32-bit range trec_eval accepts",
                path=name, line=lineno, field="score",
            )
        key = (qid, docid)
        docs = qrels.setdefault(qid, {})
        if docid in docs:
            if docs[docid] != grade:
                raise CorpusFormatError(
                    f"conflicting grades for query {qid!r}, document {docid!r}: "
                    f"{docs[docid]} on line {where[key]} and {grade} on line {lineno}",
                    path=name, line=lineno, field="score",
                )
            repeated += 1
            continue
        docs[docid] = grade
        where[key] = lineno
    if repeated:
        logger.warning("ignored %d repeated judgments in %s", repeated, name)
    logger.debug("read %d judgments for %d queries from %s", len(where), len(qrels), name)
    return qrels


def load_beir(folder: PathLike, split: str = "test"
              ) -> tuple[CorpusReader, dict[str, str], dict[str, dict[str, int]]]:
    """Open a BEIR folder: ``(corpus reader, queries, qrels for split)``.

    Reads ``queries.jsonl`` (or ``.gz``) and ``qrels/<split>.tsv`` (or ``.gz``). All queries are
    returned, including those without judgments; callers filter as needed. The corpus is not
    read until the returned :class:`CorpusReader` is iterated.

    Raises:
        FileNotFoundError: the folder, its queries file or the split's qrels file is missing.
        CorpusFormatError: as for :class:`CorpusReader`, :func:`load_queries`, :func:`load_qrels`.
    """
    root = Path(folder)
    if not root.exists():
        raise FileNotFoundError(f"BEIR folder not found: {root}")
    if not root.is_dir():
        raise CorpusFormatError("expected a BEIR folder, got a file", path=str(root))
    corpus = CorpusReader(root, format="beir")
    queries_file = next(
        (root / n for n in ("queries.jsonl", "queries.jsonl.gz") if (root / n).is_file()), None
    )
    if queries_file is None:
        raise FileNotFoundError(f"queries not found: {root / 'queries.jsonl'}")
    qrels_file = next(
        (root / "qrels" / n for n in (f"{split}.tsv", f"{split}.tsv.gz")
         if (root / "qrels" / n).is_file()),
        None,
    )
    if qrels_file is None:
        qdir = root / "qrels"
        available = sorted(
            f.name.split(".")[0] for f in qdir.iterdir() if _strip_gz(f).endswith(".tsv")
        ) if qdir.is_dir() else []
        raise FileNotFoundError(
            f"qrels not found: {qdir / (split + '.tsv')} (available splits: {available or 'none'})"
        )
    return corpus, load_queries(queries_file), load_qrels(qrels_file)


# --------------------------------------------------------------------------- batching


def iter_batches(iterable: Iterable[T], size: int) -> Iterator[list[T]]:
    """Yield consecutive lists of up to ``size`` items from ``iterable`` (the last may be shorter).

    Raises:
        ConfigError: ``size`` is not a positive integer.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"batch size must be a positive integer, got {size!r}")
    return _batches(iter(iterable), size)


def _batches(it: Iterator[T], size: int) -> Iterator[list[T]]:
    while True:
        batch = list(itertools.islice(it, size))
        if not batch:
            return
        yield batch
