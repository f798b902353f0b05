"""An on-disk cache of encoded documents, keyed on content, so no text is ever encoded twice.

Encoding is by far the slowest part of a build (tens of documents per second per CPU core). With
a cache folder, every encoded document is kept under the key ``sha256(encoder config + text)``:
run an interrupted build again and only the documents that are missing get encoded; rebuild or
add to an index with the same encoder and an unchanged text is read back, while a *changed* text
under the same id gets a new key and is always re-encoded. One folder may serve several encoders
(the config is part of the key) and any chunking or document order.

Layout: ``cache.json`` (the format) and ``enc-<n>.npz`` files, each holding the keys of a batch of
documents and each representation by name: ``<name>.vectors`` for a dense one, ``<name>.data`` /
``.indices`` / ``.indptr`` / ``.shape`` (CSR arrays) for a sparse one. Every file is written to a temporary
name and renamed, so a file is either complete or absent; unreadable files are skipped with a
warning and their documents re-encoded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import ConfigError
from .base import EncodedBatch

__all__ = ["EncodingCache", "content_key"]

logger = logging.getLogger(__name__)

FORMAT = "hybridret-encoding-cache-v3"
_KEY_BYTES = 20


def content_key(encoder_config: dict[str, Any], text: str) -> bytes:
    """The cache key of ``text`` encoded by the encoder described by ``encoder_config``."""
    h = hashlib.sha256(json.dumps(encoder_config, sort_keys=True).encode())
    h.update(b"\0")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.digest()[:_KEY_BYTES]


class EncodingCache:
    """Encoded documents under ``root`` for one encoder (others may share the folder).

    Raises:
        ConfigError: ``root`` exists but is not an encoding cache of this format.
    """

    def __init__(self, root: str | Path, encoder_config: dict[str, Any]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.config = encoder_config
        meta_file = self.root / "cache.json"
        if meta_file.is_file():
            try:
                found = json.loads(meta_file.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{meta_file} is not valid JSON ({exc}); remove the folder to start over") from None
            if not isinstance(found, dict) or found.get("format") != FORMAT:
                logger.warning("%s holds an encoding cache of another format (%s); starting a new one there",
                               self.root, found.get("format") if isinstance(found, dict) else found)
                for pattern in ("chunk-*.npz", "enc-*.npz"):
                    for old in self.root.glob(pattern):
                        old.unlink(missing_ok=True)
                self._write_meta(meta_file)
        else:
            self._write_meta(meta_file)
        self._where: dict[bytes, tuple[str, int]] = {}
        for path in sorted(self.root.glob("enc-*.npz")):
            try:
                with np.load(path, allow_pickle=False) as z:
                    keys = z["keys"]
            except (OSError, ValueError, KeyError) as exc:
                logger.warning("unreadable cache file %s (%s); its documents will be re-encoded", path, exc)
                continue
            for row, key in enumerate(keys):
                self._where[bytes(key)] = (path.name, row)
        self._loaded: tuple[str, dict[str, np.ndarray]] | None = None
        self.hits = 0
        self.misses = 0

    def _write_meta(self, meta_file: Path) -> None:
        tmp = meta_file.with_suffix(f".json.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"format": FORMAT}, indent=2) + "\n")
        os.replace(tmp, meta_file)

    def keys(self, texts: Sequence[str]) -> list[bytes]:
        return [content_key(self.config, t) for t in texts]

    def _file(self, name: str) -> dict[str, np.ndarray]:
        if self._loaded is None or self._loaded[0] != name:
            with np.load(self.root / name, allow_pickle=False) as z:
                self._loaded = (name, {k: z[k] for k in z.files})
        return self._loaded[1]

    def get(self, keys: Sequence[bytes]) -> tuple[list[int], list[dict[str, Any]]]:
        """Positions of ``keys`` found in the cache and, for each, its representations by name (a
        dense row ``(dim,)`` or a 1-row CSR matrix)."""
        found: list[int] = []
        rows: list[dict[str, Any]] = []
        for i, key in enumerate(keys):
            where = self._where.get(key)
            if where is None:
                self.misses += 1
                continue
            try:
                z = self._file(where[0])
            except (OSError, ValueError, KeyError) as exc:
                logger.warning("unreadable cache file %s (%s); re-encoding", where[0], exc)
                self.misses += 1
                continue
            found.append(i)
            rows.append(_row(z, where[1]))
            self.hits += 1
        return found, rows

    def put(self, keys: Sequence[bytes], batch: EncodedBatch) -> None:
        """Store the encodings of ``keys`` (one file, written atomically)."""
        if not keys:
            return
        arrays: dict[str, np.ndarray] = {"keys": np.frombuffer(b"".join(keys), np.uint8).reshape(len(keys), -1)}
        for name, values in batch.reps.items():
            if sp.issparse(values):
                s = sp.csr_matrix(values)
                arrays.update({f"{name}.data": s.data.astype(np.float32), f"{name}.indices": s.indices.astype(np.int32),
                               f"{name}.indptr": s.indptr.astype(np.int64),
                               f"{name}.shape": np.array(s.shape, dtype=np.int64)})
            else:
                arrays[f"{name}.vectors"] = np.ascontiguousarray(values, dtype=np.float32)
        name = f"enc-{uuid.uuid4().hex}.npz"
        tmp = self.root / f"tmp-{os.getpid()}-{name}"
        np.savez(tmp, **arrays)
        os.replace(tmp, self.root / name)
        for row, key in enumerate(keys):
            self._where[key] = (name, row)

    def nbytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.glob("enc-*.npz"))


def _row(z: dict[str, np.ndarray], r: int) -> dict[str, Any]:
    """Row ``r`` of every representation stored in one cache file."""
    out: dict[str, Any] = {}
    for key in z:
        name, _, what = key.rpartition(".")
        if what == "vectors":
            out[name] = z[key][r]
        elif what == "data":
            lo, hi = int(z[f"{name}.indptr"][r]), int(z[f"{name}.indptr"][r + 1])
            out[name] = sp.csr_matrix((z[key][lo:hi], z[f"{name}.indices"][lo:hi], [0, hi - lo]),
                                      shape=(1, int(z[f"{name}.shape"][1])))
    return out
