"""The write side: build, add, upsert, delete and compact an index directory, one writer at a time.

Every operation writes new files only (a new segment, new tombstone files) and then commits one
new manifest atomically (see :mod:`hybridret.index.manifest`): a crash at any point leaves the
index as it was before or as it is after the operation, never a mix, and an operation returns
only once its commit is durable. The writer lock (:mod:`hybridret.index.lock`) is held from
:class:`IndexWriter` construction until :meth:`IndexWriter.close`.

Encodings are reused wherever the text is unchanged: an upsert whose text equals the stored one
copies the stored vectors (only metadata or title-less changes), an unchanged document is not
rewritten at all, and an :class:`~hybridret.encoders.cache.EncodingCache` keyed on content serves
rebuilds and resumed builds. Compaction re-encodes nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .data import Document, iter_batches
from .encoders import EncodedBatch, Encoder
from .encoders.reps import REPRESENTATIONS, encode, rep_spec, stack_rows, take_rows
from .errors import (
    ConfigError,
    CorpusFormatError,
    DocumentNotFoundError,
    IndexExistsError,
    IndexFormatError,
    TruncationWarning,
)
from .index.dense_auto import AUTO_MIN_ROWS
from .index.expiry import EXPIRES_AT, Clock, ExpiryError, check_clock, check_ttl, parse_expiry
from .index.formats import BUILTIN_FORMATS, builtin_parts
from .index.lock import WriterLock
from .index.manifest import (MANIFEST, PENDING, check_expected, check_lineage, commit, names, new_segment,
                             read_manifest)
from .index.metadata import MetadataError, check_metadata
from .index.parents import chunk_rows, document_counts, document_of
from .index.parts import PART_TYPES, TEXT, PartSpec
from .index.segment import SEGMENT_FILE, SegmentWriter, text_key
from .index.snapshot import Snapshot, open_snapshot
from .index.storage import atomic_write_json, atomic_write_npy

__all__ = ["DEFAULT_SETTINGS", "IndexWriter", "Layout", "WriteResult", "as_document", "stored_values"]

logger = logging.getLogger(__name__)
#: What a write did, one line per write (the CLI prints its own and quiets this logger).
summary_logger = logging.getLogger("hybridret.summary")

DEFAULT_SETTINGS: dict[str, Any] = {
    "faiss_factory": "auto", "faiss_auto_min_rows": AUTO_MIN_ROWS, "faiss_metric": "ip", "sparse_scheme": "impact",
    "sparse_bits": 6,
    "sparse_max_weight": 5.0, "bm25": True, "store_text": True, "max_segments": 8,
    "phrase_index": True,  # the "phrases" part ($text phrase filters, index/phrases.py)
}
#: built-in parts an existing index gains only when every segment is rewritten (compact): the
#: manifest lists the parts of every segment, so older segments without them must all go at once
_ADDED_ON_REWRITE = ("phrases",)
_BODY_KEYS = ("fusion", "fusion_tuned_on", "source", "chunking")  # carried from commit to commit
_DOC_KEYS = frozenset({"_id", "id", "title", "text", "contents", "metadata"})
COMPACT_CHUNK = 4096


@dataclass(frozen=True)
class Layout:
    """What every segment written now holds: representations (name -> kind and width) and parts
    (name -> :class:`~hybridret.index.parts.PartSpec`)."""

    reps: dict[str, dict[str, Any]]
    parts: dict[str, PartSpec]

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> Layout:
        """The layout a (format-3, or upgraded) manifest records."""
        return cls({n: dict(r) for n, r in manifest["representations"].items()},
                   {n: PartSpec.from_dict(n, d) for n, d in manifest["parts"].items()})

    def sources(self) -> list[str]:
        """The representations the parts are built from (``"text"`` aside), in a fixed order."""
        return sorted({spec.source for spec in self.parts.values() if spec.source != TEXT})


@dataclass
class WriteResult:
    """What one write did, counted in rows (chunks, for a chunked index). ``missing``: ids given to
    delete that were not in the index; ``deleted`` also counts chunks an upsert left behind, and the
    expired documents a compaction dropped. ``documents``: in an index of chunks, the same counted in
    documents (``{"added", "updated", "unchanged", "deleted"}``: a document whose chunks changed is
    updated, one delete of a document's 12 chunks is 1 deleted); empty where rows are documents."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    skipped_empty: int = 0
    encoded: int = 0  # documents that went through the encoder (the rest reused stored encodings)
    missing: list[str] = field(default_factory=list)
    matched: list[str] | None = None  # a dry-run delete: the ids it would delete
    documents: dict[str, int] = field(default_factory=dict)  # chunked index: the counts in documents
    commit: int | None = None  # the commit number written, None when nothing changed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """What was done, in words: ``"3 added, 1 skipped empty"``; in an index of chunks
        ``"5 documents (120 chunks) added"``, or, where documents and chunks differ in kind,
        ``"documents: 1 updated; chunks: 2 added, 3 updated, 1 deleted"``."""
        kinds = ("added", "updated", "unchanged", "deleted")
        rows = {k: getattr(self, k) for k in kinds if getattr(self, k)}
        blank = [f"{self.skipped_empty:,} skipped empty"] if self.skipped_empty else []
        if not self.documents:
            return ", ".join([f"{v:,} {k}" for k, v in rows.items()] + blank) or "nothing changed"
        docs = {k: v for k, v in self.documents.items() if v}
        if not docs and not rows:
            return ", ".join(blank) or "nothing changed"
        if len(docs) == 1 and list(docs) == list(rows):
            (kind, n), = docs.items()
            return ", ".join([f"{count_words(n, rows[kind])} {kind}"] + blank)
        words = ", ".join(f"{v:,} {k}" for k, v in docs.items()) or "none changed"
        return f"documents: {words}; chunks: " + ", ".join([f"{v:,} {k}" for k, v in rows.items()] + blank)


def count_words(documents: int, chunks: int | None = None) -> str:
    """``"140 documents (3,611 chunks)"``; ``"1 document"`` without chunks."""
    out = f"{documents:,} document{'' if documents == 1 else 's'}"
    if chunks is not None:
        out += f" ({chunks:,} chunk{'' if chunks == 1 else 's'})"
    return out


def _text_field(value: Any, name: str, where: str) -> str:
    if value is None and name == "title":
        return ""
    if not isinstance(value, str):
        raise CorpusFormatError(f"{where}: field {name!r} must be a string, got {type(value).__name__}", field=name)
    return value


def as_document(item: Any, position: int, *, allow_bare: bool = False) -> Document:
    """Validate one document given to the library: a :class:`Document`, a mapping with an id
    (``"_id"`` or ``"id"``: string or integer), ``"text"`` (or ``"contents"``), optional ``"title"``
    and ``"metadata"`` (other fields join the metadata, as in JSONL corpora), or an ``(id, text)`` /
    ``(id, title, text)`` tuple. Bare strings (auto ids) only where ``allow_bare``. The rules and
    messages are those of the corpus readers; nothing is coerced to a string silently."""
    where = f"documents[{position}] (counting from 0)"
    if isinstance(item, Document):
        doc_id, text, title, meta = item.id, item.text, item.title, item.metadata
    elif isinstance(item, str):
        if not allow_bare:
            raise CorpusFormatError(f"{where}: a bare string has no id; pass {{'id': ..., 'text': ...}}", field="id")
        doc_id, text, title, meta = str(position), item, "", {}
    elif isinstance(item, Mapping):
        doc_id = item.get("_id", item.get("id"))
        text = item.get("text", item.get("contents"))
        if text is None:
            raise CorpusFormatError(f"{where}: missing field 'text'", field="text")
        title = item.get("title")
        meta = item.get("metadata")
        if meta is not None and not isinstance(meta, Mapping):
            raise CorpusFormatError(f"{where}: field 'metadata' must be an object, got {type(meta).__name__}",
                                    field="metadata")
        extra = {k: v for k, v in item.items() if k not in _DOC_KEYS}
        clash = [k for k in extra if meta and k in meta and meta[k] != extra[k]]
        if clash:
            raise CorpusFormatError(f"{where}: field {clash[0]!r} is given both at the top level and inside "
                                    "'metadata'", field=clash[0])
        if extra:
            meta = {**(meta or {}), **extra}
    elif isinstance(item, tuple) and len(item) in (2, 3):
        doc_id, text, title, meta = item[0], item[-1], (item[1] if len(item) == 3 else ""), {}
    else:
        raise CorpusFormatError(f"{where}: cannot index a {type(item).__name__}; pass a Document, a dict or an "
                                "(id, text) tuple")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise CorpusFormatError(f"{where}: the id must be a string or an integer, got {type(doc_id).__name__}",
                                field="id")
    doc_id = str(doc_id)
    if not doc_id.strip() or "\n" in doc_id or "\r" in doc_id:
        raise CorpusFormatError(f"{where}: invalid document id {doc_id!r} (blank or contains a newline)", field="id")
    text = _text_field(text, "text", where)
    title = _text_field(title, "title", where)
    for name, value in (("id", doc_id), ("text", text), ("title", title)):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise CorpusFormatError(f"{where} ({doc_id!r}): field {name!r} is not valid Unicode (a lone surrogate?)",
                                    field=name) from None
    try:
        meta = check_metadata(meta)
    except MetadataError as exc:
        raise CorpusFormatError(f"{where} ({doc_id!r}): {exc}", field=exc.field or "metadata") from None
    if EXPIRES_AT in meta:
        try:
            parse_expiry(meta[EXPIRES_AT])
        except ExpiryError as exc:
            raise CorpusFormatError(f"{where} ({doc_id!r}): {exc}", field=EXPIRES_AT) from None
    return Document(id=doc_id, text=text, title=title, metadata=meta)


_SPARSE_SCHEMES = {"impact": None, "tfgrid": None, "planes": (2, 16), "buckets": (2, 64)}


def check_settings(settings: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """Refuse index settings that cannot take effect, naming the setting as the user gave it."""
    scheme = settings.get("sparse_scheme")
    if scheme not in _SPARSE_SCHEMES:
        raise ConfigError(f"sparse_scheme {scheme!r} is unknown; expected one of {', '.join(_SPARSE_SCHEMES)}")
    bits = settings.get("sparse_bits")
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise ConfigError(f"sparse_bits must be an integer, got {bits!r}")
    span = _SPARSE_SCHEMES[scheme]
    if span is None:
        if "sparse_bits" in given and bits != DEFAULT_SETTINGS["sparse_bits"]:
            raise ConfigError(f"sparse_bits={bits} applies only to the format-1 sparse schemes 'planes' and "
                              f"'buckets'; sparse_scheme {scheme!r} has no bit setting (leave sparse_bits out)")
    elif not span[0] <= bits <= span[1]:
        what = "bit planes" if scheme == "planes" else "weight buckets"
        raise ConfigError(f"sparse_bits={bits}: sparse_scheme {scheme!r} takes {span[0]} to {span[1]} {what} per term")
    factory = settings.get("faiss_factory")
    if not isinstance(factory, str) or not factory.strip():
        raise ConfigError(f"faiss_factory must be 'auto' or a FAISS factory string, got {factory!r}")
    if not isinstance(settings.get("phrase_index", True), bool):
        raise ConfigError(f"phrase_index must be true or false, got {settings.get('phrase_index')!r}")
    rows = settings.get("faiss_auto_min_rows")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ConfigError(f"faiss_auto_min_rows must be a non-negative integer (segments with fewer vectors are "
                          f"searched with Flat), got {rows!r}")


@dataclass
class PlanState:
    """What :meth:`IndexWriter._plan_document` needs of the write a document belongs to."""

    mode: str
    snap: Snapshot | None
    live_now: Snapshot | None
    chunker: Any
    chunked: bool
    ttl: float | None
    now: float
    result: WriteResult
    tombstone: Callable[[int], None]
    seen: set[str] = field(default_factory=set)


def add_rows(writer: SegmentWriter, batch: list[Document], enc: EncodedBatch) -> None:
    """Write the encoded ``batch`` to the new segment."""
    writer.add([d.id for d in batch], [d.title for d in batch], [d.text for d in batch],
               [d.full_text for d in batch], [d.metadata for d in batch], enc, [text_key(d.full_text) for d in batch])


class IndexWriter:
    """The one writer of an index directory (created if absent). ``encoder`` is a loaded encoder
    or a callable returning one (called only when something must be encoded). ``expect``: the
    manifest the caller loaded; the writer then refuses an index folder that is gone, replaced by
    another index, or whose manifest does not descend from that commit
    (:func:`~hybridret.index.manifest.check_lineage`), instead of writing a new index there."""

    def __init__(self, root: str | Path, *, encoder: Encoder | Callable[[], Encoder] | None = None,
                 encoder_config: dict[str, Any] | None = None, settings: Mapping[str, Any] | None = None,
                 device: str | None = None, clock: Clock | None = None,
                 expect: Mapping[str, Any] | None = None) -> None:
        self.root = Path(root)
        self.clock = check_clock(clock)  # "now" for expiry and ttl=
        if expect is not None:
            expect = check_expected(expect)
        if expect is not None and not (self.root / MANIFEST).is_file():  # before the lock makes the folder
            check_lineage(self.root, None, expect)
        self.device = device
        self._encoder = encoder if isinstance(encoder, Encoder) else None
        self._encoder_factory = None if isinstance(encoder, Encoder) else encoder
        self._truncated_before: dict[str, int] | None = None
        self._encoder_progress: bool | None = False  # show_progress of the encoder calls of the current write
        self.lock = WriterLock(self.root)
        try:
            self.manifest: dict[str, Any] | None = read_manifest(self.root) if (self.root / MANIFEST).exists() else None
            if expect is not None:
                check_lineage(self.root, self.manifest, expect)
        except BaseException:
            self.lock.release()
            raise
        base = dict(DEFAULT_SETTINGS)
        if self.manifest is not None:
            base.update({k: v for k, v in self.manifest.get("settings", {}).items() if k in DEFAULT_SETTINGS})
        if settings:
            unknown = set(settings) - set(DEFAULT_SETTINGS)
            if unknown:
                raise ConfigError(f"unknown index settings: {sorted(unknown)}")
            base.update(settings)
            check_settings(base, settings)
        self.settings = base
        self._given = frozenset(settings or ())
        self.given_config = encoder_config
        self.encoder_config = (self.manifest or {}).get("encoder") or encoder_config

    # -- helpers --------------------------------------------------------------------------------
    def _get_encoder(self) -> Encoder:
        if self._encoder is None:
            if self._encoder_factory is None:
                raise ConfigError("this writer has no encoder: pass encoder= to add documents")
            self._encoder = self._encoder_factory()
        return self._encoder

    def close(self) -> None:
        self.lock.release()

    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self, reuse: Mapping[str, Any] | None = None) -> Snapshot | None:
        if self.manifest is None:
            return None
        return open_snapshot(self.root, device=self.device, reuse=dict(reuse or {}))

    def _commit(self, segments: list[dict[str, Any]], extra: Mapping[str, Any], layout: Layout) -> int:
        prev = self.manifest or {}
        body: dict[str, Any] = {k: prev[k] for k in _BODY_KEYS if k in prev}
        body.update({
            "encoder": self.encoder_config, "settings": dict(self.settings), "segments": segments,
            "num_docs": sum(s["num_docs"] - s.get("num_deleted", 0) for s in segments),
            "skipped_empty": int(prev.get("skipped_empty", 0)),
            "representations": {n: dict(r) for n, r in layout.reps.items()},
            "parts": {n: spec.to_dict() for n, spec in layout.parts.items()},
        })
        body.update(extra)
        body["components"] = _components(self.root, segments) or prev.get("components", {})
        try:
            self.manifest = commit(self.root, body, previous=self.manifest)
        except BaseException:
            self._drop_pending(segments)
            raise
        return int(self.manifest["commit"])

    def _drop_pending(self, segments: list[dict[str, Any]]) -> None:
        """After a failed commit: remove the tombstone files it would have named (unless a commit did)."""
        try:
            live = read_manifest(self.root)
        except Exception:
            live = {"segments": []}
        named = {(e.get("name"), e.get("deleted")) for e in live.get("segments", [])}
        for seg in segments:
            name = seg.get("deleted")
            marker = self.root / seg["name"] / f"{name}{PENDING}"
            if name and marker.exists() and (seg["name"], name) not in named:
                (self.root / seg["name"] / name).unlink(missing_ok=True)
                marker.unlink(missing_ok=True)

    def commit_fields(self, fields: Mapping[str, Any]) -> int:
        """Commit the current segments with manifest ``fields`` changed (e.g. the stored fusion)."""
        if self.manifest is None:
            raise ConfigError(f"no index at {self.root} yet")
        return self._commit(list(self.manifest["segments"]), fields, self._layout())

    def _layout(self, new: bool = False, *, rewrite_all: bool = False) -> Layout:
        """The representations and parts every segment written now gets. An existing index keeps its
        representations and the parts retrievers brought; the built-in parts follow the current
        settings, except that a part its manifest does not list yet (``phrases``, for an index
        written before it existed) comes only with a rewrite of every segment (``rewrite_all``:
        ``compact``), since the manifest's parts are those of every segment. A new index (``new``)
        takes the encoder's heads and every registered retriever's own part."""
        from .retrievers import REGISTRY

        if not new and self.manifest is not None:
            reps = {n: dict(r) for n, r in self.manifest["representations"].items()}
            own = {n: PartSpec.from_dict(n, d) for n, d in self.manifest["parts"].items()}
        else:
            reps = self._get_encoder().representations()
            own = {}
            for r in REGISTRY.values():
                if r.part_type is None or r.part_name in own:
                    continue
                if r.needs != TEXT and r.needs not in reps:
                    reps[r.needs] = rep_spec(r.needs, reps)
                own[r.part_name] = PartSpec(r.part_type.format, r.needs)
        parts = builtin_parts(self.settings, reps)
        if not new and self.manifest is not None and not rewrite_all:
            for name in _ADDED_ON_REWRITE:
                if name in parts and name not in self.manifest["parts"]:
                    del parts[name]
        parts.update({n: spec for n, spec in own.items() if spec.format not in BUILTIN_FORMATS})
        return Layout(reps, parts)

    # -- writes ---------------------------------------------------------------------------------
    def write(self, documents: Iterable[Any], *, mode: str, batch_size: int = 32, chunk_size: int = 1024,
              encode_cache: str | Path | None = None, show_progress: bool | None = None, total: int | None = None,
              reuse: Mapping[str, Any] | None = None, source: Mapping[str, Any] | None = None,
              chunk_tokens: int | None = None, chunk_overlap: int | None = None,
              ttl: float | None = None, columns: Any = None) -> WriteResult:
        """``mode``: ``"build"`` (replace everything with ``documents``), ``"add"`` (new ids only) or
        ``"upsert"`` (add or replace by id). ``chunk_tokens`` / ``chunk_overlap``: cut each document
        into chunks (:mod:`hybridret.chunking`); ``None``: as the index was built (a build records
        them), ``0``: no chunking. A document's chunks are replaced together: chunks that vanished
        are deleted, unchanged ones kept, and only chunks whose text is new are encoded. ``ttl``
        (seconds): documents without an ``expires_at`` expire that long after this write (an explicit
        ``"expires_at": null`` means never, and wins).
        ``documents`` may also be a pyarrow ``Table``, ``RecordBatch`` or ``RecordBatchReader``, or
        hold such tables among its items (:mod:`hybridret.arrow`; ``columns``: which columns hold
        the id, text, title and metadata)."""
        from tqdm.auto import tqdm

        from .arrow import flatten_arrow, is_arrow
        from .encoders._hf import progress_enabled

        if mode not in ("build", "add", "upsert"):
            raise ConfigError(f"unknown write mode {mode!r}")
        for name, v in (("chunk_size", chunk_size), ("batch_size", batch_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        ttl = check_ttl(ttl)
        if is_arrow(documents):
            if total is None and hasattr(documents, "num_rows"):
                total = int(documents.num_rows)
            documents = flatten_arrow(documents, columns)
        if documents is None or not hasattr(documents, "__iter__"):
            raise CorpusFormatError(f"documents must be an iterable of documents, got {type(documents).__name__}")
        if isinstance(documents, (str, bytes, Mapping, Document)):
            raise CorpusFormatError("documents must be an iterable of documents (a list of dicts, Documents or "
                                    f"(id, text) tuples), not a single {type(documents).__name__}")
        documents = flatten_arrow(documents, columns) if columns is not None else _with_arrow(documents)
        spec = self._chunk_spec(mode, chunk_tokens, chunk_overlap)
        snap = None if mode == "build" else self.snapshot(reuse)
        now = self.clock()
        live_now = snap.at(now) if snap is not None else None
        new = mode == "build" or self.manifest is None
        layout = self._layout(new)
        if new:
            self.encoder_config = self._get_encoder().config()
        else:
            given = self._encoder.config() if self._encoder is not None else self.given_config
            self._check_encoder(given)
        chunker = None
        if spec is not None:
            from .chunking import Chunker

            chunker = Chunker(spec.tokens, spec.overlap, encoder=self._get_encoder())
        cache = None
        if encode_cache is not None:
            from .encoders.cache import EncodingCache

            cache = EncodingCache(encode_cache, self.encoder_config or {})
        if total is None and hasattr(documents, "__len__"):
            total = len(documents)  # type: ignore[arg-type]
        seg_dir = new_segment(self.root)
        writer = SegmentWriter(seg_dir, parts=layout.parts, reps=layout.reps, store_text=self.settings["store_text"])
        result = WriteResult()
        chunked = spec is not None or (mode != "build" and (bool((self.manifest or {}).get("chunking")) or (
            snap is not None and document_counts(snap)[1] > 0)))
        if chunked:
            result.documents = {"added": 0, "updated": 0, "unchanged": 0}
        replaced: dict[int, list[int]] = {}

        def tombstone(row: int) -> None:
            s, local = snap.locate(np.array([row]))  # type: ignore[union-attr]
            replaced.setdefault(int(s[0]), []).append(int(local[0]))

        state = PlanState(mode, snap, live_now, chunker, chunked, ttl, now, result, tombstone)
        whole = progress_enabled(show_progress, total or chunk_size + 1, chunk_size)
        bar = tqdm(total=total, desc={"build": "indexing", "add": "adding", "upsert": "upserting"}[mode], unit="doc",
                   disable=not whole)
        # one chunk or less (up to 1,024 documents): no bar per chunk, so the encoders show theirs per batch
        # (following the log level as this one does); with the bar per chunk they stay quiet
        self._encoder_progress = False if whole else show_progress
        self._truncated_before = None  # the encoder's counts when this write first encodes
        try:
            position = 0
            for group in iter_batches(documents, chunk_size):
                batch: list[Document] = []
                old_rows: list[int | None] = []
                sources: list[int | None] = []  # the row whose stored encoding may serve (same text)
                for item in group:
                    doc = as_document(item, position, allow_bare=mode == "build")
                    position += 1
                    self._plan_document(doc, state, batch, old_rows, sources)
                if batch:
                    enc, encoded = self._encode(batch, sources, snap, cache, batch_size, layout)
                    result.encoded += len(encoded)
                    add_rows(writer, batch, enc)
                bar.update(len(group))
            bar.close()
            result.skipped_empty += int(getattr(documents, "skipped_empty", 0) or 0)  # a CorpusReader's own count
            if mode == "build" and writer.count == 0:
                raise CorpusFormatError("no documents to index (the input was empty or every document was blank)")
            self._warn_truncated(writer.count)
            if writer.count == 0:
                writer.abort()
                if not replaced:
                    logger.info("nothing to write: %d unchanged, %d blank", result.unchanged, result.skipped_empty)
                    return result
            else:
                writer.close()
        except BaseException:
            bar.close()
            writer.abort()
            raise
        segments = [] if mode == "build" else self._with_tombstones(snap, replaced)
        if writer.count:
            segments.append({"name": seg_dir.name, "num_docs": writer.count, "deleted": None, "num_deleted": 0})
        extra: dict[str, Any] = {}
        if mode == "build":
            extra["skipped_empty"] = result.skipped_empty
            if spec is not None:
                extra["chunking"] = spec.to_dict()
            if self.manifest is not None:  # a rebuild keeps nothing of the old index but its location
                self.manifest = {"commit": self.manifest.get("commit", 0)}
        else:
            extra["skipped_empty"] = int((self.manifest or {}).get("skipped_empty", 0)) + result.skipped_empty
        if source is not None:
            extra["source"] = dict(source)
        try:
            result.commit = self._commit(segments, extra, layout)
        except BaseException:  # e.g. a full disk while writing the manifest: the old state stays
            if writer.count and not names(self.root, seg_dir.name):  # never remove what a commit already names
                shutil.rmtree(seg_dir, ignore_errors=True)
            raise
        if cache is not None:
            logger.debug("encoding cache %s: %d reused, %d encoded (%.0f MB)", cache.root, cache.hits, cache.misses,
                         cache.nbytes() / 1e6)
        summary_logger.info("%s %s: %s (commit %d)", mode, self.root, result.summary(), result.commit)
        return result

    def _plan_document(self, doc: Document, state: PlanState, batch: list[Document], old_rows: list[int | None],
                       sources: list[int | None]) -> None:
        """Decide what ``doc`` becomes, before anything is encoded: its units (itself or its chunks)
        to encode go to ``batch`` (with the rows they replace and the rows whose stored encodings may
        serve), the rows it replaces are tombstoned through ``state.tombstone``, and ``state.result``
        counts it. Raises (refusing the document) before changing any of these."""
        snap, result = state.snap, state.result
        if not doc.full_text.strip():
            result.skipped_empty += 1
            return
        if state.ttl is not None and EXPIRES_AT not in doc.metadata:  # an explicit null: never
            doc.metadata[EXPIRES_AT] = round(state.now + state.ttl, 3)
        units, previous = self._units(doc, state.chunker, snap)
        if not units:  # text the tokenizer reads as nothing (e.g. only zero-width characters)
            result.skipped_empty += 1
            return
        if state.mode == "add" and state.live_now is not None:
            _refuse_existing(state.live_now, doc, units, previous, self.root)
        for unit in units:
            if unit.id in state.seen:
                raise CorpusFormatError(f"duplicate document id {unit.id!r}", field="id")
        by_key = {snap.segments[int(s)].key_of(int(r)): g  # type: ignore[union-attr]
                  for g, s, r in zip(previous, *snap.locate(np.asarray(previous, dtype=np.int64)))
                  } if previous else {}
        kept = {u.id for u in units}
        existed, changed = bool(previous), False
        for r in previous:
            if str(snap.ids[r]) not in kept:  # type: ignore[union-attr]
                state.tombstone(r)  # a chunk that vanished, or the document before it was chunked
                result.deleted += 1
                changed = True
        for unit in units:
            state.seen.add(unit.id)
            old = snap.row_of(unit.id) if snap is not None else None
            existed = existed or old is not None
            if old is not None and _unchanged(snap, old, unit):  # type: ignore[arg-type]
                result.unchanged += 1
                continue
            changed = True
            batch.append(unit)
            old_rows.append(old)
            sources.append(by_key.get(text_key(unit.full_text), old))
            if old is None:
                result.added += 1
            else:
                result.updated += 1
                state.tombstone(old)
        if state.chunked:
            result.documents["updated" if existed and changed else "unchanged" if existed else "added"] += 1

    def _chunk_spec(self, mode: str, tokens: int | None, overlap: int | None) -> Any:
        """The chunking of this write: given, or as the index records it (``None``: none)."""
        from .chunking import ChunkSpec

        if tokens is None:
            if overlap is not None:
                raise ConfigError("chunk_overlap needs chunk_tokens")
            stored = (self.manifest or {}).get("chunking") if mode != "build" else None
            return ChunkSpec.from_dict(stored) if stored else None
        if tokens == 0 and not isinstance(tokens, bool):
            if overlap is not None:  # it would be ignored: there are no chunks to overlap
                raise ConfigError(f"chunk_overlap={overlap!r} given with chunk_tokens=0 (no chunking): there are no "
                                  "chunks to overlap; leave chunk_overlap out, or give chunk_tokens > 0")
            return None
        return ChunkSpec(tokens, 0 if overlap is None else overlap)

    @staticmethod
    def _units(doc: Document, chunker: Any, snap: Snapshot | None) -> tuple[list[Document], list[int]]:
        """What ``doc`` is written as (itself, or its chunks), and the live rows it replaces that
        are not its own ids: its chunks (by ``parent_id``) and, when chunked, itself unchunked."""
        units = [doc] if chunker is None else [c for c in chunker.chunk(doc) if c.full_text.strip()]
        if snap is None:
            return units, []
        previous = chunk_rows(snap, doc.id)
        whole = snap.row_of(doc.id) if chunker is not None else None
        if whole is not None and whole not in previous:
            previous.append(whole)
        return units, previous

    def _check_encoder(self, given: dict[str, Any] | None) -> None:
        from .encoders import compare_configs

        stored = self.encoder_config
        diffs = compare_configs(stored, given) if stored is not None and given is not None else []
        if diffs:
            raise ConfigError(f"the encoder given is not the one that built {self.root}: " + "; ".join(diffs) +
                              "; documents encoded by another model cannot be mixed into this index")

    def _encode(self, batch: list[Document], old_rows: list[int | None], snap: Snapshot | None, cache: Any,
                batch_size: int, layout: Layout) -> tuple[EncodedBatch, list[int]]:
        """Encodings of ``batch``, each representation the parts are built from: stored values where
        ``old_rows`` names a row of the same text (the same id, or another chunk of the same
        document), then the cache, then the encoder for the rest; with the positions in ``batch``
        that went through the encoder."""
        n = len(batch)
        names = layout.sources()
        texts = [d.full_text for d in batch]
        rows: list[dict[str, Any] | None] = [None] * n
        for i, (doc, old) in enumerate(zip(batch, old_rows)):
            if old is not None and snap is not None:
                rows[i] = _stored_encoding(snap, old, text_key(doc.full_text), layout)
        key_of: dict[int, bytes] = {}
        if cache is not None and names:
            todo = [i for i in range(n) if rows[i] is None]
            key_of = dict(zip(todo, cache.keys([texts[i] for i in todo])))
            found, got = cache.get([key_of[i] for i in todo])
            for j, values in zip(found, got):
                if all(name in values for name in names):
                    rows[todo[j]] = values
        todo = [i for i in range(n) if rows[i] is None] if names else []
        if todo:
            heads = [name for name in names if name not in REPRESENTATIONS]
            encoder = self._get_encoder() if heads else None
            if encoder is not None and self._truncated_before is None:
                self._truncated_before = encoder.truncation_counts()
            enc = encode(encoder, names, [texts[i] for i in todo], queries=False, batch_size=batch_size,
                         show_progress=self._encoder_progress)
            if cache is not None:
                cache.put([key_of[i] for i in todo], enc)
            for j, i in enumerate(todo):
                rows[i] = {name: take_rows(layout.reps[name]["kind"], enc.get(name), [j]) for name in names}
        out = {name: stack_rows(layout.reps[name]["kind"], [r[name] for r in rows]) for name in names} if n else {}
        return EncodedBatch(out), todo

    def _warn_truncated(self, count: int) -> None:
        before = self._truncated_before
        if before is None or self._encoder is None:  # nothing was encoded by this write
            return
        for model, total in self._encoder.truncation_counts().items():
            cut = total - before.get(model, 0)
            if cut:  # warnings, not only the logger: a library user sees it without configuring logging
                warnings.warn(f"{model}: {cut} of {count} documents were longer than max_length tokens and were "
                              "truncated (only their beginning is searchable; split long documents into passages, "
                              "or raise max_length)", TruncationWarning, stacklevel=4)

    def _with_tombstones(self, snap: Snapshot | None, dead: Mapping[int, list[int]]) -> list[dict[str, Any]]:
        """The current segment entries, with ``dead`` (segment index -> local rows) tombstoned in new files."""
        if snap is None:
            return []
        number = int((self.manifest or {}).get("commit", 0)) + 1
        out = []
        for i, entry in enumerate(self.manifest["segments"]):  # type: ignore[index]
            entry = dict(entry)
            if dead.get(i):
                rows = np.union1d(snap.deleted[i], np.asarray(dead[i], dtype=np.int64))
                name = f"deleted-{number:08d}-{uuid.uuid4().hex[:8]}.npy"  # never the name of a live file
                # marked pending until the commit names it: readers tell it from a newer commit's file
                # (which an older manifest put back would hide, see Snapshot)
                atomic_write_json(snap.root / entry["name"] / (name + PENDING), {"pid": os.getpid()})  # durable first
                atomic_write_npy(snap.root / entry["name"] / name, rows.astype(np.int64))
                entry["deleted"], entry["num_deleted"] = name, int(len(rows))
            out.append(entry)
        return out

    def delete(self, ids: Iterable[str] | None = None, *, filter: Any = None, missing: str = "error",
               dry_run: bool = False, reuse: Mapping[str, Any] | None = None) -> WriteResult:
        """Tombstone documents by id, or every document matching ``filter`` (the syntax of
        :mod:`hybridret.filters`), in one commit; ``result.deleted`` counts the rows deleted. An id
        also deletes the chunks of that document (``id#0``, ``id#1``, ...; see
        :mod:`hybridret.chunking`). ``missing="error"`` (default) refuses the whole call when an id
        is unknown (nothing is deleted); ``"ignore"`` deletes the rest and lists them in the result.
        ``dry_run``: commit nothing; ``result.deleted`` and ``result.matched`` (the ids) say what
        would go. Expired documents still in the index are deleted like the others."""
        snap = self.snapshot(reuse)
        rows, result = deletion(snap, ids, filter=filter, missing=missing, root=self.root)
        if dry_run:
            return dry_run_result(snap, rows, result)
        return self._tombstone(snap, rows, result, "deleted")

    def purge(self, *, reuse: Mapping[str, Any] | None = None) -> WriteResult:
        """Tombstone every document expired by now (``expires_at``), in one commit (searches never
        return them anyway; this makes the counts say so, and ``compact`` frees their space)."""
        snap = self.snapshot(reuse)
        if snap is None:
            return WriteResult()
        rows = [int(snap.offsets[i]) + r for i, local in enumerate(snap.expired(self.clock())) for r in local.tolist()]
        return self._tombstone(snap, rows, WriteResult(documents=_documents_deleted(snap, rows)), "purged expired")

    @staticmethod
    def _rows_of(snap: Snapshot | None, doc_id: str) -> list[int]:
        """Live rows of id ``doc_id``: the document itself and its chunks."""
        if snap is None:
            return []
        row = snap.row_of(doc_id)
        return ([row] if row is not None else []) + chunk_rows(snap, doc_id)

    @staticmethod
    def _matching(snap: Snapshot | None, filter: Any) -> list[int]:
        """Live rows matching ``filter``."""
        from .filters import parse_filter

        filt = parse_filter(filter)
        if snap is None or filt is None:
            return []
        filt.check_fields(seg.columns for seg in snap.segments)
        out: list[int] = []
        for i, seg in enumerate(snap.segments):
            mask = filt.segment_mask(seg)
            if snap.live[i] is not None:
                mask = mask & snap.live[i]
            out.extend((np.flatnonzero(mask) + int(snap.offsets[i])).tolist())
        return out

    def _tombstone(self, snap: Snapshot | None, rows: list[int], result: WriteResult, what: str) -> WriteResult:
        """Commit tombstones for global ``rows`` (nothing when there are none)."""
        if not rows or snap is None:
            return result
        seg, local = snap.locate(np.asarray(rows, dtype=np.int64))
        dead: dict[int, list[int]] = {}
        for s, r in zip(seg.tolist(), local.tolist()):
            dead.setdefault(s, []).append(r)
        segments = self._with_tombstones(snap, dead)
        result.deleted = len(rows)
        result.commit = self._commit(segments, {}, self._layout())
        summary_logger.info("%s %s (commit %d)", what, count_words(result.documents["deleted"], result.deleted)
                            if result.documents else count_words(result.deleted), result.commit)
        return result

    def compact(self, *, reuse: Mapping[str, Any] | None = None, show_progress: bool | None = None,
                migrate: bool = False) -> WriteResult:
        """Merge every segment into one and drop tombstoned documents, re-encoding nothing. BM25
        statistics then equal those of a fresh build of the live documents. ``migrate`` switches the
        index to the current sparse format (``sparse_scheme="impact"``) and rewrites even a single
        segment that is in an older one. Documents expired by now (``expires_at``) are dropped too,
        and counted in ``deleted``."""
        snap = self.snapshot(reuse)
        snap = snap.at(self.clock()) if snap is not None else None
        stale = switched = False
        if migrate:
            switched = self.settings["sparse_scheme"] != DEFAULT_SETTINGS["sparse_scheme"]
            self.settings["sparse_scheme"] = DEFAULT_SETTINGS["sparse_scheme"]
            if "faiss_factory" not in self._given and self.settings["faiss_factory"] == "Flat":
                switched = True  # the former default: the size rule now chooses
                self.settings["faiss_factory"] = DEFAULT_SETTINGS["faiss_factory"]
        if "faiss_factory" in self._given and self.manifest is not None and \
                self.manifest.get("settings", {}).get("faiss_factory") != self.settings["faiss_factory"]:
            switched = True
        if migrate or "faiss_factory" in self._given:
            layout = self._layout(rewrite_all=True)
            stale = snap is not None and any(_outdated(seg, layout) for seg in snap.segments)
        if snap is None or (len(snap.segments) <= 1 and snap.num_deleted == 0 and not stale):
            if switched and snap is not None:  # nothing to rewrite, but later segments use the current format
                return WriteResult(commit=self._commit(list(self.manifest["segments"]), {}, self._layout()))  # type: ignore[index]
            return WriteResult()
        return self._merge(snap, list(range(len(snap.segments))), show_progress=show_progress, what="compacted")

    def merge_small(self, *, reuse: Mapping[str, Any] | None = None) -> WriteResult | None:
        """The merge policy run after each add/upsert: while there are more than ``max_segments``
        segments, merge the smallest ones (by live documents) into one, so that searches never pay
        for many small segments. ``None`` when nothing needed merging."""
        limit = int(self.settings.get("max_segments") or 0)
        if limit < 1 or self.manifest is None or len(self.manifest["segments"]) <= limit:
            return None
        if self.settings["bm25"] and not self.settings["store_text"]:
            return None  # BM25 cannot be rebuilt without the texts: segments stay as they are
        snap = self.snapshot(reuse).at(self.clock())  # type: ignore[union-attr]  # expired rows are not merged
        sizes = [s.num_docs - len(d) for s, d in zip(snap.segments, snap.deleted)]  # type: ignore[union-attr]
        n_merge = len(sizes) - limit + 1
        chosen = sorted(sorted(range(len(sizes)), key=lambda i: (sizes[i], i))[:n_merge])
        return self._merge(snap, chosen, show_progress=False, what="merged")  # type: ignore[arg-type]

    def _merge(self, snap: Snapshot, chosen: list[int], *, show_progress: bool | None, what: str) -> WriteResult:
        """Rewrite segments ``chosen`` (indices, in order) as one, without their tombstoned rows; the
        merged segment takes the place of the first of them."""
        from tqdm.auto import tqdm

        from .encoders._hf import progress_enabled

        if self.settings["bm25"] and not self.settings["store_text"]:
            raise ConfigError(f"{self.root} keeps no document text (store_text=False), which BM25 needs to be "
                              "rebuilt; segments cannot be merged: rebuild the index from the corpus")
        layout = self._layout(rewrite_all=len(chosen) == len(snap.segments))
        if what == "compacted":  # a compaction (and --migrate) stamps new checksums: verify the old ones first
            _verify_before_rewrite(snap, chosen)
        total = sum(snap.segments[i].num_docs - len(snap.deleted[i]) for i in chosen)
        seg_dir = new_segment(self.root)
        writer = SegmentWriter(seg_dir, parts=layout.parts, reps=layout.reps, store_text=self.settings["store_text"])
        bar = tqdm(total=total, desc="compacting" if what == "compacted" else "merging", unit="doc",
                   disable=not progress_enabled(show_progress, total, COMPACT_CHUNK))
        try:
            for i in chosen:
                seg = snap.segments[i]
                live = np.flatnonzero(snap.live[i]) if snap.live[i] is not None else np.arange(seg.num_docs)
                for a in range(0, len(live), COMPACT_CHUNK):
                    rows = live[a:a + COMPACT_CHUNK]
                    docs = []
                    for r in rows.tolist():
                        title, text = seg.docs.get(r)
                        docs.append(Document(id=str(seg.docs.ids[r]), text=text, title=title,
                                             metadata=seg.metadata_of(r)))
                    enc = EncodedBatch(stored_values(seg, rows, layout, required=True))
                    keys = [seg.key_of(r) or text_key(d.full_text) for r, d in zip(rows.tolist(), docs)]
                    writer.add([d.id for d in docs], [d.title for d in docs], [d.text for d in docs],
                               [d.full_text for d in docs], [d.metadata for d in docs], enc, keys)
                    bar.update(len(rows))
            bar.close()
            if writer.count:
                writer.close()
        except BaseException:
            bar.close()
            writer.abort()
            raise
        merged = {"name": seg_dir.name, "num_docs": writer.count, "deleted": None, "num_deleted": 0}
        if not writer.count:
            writer.abort()
        entries: list[dict[str, Any]] = []
        for i, entry in enumerate(self.manifest["segments"]):  # type: ignore[index]
            if i == chosen[0] and writer.count:
                entries.append(merged)
            if i not in chosen:
                entries.append(dict(entry))
        result = WriteResult(deleted=sum(len(snap.deleted[i]) for i in chosen))
        try:
            result.commit = self._commit(entries, {}, layout)
        except BaseException:
            if not names(self.root, seg_dir.name):
                shutil.rmtree(seg_dir, ignore_errors=True)
            raise
        logger.info("%s %d segments into %d (%d documents, %d tombstones dropped); %d segments now", what,
                    len(chosen), 1 if writer.count else 0, writer.count, result.deleted, len(entries))
        return result


def deletion(snap: Snapshot | None, ids: Iterable[str] | str | None = None, *, filter: Any = None,
             missing: str = "error", root: Path | str = "") -> tuple[list[int], WriteResult]:
    """What :meth:`IndexWriter.delete` would delete from ``snap``: the global rows (sorted) and a
    :class:`WriteResult` whose ``deleted`` / ``missing`` say so (``matched``: the ids, filled in
    only by :func:`dry_run_result`). Writes nothing."""
    if missing not in ("error", "ignore"):
        raise ConfigError(f"missing must be 'error' or 'ignore', got {missing!r}")
    if ids is None and filter is None:
        raise ConfigError("ids must be a list of document ids (or give filter= to delete what matches), got None")
    if ids is not None and filter is not None:
        raise ConfigError("delete takes ids or a filter, not both")
    result = WriteResult()
    if filter is not None:
        rows = IndexWriter._matching(snap, filter)
    else:
        ids = _check_ids(ids)
        rows = []
        for i in ids:
            found = IndexWriter._rows_of(snap, i)
            if not found:
                result.missing.append(i)
            rows += found
        if result.missing and missing == "error":
            shown = ", ".join(repr(i) for i in result.missing[:10]) + (" ..." if len(result.missing) > 10 else "")
            raise DocumentNotFoundError(f"{len(result.missing)} of {len(ids)} ids are not in the index at "
                                        f"{root}: {shown}; nothing was deleted", result.missing)
    rows = sorted(set(rows))
    result.deleted = len(rows)
    result.documents = _documents_deleted(snap, rows)
    return rows, result


def _refuse_existing(live: Snapshot, doc: Document, units: list[Document], previous: list[int], root: Path) -> None:
    """``add`` refuses a document whose id, or one of its chunks' ids, a live document has; the
    message names the id that is there (``get`` finds it), not only the document given."""
    old = [i for i in (str(live.ids[r]) for r in previous) if live.row_of(i) is not None]
    clash = [u.id for u in units if live.row_of(u.id) is not None]
    if not old and not clash:
        return
    hint = "use upsert (CLI: --upsert) to replace it"
    if doc.id in clash or old and not clash:
        chunks = [i for i in old if i != doc.id]
        how = (f" (as {len(chunks)} chunks: {', '.join(map(repr, chunks[:3]))}{' ...' if len(chunks) > 3 else ''})"
               if chunks and doc.id not in old else "")
        raise IndexExistsError(f"document {doc.id!r} is already in the index at {root}{how}; {hint}")
    ids = ", ".join(repr(u.id) for u in units[:3]) + (" ..." if len(units) > 3 else "")
    raise IndexExistsError(f"document {doc.id!r} is cut into chunks with the ids {ids}, and the index at {root} "
                           f"already has a document with the id {clash[0]!r} (get {clash[0]!r} shows it); give "
                           f"{doc.id!r} another id, or {hint}")


def dry_run_result(snap: Snapshot | None, rows: list[int], result: WriteResult) -> WriteResult:
    """``result`` of a dry-run delete of ``rows``: ``matched`` lists their ids; nothing is written
    (so a dry run needs no writer, and works on an index that cannot be written)."""
    result.matched = [str(snap.ids[r]) for r in rows] if snap is not None else []
    return result


def _documents_deleted(snap: Snapshot | None, rows: list[int]) -> dict[str, int]:
    """``{"deleted": documents}`` for global ``rows`` of an index holding chunks (else ``{}``)."""
    if snap is None or not document_counts(snap)[1]:
        return {}
    return {"deleted": len({document_of(snap, r) for r in rows})}


def _with_arrow(documents: Iterable[Any]) -> Iterable[Any]:
    """``documents``, with pyarrow tables among its items expanded into their documents (a list
    or a reader with counts of its own is kept as it is when it holds none)."""
    from .arrow import flatten_arrow, is_arrow

    if isinstance(documents, (list, tuple)) and not any(is_arrow(d) for d in documents):
        return documents
    if hasattr(documents, "skipped_empty"):  # a CorpusReader: its own documents, and its count of blank ones
        return documents
    return flatten_arrow(documents)


def _check_ids(ids: Any) -> list[str]:
    """Document ids given to delete, validated and deduplicated (one id alone is accepted)."""
    if isinstance(ids, (str, int)) and not isinstance(ids, bool):
        ids = [ids]
    if ids is None or isinstance(ids, (bytes, Mapping)) or not hasattr(ids, "__iter__"):
        raise ConfigError(f"ids must be a list of document ids, got {type(ids).__name__}")
    checked = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (str, int)):
            raise ConfigError(f"document ids are strings or integers, got {i!r}")
        checked.append(str(i))
    return list(dict.fromkeys(checked))


def _unchanged(snap: Snapshot, row: int, doc: Document) -> bool:
    """Same text (by hash, and literally where texts are stored) and the same metadata."""
    title, text, meta = snap.get(row)
    s, local = snap.locate(np.array([row]))
    seg = snap.segments[int(s[0])]
    key = seg.key_of(int(local[0]))
    if meta != doc.metadata or (key is not None and key != text_key(doc.full_text)):
        return False
    if seg.docs.has_text:
        return title == doc.title and text == doc.text
    return key is not None


def stored_values(seg: Any, rows: np.ndarray, layout: Layout, *, required: bool = False) -> dict[str, Any] | None:
    """The stored values of local ``rows`` of segment ``seg`` for every representation the parts are
    built from, read back from a part of the segment that keeps them exactly. ``None`` (or, with
    ``required``, a :class:`ConfigError`) when some representation cannot be read back."""
    out: dict[str, Any] = {}
    for name in layout.sources():
        for part_name, spec in layout.parts.items():
            part = seg.part(part_name) if spec.source == name else None
            pt = PART_TYPES.get(str(part.meta.get("format"))) if part is not None else None
            if pt is not None and pt.stored is not None:
                out[name] = pt.stored(part, rows)
                break
        else:
            if required:
                raise ConfigError(f"{seg.root}: no part keeps representation {name!r}, so its rows cannot be copied "
                                  "without encoding them again; rebuild the index from the corpus")
            return None
    return out


def _stored_encoding(snap: Snapshot, row: int, key: bytes, layout: Layout) -> dict[str, Any] | None:
    """The stored representations of ``row`` when its text hash is ``key`` (an unchanged text)."""
    s, local = snap.locate(np.array([row]))
    seg, r = snap.segments[int(s[0])], int(local[0])
    if seg.key_of(r) != key:
        return None
    return stored_values(seg, np.array([r]), layout)


def _outdated(seg: Any, layout: Layout) -> bool:
    """A segment in an older layout, or whose parts differ from the index's current formats (or,
    for a dense part, was built for another FAISS factory than the one now asked for)."""
    def differs(meta: Mapping[str, Any], spec: PartSpec) -> bool:
        if meta.get("format") != spec.format:
            return True
        want = spec.options.get("factory")
        have = meta.get("requested_factory", meta.get("factory"))
        return want is not None and str(have).strip().lower() != str(want).strip().lower()

    return seg.layout != "parts" or any(seg.part(n) is None or differs(seg.part(n).meta, spec)
                                        for n, spec in layout.parts.items())


def _verify_before_rewrite(snap: Snapshot, chosen: list[int]) -> None:
    """Every byte of the segments ``chosen`` against the checksums written with them (the check
    ``info --check`` runs), before a compaction copies them into a segment with new checksums:
    damage found is an :class:`IndexFormatError` (nothing is written), never re-stamped as valid.
    Format-1 segments have no checksums to verify."""
    from .index.segment import check_files

    for i in chosen:
        seg = snap.segments[i]
        problems = check_files(seg.root, seg.files, full=True) if seg.files is not None else []
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise IndexFormatError(f"{problems[0]}{more}; nothing was compacted: a compaction would stamp the damage "
                                   "as valid (restore the segment from a copy, or rebuild the index)")


_SUMMED = frozenset({"num_docs", "nnz", "total_len", "num_postings", "sparse_postings", "dense_runs"})  # counts that add up
_PER_POSTING = "bytes_per_posting"  # fields that start so are per-posting figures: weighted by each segment's nnz
_LARGEST = frozenset({"max_weight", "max_len"})


def components_across(metas: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One part's ``meta.json`` over every segment that has it: counts summed (``num_docs``,
    ``nnz``, ...), maxima the largest, fields equal everywhere as they are, and any other field that
    differs between segments as ``{"per_segment": [...]}`` (e.g. BM25's ``num_terms``, which
    distinct segments do not add up to); ``segments`` says how many were described."""
    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(k for m in metas for k in m))
    for key in keys:
        values = [m.get(key) for m in metas]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if key in _SUMMED and numbers:
            out[key] = sum(values)
        elif key in _LARGEST and numbers:
            out[key] = max(values)
        elif key.startswith(_PER_POSTING) and numbers and all(isinstance(m.get("nnz"), int) for m in metas):
            total = sum(int(m["nnz"]) for m in metas)
            out[key] = round(sum(v * int(m["nnz"]) for v, m in zip(values, metas)) / max(1, total), 3)
        elif all(v == values[0] for v in values):
            out[key] = values[0]
        else:
            out[key] = {"per_segment": values}
    out["segments"] = len(metas)
    return out


def parts_across_segments(snap: Any) -> dict[str, Any]:
    """Every part described over all segments (:func:`~hybridret.indexer.components_across`): the
    ``meta.json`` each segment wrote for it; the manifest's (the newest segment's) where a segment
    has none (older layouts)."""
    from .index.storage import read_json

    newest = snap.manifest.get("components") or {}
    metas: dict[str, list[dict[str, Any]]] = {}
    for seg in snap.segments:
        for name in newest:
            path = seg.root / name / "meta.json"
            if path.is_file():
                metas.setdefault(name, []).append(read_json(path))
    out = {name: components_across(metas[name]) if name in metas else dict(meta) for name, meta in newest.items()}
    parts = [s.sparse for s in snap.segments if getattr(s, "sparse", None) is not None]
    if "sparse" in out and parts and len(metas.get("sparse", [])) != len(snap.segments):  # older layouts
        out["sparse"].update(num_docs=sum(p.num_docs for p in parts), nnz=sum(int(p.forward.nnz) for p in parts))
    return out


def _components(root: Path, segments: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``info`` shows of the components: the ``meta.json`` of each part of the newest segment."""
    from .index.storage import read_json

    if not segments:
        return {}
    seg = root / segments[-1]["name"]
    listed = read_json(seg / SEGMENT_FILE).get("parts") if (seg / SEGMENT_FILE).is_file() else None
    names = list(listed) if isinstance(listed, dict) else ["dense", "sparse"]
    return {name: read_json(seg / name / "meta.json") for name in names if (seg / name / "meta.json").is_file()}
