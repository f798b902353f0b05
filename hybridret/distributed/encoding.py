"""Encodings made elsewhere, handed to a shard's IndexWriter, and the encoding step of a distributed build.

Shards never load the models to write: the coordinator (routed add/upsert) or the build's encoder
actors encode, and a shard's :class:`~hybridret.indexer.IndexWriter` gets a
:class:`PrecomputedEncoder` that answers from those encodings (and the shared encoding cache). It
carries the real encoder's config, so the shard's manifest records the real models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..encoders import EncodedBatch, Encoder
from ..errors import EncoderError

__all__ = ["BatchEncoder", "PrecomputedEncoder", "encoder_shape"]


def encoder_shape(encoder: Encoder) -> dict[str, Any]:
    """What a shard writer needs to know of the encoder without loading it: config and sizes."""
    return {"config": encoder.config(), "dense_dim": encoder.dense_dim,
            "vocab_size": len(encoder.vocab) if encoder.vocab is not None else None}


class PrecomputedEncoder(Encoder):
    """An encoder that only looks up encodings computed by someone else (by full text)."""

    def __init__(self, shape: Mapping[str, Any], table: Mapping[str, tuple[np.ndarray | None, Any]] | None = None,
                 *, what: str = "shard") -> None:
        self._config = dict(shape["config"])
        self.dense_dim = shape.get("dense_dim")
        size = shape.get("vocab_size")
        self.vocab = [""] * int(size) if size else None  # only its length is used by writers
        self.table = dict(table or {})
        self.what = what
        self._loaded = True

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def encode_queries(self, texts: Sequence[str], *, batch_size: int | None = None,
                       show_progress: bool | None = None) -> EncodedBatch:
        raise EncoderError(f"{self.what}: queries are encoded by the coordinator, not by a shard")

    def encode_documents(self, texts: Sequence[str], *, batch_size: int | None = None,
                         show_progress: bool | None = None) -> EncodedBatch:
        missing = [t for t in texts if t not in self.table]
        if missing:
            raise EncoderError(f"{self.what}: {len(missing)} documents arrived without their encodings "
                               f"(first: {missing[0][:60]!r}); the coordinator or the build's encoding step must "
                               "encode them")
        rows = [self.table[t] for t in texts]
        dense = np.stack([r[0] for r in rows]).astype(np.float32) if self.dense_dim else None
        sparse = sp.vstack([r[1] for r in rows], format="csr").astype(np.float32) if self.vocab else None
        return EncodedBatch(dense=dense, sparse=sparse)


def encodings_table(texts: Sequence[str], batch: EncodedBatch) -> dict[str, tuple[np.ndarray | None, Any]]:
    """``{text: (dense row, sparse 1-row CSR)}`` of an encoded batch (what a shard writer looks up)."""
    sparse = batch.sparse.tocsr() if batch.sparse is not None else None
    return {t: (None if batch.dense is None else batch.dense[i], None if sparse is None else sparse[i])
            for i, t in enumerate(texts)}


class BatchEncoder:
    """The Ray Data ``map_batches`` callable of a distributed build: one per actor, holding the
    encoder's models; every batch goes through the shared content-keyed encoding cache, so texts
    encoded before an interruption are read back, never encoded again."""

    def __init__(self, config: dict[str, Any], cache_dir: str, device: str | None = None, batch_size: int = 32) -> None:
        from .._runtime import prepare_native_libraries
        from ..encoders import encoder_from_config
        from ..encoders.cache import EncodingCache

        prepare_native_libraries()
        self.encoder = encoder_from_config(config, device=device)
        self.cache_dir = Path(cache_dir)
        self.config = config
        self.cache = EncodingCache(self.cache_dir, config)
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch["full_text"]]
        keys = self.cache.keys(texts)
        found, _ = self.cache.get(keys)
        have = set(found)
        todo = [i for i in range(len(texts)) if i not in have]
        if todo:
            enc = self.encoder.encode_documents([texts[i] for i in todo], batch_size=self.batch_size,
                                                show_progress=False)
            self.cache.put([keys[i] for i in todo], enc)
        encoded = np.zeros(len(texts), dtype=bool)
        encoded[todo] = True
        return {"id": np.asarray(batch["id"]), "encoded": encoded}
