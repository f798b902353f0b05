"""One immutable segment: the documents of one write, with every component of the index.

A segment folder holds ``docids.txt`` and the text store (:mod:`.docstore`), ``metadata.jsonl``
(:mod:`.metadata`), ``keys.npy`` (a 16-byte hash of each document's encoded text, so an unchanged
text is never encoded again) and one folder per named part (:mod:`.parts`: ``dense/``, ``sparse/``,
``bm25/``, ...), listed with its format in ``segment.json``. Nothing in it changes after its
commit; deletions are tombstone files beside it (``deleted-<commit>.npy``, named by the manifest).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..encoders import EncodedBatch
from ..errors import ConfigError, IndexFormatError
from .docstore import DocStore, DocStoreWriter
from ._once import Once
from .expiry import read_expiry
from .formats import open_part, part_type
from .legacy import open_legacy_parts
from .metadata import MetadataColumns, MetadataWriter, read_metadata
from .parents import read_parents
from .parts import TEXT, PartSpec, check_name
from .storage import NpyAppender, atomic_write_json, load_npy, read_json

__all__ = ["Segment", "SegmentWriter", "check_files", "file_list", "text_key"]

logger = logging.getLogger(__name__)

KEY_BYTES = 16
FORMAT = "hybridret-segment-v2"  # lists its parts (index format 3)
FORMAT_V1 = "hybridret-segment-v1"  # format 2: dense/ and sparse/ folders
SEGMENT_FILE = "segment.json"
_QUICK_HASH = 1 << 20  # files up to this size are checksummed at every load
_UNLISTED = (".building", ".managed.json", SEGMENT_FILE)  # tantivy rewrites .managed.json when it opens


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _edges(path: Path, size: int) -> str:
    """SHA-256 of a large file's first and last :data:`_QUICK_HASH` bytes: what a load checks of it."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read(_QUICK_HASH))
        fh.seek(max(size - _QUICK_HASH, 0))
        h.update(fh.read(_QUICK_HASH))
    return h.hexdigest()


def file_list(root: Path) -> dict[str, dict[str, Any]]:
    """Every file of a finished segment (tombstones, locks and tantivy's bookkeeping aside):
    relative path -> size and SHA-256 (and, for files over :data:`_QUICK_HASH` bytes, ``edges``:
    the SHA-256 of their first and last MiB, which every load checks)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if name in _UNLISTED or name.endswith(".lock") or name.startswith("deleted-") or "/" not in rel and \
                    name.startswith("."):
                continue
            size = path.stat().st_size
            out[rel] = {"size": size, "sha256": _sha256(path)}
            if size > _QUICK_HASH:
                out[rel]["edges"] = _edges(path, size)
    return out


def check_files(root: Path, listed: dict[str, dict[str, Any]], *, full: bool) -> list[str]:
    """Problems with a segment's files against its list: missing, resized, a symbolic link, or a
    changed checksum (small files and the first and last MiB of large ones always, every byte of
    every file with ``full``)."""
    problems = []
    for rel, want in listed.items():
        path = root / rel
        try:
            st = os.lstat(path)
        except OSError:
            problems.append(f"missing index file {path}")
            continue
        size = st.st_size
        if stat.S_ISLNK(st.st_mode):
            problems.append(f"{path} is a symbolic link (to {os.readlink(path)}); an index holds its own files")
        elif size != want.get("size"):
            problems.append(f"{path} has {size} bytes, {want.get('size')} were written (truncated or replaced?)")
        elif (full or size <= _QUICK_HASH) and _sha256(path) != want.get("sha256"):
            problems.append(f"{path} does not match the checksum written with it (damaged)")
        elif not full and want.get("edges") and _edges(path, size) != want["edges"]:
            problems.append(f"{path} does not match the checksum written with it (its first or last MiB is damaged)")
    return problems


def text_key(text: str) -> bytes:
    """The hash under which a document's encoded text is recognised (16 bytes of SHA-256)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:KEY_BYTES]


class SegmentWriter:
    """Streams encoded documents into a new segment folder; :meth:`close` finishes every part.

    ``parts`` (name -> :class:`~.parts.PartSpec`) are the parts to write, each in the folder of its
    name, built from its source: ``reps[source]`` gives a representation's kind and width (the
    values come with each :meth:`add`), ``"text"`` the documents' full texts."""

    def __init__(self, root: Path, *, parts: Mapping[str, PartSpec], reps: Mapping[str, Mapping[str, Any]],
                 store_text: bool) -> None:
        self.root = root
        self.specs = dict(parts)
        self.docs = DocStoreWriter(root, store_text=store_text)
        self.meta = MetadataWriter(root)
        self.keys = NpyAppender(root / "keys.npy", np.uint8, (KEY_BYTES,))
        self.builders: dict[str, Any] = {}
        self.count = 0
        try:
            for name, spec in self.specs.items():
                check_name(name)
                pt = part_type(spec.format)
                dim = None
                if spec.source != TEXT:
                    if spec.source not in reps:
                        raise ConfigError(f"part {name!r} is built from representation {spec.source!r}, which this "
                                          f"index does not have (it has {', '.join(reps) or 'none'})")
                    dim = int(reps[spec.source]["dim"])
                self.builders[name] = pt.create(root / name, dim, spec.options)
        except BaseException:
            self.abort()
            raise

    def add(self, ids: Sequence[str], titles: Sequence[str], texts: Sequence[str], full_texts: Sequence[str],
            metadata: Sequence[dict[str, Any]], enc: EncodedBatch, keys: Sequence[bytes]) -> None:
        n = len(ids)
        for name, spec in self.specs.items():
            if spec.source != TEXT and spec.source not in enc:
                raise ConfigError(f"part {name!r} needs representation {spec.source!r}, which the encodings lack")
        self.docs.add(list(ids), list(titles), list(texts))
        self.meta.add(list(metadata))
        self.keys.append(np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(n, KEY_BYTES))
        for name, spec in self.specs.items():
            self.builders[name].add(list(full_texts) if spec.source == TEXT else enc.get(spec.source))
        self.count += n

    def close(self) -> None:
        self.docs.close()
        self.meta.close()
        self.keys.close()
        for builder in self.builders.values():
            builder.close()
        atomic_write_json(self.root / SEGMENT_FILE, {
            "format": FORMAT, "num_docs": self.count,
            "parts": {name: spec.format for name, spec in self.specs.items()}, "files": file_list(self.root)})

    def abort(self) -> None:
        for part in (self.docs, self.keys, *self.builders.values()):
            if part is not None:
                try:
                    part.abort()
                except Exception:  # already closed or half-made: the folder goes next anyway
                    logger.debug("abort of %s failed", part, exc_info=True)
        shutil.rmtree(self.root, ignore_errors=True)


class Segment:
    """A committed segment, opened read-only: its documents and a ``dict`` of named parts. Every
    part is opened eagerly (a reader must not find a file gone later), and nothing is written
    afterwards, so one instance serves any number of threads and snapshots.

    Segments written since format 3 list their parts in ``segment.json`` (each opened by the
    reader its ``meta.json`` names); older folders are opened as named parts by
    :func:`~.legacy.open_legacy_parts`."""

    def __init__(self, root: str | Path, num_docs: int, *, device: str | None = None) -> None:
        self.root = Path(root)
        self.name = self.root.name
        self.num_docs = int(num_docs)
        self.files: dict[str, dict[str, Any]] | None = None
        listed: dict[str, str] | None = None
        if (self.root / SEGMENT_FILE).is_file():  # absent in format-1 folders
            info = read_json(self.root / SEGMENT_FILE)
            if not isinstance(info, dict) or info.get("format") not in (FORMAT, FORMAT_V1) or \
                    info.get("num_docs") != self.num_docs:
                raise IndexFormatError(f"{self.root / SEGMENT_FILE} does not describe a segment of {self.num_docs} "
                                       "documents")
            self.files = dict(info.get("files") or {})
            problems = check_files(self.root, self.files, full=False)
            if problems:
                raise IndexFormatError("; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)"
                                                                  if len(problems) > 3 else ""))
            if info.get("format") == FORMAT:
                listed = info.get("parts")
                if not isinstance(listed, dict):
                    raise IndexFormatError(f"{self.root / SEGMENT_FILE} lists no parts")
        self.docs = DocStore(self.root, expected=self.num_docs)
        if listed is not None:
            for name in listed:
                if (self.root / check_name(name)).is_symlink():
                    raise IndexFormatError(f"{self.root / name}: the part folder is a symbolic link (to "
                                           f"{os.readlink(self.root / name)}); an index holds its own files")
            self.parts: dict[str, Any] = {name: open_part(self.root / check_name(name), str(fmt), device=device)
                                          for name, fmt in listed.items()}
        else:
            if (self.root / "bm25").is_dir():  # a folder per part: only segments that list them in segment.json
                raise IndexFormatError(f"{self.root / SEGMENT_FILE}: missing (every segment of this layout has one; "
                                       "the segment is damaged)")
            if self.files is None and not self.name.startswith("gen-"):  # format 1: one folder, gen-*; seg-*: format 2+
                raise IndexFormatError(f"{self.root / SEGMENT_FILE}: missing; every seg-* segment (index format 2 and "
                                       "later) is written with one, so the segment is damaged (restore it from a copy; "
                                       "compacting would stamp what is left as valid)")
            try:
                self.parts = open_legacy_parts(self.root, device=device)
            except IndexFormatError as exc:
                raise IndexFormatError(f"{self.root / SEGMENT_FILE}: missing, and the folder is no older segment layout "
                                       f"either ({exc})") from None
        self.layout = "parts" if listed is not None else "legacy"
        for name, part in self.parts.items():
            if part.num_docs != self.num_docs:
                raise IndexFormatError(f"{self.root}: {name} part holds {part.num_docs} documents, "
                                       f"expected {self.num_docs}")
        for part in self.parts.values():
            sample = getattr(part, "sample_check", None)
            if sample is not None:
                sample()
        rows = read_metadata(self.root, self.num_docs)
        self.metadata = rows
        self.columns = MetadataColumns(rows, self.num_docs)
        self.expiry = read_expiry(self.columns, self.root)  # (times, rows) of documents with an expires_at
        self.parents = read_parents(self.columns, self.docs.ids)  # chunk rows by parent id (see parents.py)
        self.keys: np.ndarray | None = None
        if (self.root / "keys.npy").is_file():  # absent in format-1 folders
            self.keys = np.asarray(load_npy(self.root / "keys.npy", mmap=False))
            if self.keys.shape != (self.num_docs, KEY_BYTES):
                raise IndexFormatError(f"{self.root}/keys.npy does not match the segment's {self.num_docs} documents")
        self._text: Once[Any] = Once()

    @property
    def text(self) -> Any:
        """The segment's :class:`~.textmatch.TextMatcher` (``$text`` filters), made on first use."""
        from .textmatch import TextMatcher

        return self._text.get(lambda: TextMatcher(self))

    def part(self, name: str) -> Any:
        """The part ``name`` (``None`` when this segment has none)."""
        return self.parts.get(name)

    @property
    def dense(self) -> Any:
        """Shorthand for ``part("dense")``."""
        return self.parts.get("dense")

    @property
    def sparse(self) -> Any:
        """Shorthand for ``part("sparse")`` (the learned-sparse part)."""
        return self.parts.get("sparse")

    def metadata_of(self, row: int) -> dict[str, Any]:
        return dict(self.metadata[row]) if self.metadata is not None else {}

    def key_of(self, row: int) -> bytes | None:
        return bytes(self.keys[row]) if self.keys is not None else None

    def check(self) -> list[str]:
        """A full check: every file against its checksum, and the values inside (finite vectors and
        weights, readable texts and metadata). Slow on big segments; ``hybridret info --check``."""
        problems = check_files(self.root, self.files, full=True) if self.files is not None else []
        for part in self.parts.values():
            check = getattr(part, "check", None)
            if check is not None:
                problems.extend(check())
        for row in range(self.num_docs) if self.docs.has_text else ():
            try:
                self.docs.get(row)
            except IndexFormatError as exc:
                problems.append(str(exc))
                break
        return problems

    def tombstones(self, name: str | None) -> np.ndarray:
        """The deleted rows listed by the tombstone file ``name`` (sorted, unique)."""
        if not name:
            return np.zeros(0, dtype=np.int64)
        rows = np.asarray(load_npy(self.root / name, mmap=False), dtype=np.int64)
        if rows.ndim != 1 or (len(rows) and (rows.min() < 0 or rows.max() >= self.num_docs)):
            raise IndexFormatError(f"{self.root / name}: tombstones outside the segment's {self.num_docs} rows")
        return rows
