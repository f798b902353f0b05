"""The index directory: a manifest, written last and atomically, listing immutable segments.

Layout (format 3)::

    DIR/manifest.json        format version, commit number, library versions, settings, the parts
                             every segment has and the representations they are built from, segments
    DIR/seg-<id>/            one immutable segment: docids.txt, texts.*, metadata.jsonl, keys.npy,
                             segment.json and one folder per part (dense/, sparse/, bm25/, ...)
    DIR/seg-<id>/deleted-<commit>.npy   the segment's tombstones as of that commit (sorted rows)
    DIR/write.lock           held (flock) by the one writer; see :mod:`hybridret.index.lock`
    DIR/leases/              readers' leases: files a live reader uses are never deleted under it

Every write (build, add, upsert, delete, compact) creates new files only, then replaces
``manifest.json`` (one atomic rename). Until that rename the old manifest names old, untouched
files, so a crash at any point leaves the previous state readable; afterwards the new state is
complete. Files no manifest or live lease names are removed after a commit.

Format 1 (one ``gen-<id>/`` folder named by ``"generation"``) reads as one segment without
tombstones; format 2 segments keep learned terms and BM25 in one ``sparse/`` folder. Both open as
named parts without rewriting (:mod:`.legacy`); the first write commits a format-3 manifest over
the same folders, and ``compact(migrate=True)`` rewrites the segments.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import IndexFormatError, IndexNotFoundError
from .storage import atomic_write_json, fsync_dir, fsync_file, read_json

__all__ = ["FORMAT_VERSION", "HISTORY", "MANIFEST", "PENDING", "check_expected", "check_lineage", "collect_garbage",
           "commit", "library_versions", "link_file", "link_tree", "names", "new_segment", "read_manifest", "segment_files",
           "tombstone_commit"]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 3
MANIFEST = "manifest.json"
BUILDING = ".building"  # marker inside a segment that is still being written
LEASES = "leases"
_SEGMENT_NAME = re.compile(r"^(seg|gen)-[A-Za-z0-9-]+$")
_DELETED_NAME = re.compile(r"^deleted-[0-9]+(-[0-9a-f]+)?\.npy$")
PENDING = ".pending"  # beside a tombstone file a writer made for a commit it has not finished
HISTORY = 64  # commit ids of the previous commits a manifest lists (its lineage)


def tombstone_commit(name: str) -> int | None:
    """The commit number a tombstone file was written for (``deleted-<commit>-<hex>.npy``)."""
    if not _DELETED_NAME.match(name):
        return None
    return int(name.split("-")[1].split(".")[0])


def library_versions() -> dict[str, str]:
    """The versions of the libraries an index's files depend on (a fresh dict each call)."""
    return dict(_installed_versions())


@functools.lru_cache(maxsize=1)
def _installed_versions() -> tuple[tuple[str, str], ...]:
    # looked up once per process: each metadata.version() scans sys.path (~20 ms for the eight, paid
    # on every manifest read and commit before)
    out = {"hybridret": __version__}
    for dist in ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "tantivy", "numpy", "scipy", "torch", "transformers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return tuple(out.items())


def new_segment(root: str | Path) -> Path:
    """Create an empty, marked segment folder inside ``root`` (created if needed)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    seg = root / f"seg-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    seg.mkdir()
    (seg / BUILDING).write_text(str(os.getpid()))
    return seg


def link_file(src: Path, dst: Path) -> None:
    """Hard-link one finished file (never modified in place), copying where links are impossible."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def link_tree(src: Path, dst: Path) -> None:
    """Copy a finished segment, hard-linking files where the filesystem allows (they are never
    modified in place)."""

    def copy(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=copy, dirs_exist_ok=True)


def _sync_tree(path: Path) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            fsync_file(os.path.join(dirpath, name))
        fsync_dir(dirpath)


def segment_files(manifest: dict[str, Any]) -> set[str]:
    """Paths (relative to the index directory) that a manifest needs: segment folders and tombstones."""
    out: set[str] = set()
    for seg in manifest.get("segments", []):
        out.add(seg["name"])
        if seg.get("deleted"):
            out.add(f"{seg['name']}/{seg['deleted']}")
    return out


def commit(root: str | Path, body: dict[str, Any], *, previous: dict[str, Any] | None) -> dict[str, Any]:
    """Make ``body`` (which lists ``segments``) the live state of ``root``, then remove what no
    manifest or live lease needs. ``previous`` is the manifest the writer started from (``None``
    for a new index); its commit number is incremented. Returns the manifest written."""
    root = Path(root)
    committed = {e.get("name"): e.get("deleted") for e in (previous or {}).get("segments", []) if isinstance(e, dict)}
    for seg in body["segments"]:
        path = root / seg["name"]
        if (path / BUILDING).exists():
            _sync_tree(path)
            (path / BUILDING).unlink()
        elif seg.get("deleted") and committed.get(seg["name"]) != seg["deleted"]:
            fsync_file(path / seg["deleted"])  # a new tombstone file: the segment's other files were synced with it
            fsync_dir(path)
    fsync_dir(root)
    prev = previous or {}
    history = [prev["commit_id"], *prev.get("history", [])][:HISTORY] if prev.get("commit_id") else []
    out = {**body, "format_version": FORMAT_VERSION, "commit": int(prev.get("commit", 0)) + 1,
           "index_id": prev.get("index_id") or uuid.uuid4().hex, "commit_id": uuid.uuid4().hex[:16],
           "history": history, "libraries": library_versions(), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out.pop("generation", None)
    atomic_write_json(root / MANIFEST, out)
    for seg in body["segments"]:  # its tombstones are committed now: no longer pending
        if seg.get("deleted"):
            (root / seg["name"] / (seg["deleted"] + PENDING)).unlink(missing_ok=True)
    try:  # the commit is done: tidying up must never turn it into an error
        collect_garbage(root, out)
    except Exception:
        logger.warning("could not remove unused files in %s (they go at the next commit)", root, exc_info=True)
    return out


def names(root: str | Path, segment: str) -> bool:
    """Whether the live manifest of ``root`` names ``segment`` (i.e. its commit happened)."""
    try:
        data = read_json(Path(root) / MANIFEST)
    except (IndexFormatError, OSError):
        return False
    return isinstance(data, dict) and any(isinstance(e, dict) and e.get("name") == segment
                                          for e in data.get("segments", []) or [])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but is not ours
        return True
    return True


def _building_alive(marker: Path) -> bool:
    """A segment still being built by a live process (this one included) must not be removed."""
    try:
        return _alive(int(marker.read_text().strip()))
    except (ValueError, OSError):
        return False


def _leased(root: Path) -> set[str]:
    """Everything named by the lease of a live reader; leases of dead processes are removed."""
    out: set[str] = set()
    folder = root / LEASES
    if not folder.is_dir():
        return out
    for lease in folder.glob("lease-*.json"):
        try:
            data = json.loads(lease.read_text())
            pid = int(data["pid"])
            files = [str(f) for f in data["files"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or damaged: the next collection decides
        if _alive(pid):
            out.update(files)
        else:
            lease.unlink(missing_ok=True)
    return out


_TEMP = re.compile(r"^\..+\.tmp-([0-9]+)$")  # storage._atomic_write's temporary sibling: .NAME.tmp-PID


def _remove_stale_temps(folder: Path) -> None:
    """Remove the temporary files of atomic writes (``.NAME.tmp-PID``) in ``folder`` whose process
    is gone (killed before its rename): nothing would ever remove them otherwise. A live process's
    own temporary file is left alone."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for f in entries:
        m = _TEMP.match(f.name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            logger.info("removing %s, left by a write that was killed", f)
            f.unlink(missing_ok=True)


def collect_garbage(root: str | Path, manifest: dict[str, Any]) -> None:
    """Remove segments and tombstone files that neither ``manifest`` nor a live reader's lease
    names, segments left half-built by dead processes, and the temporary files of atomic writes
    (of ``manifest.json``, of tombstones) whose process was killed. Never raises for a file in use."""
    root = Path(root)
    named = segment_files(manifest)
    keep = named | _leased(root)
    _remove_stale_temps(root)
    for entry in root.iterdir():
        if not entry.is_dir() or not _SEGMENT_NAME.match(entry.name):
            continue
        if entry.name not in keep:
            marker = entry / BUILDING
            if marker.exists() and _building_alive(marker):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            continue
        _remove_stale_temps(entry)
        files = list(entry.iterdir())
        for f in files:
            if _DELETED_NAME.match(f.name) and f"{entry.name}/{f.name}" not in keep:
                f.unlink(missing_ok=True)
        for f in files:
            if f.name.endswith(PENDING) and (not (entry / f.name[:-len(PENDING)]).exists() or
                                             f"{entry.name}/{f.name[:-len(PENDING)]}" in named):
                f.unlink(missing_ok=True)  # its tombstone file is gone, or committed: nothing is pending


def _v1_to_v2(manifest: dict[str, Any], path: Path) -> dict[str, Any]:
    gen = manifest.get("generation")
    n = manifest.get("num_docs")
    if not isinstance(gen, str) or not isinstance(n, int):
        raise IndexFormatError(f"{path}: format-1 manifest without a generation and a document count")
    out = {k: v for k, v in manifest.items() if k != "generation"}
    out["segments"] = [{"name": gen, "num_docs": n, "deleted": None, "num_deleted": 0}]
    out["commit"] = 0
    return out


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The manifest of ``root`` as format 3 (a format-1 manifest is read as one segment; format 1
    and 2 get the ``parts`` and ``representations`` tables their settings imply), checked: segment
    names are plain folder names inside ``root`` and every segment folder exists."""
    root = Path(root)
    if not root.exists():
        raise IndexNotFoundError(f"no index at {root}: directory does not exist")
    path = root / MANIFEST
    if not path.is_file():
        raise IndexNotFoundError(f"no index at {root}: {MANIFEST} is missing (not a hybridret index, or never finished)")
    manifest = read_json(path)
    if not isinstance(manifest, dict):
        raise IndexFormatError(f"{path}: expected a JSON object")
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise IndexFormatError(f"{path}: no format_version")
    if version < 1:
        raise IndexFormatError(f"{path}: format_version {version} is not an index format (hybridret writes 1 to "
                               f"{FORMAT_VERSION})")
    if version > FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: index format {version} is newer than this hybridret ({__version__}) reads "
            f"(format {FORMAT_VERSION}); upgrade hybridret"
        )
    if version == 1:
        manifest = _v1_to_v2(manifest, path)
    if version < 3:  # parts and representations as format 3 names them (legacy/__init__.py)
        from .legacy import upgrade_manifest

        manifest = upgrade_manifest(manifest, root)
    for key in ("parts", "representations"):
        if not isinstance(manifest.get(key), dict):
            raise IndexFormatError(f"{path}: no {key} table")
    segments = manifest.get("segments")
    if not isinstance(segments, list):
        raise IndexFormatError(f"{path}: no segment list")
    for seg in segments:
        if not isinstance(seg, dict) or not isinstance(seg.get("name"), str) or not _SEGMENT_NAME.match(seg["name"]):
            raise IndexFormatError(f"{path}: invalid segment entry {seg!r} (a segment is a folder inside the index)")
        if not isinstance(seg.get("num_docs"), int) or seg["num_docs"] < 0:
            raise IndexFormatError(f"{path}: segment {seg['name']} has no document count")
        deleted = seg.get("deleted")
        if deleted is not None and (not isinstance(deleted, str) or not _DELETED_NAME.match(deleted)):
            raise IndexFormatError(f"{path}: segment {seg['name']} names an invalid tombstone file {deleted!r}")
        folder = root / seg["name"]
        if folder.is_symlink():
            raise IndexFormatError(f"{folder}: the segment folder is a symbolic link (to {os.readlink(folder)}); an "
                                   "index holds its own segments (copy it, or hard-link its files)")
        if not folder.is_dir():
            raise IndexFormatError(f"{path}: names segment {seg['name']!r}, which is missing")
    saved = manifest.get("libraries", {})
    now = library_versions()
    for lib in ("faiss-cpu", "tantivy"):
        if isinstance(saved, dict) and lib in saved and lib in now and \
                str(saved[lib]).split(".")[:2] != now[lib].split(".")[:2]:
            logger.warning("index at %s was written with %s %s; this is %s", root, lib, saved[lib], now[lib])
    return manifest


def check_expected(expected: Any) -> dict[str, Any]:
    """``expected`` (a writer's ``expect=``: the manifest a caller loaded) as a dict, refusing what
    is not one: a mapping whose ``commit`` is an integer >= 0 and whose ``index_id`` and
    ``commit_id`` are strings (each may be absent or ``None``, as in manifests that predate them)."""
    from collections.abc import Mapping

    from ..errors import ConfigError

    if not isinstance(expected, Mapping):
        raise ConfigError(f"expect must be the manifest the caller loaded (a mapping with 'commit', 'index_id', "
                          f"'commit_id'), got {type(expected).__name__}")
    commit = expected.get("commit")
    if commit is not None and (isinstance(commit, bool) or not isinstance(commit, int) or commit < 0):
        raise ConfigError(f"expect['commit'] must be a commit number (an integer >= 0), got {commit!r}")
    for key in ("index_id", "commit_id"):
        value = expected.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"expect[{key!r}] must be a string, got {type(value).__name__} {value!r}")
    history = expected.get("history")
    if history is not None and (not isinstance(history, list) or not all(isinstance(h, str) for h in history)):
        raise ConfigError("expect['history'] must be a list of commit ids (strings)")
    return dict(expected)


def check_lineage(root: Path, manifest: dict[str, Any] | None, expected: dict[str, Any]) -> None:
    """Refuse to write when the index at ``root`` is not the one a writer loaded (``expected``: the
    manifest it read then): the folder is gone, another index replaced it, or its manifest is older
    than, or forked from, the commit loaded. Manifests written before commit ids existed pass."""
    loaded = int(expected.get("commit", 0) or 0)
    if manifest is None:
        raise IndexNotFoundError(f"the index at {root} is gone (it was at commit {loaded} when it was loaded); "
                                 "nothing was written: load it again, or build a new one with index()")
    want_id, have_id = expected.get("index_id"), manifest.get("index_id")
    if want_id and have_id and want_id != have_id:
        raise IndexFormatError(f"the index at {root} was replaced by another index since it was loaded (index id "
                               f"{have_id[:8]}, loaded {want_id[:8]}); nothing was written: load it again to write to it")
    now = int(manifest.get("commit", 0) or 0)
    if now < loaded:
        raise IndexFormatError(f"{root / MANIFEST} is at commit {now}, older than commit {loaded} when the index was "
                               "loaded (restored from an older copy?); nothing was written")
    want_commit = expected.get("commit_id")
    if want_id and want_commit and now - loaded <= HISTORY and \
            want_commit not in [manifest.get("commit_id"), *manifest.get("history", [])]:
        raise IndexFormatError(f"{root / MANIFEST}: commit {now} does not descend from commit {loaded} that was "
                               "loaded (the index was replaced or restored meanwhile); nothing was written")
