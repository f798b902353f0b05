"""Dense bi-encoder: transformer hidden states -> pooling -> (optional) L2 normalisation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..models import DEFAULT_DENSE_MODEL
from ._hf import TransformerRunner, check_pooling, pool
from .base import EncodedBatch, Encoder

__all__ = ["DenseEncoder", "assemble_dense"]


def assemble_dense(parts: list[tuple[np.ndarray, np.ndarray]], n: int, dim: int) -> np.ndarray:
    """Put length-sorted batch outputs back in input order."""
    out = np.zeros((n, dim), dtype=np.float32)
    for pos, block in parts:
        out[pos] = block
    return out


def normalise(x: Any) -> Any:
    import torch

    return torch.nn.functional.normalize(x.float(), p=2, dim=-1)


class DenseEncoder(Encoder):
    """Dense-only encoder (default: all-MiniLM-L6-v2, packaged; mean pooling, L2-normalised).

    ``query_prefix`` / ``document_prefix`` are prepended to texts, for models trained with
    instructions such as ``"query: "`` / ``"passage: "``.
    """

    def __init__(
        self,
        model: str = DEFAULT_DENSE_MODEL,
        *,
        max_length: int = 256,
        pooling: str = "mean",
        normalize: bool = True,
        query_prefix: str = "",
        document_prefix: str = "",
        batch_size: int = 32,
        device: str | None = None,
    ) -> None:
        check_pooling(pooling)
        self.model_name = model
        self.runner = TransformerRunner(model, "base", device=device, max_length=max_length)
        self.pooling = pooling
        self.normalize = normalize
        self.query_prefix = query_prefix
        self.document_prefix = document_prefix
        self.batch_size = batch_size
        self.dense_dim = int(self.runner.model.config.hidden_size)
        self.vocab = None

    @property
    def device(self) -> str:
        return self.runner.device

    def _encode(self, texts: Sequence[str], prefix: str, batch_size: int | None, show_progress: bool | None,
                desc: str) -> np.ndarray:
        model = self.runner.model
        if prefix:
            texts = [prefix + t for t in texts]

        def step(ids: Any, mask: Any) -> tuple[Any, ...]:
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
            vec = pool(hidden, mask, self.pooling)
            vec = normalise(vec) if self.normalize else vec.float()
            return (vec.cpu().numpy(),)

        parts = self.runner.run(texts, batch_size or self.batch_size, step, desc=desc, show_progress=show_progress)
        return assemble_dense([(p, r[0]) for p, r in parts], len(texts), self.dense_dim)

    def encode_queries(self, texts: Sequence[str], *, batch_size: int | None = None,
                       show_progress: bool | None = None) -> EncodedBatch:
        return EncodedBatch(dense=self._encode(texts, self.query_prefix, batch_size, show_progress, "dense queries"))

    def encode_documents(self, texts: Sequence[str], *, batch_size: int | None = None,
                         show_progress: bool | None = None) -> EncodedBatch:
        return EncodedBatch(dense=self._encode(texts, self.document_prefix, batch_size, show_progress, "dense docs"))

    def config(self) -> dict[str, Any]:
        return {
            "type": "dense",
            "model": self.model_name,
            "max_length": self.runner.max_length,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "query_prefix": self.query_prefix,
            "document_prefix": self.document_prefix,
        }

