"""Group commit: several writes (add, upsert, delete by id) applied in one commit.

A server answering many clients receives writes faster than it can commit them one at a time: every
commit pays a fixed price (an encoder call, a new segment, fsyncs, a new manifest, the searcher
reopening its snapshot), and a write that waits behind 30 others waits for 30 of them.
:func:`write_group` applies a list of :class:`WriteRequest` s with one encoder pass over all their new
texts, one new segment, one tombstone file per touched segment and one manifest commit, and gives
each request the outcome it would have had alone on the last commit:

* each request is planned on its own (its documents read, ``add`` of an id that exists refused,
  unknown ids of a delete refused, chunking done) before anything is encoded; a request refused
  there gets its own error and is left out of the commit, the others go on;
* the requests of one group must touch different documents (:func:`conflict_keys` is the test a
  caller groups by); a request that touches a document an earlier request of the group writes is
  refused with a :class:`~hybridret.errors.ConfigError` (it would see the state before that write);
* when encoding or the commit fails, every request of the group gets that error and nothing of the
  group is committed (the manifest is replaced atomically, last: there is no partial commit);
* ``cancel`` (a :class:`threading.Event`) stops the group before its commit, between encoder
  slices: every request then gets :class:`~hybridret.errors.WriteCancelledError`;
* the results are returned once the commit is durable (the manifest is fsynced).
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .data import Document
from .errors import ConfigError, CorpusFormatError, WriteCancelledError
from .index.expiry import check_ttl
from .index.manifest import names, new_segment
from .index.parents import document_counts
from .index.segment import SegmentWriter
from .indexer import IndexWriter, PlanState, WriteResult, add_rows, as_document, deletion, summary_logger

__all__ = ["GROUPED_OPS", "WriteRequest", "conflict_keys", "write_group"]

logger = logging.getLogger(__name__)

GROUPED_OPS = ("add", "upsert", "delete")
#: texts encoded between two looks at ``cancel``
ENCODE_SLICE = 16


@dataclass
class WriteRequest:
    """One write of a group: ``add`` / ``upsert`` of ``documents`` (each as :meth:`IndexWriter.write`
    takes them, with ``ttl`` seconds for those without an ``expires_at``) or ``delete`` of ``ids``
    (``missing``: ``"error"`` refuses the request when an id is unknown, ``"ignore"`` lists it)."""

    op: str
    documents: Sequence[Any] = ()
    ids: Sequence[str] = ()
    ttl: float | None = None
    missing: str = "error"

    def __post_init__(self) -> None:
        if self.op not in GROUPED_OPS:
            raise ConfigError(f"a grouped write is one of {', '.join(GROUPED_OPS)}, got {self.op!r}")


def conflict_keys(ids: Sequence[Any]) -> frozenset[str]:
    """The keys two requests of a group must not share: each id up to its first ``#`` (a chunk
    ``doc#3`` and its document ``doc`` have the same key). Conservative: disjoint keys mean disjoint
    documents, chunks included."""
    return frozenset(str(i).split("#", 1)[0] for i in ids)


@dataclass
class _Plan:
    index: int
    result: WriteResult
    batch: list[Document] = field(default_factory=list)
    old_rows: list[int | None] = field(default_factory=list)
    sources: list[int | None] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)  # global rows tombstoned
    ids: set[str] = field(default_factory=set)  # ids written


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise WriteCancelledError("the write was stopped before its commit (the server is shutting down); nothing "
                                  "of it was committed: send it again")


def _plan(writer: IndexWriter, req: WriteRequest, index: int, snap: Any, live_now: Any, chunker: Any,
          chunked: bool, now: float) -> _Plan:
    if req.op == "delete":
        rows, result = deletion(snap, req.ids, missing=req.missing, root=writer.root)
        return _Plan(index, result, dead=rows)
    docs = req.documents
    if docs is None or isinstance(docs, (str, bytes, Mapping, Document)) or not hasattr(docs, "__iter__"):
        raise CorpusFormatError(f"documents must be a list of documents, got {type(docs).__name__}")
    plan = _Plan(index, WriteResult(documents={"added": 0, "updated": 0, "unchanged": 0} if chunked else {}))
    state = PlanState(req.op, snap, live_now, chunker, chunked, check_ttl(req.ttl), now, plan.result, plan.dead.append)
    for position, item in enumerate(docs):
        writer._plan_document(as_document(item, position), state, plan.batch, plan.old_rows, plan.sources)
    plan.ids = state.seen
    return plan


def write_group(writer: IndexWriter, requests: Sequence[WriteRequest], *, reuse: Mapping[str, Any] | None = None,
                batch_size: int = 32, cancel: threading.Event | None = None) -> list[WriteResult | Exception]:
    """Apply ``requests`` to the index of ``writer`` in one commit (see the module's docstring);
    one outcome per request, in order: its :class:`~hybridret.indexer.WriteResult` (``commit``: the
    commit written, ``None`` when the request changed nothing) or the exception that refused it."""
    from .chunking import Chunker

    if writer.manifest is None:
        raise ConfigError(f"no index at {writer.root} yet: build one before adding to it")
    outcomes: list[WriteResult | Exception | None] = [None] * len(requests)
    snap = writer.snapshot(reuse)
    assert snap is not None
    now = writer.clock()
    live_now = snap.at(now)
    layout = writer._layout()
    writer._check_encoder(writer._encoder.config() if writer._encoder is not None else writer.given_config)
    spec = writer._chunk_spec("add", None, None)
    chunker = Chunker(spec.tokens, spec.overlap, encoder=writer._get_encoder()) if spec is not None else None
    chunked = spec is not None or document_counts(snap)[1] > 0
    plans: list[_Plan] = []
    taken_ids: dict[str, int] = {}
    taken_rows: dict[int, int] = {}
    for i, req in enumerate(requests):
        try:
            plan = _plan(writer, req, i, snap, live_now, chunker, chunked, now)
            rows = set(plan.dead) | {r for r in plan.old_rows if r is not None}
            ids = plan.ids | {str(snap.ids[r]) for r in rows}
            other = next((taken_ids[x] for x in ids if x in taken_ids), None)
            if other is None:
                other = next((taken_rows[r] for r in rows if r in taken_rows), None)
            if other is not None:
                raise ConfigError(f"write #{i} of the group touches a document that write #{other} of the same group "
                                  "writes; send it again (grouped writes must touch different documents)")
        except Exception as exc:  # this request's own error: the others go on
            outcomes[i] = exc
            continue
        taken_ids.update(dict.fromkeys(ids, i))
        taken_rows.update(dict.fromkeys(rows, i))
        plans.append(plan)
    try:
        commit = _commit_plans(writer, plans, snap, layout, batch_size, cancel)
    except Exception as exc:  # nothing of the group was committed: each of its requests is told
        for plan in plans:
            outcomes[plan.index] = exc
        return outcomes  # type: ignore[return-value]
    for plan in plans:
        plan.result.commit = commit if (plan.batch or plan.dead) else None
        outcomes[plan.index] = plan.result
    return outcomes  # type: ignore[return-value]


def _commit_plans(writer: IndexWriter, plans: list[_Plan], snap: Any, layout: Any, batch_size: int,
                  cancel: threading.Event | None) -> int | None:
    """Encode the units of every plan (one pass, in slices), write one segment and commit once."""
    units = [u for p in plans for u in p.batch]
    sources = [s for p in plans for s in p.sources]
    owner = [k for k, p in enumerate(plans) for _ in p.batch]
    dead = sorted({r for p in plans for r in p.dead})
    if not units and not dead:
        return None
    _check_cancel(cancel)
    seg_dir = new_segment(writer.root)
    seg = SegmentWriter(seg_dir, parts=layout.parts, reps=layout.reps, store_text=writer.settings["store_text"])
    writer._encoder_progress = False
    writer._truncated_before = None
    try:
        for start in range(0, len(units), ENCODE_SLICE):
            _check_cancel(cancel)
            part = units[start:start + ENCODE_SLICE]
            enc, encoded = writer._encode(part, sources[start:start + ENCODE_SLICE], snap, None, batch_size, layout)
            for j in encoded:
                plans[owner[start + j]].result.encoded += 1
            add_rows(seg, part, enc)
        writer._warn_truncated(seg.count)
        if seg.count:
            seg.close()
        else:
            seg.abort()
        _check_cancel(cancel)
    except BaseException:
        seg.abort()
        raise
    replaced: dict[int, list[int]] = {}
    if dead:
        where, local = snap.locate(np.asarray(dead, dtype=np.int64))
        for s, r in zip(where.tolist(), local.tolist()):
            replaced.setdefault(int(s), []).append(int(r))
    segments = writer._with_tombstones(snap, replaced)
    if seg.count:
        segments.append({"name": seg_dir.name, "num_docs": seg.count, "deleted": None, "num_deleted": 0})
    skipped = sum(p.result.skipped_empty for p in plans)
    try:
        commit = writer._commit(segments, {"skipped_empty": int(writer.manifest.get("skipped_empty", 0)) + skipped},
                                layout)
    except BaseException:
        if seg.count and not names(writer.root, seg_dir.name):  # never remove what a commit already names
            shutil.rmtree(seg_dir, ignore_errors=True)
        raise
    summary_logger.info("group of %d writes to %s: %d rows added, %d updated, %d deleted (commit %d)", len(plans),
                        writer.root, sum(p.result.added for p in plans), sum(p.result.updated for p in plans),
                        sum(p.result.deleted for p in plans), commit)
    return commit
