"""The read side: a read-only, thread-safe, picklable searcher over one snapshot of an index.

A :class:`Searcher` holds a :class:`~hybridret.index.snapshot.Snapshot` and an encoder. Searching
writes no shared state: the parts of a segment are read-only once opened, and what a search derives
from a commit (BM25's live statistics, tf factors) is computed once into that snapshot's
``cache``, so any number of threads may call :meth:`Searcher.search` at once (tantivy and FAISS
release the GIL). :meth:`Searcher.refresh` opens the newest commit and swaps it in with one
assignment; searches already running finish on the snapshot they started with.

``threads`` (on the searcher, or per call) is the search's thread budget, passed down to every
part: ``None`` uses every core, ``1`` starts no worker thread (tantivy, the BM25 store and FAISS
all run on the calling thread; see :mod:`hybridret.index.dense` for FAISS and torch). Encoding the
queries runs the encoder's models with their own (process-wide) torch settings.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .._runtime import prepare_native_libraries
from ..encoders import Encoder, encoder_from_config
from ..encoders.reps import REPRESENTATIONS, encode
from ..errors import ConfigError, StaleSnapshotWarning
from ..filters import Filter
from ..fusion.config import FusionConfig
from ..index.expiry import Clock, check_clock
from ..index.snapshot import Snapshot, open_snapshot
from ..methods import method_names
from ..retrievers import BUILTIN, REGISTRY, QueryBatch
from ..retrievers.base import check_threads
from ..types import Hit, Hits, MatchedTerm
from .plan import PlanResult, SearchPlan, default_fusion, plan_search, runnable
from .relevance import search_relevance
from .request import SearchRequest
from .rerank import Reranker, load_reranker
from .run import hits_of, run_plan
from .snippets import WordMatcher, hit_snippets, matched_view
from .source import SnapshotSource

__all__ = ["METHODS", "HitSource", "Searcher"]

logger = logging.getLogger(__name__)

METHODS: tuple[str, ...] = method_names(BUILTIN)  # the built-in methods; all now: method_names(REGISTRY)
_ENCODER_LOCK = threading.Lock()  # one encoder build at a time per process (see EncoderSlot)


class EncoderSlot:
    """An encoder built on first use from a config, once, even when many threads ask at once."""

    def __init__(self, encoder: Encoder | None, config: dict[str, Any] | None, device: str | None, *,
                 verify: bool = True) -> None:
        self._encoder = encoder
        self.config = encoder.config() if encoder is not None else config
        self.device = device
        self.verify = verify

    @property
    def loaded(self) -> bool:
        return self._encoder is not None

    def get(self) -> Encoder:
        enc = self._encoder
        if enc is not None:
            return enc
        with _ENCODER_LOCK:
            if self._encoder is None:
                if self.config is None:
                    raise ConfigError("this index has no encoder")
                prepare_native_libraries()
                self._encoder = encoder_from_config(self.config, device=self.device, verify=self.verify)
            return self._encoder

    def has(self, name: str) -> bool:
        """Whether queries can be encoded into representation ``name`` (an encoder head, known
        from the config without loading a model, or a registered representation)."""
        if name in REPRESENTATIONS:
            return True
        if self._encoder is not None:
            return name in self._encoder.heads()
        kind = (self.config or {}).get("type")
        if name == "sparse":
            return kind in ("paired", "splade", "joint")
        if name == "dense":
            return kind in ("paired", "dense", "joint")
        return False


def _stored(snap: Snapshot, row: int) -> dict[str, Any]:
    """``{"id", "title", "text", "metadata"}`` of a global row."""
    title, text, meta = snap.get(row)
    return {"id": str(snap.ids[row]), "title": title, "text": text, "metadata": meta}


def encode_query_batch(slot: EncoderSlot, texts: list[str], needs: set[str]) -> QueryBatch:
    """``texts`` encoded into the representations in ``needs`` (``"text"`` needs none); the
    encoder is built on first use, and runs only the models asked for."""
    names = sorted(n for n in needs if n != "text")
    if not names or not texts:
        return QueryBatch(texts)
    enc = slot.get() if any(n not in REPRESENTATIONS for n in names) else None
    return QueryBatch(texts, encode(enc, names, texts, queries=True).reps)


class HitSource:
    """What per-hit views read: the snapshot the search ran on and the encoder's vocabulary."""

    def __init__(self, snap: Snapshot, encoder: EncoderSlot, matcher: WordMatcher | None = None) -> None:
        self.snap = snap
        self.encoder = encoder
        self.matcher = matcher or WordMatcher()

    def view(self, hits: Hits, i: int, *, details: bool = True) -> list[Hit]:
        """Query ``i``'s hits; ``details=False`` leaves out matched terms and snippets."""
        out: list[Hit] = []
        snap = self.snap
        for j, row in enumerate(hits.rows[i]):
            if row < 0:
                continue
            title, text, meta = snap.get(int(row))
            matched: list[MatchedTerm] = []
            if details and hits.query_sparse is not None:
                matched = self._matched_terms(hits.query_sparse[i], int(row), (title + " " + text).strip())
            out.append(Hit(id=str(hits.ids[i, j]), rank=j + 1, score=float(hits.scores[i, j]),
                           scores={name: float(v[i, j]) for name, v in hits.components.items()},
                           title=title, text=text, matched_terms=matched, metadata=meta,
                           snippets=hit_snippets(hits.queries[i], text, matched, self.matcher) if details else [],
                           relevance=float(hits.relevance[i, j]) if hits.relevance is not None else None))
        return out

    def _matched_terms(self, q: sp.csr_matrix, row: int, text: str) -> list[MatchedTerm]:
        """The learned-sparse terms query ``q`` shares with ``row``, literal or expansion decided
        at word level (:func:`hybridret.search.snippets.literal_terms`: "star" is literal in "Stars")."""
        s, local = self.snap.locate(np.array([row]))
        part = self.snap.segments[int(s[0])].part("sparse")
        if part is None:
            return []
        d = part.forward[int(local[0])]
        return matched_view(self.encoder.get(), q, d.indices, d.data, text, self.matcher)


class Searcher:
    """Search one index directory. Thread-safe; :meth:`refresh` picks up new commits.

    >>> searcher = Searcher("indexes/mine")
    >>> hits = searcher.search("a question", k=10, filter={"source": "wiki"})
    """

    def __init__(self, root: str | Path | None = None, *, encoder: Encoder | EncoderSlot | None = None,
                 device: str | None = None, snapshot: Snapshot | None = None, refresh_every: float | None = None,
                 warm: bool = False, threads: int | None = None, clock: Clock | None = None) -> None:
        prepare_native_libraries()
        self.clock = check_clock(clock)  # what "now" is for expiry (seconds since the epoch)
        self.threads = check_threads(threads)  # each search's thread budget unless the call gives one
        if snapshot is None:
            if root is None:
                raise ConfigError("Searcher needs an index directory")
            snapshot = open_snapshot(root, device=device)
        self.root = Path(snapshot.root)
        self.device = device
        self._snap = snapshot
        stored = snapshot.manifest.get("encoder")
        self._encoder = encoder if isinstance(encoder, EncoderSlot) else EncoderSlot(encoder, stored, device)
        self._refresh_lock = threading.Lock()
        self._manifest_stat: tuple[int, int, int] | None = None  # the manifest file as last read (see refresh_if_changed)
        self._rerankers: dict[str, Reranker] = {}  # cross-encoder folder -> its loaded model
        self._rerank_lock = threading.Lock()
        self._matcher = WordMatcher()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        if refresh_every is not None:
            self.refresh_every(refresh_every)
        if warm:
            self.warm()

    # -- state ----------------------------------------------------------------------------------
    @property
    def snapshot(self) -> Snapshot:
        return self._snap

    @property
    def encoder(self) -> Encoder:
        return self._encoder.get()

    @property
    def num_docs(self) -> int:
        """Live documents now (expired ones not counted)."""
        return self.current().num_docs

    def document_counts(self) -> tuple[int, int]:
        """``(documents, chunks)`` live now: in an index of chunks (:mod:`hybridret.chunking`) the
        chunks of one document count as one document; ``chunks`` is 0 in an index without chunks,
        where :attr:`num_docs` counts the documents."""
        from ..index.parents import document_counts

        return document_counts(self.current())

    def current(self) -> Snapshot:
        """The snapshot as seen now: expired documents masked (see :meth:`Snapshot.at`)."""
        return self._snap.at(self.clock())

    def warm(self) -> Searcher:
        """Load the encoder's models now (a server does this before taking requests)."""
        self._encoder.get().warm()
        return self

    def refresh(self) -> bool:
        """Open the index's newest commit if there is one (segments already open are reused).
        Returns whether the snapshot changed."""
        with self._refresh_lock:
            return self._refresh_locked()

    def _refresh_locked(self) -> bool:
        from ..index.manifest import read_manifest

        current = self._snap
        seen = self._stat_manifest()  # before the read: a commit between the two is seen next time
        latest = read_manifest(self.root)
        self._manifest_stat = seen
        if latest.get("commit") == current.commit and latest.get("saved_at") == current.manifest.get("saved_at"):
            return False
        reuse = {s.name: s for s in current.segments}
        self._snap = open_snapshot(self.root, device=self.device, reuse=reuse)
        logger.debug("refreshed %s: commit %s -> %s", self.root, current.commit, self._snap.commit)
        return True

    def _stat_manifest(self) -> tuple[int, int, int] | None:
        from ..index.manifest import MANIFEST

        try:
            st = os.stat(self.root / MANIFEST)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def refresh_if_changed(self) -> bool:
        """:meth:`refresh` when the manifest file changed since it was last read (one ``stat``, a
        few microseconds: cheap enough before every request; every commit replaces the manifest file).
        Never waits: while another thread refreshes, this returns ``False`` and the current snapshot
        stays (the refreshing thread installs the new one). Returns whether the snapshot changed."""
        seen = self._manifest_stat
        if seen is not None and self._stat_manifest() == seen:
            return False
        if not self._refresh_lock.acquire(blocking=False):
            return False  # another thread (e.g. the writer after its commit) is opening the new commit: a read
            # goes on with the snapshot it has instead of waiting for it
        try:
            return self._refresh_locked()
        finally:
            self._refresh_lock.release()

    def refresh_every(self, seconds: float) -> None:
        """Refresh in a background thread every ``seconds`` until :meth:`close`."""
        if seconds <= 0:
            raise ConfigError(f"refresh interval must be positive, got {seconds}")
        if self._timer is not None:
            raise ConfigError("this searcher already refreshes on a timer")

        def loop() -> None:
            while not self._stop.wait(seconds):
                try:
                    self.refresh()
                except Exception as exc:  # keep serving the old snapshot; say why once per failure
                    logger.debug("refreshing %s failed", self.root, exc_info=True)
                    warnings.warn(f"refreshing {self.root} failed ({type(exc).__name__}: {exc}); still serving "
                                  f"commit {self._snap.commit}", StaleSnapshotWarning, stacklevel=1)

        self._timer = threading.Thread(target=loop, name="hybridret-refresh", daemon=True)
        self._timer.start()

    def close(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=5)
            self._timer = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as a reference: the directory, the device and the encoder's description. The
        unpickled searcher opens the index's current commit (a timer, if any, is not carried)."""
        return {"root": str(self.root), "device": self.device, "encoder_config": self._encoder.config,
                "verify": self._encoder.verify, "threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        slot = EncoderSlot(None, state["encoder_config"], state["device"], verify=state.get("verify", True))
        self.__init__(state["root"], device=state["device"], encoder=slot,  # type: ignore[misc]
                      threads=state.get("threads"))

    # -- availability and fusion defaults --------------------------------------------------------
    def available(self, snap: Snapshot | None = None) -> dict[str, bool]:
        """Which retrievers this index (and its encoder) can run."""
        snap = snap or self._snap
        return runnable({name: r.available(snap) for name, r in REGISTRY.items()}, self._encoder.has)

    def fusion_config(self, method: str = "hybrid", fusion: FusionConfig | Mapping[str, Any] | None = None,
                      snap: Snapshot | None = None) -> FusionConfig | None:
        """The fusion settings for a method (:func:`hybridret.search.plan.default_fusion`): explicit
        ``fusion`` first, then what ``hybridret tune`` stored in the index, then defaults
        (``hybrid`` = GQR guided by learned sparse + BM25, the best fixed setting measured in
        docs/fusion.md, its guide weights set per query by the retrievers' top-10 agreement),
        dropping whatever this index lacks. ``None`` when ``hybrid`` has a single retriever to run
        (e.g. a sparse-only index without BM25)."""
        snap = snap or self._snap
        return default_fusion(method, fusion, available=self.available(snap), stored=snap.manifest.get("fusion"))

    # -- search ---------------------------------------------------------------------------------
    def encode_queries(self, texts: list[str], needs: set[str]) -> QueryBatch:
        return encode_query_batch(self._encoder, texts, needs)

    def get(self, ids: str | Sequence[str], *, chunks: bool = False) -> list[dict[str, Any] | None]:
        """The stored documents of ``ids`` (``{"id", "title", "text", "metadata"}``), ``None`` for
        ids that are not in the index (or were deleted, or expired), in the order given.

        In an index of chunks (:mod:`hybridret.chunking`) a document's id gives the document
        re-assembled from its chunks (:func:`hybridret.index.parents.assemble`: the text joined in
        chunk order, overlaps counted once, ``num_chunks`` added); ``chunks=True`` adds its chunks
        as stored (``"chunks": [{"id", "title", "text", "metadata"}, ...]``). A chunk's own id
        (``DOC#3``) gives that chunk."""
        from ..index.parents import assemble, chunk_rows

        if isinstance(ids, str):
            ids = [ids]
        if isinstance(ids, (bytes, Mapping)) or not isinstance(ids, Sequence):
            raise ConfigError(f"ids must be a string or a list of strings, got {type(ids).__name__}")
        snap = self.current()
        out: list[dict[str, Any] | None] = []
        for doc_id in ids:
            if not isinstance(doc_id, str):
                raise ConfigError(f"document ids are strings, got {doc_id!r}")
            row = snap.row_of(doc_id)
            if row is None:
                parts = [_stored(snap, r) for r in chunk_rows(snap, doc_id)]
                out.append(assemble(doc_id, parts, chunks=chunks) if parts else None)
                continue
            out.append(_stored(snap, row))
        return out

    def documents(self, filter: Filter | Mapping[str, Any] | str | None = None, *, offset: int = 0,
                  limit: int | None = None) -> list[dict[str, Any]]:
        """Every live document matching ``filter`` (all of them for ``None``), not the top-k of a
        query: ``{"id", "title", "text", "metadata"}`` as :meth:`get` returns them, in the order they
        were written (an upserted document moves to the end), from ``offset`` on, at most ``limit``
        (see :mod:`hybridret.index.listing`). Deleted and expired documents are never listed."""
        from .listing import list_documents

        return list_documents(self.current(), filter, offset=offset, limit=limit).documents

    def count(self, filter: Filter | Mapping[str, Any] | str | None = None) -> int:
        """How many live documents match ``filter`` (``None``: :attr:`num_docs`); reads no text."""
        from .listing import list_documents

        return list_documents(self.current(), filter, limit=0).total

    def search(self, queries: str | Sequence[str] | SearchRequest, k: int | None = None, **options: Any) -> Hits:
        """Search: ``search(queries, k=10, **options)`` with the options of a
        :class:`~hybridret.search.request.SearchRequest` (or a request itself), each checked there.

        ``method``: ``"hybrid"`` (default: the index's tuned fusion, else GQR: the dense
        query refined towards the learned-sparse + BM25 scores of the candidates, each guide weighted
        per query by its top-10 agreement with the other retrievers), one retriever
        (``"dense"``, ``"sparse"``, ``"bm25"``) or a fusion method (``"linear"``, ``"rrf"``,
        ``"gqr"``, a registered one; see :class:`FusionConfig`). ``filter`` (see :mod:`hybridret.filters`) is applied
        before top-k: exact methods return the exact top-k of the matching documents (learned sparse
        and BM25 never return a document that scores 0; HNSW/IVF segments return the matching
        documents their graph or lists reach, see docs/filters.md). ``candidates``
        overrides the per-retriever depth of fused methods. ``threads``: this call's thread budget
        (default: the searcher's; ``None`` there: every core; ``1``: no worker thread). Blank
        queries get no hits. Returns :class:`Hits` of shape ``(len(queries), min(k, live documents))``:
        a ``k`` beyond the index's size costs nothing extra; fused methods rank at most
        :data:`~hybridret.fusion.config.MAX_CANDIDATES` (10 000) per retriever.

        ``offset``: skip that many hits (grouped: groups); a page is a slice of the unpaginated list
        of the same snapshot. ``group_by`` / ``group_size``: the top ``k`` groups of chunks sharing
        that metadata field's value, with their best ``group_size`` chunks (default 3; see
        :mod:`hybridret.search.grouping`: exact for single retrievers). ``rerank``: a
        :class:`~hybridret.search.rerank.Reranker` or a local cross-encoder folder scoring the first
        stage's top ``rerank_depth`` (default 50); the hits follow its score (see
        :mod:`hybridret.search.run`). ``relevance=True``: also each hit's calibrated relevance in
        [0, 1] (``Hits.relevance``, ``Hit.relevance``; :mod:`hybridret.search.relevance`, docs/relevance.md),
        from the calibration stored in the index or the shipped one of the packaged models; a
        :class:`~hybridret.search.relevance.Calibration` uses that one. ``diversify=λ`` (in [0, 1]):
        the hits (grouped: the groups) in maximal-marginal-relevance order over the first stage's pool,
        fewer near-duplicates (:mod:`hybridret.search.diversify`; 1 = the plain order)."""
        req = SearchRequest.of(queries, k, **options)
        snap, plan, res = self._run(req)
        rel, ans = search_relevance(req.relevance, snap, plan, res) if req.relevance is not False else (None, None)
        return hits_of(plan, res, HitSource(snap, self._encoder, self._matcher), relevance=rel, answerability=ans)

    def _run(self, req: SearchRequest) -> tuple[Snapshot, SearchPlan, PlanResult]:
        """Plan and run a checked search on one snapshot (expired documents masked): what
        :meth:`search` returns the hits of, and :mod:`hybridret.search.calibrate` fits on."""
        snap = self.current()
        threads = req.threads if req.threads is not None else self.threads
        reranker = self.reranker(req.rerank) if req.rerank is not None else None
        plan = plan_search(req, available=self.available(snap), stored_fusion=snap.manifest.get("fusion"),
                           require=snap.num_rows > 0, num_docs=snap.num_docs, rerank=reranker)
        return snap, plan, run_plan(plan, SnapshotSource(snap, threads=threads), self.encode_queries,
                                    tops=req.relevance is not False)

    def reranker(self, rerank: Reranker | str | Path) -> Reranker:
        """``rerank`` as a :class:`~hybridret.search.rerank.Reranker`: a cross-encoder folder is loaded
        once per searcher, on the encoders' device."""
        if isinstance(rerank, Reranker):
            return rerank
        device = self.device
        if self._encoder.loaded:
            device = getattr(self._encoder.get(), "device", device)
        return load_reranker(rerank, device=device, cache=self._rerankers, lock=self._rerank_lock)
