"""Paired hybrid encoder: a dense model and a sparse model side by side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import EncodedBatch, Encoder
from .dense import DenseEncoder
from .splade import SpladeEncoder

__all__ = ["PairedEncoder"]


class PairedEncoder(Encoder):
    """Runs a :class:`DenseEncoder` and a :class:`SpladeEncoder` on the same texts (each loads its
    model on first use, or both on :meth:`warm`)."""

    def __init__(self, dense: DenseEncoder, sparse: SpladeEncoder) -> None:
        self.dense = dense
        self.sparse = sparse

    def _load(self) -> None:
        self.dense.warm()
        self.sparse.warm()

    @property
    def dense_dim(self) -> int:  # type: ignore[override]
        return self.dense.dense_dim

    @property
    def vocab(self) -> list[str]:  # type: ignore[override]
        return self.sparse.vocab

    @property
    def has_dense(self) -> bool:
        return True

    @property
    def has_sparse(self) -> bool:
        return True

    def only(self, names: set[str] | frozenset[str]) -> Encoder:
        if "sparse" not in names:
            return self.dense
        if "dense" not in names:
            return self.sparse
        return self

    def _loaded_runners(self) -> list[Any]:
        return self.dense._loaded_runners() + self.sparse._loaded_runners()

    def _sparse_runner(self) -> Any:
        return self.sparse.runner

    def document_tokenizers(self) -> list[tuple[Any, int, str]]:
        return self.dense.document_tokenizers() + self.sparse.document_tokenizers()

    @classmethod
    def from_names(cls, dense_model: str | None = None, sparse_model: str | None = None, *,
                   device: str | None = None, backend: str = "auto", **kwargs: Any) -> PairedEncoder:
        """Build from two model names (``None`` = the packaged defaults); ``backend`` (see
        :mod:`hybridret.encoders.backends`) applies to both."""
        dense_kw = {"device": device, "backend": backend, **kwargs}
        sparse_kw = {"device": device, "backend": backend, **kwargs}
        dense = DenseEncoder(dense_model, **dense_kw) if dense_model else DenseEncoder(**dense_kw)
        sparse = SpladeEncoder(sparse_model, **sparse_kw) if sparse_model else SpladeEncoder(**sparse_kw)
        return cls(dense, sparse)

    @property
    def sparse_tokenizer(self) -> Any:
        return self.sparse.runner.tokenizer

    def encode_queries(self, texts: Sequence[str], *, batch_size: int | None = None,
                       show_progress: bool | None = None) -> EncodedBatch:
        d = self.dense.encode_queries(texts, batch_size=batch_size, show_progress=show_progress)
        s = self.sparse.encode_queries(texts, batch_size=batch_size, show_progress=show_progress)
        return EncodedBatch(dense=d.dense, sparse=s.sparse)

    def encode_documents(self, texts: Sequence[str], *, batch_size: int | None = None,
                         show_progress: bool | None = None) -> EncodedBatch:
        d = self.dense.encode_documents(texts, batch_size=batch_size, show_progress=show_progress)
        s = self.sparse.encode_documents(texts, batch_size=batch_size, show_progress=show_progress)
        return EncodedBatch(dense=d.dense, sparse=s.sparse)

    def config(self) -> dict[str, Any]:
        return {"type": "paired", "dense": self.dense.config(), "sparse": self.sparse.config()}
