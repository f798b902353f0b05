"""HybridRetriever: the one-object API (encode -> index -> search -> save/load), and a living index.

It composes the two sides: writes go through :class:`~hybridret.indexer.IndexWriter` (build, add,
upsert, delete, compact: each one atomic commit), searches through a
:class:`~hybridret.search.searcher.Searcher` over the latest snapshot, refreshed after each write.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._runtime import prepare_native_libraries
from .encoders import Encoder, PairedEncoder
from .errors import ConfigError, IndexExistsError, IndexFormatError
from .filters import Filter
from .fusion.config import FusionConfig
from .index.dense_auto import AUTO_MIN_ROWS
from .index.expiry import Clock, check_clock
from .index.lock import WriterLock
from .index.manifest import MANIFEST, collect_garbage, commit, link_file, link_tree, read_manifest
from .indexer import DEFAULT_SETTINGS, IndexWriter, WriteResult, count_words, parts_across_segments, summary_logger
from .retrievers import QueryBatch
from .search.request import SearchRequest
from .search.searcher import METHODS, EncoderSlot, Searcher
from .types import Hits

if TYPE_CHECKING:  # pragma: no cover
    from .group_commit import WriteRequest

__all__ = ["METHODS", "HybridRetriever"]

logger = logging.getLogger(__name__)


class HybridRetriever:
    """Index documents with a hybrid encoder and search them densely, sparsely, with BM25, or fused.

    >>> retriever = HybridRetriever.from_models()          # packaged MiniLM + SPLADE-tiny
    >>> retriever.index([{"id": "a", "text": "...", "source": "wiki"}, ...])
    >>> hits = retriever.search(["a question"], k=10, filter={"source": "wiki"})
    >>> retriever.upsert([...]); retriever.delete(["a"]); retriever.compact()
    >>> retriever.save("indexes/mine"); HybridRetriever.load("indexes/mine")

    Settings: ``faiss_factory`` (``"auto"``, the default: exact ``"Flat"`` for segments of fewer than
    ``faiss_auto_min_rows`` vectors (100,000), a compressed IVF-RaBitQ index tuned to recall@10 0.995
    with exact re-scoring above (:mod:`hybridret.index.dense_auto`); or any FAISS factory string),
    ``faiss_metric`` (``"ip"``/``"l2"``), ``sparse_scheme`` / ``sparse_bits`` / ``sparse_max_weight``
    (how learned weights are indexed: ``"impact"``, the default, keeps impact-layered postings
    searched with pruning in numba (:mod:`hybridret.index.impact`); ``"tfgrid"`` stores them as
    term frequencies on tantivy's own BM25 curve; the format-1 ``"planes"`` / ``"buckets"`` use bit
    planes or weight buckets and take ``sparse_bits`` / ``sparse_max_weight``; results stay exact
    whatever they are, only speed changes), ``bm25`` (index the text for BM25),
    ``store_text`` (keep texts for hit views) and ``max_segments`` (after an add or upsert, the
    smallest segments are merged while there are more; 0 = never merge automatically) and
    ``phrase_index`` (the ``phrases`` part that answers ``$text`` phrase filters; see docs/filters.md).
    ``clock``: what "now" is for expiry (a callable returning seconds since the epoch; default
    :func:`time.time`).

    RAG knowledge bases: ``index(..., chunk_tokens=N, chunk_overlap=M)`` cuts documents into chunks
    (:mod:`hybridret.chunking`; later adds and upserts cut the same way), ``delete("doc")`` removes
    a document's chunks, ``delete(filter={...})`` removes what matches, and documents with an
    ``expires_at`` (or written with ``ttl=``) stop being returned at that time
    (:mod:`hybridret.index.expiry`).
    """

    def __init__(self, encoder: Encoder | None = None, *, faiss_factory: str = "auto", faiss_metric: str = "ip",
                 faiss_auto_min_rows: int = AUTO_MIN_ROWS, sparse_scheme: str = "impact", sparse_bits: int = 6, sparse_max_weight: float = 5.0,
                 bm25: bool = True, store_text: bool = True, max_segments: int = 8, device: str | None = None,
                 clock: Clock | None = None, phrase_index: bool = True) -> None:
        prepare_native_libraries()
        self.device = device
        self.clock = check_clock(clock)
        self.settings: dict[str, Any] = {
            "faiss_factory": faiss_factory, "faiss_metric": faiss_metric, "faiss_auto_min_rows": faiss_auto_min_rows,
            "sparse_scheme": sparse_scheme,
            "sparse_bits": sparse_bits, "sparse_max_weight": sparse_max_weight, "bm25": bm25,
            "store_text": store_text, "max_segments": max_segments, "phrase_index": phrase_index,
        }
        self._slot = EncoderSlot(encoder, None, device)
        self._root: Path | None = None
        self._searcher: Searcher | None = None

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_models(cls, dense_model: str | None = None, sparse_model: str | None = None, *,
                    device: str | None = None, max_length: int = 256, backend: str = "auto",
                    **settings: Any) -> HybridRetriever:
        """A paired encoder from two model names (``None`` = packaged defaults), then an empty retriever.
        ``backend``: ``"auto"`` (on the CPU: onnx where onnxruntime is installed, else torch where
        installed, else numpy), ``"onnx"`` (ONNX Runtime, float32, no torch), ``"onnx-int8"``,
        ``"numpy"`` (float32, no torch needed), ``"torch"`` (float32), ``"torch-bf16"`` or ``"torch-int8"``
        (faster CPU encoding); see :mod:`hybridret.encoders.backends`."""
        prepare_native_libraries()
        encoder = PairedEncoder.from_names(dense_model, sparse_model, device=device, max_length=max_length,
                                           backend=backend)
        return cls(encoder, device=device, **settings)

    @property
    def encoder(self) -> Encoder:
        """The encoder; loaded on first use for a retriever read from disk."""
        return self._slot.get()

    @property
    def searcher(self) -> Searcher:
        """The read-only searcher over the current snapshot (share it between threads)."""
        if self._searcher is None:
            raise ConfigError("the retriever has no index yet: call index() or load()")
        return self._searcher

    @property
    def path(self) -> Path | None:
        """The directory the index lives in (a temporary one until :meth:`save`)."""
        return self._root

    @property
    def manifest(self) -> dict[str, Any]:
        return dict(self._searcher.snapshot.manifest) if self._searcher is not None else {}

    @property
    def num_docs(self) -> int:
        """Live rows: documents, or chunks in an index of chunks (see :meth:`document_counts`)."""
        return self._searcher.num_docs if self._searcher is not None else 0

    def document_counts(self) -> tuple[int, int]:
        """``(documents, chunks)`` live now (see :meth:`Searcher.document_counts`)."""
        return self._searcher.document_counts() if self._searcher is not None else (0, 0)

    def _single_segment(self) -> Any:
        segs = self.searcher.snapshot.segments
        if len(segs) != 1:
            raise ConfigError(f"the index has {len(segs)} segments; use the Searcher, or compact() first")
        return segs[0]

    @property
    def dense(self) -> Any:
        """The dense index of a one-segment index (``None`` without one)."""
        return self._single_segment().dense

    @property
    def sparse(self) -> Any:
        """The learned-sparse part of a one-segment index (``None`` without one)."""
        return self._single_segment().sparse

    def part(self, name: str) -> Any:
        """The part ``name`` (``"dense"``, ``"sparse"``, ``"bm25"``, ...) of a one-segment index
        (``None`` without one)."""
        return self._single_segment().part(name)

    @property
    def docs(self) -> Any:
        return self._single_segment().docs

    # -- writes ---------------------------------------------------------------------------------
    def _writer(self, root: Path, **kw: Any) -> IndexWriter:
        return IndexWriter(root, encoder=self._slot.get, encoder_config=self._slot.config,
                           device=self.device, clock=self.clock, **kw)

    def _expect(self) -> dict[str, Any] | None:
        """The manifest this retriever serves: its writes refuse an index gone or replaced since."""
        return self._searcher.snapshot.manifest if self._searcher is not None else None

    def _reuse(self) -> dict[str, Any]:
        return {s.name: s for s in self._searcher.snapshot.segments} if self._searcher is not None else {}

    def _after_write(self, writer: IndexWriter) -> None:
        """Serve the new commit, then (still holding the writer lock) remove what only our previous
        snapshot kept alive; segments other readers lease stay."""
        if self._searcher is None:
            self._searcher = Searcher(self._root, encoder=self._slot, device=self.device, clock=self.clock)
        else:
            self._searcher.refresh()
        if writer.manifest is not None:
            collect_garbage(writer.root, writer.manifest)

    def index(self, documents: Iterable[Any], *, batch_size: int = 32, chunk_size: int = 1024,
              workdir: str | Path | None = None, show_progress: bool | None = None, total: int | None = None,
              encode_cache: str | Path | None = None, overwrite: bool = False,
              source: Mapping[str, Any] | None = None, chunk_tokens: int | None = None,
              chunk_overlap: int | None = None, ttl: float | None = None, columns: Any = None) -> HybridRetriever:
        """Encode and index a stream of documents (``Document``, dict, ``(id, text)`` or str), replacing
        nothing: a retriever that already holds documents needs ``overwrite=True`` (or use
        :meth:`add` / :meth:`upsert`).

        Dicts carry ``"id"``/``"_id"``, ``"text"``, optional ``"title"`` and ``"metadata"``; any other
        field joins the metadata. Documents are processed ``chunk_size`` at a time, so memory holds
        one chunk plus the FAISS index. The index lives in ``workdir`` (default: a temporary
        directory, removed with the retriever; :meth:`save` makes it permanent) and is committed
        atomically at the end. Blank documents are skipped and counted (``manifest["skipped_empty"]``);
        duplicate ids raise :class:`CorpusFormatError`. ``encode_cache`` (a folder) keeps every
        encoded document, keyed on its content: after an interruption, or for a rebuild, only
        documents not encoded before are encoded.

        ``chunk_tokens`` (and ``chunk_overlap``): cut every document into chunks of at most that
        many tokens of the dense model (:class:`~hybridret.chunking.Chunker`), indexed as
        ``DOCID#0``, ``DOCID#1``, ... with ``parent_id``, ``chunk``, ``start`` and ``end`` in their
        metadata; the index records it, and :meth:`add` / :meth:`upsert` cut the same way.
        ``ttl`` (seconds): documents without an ``expires_at`` expire that long from now.

        Arrow: ``documents`` may be a pyarrow ``Table``, ``RecordBatch`` or ``RecordBatchReader`` (or
        an iterable of them), read a batch at a time; ``columns`` maps its columns, e.g. ``{"id":
        "doc_id", "text": "body", "metadata": ["source"]}`` (default: ``_id``/``id``, ``text``,
        ``title``, every other column as metadata; see :mod:`hybridret.arrow`). A Parquet corpus:
        ``index(CorpusReader("corpus.parquet"))``.
        """
        if self._searcher is not None and self.num_docs and not overwrite and workdir is None:
            raise IndexExistsError(f"this retriever already holds {self.num_docs} documents; use add()/upsert() "
                                   "to change them, or index(..., overwrite=True) to replace them all")
        if self._slot.config is None:
            raise ConfigError("this retriever has no encoder")
        if workdir is None:
            root = self._root if self._root is not None and overwrite else Path(tempfile.mkdtemp(prefix="hybridret-"))
            if root != self._root:
                weakref.finalize(self, shutil.rmtree, str(root), True)
        else:
            root = Path(workdir)
            if (root / MANIFEST).exists() and not overwrite:
                raise IndexExistsError(f"an index already exists at {root}; pass overwrite=True (CLI: --overwrite)")
        with self._writer(root, settings=self.settings) as w:
            w.write(documents, mode="build", batch_size=batch_size, chunk_size=chunk_size, encode_cache=encode_cache,
                    show_progress=show_progress, total=total, source=source, chunk_tokens=chunk_tokens,
                    chunk_overlap=chunk_overlap, ttl=ttl, columns=columns)
            if root != self._root:
                self._root, self._searcher = root, None
            self._after_write(w)
        documents, chunks = self.searcher.document_counts()
        summary_logger.info("indexed %s", count_words(documents, chunks if chunks else None))
        return self

    def _write(self, documents: Iterable[Any], mode: str, **kw: Any) -> WriteResult:
        if self._root is None:
            raise ConfigError("the retriever has no index yet: call index() or load() first")
        with self._writer(self._root, expect=self._expect()) as w:
            result = w.write(documents, mode=mode, reuse=self._reuse(), **kw)
            self._after_write(w)
            if result.commit is not None:
                self._merge_small(w)
        return result

    def _merge_small(self, w: IndexWriter) -> None:
        """After a commit: merge small segments (housekeeping, never an error)."""
        try:
            if w.merge_small(reuse=self._reuse()) is not None:
                self._after_write(w)
        except Exception:
            logger.warning("merging small segments of %s failed; they stay as they are", self._root, exc_info=True)

    def write_group(self, requests: Sequence[WriteRequest], *, batch_size: int = 32,
                    cancel: threading.Event | None = None, merge: bool = True) -> list[WriteResult | Exception]:
        """Apply several adds, upserts and deletes by id in one commit (group commit, see
        :mod:`hybridret.group_commit`): one outcome per request, its :class:`WriteResult` or the
        error that refused it alone; an error of the commit itself is every request's outcome.
        Committed (and served by :attr:`searcher`) when this returns. ``merge=False``: leave the
        merge of small segments that follows a commit to a later :meth:`merge_small` (a server
        answers first, then merges)."""
        from .group_commit import write_group

        if self._root is None:
            raise ConfigError("the retriever has no index yet: call index() or load() first")
        with self._writer(self._root, expect=self._expect()) as w:
            outcomes = write_group(w, requests, reuse=self._reuse(), batch_size=batch_size, cancel=cancel)
            if any(isinstance(o, WriteResult) and o.commit is not None for o in outcomes):
                self._after_write(w)
                if merge and (cancel is None or not cancel.is_set()):
                    self._merge_small(w)
        return outcomes

    def merge_small(self) -> None:
        """Merge small segments when there are more than ``max_segments`` (what every add and
        upsert does after its commit; housekeeping: a failure is logged, never raised)."""
        if self._root is None:
            raise ConfigError("the retriever has no index yet")
        with self._writer(self._root, expect=self._expect()) as w:
            self._merge_small(w)

    def add(self, documents: Iterable[Any], **kw: Any) -> WriteResult:
        """Add new documents (an id already in the index is an error: use :meth:`upsert`).
        Committed when this returns. Takes ``batch_size``, ``chunk_size``, ``encode_cache``,
        ``show_progress``, ``total``, ``chunk_tokens`` / ``chunk_overlap`` (default: as the index
        was built; ``0``: no chunking), ``ttl`` and ``columns`` (Arrow input) as :meth:`index` does."""
        return self._write(documents, "add", **kw)

    def upsert(self, documents: Iterable[Any], **kw: Any) -> WriteResult:
        """Add documents or replace those with the same ids. An unchanged document is left as it is;
        a changed one whose text is unchanged keeps its stored vectors (nothing is re-encoded). A
        chunked document's chunks are replaced together: chunks that vanished are deleted, and a
        chunk whose text some chunk of the document already had is not encoded again
        (``result.encoded`` counts the chunks that were)."""
        return self._write(documents, "upsert", **kw)

    def delete(self, ids: Iterable[str] | str | None = None, *,
               filter: Filter | Mapping[str, Any] | str | None = None, missing: str = "error",
               dry_run: bool = False) -> WriteResult:
        """Delete documents by id, or every document matching ``filter``, in one commit
        (tombstones: searches never return them again); ``result.deleted`` is the count. An id
        deletes the document's chunks too. Unknown ids raise :class:`DocumentNotFoundError` and
        nothing is deleted, unless ``missing="ignore"``. ``dry_run=True`` deletes nothing and
        lists the ids it would delete in ``result.matched``."""
        if self._root is None:
            raise ConfigError("the retriever has no index yet")
        if dry_run:  # reads only: no writer, no lock (the index may be read-only)
            from .index.snapshot import open_snapshot
            from .indexer import deletion, dry_run_result

            snap = open_snapshot(self._root, device=self.device, reuse=self._reuse())
            try:
                rows, result = deletion(snap, ids, filter=filter, missing=missing, root=self._root)
                return dry_run_result(snap, rows, result)
            finally:
                snap.close()
        with self._writer(self._root, expect=self._expect()) as w:
            result = w.delete(ids, filter=filter, missing=missing, dry_run=dry_run, reuse=self._reuse())
            if result.commit is not None:
                self._after_write(w)
        return result

    def purge(self) -> WriteResult:
        """Tombstone the documents expired by now (one commit; ``result.deleted`` counts them).
        Searches skip expired documents without it; :meth:`compact` also drops them."""
        if self._root is None:
            raise ConfigError("the retriever has no index yet")
        with self._writer(self._root, expect=self._expect()) as w:
            result = w.purge(reuse=self._reuse())
            if result.commit is not None:
                self._after_write(w)
        return result

    def compact(self, *, migrate: bool = False, show_progress: bool | None = None,
                faiss_factory: str | None = None) -> WriteResult:
        """Merge all segments into one and drop deleted documents (nothing is re-encoded).
        ``migrate=True`` also rewrites segments of an older sparse format (bit planes, BM25 in
        tantivy) in the current one (``sparse_scheme="impact"``), and moves an index on the former
        default dense part (``Flat``) to the size rule (``"auto"``); later writes use them too.
        ``faiss_factory``: the dense part the compacted segment and later writes get (``"auto"``,
        ``"Flat"``, any FAISS factory string); segments built otherwise are rewritten."""
        if self._root is None:
            raise ConfigError("the retriever has no index yet")
        settings = {"faiss_factory": faiss_factory} if faiss_factory is not None else None
        with self._writer(self._root, expect=self._expect(), settings=settings) as w:
            result = w.compact(reuse=self._reuse(), show_progress=show_progress, migrate=migrate)
            self._after_write(w)
        return result

    def refresh(self) -> bool:
        """Pick up commits made by other writers (processes) since this retriever's snapshot."""
        return self.searcher.refresh()

    def set_fusion(self, config: FusionConfig | None, tuned_on: Mapping[str, Any] | None = None) -> None:
        """Store (or with ``None`` clear) the fusion setting ``hybrid`` uses for this index."""
        if self._root is None:
            raise ConfigError("the retriever has no index yet")
        with self._writer(self._root, expect=self._expect()) as w:
            w.commit_fields({"fusion": config.to_dict() if config is not None else None,
                             "fusion_tuned_on": dict(tuned_on) if tuned_on else None})
            self._after_write(w)

    def set_relevance(self, calibration: Any) -> None:
        """Store (or with ``None`` clear) the relevance calibration (:func:`hybridret.search.calibrate.calibrate`)
        that ``search(..., relevance=True)`` uses for this index, before the shipped one."""
        from .search.relevance import Calibration

        if calibration is not None and not isinstance(calibration, Calibration):
            raise ConfigError(f"set_relevance takes a hybridret.search.relevance.Calibration or None, got "
                              f"{type(calibration).__name__}")
        if self._root is None:
            raise ConfigError("the retriever has no index yet")
        with self._writer(self._root, expect=self._expect()) as w:
            w.commit_fields({"relevance": calibration.to_dict() if calibration is not None else None})
            self._after_write(w)

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the index to ``path`` (hard links where the filesystem allows). The previous index
        there stays readable until the new one is complete (the manifest is replaced last,
        atomically). Returns ``path``."""
        if self._searcher is None or self._root is None:
            raise ConfigError("nothing to save: call index() first")
        root = Path(path)
        if root.resolve() == self._root.resolve():
            return root  # every write is already committed there
        if (root / MANIFEST).exists() and not overwrite:
            raise IndexExistsError(f"an index already exists at {root}; pass overwrite=True (CLI: --overwrite)")
        if root.exists() and not root.is_dir():
            raise IndexExistsError(f"cannot save to {root}: it is a file, not a directory")
        snap = self._searcher.snapshot
        with WriterLock(root):
            previous = read_manifest(root) if (root / MANIFEST).exists() else None
            for seg in snap.segments:
                if not seg.root.is_dir():
                    raise IndexFormatError(f"this retriever's files ({seg.root}) were removed; load the index "
                                           "again or re-index to save it")
                there = root / seg.name
                if there.exists() and not _complete_copy(seg, there, previous):
                    shutil.rmtree(there)  # left half-linked by an interrupted save: redo it
                if not there.exists():
                    try:
                        link_tree(seg.root, root / seg.name)
                    except BaseException:
                        shutil.rmtree(root / seg.name, ignore_errors=True)
                        raise
            for seg, entry in zip(snap.segments, snap.manifest["segments"]):  # tombstones newer than the copy
                name = entry.get("deleted")
                if name and not (root / seg.name / name).exists():
                    link_file(seg.root / name, root / seg.name / name)
            body = {k: v for k, v in snap.manifest.items() if k not in ("commit", "format_version", "saved_at",
                                                                         "libraries")}
            commit(root, body, previous=previous)
        return root

    @classmethod
    def load(cls, path: str | Path, *, encoder: Encoder | None = None, device: str | None = None,
             warm: bool = False, verify: bool = True, clock: Clock | None = None) -> HybridRetriever:
        """Open an index directory. The encoder is rebuilt from the manifest (its models load on
        first use; ``warm``: now, before the first query), and the weights found must have the
        fingerprints recorded at build time (``verify=False`` skips that check). An ``encoder``
        given must be the one that built the index (:class:`ConfigError` lists the differences).
        Search it while other processes write: :meth:`refresh` picks up their commits."""
        from .encoders import compare_configs, encoder_from_config

        prepare_native_libraries()
        manifest = read_manifest(path)
        settings = {k: v for k, v in manifest.get("settings", {}).items() if k in DEFAULT_SETTINGS}
        self = cls(encoder, device=device, clock=clock, **settings)
        stored = manifest.get("encoder")
        if encoder is not None and stored is not None:
            diffs = compare_configs(stored, encoder.config())
            if diffs:
                raise ConfigError(f"the encoder given is not the one that built {path}: " + "; ".join(diffs) +
                                  " (vectors from different models cannot be compared; load without encoder=)")
        if encoder is None:
            if stored is None:
                raise IndexFormatError(f"{path}: the manifest names no encoder")
            # built now, so a missing model or changed weights fail here, not at the first query
            self._slot = EncoderSlot(encoder_from_config(stored, device=device, verify=verify), None, device)
        self._root = Path(path)
        self._searcher = Searcher(self._root, encoder=self._slot, device=device, warm=warm, clock=self.clock)
        old = sum(s.layout != "parts" for s in self._searcher.snapshot.segments)
        if old:
            logger.info("%s: %d segment(s) in an older layout (index format 1 or 2): searches are exact; "
                        "`hybridret compact --migrate %s` rewrites them (nothing is re-encoded)", path, old, path)
        return self

    def info(self) -> dict[str, Any]:
        """The manifest plus counts per segment and the size on disk. ``num_docs`` counts rows (live
        chunks, in an index of chunks), ``num_documents`` documents and ``num_chunks`` chunk rows."""
        from .index.parents import document_counts

        snap = self.searcher.snapshot
        out = dict(snap.manifest)
        now = snap.at(self.clock())
        out["num_docs"] = now.num_docs  # expired documents are not live (rows: chunks in an index of chunks)
        out["num_documents"], out["num_chunks"] = document_counts(now)
        out["num_deleted"] = snap.num_deleted
        out["num_expired"] = now.num_expired  # expired, not yet purged or compacted away
        out["segments"] = [{**e, "live": e["num_docs"] - e.get("num_deleted", 0)} for e in snap.manifest["segments"]]
        out["components"] = parts_across_segments(snap)
        out["bytes_on_disk"] = sum(f.stat().st_size for s in snap.segments for f in s.root.rglob("*") if f.is_file())
        return out

    def check(self) -> list[str]:
        """Verify every file of the current snapshot against the checksums written with it, and the
        values inside (``hybridret info --check``). Returns the problems found (``[]``: all good)."""
        snap = self.searcher.snapshot
        problems = []
        for seg, entry, dead in zip(snap.segments, snap.manifest["segments"], snap.deleted):
            if seg.files is None:
                problems.append(f"{seg.root}: a format-1 segment has no checksums (compact to add them)")
            problems += seg.check()
            if len(dead) != entry.get("num_deleted", 0):
                problems.append(f"{seg.root}: the manifest counts {entry.get('num_deleted')} deleted documents, "
                                f"its tombstone file {len(dead)}")
        return problems

    # -- search ---------------------------------------------------------------------------------
    def fusion_config(self, method: str = "hybrid", fusion: FusionConfig | Mapping[str, Any] | None = None
                      ) -> FusionConfig | None:
        """See :meth:`Searcher.fusion_config`."""
        return self.searcher.fusion_config(method, fusion)

    def encode_queries(self, texts: list[str], needs: set[str]) -> QueryBatch:
        return self.searcher.encode_queries(texts, needs)

    def get(self, ids: str | Sequence[str], *, chunks: bool = False) -> list[dict[str, Any] | None]:
        """See :meth:`Searcher.get`: stored documents by id (``None`` where absent); in an index of
        chunks a document's id gives it re-assembled, with its chunks when ``chunks=True``."""
        return self.searcher.get(ids, chunks=chunks)

    def documents(self, filter: Filter | Mapping[str, Any] | str | None = None, *, offset: int = 0,
                  limit: int | None = None) -> list[dict[str, Any]]:
        """See :meth:`Searcher.documents`: every document matching ``filter``, in written order
        (``[]`` before the first write)."""
        if self._searcher is None:
            from .search.listing import check_page

            check_page(offset, limit)
            return []
        return self._searcher.documents(filter, offset=offset, limit=limit)

    def count(self, filter: Filter | Mapping[str, Any] | str | None = None) -> int:
        """See :meth:`Searcher.count`: how many documents match ``filter`` (0 before the first write)."""
        if self._searcher is None:
            from .filters import parse_filter

            parse_filter(filter)
            return 0
        return self._searcher.count(filter)

    def search(self, queries: str | Sequence[str] | SearchRequest, k: int | None = None, **options: Any) -> Hits:
        """See :meth:`Searcher.search`: ``search(queries, k=10, **options)`` with the options of a
        :class:`~hybridret.search.request.SearchRequest` (``threads``: this call's thread budget,
        ``None``: every core; ``offset``, ``group_by`` / ``group_size``, ``rerank`` / ``rerank_depth``:
        pages, groups, reranking; ``relevance=True``: each hit's calibrated relevance in [0, 1];
        ``diversify=λ``: MMR order, fewer near-duplicate hits)."""
        if self._searcher is None:
            raise ConfigError("the retriever has no index yet: call index() or load()")
        return self._searcher.search(queries, k, **options)


def _complete_copy(seg: Any, there: Path, target_manifest: dict[str, Any] | None) -> bool:
    """Whether ``there`` already holds all of segment ``seg``: named by the target's manifest (so it
    was committed there), or holding every file of the segment's file list at its size."""
    from .index.segment import check_files

    if target_manifest is not None and any(e.get("name") == seg.name for e in target_manifest["segments"]):
        return True
    return seg.files is not None and not check_files(there, seg.files, full=False)

