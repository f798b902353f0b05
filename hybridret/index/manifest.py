"""The index directory: a manifest, written last and atomically, naming one generation folder.

Layout::

    DIR/manifest.json     format version, library versions, counts, components, generation name
    DIR/gen-<id>/         docids.txt, texts.*, dense/, sparse/ (see docs/index-format.md)

A build or save writes a *new* generation folder and only then replaces ``manifest.json`` (one
atomic rename). Until that rename the old manifest still names the old, untouched generation,
so a crash at any point leaves the previous index readable. Unreferenced generations are removed
after a successful commit.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import IndexExistsError, IndexFormatError, IndexNotFoundError
from .storage import atomic_write_json, fsync_dir, read_json

__all__ = ["FORMAT_VERSION", "commit", "library_versions", "link_tree", "new_generation", "read_manifest"]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
BUILDING = ".building"  # marker inside a generation that is still being written


def library_versions() -> dict[str, str]:
    out = {"hybridret": __version__}
    for dist in ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "tantivy", "numpy", "scipy", "torch", "transformers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def new_generation(root: str | Path) -> Path:
    """Create an empty, marked generation folder inside ``root`` (created if needed)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    gen = root / f"gen-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    gen.mkdir()
    (gen / BUILDING).write_text(str(os.getpid()))
    return gen


def link_tree(src: Path, dst: Path) -> None:
    """Copy a finished generation, hard-linking files where the filesystem allows (they are never
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
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def commit(root: str | Path, generation: Path, manifest: dict[str, Any], *, overwrite: bool) -> None:
    """Make ``generation`` the live index of ``root`` by writing the manifest, then tidy up."""
    root = Path(root)
    path = root / MANIFEST
    if path.exists() and not overwrite:
        raise IndexExistsError(f"an index already exists at {root}; pass overwrite=True (CLI: --overwrite)")
    (generation / BUILDING).unlink(missing_ok=True)
    _sync_tree(generation)
    body = {**manifest, "format_version": FORMAT_VERSION, "generation": generation.name,
            "libraries": library_versions(), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    atomic_write_json(path, body)
    for old in root.glob("gen-*"):
        if old.name == generation.name or not old.is_dir():
            continue
        marker = old / BUILDING
        if marker.exists() and _alive(marker):
            continue  # another process is still building there
        shutil.rmtree(old, ignore_errors=True)


def _alive(marker: Path) -> bool:
    """A generation still being built by a live process (this one included) must not be removed."""
    try:
        pid = int(marker.read_text().strip())
        os.kill(pid, 0)
    except (ValueError, OSError):
        return False
    return True


def read_manifest(root: str | Path) -> tuple[dict[str, Any], Path]:
    """The manifest and the generation folder it names; clear errors for anything amiss."""
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
    if not isinstance(version, int):
        raise IndexFormatError(f"{path}: no format_version")
    if version > FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: index format {version} is newer than this hybridret ({__version__}) reads "
            f"(format {FORMAT_VERSION}); upgrade hybridret"
        )
    gen = root / str(manifest.get("generation", ""))
    if not manifest.get("generation") or not gen.is_dir():
        raise IndexFormatError(f"{path}: names generation {manifest.get('generation')!r}, which is missing")
    saved = manifest.get("libraries", {})
    now = library_versions()
    for lib in ("faiss-cpu", "tantivy"):
        if lib in saved and lib in now and saved[lib].split(".")[:2] != now[lib].split(".")[:2]:
            logger.warning("index at %s was written with %s %s; this is %s", root, lib, saved[lib], now[lib])
    return manifest, gen
