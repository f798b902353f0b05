"""What a reader holds: one committed state of an index directory, immutable once opened.

A :class:`Snapshot` is the manifest read at one moment plus every segment it names, opened, and
the tombstones as of that commit; what searches derive from that commit (BM25's live statistics
under its tombstones, ...) is computed once, on first use, into its :class:`SnapshotCache`. Rows
are numbered globally across segments in manifest order (segment offset + row in the segment);
deleted rows keep their numbers and are masked. A writer
committing meanwhile changes nothing a snapshot uses: new files only, and old ones are kept while
the snapshot's lease (``DIR/leases/``) names them. ``Searcher.refresh`` opens a newer snapshot,
reusing the segments it already has open.

Expiry (:mod:`hybridret.index.expiry`) is the one thing that changes with time rather than with
commits: :meth:`Snapshot.at` gives the snapshot as seen at a time, its expired rows masked as
tombstones are (every search and ``get`` goes through it), with its own cache.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import IndexFormatError, IndexNotFoundError
from .expiry import expired_rows, segment_expiry
from .manifest import LEASES, MANIFEST, PENDING, read_manifest, segment_files, tombstone_commit
from .segment import Segment

__all__ = ["Snapshot", "SnapshotCache", "open_snapshot"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _write_lease(root: Path, manifest: dict[str, Any]) -> Path | None:
    folder = root / LEASES
    path = folder / f"lease-{os.getpid()}-{uuid.uuid4().hex[:12]}.json"
    try:
        folder.mkdir(exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "commit": manifest.get("commit"),
                                   "files": sorted(segment_files(manifest))}))
        os.replace(tmp, path)
    except OSError as exc:  # read-only index: no writer can delete anything either
        logger.debug("no reader lease at %s: %s", folder, exc)
        return None
    return path


def _drop_lease(path: Path | None) -> None:
    if path is not None:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


class SnapshotCache:
    """Values derived from one snapshot's immutable state, computed on first use and never changed
    afterwards (e.g. BM25's live statistics of a segment under the snapshot's tombstones).

    :meth:`get` computes a key's value once, however many threads ask at the same time (the others
    wait for it; different keys are computed concurrently); a failed computation stores nothing.
    It lives and dies with its snapshot: a newer snapshot starts empty, so it never reads a value of
    an older commit, and two snapshots sharing a segment never share or evict each other's values.
    Keys name their owner first, e.g. ``("bm25.live", part, segment index)``."""

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}
        self._computing: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        """The value of ``key``: ``make()``, called once per snapshot."""
        try:
            return self._values[key]
        except KeyError:
            pass
        with self._lock:
            once = self._computing.setdefault(key, threading.Lock())
        with once:
            if key not in self._values:
                self._values[key] = make()
        with self._lock:
            self._computing.pop(key, None)  # later callers find the value without a lock
        return self._values[key]

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)


class Snapshot:
    """Segments, tombstones and the id map of one commit. Read-only after construction, except for
    :attr:`cache`, where searches keep what they derive from this commit (:class:`SnapshotCache`)."""

    def __init__(self, root: Path, manifest: dict[str, Any], segments: list[Segment], lease: Path | None) -> None:
        self.root = root
        self.manifest = manifest
        self.segments = segments
        self.commit = int(manifest.get("commit", 0))
        verify_segments(root, manifest, segments)
        sizes = [s.num_docs for s in segments]
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        self.num_rows = int(self.offsets[-1])
        self.deleted: list[np.ndarray] = []
        self.live: list[np.ndarray | None] = []
        for seg, entry in zip(segments, manifest["segments"]):
            dead = seg.tombstones(entry.get("deleted"))
            if len(dead) != int(entry.get("num_deleted", len(dead)) or 0):
                raise IndexFormatError(f"{seg.root / str(entry.get('deleted'))}: {len(dead)} tombstones, the manifest "
                                       f"counts {entry.get('num_deleted')}")
            self.deleted.append(dead)
            if len(dead):
                mask = np.ones(seg.num_docs, dtype=bool)
                mask[dead] = False
                self.live.append(mask)
            else:
                self.live.append(None)
        self.num_deleted = int(sum(len(d) for d in self.deleted))
        self.num_docs = self.num_rows - self.num_deleted
        self.ids = np.concatenate([s.docs.ids for s in segments]) if segments else np.zeros(0, dtype=object)
        self._row: dict[str, int] = {}
        for i, seg in enumerate(segments):
            base = int(self.offsets[i])
            live = self.live[i]
            for j, doc_id in enumerate(seg.docs.ids):
                if live is None or live[j]:
                    self._row[str(doc_id)] = base + j
        if len(self._row) != self.num_docs:
            raise IndexFormatError(f"{root}: {self.num_docs} live documents but {len(self._row)} distinct ids "
                                   "(an id is live twice)")
        self.cache = SnapshotCache()
        self.num_expired = 0  # rows masked because they expired (only in a view from at())
        self._base: Snapshot | None = None
        self._gone: np.ndarray | None = None  # global rows masked as expired (a view's)
        self._views: dict[tuple[int, ...], Snapshot] = {}
        self._views_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _drop_lease, lease)

    # -- expiry ---------------------------------------------------------------------------------
    def at(self, now: float) -> Snapshot:
        """This commit as seen at time ``now`` (seconds since the epoch): documents whose
        ``expires_at`` is at or before ``now`` count as deleted, in every search, in ``get``, and
        in BM25's statistics. The snapshot itself when nothing has expired (the common case costs
        one binary search per segment); views are cached per set of expired rows."""
        if self._base is not None:
            return self._base.at(now)
        expiring = [segment_expiry(seg) for seg in self.segments]
        if not any(len(t) for t, _ in expiring):
            return self
        counts = tuple(int(np.searchsorted(t, now, side="right")) for t, _ in expiring)
        if not any(counts):
            return self
        with self._views_lock:
            view = self._views.get(counts)
            if view is None:
                view = self._expired_view([expired_rows(seg, now) for seg in self.segments])
                if len(self._views) >= 4:  # a few recent states: expiry only moves forward
                    self._views.pop(next(iter(self._views)))
                self._views[counts] = view
        return view

    def _expired_view(self, expired: list[np.ndarray]) -> Snapshot:
        view = copy.copy(self)  # shares the segments, ids, id map, manifest and lease
        view._base = self
        view._views = {}
        view.cache = SnapshotCache()
        gone = np.zeros(self.num_rows, dtype=bool)
        view.deleted, view.live = [], []
        for i, (seg, dead, exp) in enumerate(zip(self.segments, self.deleted, expired)):
            if len(exp):
                dead = np.union1d(dead, exp).astype(np.int64)
                mask = np.ones(seg.num_docs, dtype=bool)
                mask[dead] = False
                gone[self.offsets[i] + exp] = True
                view.deleted.append(dead)
                view.live.append(mask)
            else:
                view.deleted.append(dead)
                view.live.append(self.live[i])
        view.num_deleted = int(sum(len(d) for d in view.deleted))
        view.num_docs = self.num_rows - view.num_deleted
        view.num_expired = view.num_deleted - self.num_deleted
        view._gone = gone
        return view

    def expired(self, now: float) -> list[np.ndarray]:
        """Per segment, the local rows that are live in this commit but expired at ``now``."""
        base = self._base or self
        view = base.at(now)
        return [np.setdiff1d(v, d).astype(np.int64) for v, d in zip(view.deleted, base.deleted)]

    # -- rows -----------------------------------------------------------------------------------
    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Segment index and row inside it of each global row (``-1`` rows give segment ``-1``)."""
        rows = np.asarray(rows, dtype=np.int64)
        seg = np.searchsorted(self.offsets, rows, side="right") - 1
        seg = np.where(rows >= 0, seg, -1)
        local = np.where(rows >= 0, rows - self.offsets[np.maximum(seg, 0)], -1)
        return seg, local

    def row_of(self, doc_id: str) -> int | None:
        """Global row of a live document id, or ``None``."""
        row = self._row.get(doc_id)
        if row is not None and self._gone is not None and self._gone[row]:
            return None
        return row

    def __contains__(self, doc_id: object) -> bool:
        return self.row_of(doc_id) is not None  # type: ignore[arg-type]

    def live_ids(self) -> list[str]:
        if self._gone is None:
            return list(self._row)
        return [i for i, r in self._row.items() if not self._gone[r]]

    def get(self, row: int) -> tuple[str, str, dict[str, Any]]:
        """``(title, text, metadata)`` of a global row."""
        s, local = self.locate(np.array([row]))
        seg = self.segments[int(s[0])]
        title, text = seg.docs.get(int(local[0]))
        return title, text, seg.metadata_of(int(local[0]))

    def close(self) -> None:
        """Release the lease now (otherwise when the snapshot is garbage-collected)."""
        self._finalizer()


def _width(part: Any, kind: str) -> int | None:
    """The representation width a part was built for (dense: its dimension; sparse: its vocabulary)."""
    value = getattr(part, "dim" if kind == "dense" else "vocab_size", None)
    return int(value) if isinstance(value, (int, np.integer)) else None


def verify_segments(root: Path, manifest: dict[str, Any], segments: list[Segment]) -> None:
    """What a load verifies beyond each segment's own files, cheaply (no file is read in full):
    every part the manifest lists is present in every segment, of the width the manifest's
    representations give, and no segment holds tombstones newer than the manifest's commit that no
    writer has pending (an older ``manifest.json`` put back would otherwise bring deleted
    documents back). Raises :class:`IndexFormatError` naming the folder or file."""
    where = root / MANIFEST
    parts = manifest.get("parts") or {}
    reps = manifest.get("representations") or {}
    commit = int(manifest.get("commit", 0) or 0)
    _check_components(where, manifest.get("components"), parts, reps)
    for seg, entry in zip(segments, manifest["segments"]):
        missing = sorted(set(parts) - set(seg.parts))
        if missing and seg.num_docs:
            why = "" if seg.files is not None else f" ({seg.root / 'segment.json'} is missing too)"
            raise IndexFormatError(f"{seg.root / missing[0]}: missing; {where} lists part(s) {', '.join(missing)} for "
                                   f"every segment{why}")
        for name, spec in parts.items():
            part = seg.parts.get(name)
            source = spec.get("source") if isinstance(spec, dict) else None
            rep = reps.get(source) if isinstance(source, str) else None
            if part is None or not isinstance(rep, dict) or not isinstance(rep.get("dim"), int):
                continue
            got = _width(part, str(rep.get("kind", source)))
            if got is not None and got != rep["dim"] and not (rep.get("kind") == "sparse" and got <= 1):
                raise IndexFormatError(f"{seg.root / name}: built for {rep.get('kind', source)} width {got}, but {where} "
                                       f"gives representation {source!r} width {rep['dim']}")
        named = entry.get("deleted")
        try:
            listing = os.listdir(seg.root)
        except OSError as exc:
            raise IndexFormatError(f"{seg.root}: cannot list the segment folder ({exc.strerror})") from None
        names = set(listing)
        named_at = (tombstone_commit(named) or 0) if isinstance(named, str) else 0
        for f in listing:
            number = tombstone_commit(f)
            if number is None or f == named or f + PENDING in names:
                continue
            if named_at < number <= commit:
                # every commit's tombstone file holds all the segment's earlier ones, so a file
                # a reader still leases is always older than the one named: this one, newer and
                # committed, was dropped from the manifest by hand
                raise IndexFormatError(f"{seg.root / f}: tombstones of commit {number}, which {where} (commit {commit}) "
                                       f"does not name ({'it names none' if named is None else f'it names {named}'}); "
                                       "the manifest was edited or put back (documents deleted since would come "
                                       "back): restore the manifest that names the file")
            if number <= commit:
                continue
            raise IndexFormatError(f"{seg.root / f}: tombstones of commit {number}, newer than the commit {commit} of "
                                   f"{where}, which does not name them: the manifest was put back from an older copy? "
                                   "(documents deleted since would come back); restore the newer manifest.json, or "
                                   "remove the file if you know no commit wrote it")


def _check_components(where: Path, components: Any, parts: dict[str, Any], reps: dict[str, Any]) -> None:
    """The ``components`` the manifest describes (``info`` shows them: each part's ``meta.json``)
    must give the widths of its representations: ``dim`` of a dense part, ``vocab_size`` of a
    sparse one. A hand-edited width is refused, not shown."""
    if components is None:
        return
    if not isinstance(components, dict):
        raise IndexFormatError(f"{where}: 'components' must be an object, got {type(components).__name__}")
    for name, comp in components.items():
        spec = parts.get(name)
        source = spec.get("source") if isinstance(spec, dict) else None
        rep = reps.get(source) if isinstance(source, str) else None
        if not isinstance(comp, dict) or not isinstance(rep, dict) or not isinstance(rep.get("dim"), int):
            continue
        key = "dim" if rep.get("kind") == "dense" else "vocab_size" if rep.get("kind") == "sparse" else None
        got = comp.get(key) if key else None
        if key and got is not None and got != rep["dim"] and not (key == "vocab_size" and got in (0, 1)):
            raise IndexFormatError(f"{where}: components.{name}.{key} is {got!r}, but the manifest gives the {source!r} "
                                   f"representation width {rep['dim']} (one of them was edited?)")


def open_snapshot(root: str | Path, *, device: str | None = None, reuse: dict[str, Segment] | None = None,
                  retries: int = 8) -> Snapshot:
    """Open the current commit of ``root``. Segments in ``reuse`` (by name) are not reopened. If a
    file vanishes because a writer committed meanwhile, the newer commit is opened instead."""
    root = Path(root)
    last: Exception | None = None
    for _ in range(retries):
        manifest = read_manifest(root)
        lease = _write_lease(root, manifest)
        try:
            again = read_manifest(root)
            if again.get("commit") != manifest.get("commit") or again.get("saved_at") != manifest.get("saved_at"):
                _drop_lease(lease)
                continue  # a commit landed between the two reads: take the newer one
            segments = [(reuse or {}).get(e["name"]) or Segment(root / e["name"], e["num_docs"], device=device)
                        for e in manifest["segments"]]
            return Snapshot(root, manifest, segments, lease)
        except (IndexFormatError, IndexNotFoundError) as exc:
            _drop_lease(lease)
            last = exc
            try:
                now = read_manifest(root)
            except (IndexFormatError, IndexNotFoundError):
                raise exc from None
            if now.get("commit") == manifest.get("commit") and now.get("saved_at") == manifest.get("saved_at"):
                raise  # the index itself is damaged, not replaced under us
            logger.info("index at %s changed while opening; opening the newer commit", root)
        except BaseException:
            _drop_lease(lease)
            raise
    raise IndexFormatError(f"{root}: the index kept changing while it was opened ({last})")
