"""An on-disk cache of encoded document chunks, so an interrupted index build resumes.

Encoding is by far the slowest part of a build (tens of documents per second per CPU core), so
:meth:`HybridRetriever.index` can keep each encoded chunk in a folder. Run the same build again
after an interruption and chunks already there are read back instead of re-encoded; only the FAISS
and tantivy writing (minutes even for millions of documents) is redone.

Layout: ``cache.json`` (the encoder's config and the chunk size: a cache written by another
encoder is refused, never silently mixed) and one ``chunk-000000.npz`` per chunk holding a hash of
the chunk's document ids, the dense matrix and the sparse CSR arrays. Every file is written to a
temporary name and renamed, so a chunk is either complete or absent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import ConfigError
from .base import EncodedBatch
from .identity import compare_configs

__all__ = ["EncodingCache"]

logger = logging.getLogger(__name__)

FORMAT = "hybridret-encoding-cache-v1"


def _ids_hash(ids: Sequence[str]) -> str:
    h = hashlib.sha1()
    for i in ids:
        h.update(i.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


class EncodingCache:
    """Encoded chunks of one corpus under ``root``, for one encoder and one chunk size.

    Raises:
        ConfigError: ``root`` holds a cache written with a different encoder or chunk size.
    """

    def __init__(self, root: str | Path, encoder_config: dict[str, Any], chunk_size: int) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT, "encoder": encoder_config, "chunk_size": chunk_size}
        meta_file = self.root / "cache.json"
        if meta_file.is_file():
            try:
                found = json.loads(meta_file.read_text())
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{meta_file} is not valid JSON ({exc}); remove the folder to start over") from exc
            if found != json.loads(json.dumps(meta)):
                raise ConfigError(self._mismatch(found, meta))
        else:
            tmp = meta_file.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, meta_file)
        self.hits = 0
        self.misses = 0

    def _mismatch(self, found: dict[str, Any], meta: dict[str, Any]) -> str:
        if found.get("encoder") == json.loads(json.dumps(meta["encoder"])):
            return (f"the encoding cache at {self.root} was written with another chunk size "
                    f"({found.get('chunk_size')} vs {meta['chunk_size']} documents per chunk)")
        diffs = compare_configs(found.get("encoder"), meta["encoder"]) or ["no weights fingerprint in the cache"]
        return (f"the encoding cache at {self.root} was written with another encoder ({'; '.join(diffs)}); "
                "remove it or pass a different folder")

    def _path(self, chunk: int) -> Path:
        return self.root / f"chunk-{chunk:06d}.npz"

    def get(self, chunk: int, ids: Sequence[str]) -> EncodedBatch | None:
        """The cached encoding of chunk number ``chunk`` if it holds exactly ``ids``, else ``None``."""
        path = self._path(chunk)
        if not path.is_file():
            self.misses += 1
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                if str(z["ids_hash"]) != _ids_hash(ids):
                    logger.warning("%s holds other documents than this chunk (the corpus changed?); re-encoding", path)
                    self.misses += 1
                    return None
                dense = z["dense"] if "dense" in z.files else None
                sparse = None
                if "sp_data" in z.files:
                    shape = tuple(int(x) for x in z["sp_shape"])
                    sparse = sp.csr_matrix((z["sp_data"], z["sp_indices"], z["sp_indptr"]), shape=shape)
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("unreadable cached chunk %s (%s); re-encoding", path, exc)
            self.misses += 1
            return None
        self.hits += 1
        return EncodedBatch(dense=dense, sparse=sparse)

    def put(self, chunk: int, ids: Sequence[str], batch: EncodedBatch) -> None:
        """Store ``batch`` as chunk number ``chunk`` (atomically)."""
        arrays: dict[str, np.ndarray] = {"ids_hash": np.array(_ids_hash(ids))}
        if batch.dense is not None:
            arrays["dense"] = np.ascontiguousarray(batch.dense, dtype=np.float32)
        if batch.sparse is not None:
            s = batch.sparse.tocsr()
            arrays.update(sp_data=s.data.astype(np.float32), sp_indices=s.indices.astype(np.int32),
                          sp_indptr=s.indptr.astype(np.int64), sp_shape=np.array(s.shape, dtype=np.int64))
        path = self._path(chunk)
        tmp = path.with_name("tmp-" + path.name)
        np.savez(tmp, **arrays)
        os.replace(tmp, path)

    def nbytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.glob("chunk-*.npz"))
