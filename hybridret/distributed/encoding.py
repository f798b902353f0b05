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
from ..encoders.reps import stack_rows, take_rows
from ..errors import EncoderError

__all__ = ["BatchEncoder", "PrecomputedEncoder", "encoder_shape"]


def encoder_shape(encoder: Encoder) -> dict[str, Any]:
    """What a shard writer needs to know of the encoder without loading it: its config and the
    representations it makes (name -> kind and width)."""
    return {"config": encoder.config(), "representations": encoder.representations()}


class PrecomputedEncoder(Encoder):
    """An encoder that only looks up encodings computed by someone else (by full text), for every
    representation named in ``shape["representations"]`` (registered ones included)."""

    def __init__(self, shape: Mapping[str, Any], table: Mapping[str, Mapping[str, Any]] | None = None,
                 *, what: str = "shard") -> None:
        self._config = dict(shape["config"])
        self._reps = {n: dict(r) for n, r in (shape.get("representations") or {}).items()}
        dense, sparse = self._reps.get("dense"), self._reps.get("sparse")
        self.dense_dim = int(dense["dim"]) if dense else None
        self.vocab = [""] * int(sparse["dim"]) if sparse else None  # only its length is used by writers
        self.table = dict(table or {})
        self.what = what
        self._loaded = True

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def representations(self) -> dict[str, dict[str, Any]]:
        return {n: dict(r) for n, r in self._reps.items()}

    def heads(self) -> tuple[str, ...]:
        return tuple(self._reps)

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
        return EncodedBatch({name: stack_rows(spec["kind"], [r[name] for r in rows])
                             for name, spec in self._reps.items() if rows and name in rows[0]})


def encodings_table(texts: Sequence[str], batch: EncodedBatch) -> dict[str, dict[str, Any]]:
    """``{text: {representation: its row}}`` of an encoded batch (what a shard writer looks up)."""
    out: dict[str, dict[str, Any]] = {t: {} for t in texts}
    for name, values in batch.reps.items():
        kind = "sparse" if sp.issparse(values) else "dense"
        for i, t in enumerate(texts):
            out[t][name] = take_rows(kind, values, [i])
    return out


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
