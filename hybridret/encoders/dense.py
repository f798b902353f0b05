"""Dense bi-encoder: transformer hidden states -> pooling -> (optional) L2 normalisation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..models import DEFAULT_DENSE_MODEL, is_hub_id, model_location, resolve_model
from ._hf import (
    DEFAULT_BACKEND,
    DeviceChoice,
    TransformerRunner,
    backend_config,
    check_backend,
    check_max_length,
    check_pooling,
    pool,
)
from ._numpy_heads import numpy_normalise, numpy_pool
from .backends import ARRAY_BACKENDS
from .base import EncodedBatch, Encoder, loaded

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
    instructions such as ``"query: "`` / ``"passage: "``. ``backend``: see
    :mod:`hybridret.encoders.backends` (default ``"auto"``: on the CPU, onnx where onnxruntime is
    installed, else torch where installed, else numpy, which needs no torch, for a BERT model such as
    the default). The model loads on first use or :meth:`warm`.
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
        backend: str = DEFAULT_BACKEND,
    ) -> None:
        check_pooling(pooling)
        self.backend = check_backend(backend)
        self.model_name = model
        self.path = resolve_model(model)
        self.max_length = check_max_length(model, self.path, max_length)
        self.pooling = pooling
        self.normalize = normalize
        self.query_prefix = query_prefix
        self.document_prefix = document_prefix
        self.batch_size = batch_size
        self._device_choice = DeviceChoice(backend, device)
        self._runner: TransformerRunner | None = None
        self._dim = 0
        if is_hub_id(self.path):  # nothing is known about a Hub model before it is downloaded
            self.warm()

    def _load(self) -> None:
        self._fingerprint(self.model_name)
        runner = TransformerRunner(self.model_name, "base", device=self.device, max_length=self.max_length,
                                   path=self.path, backend=self.backend, onnx_head="hidden")
        self._dim = runner.hidden_size
        self.max_length = runner.max_length
        self._runner = runner

    runner = loaded("_runner", "The tokenizer and model (loaded on first use).")

    dense_dim = loaded("_dim", "Size of the dense vectors (loaded on first use).")

    @property
    def has_dense(self) -> bool:
        return True

    @property
    def has_sparse(self) -> bool:
        return False

    @property
    def device(self) -> str:
        return self._device_choice.get()

    def _loaded_runners(self) -> list[Any]:
        return [self._runner] if self._runner is not None else []

    def document_tokenizers(self) -> list[tuple[Any, int, str]]:
        runner = self.runner
        return [(runner.tokenizer, int(runner.max_length), self.document_prefix)]

    def _encode(self, texts: Sequence[str], prefix: str, batch_size: int | None, show_progress: bool | None,
                desc: str) -> np.ndarray:
        runner = self.runner
        model = runner.model
        bf16 = runner.backend == "torch-bf16"
        if prefix:
            texts = [prefix + t for t in texts]

        def numpy_step(ids: np.ndarray, mask: np.ndarray) -> tuple[Any, ...]:
            vec = numpy_pool(model.hidden(ids, mask), mask, self.pooling)
            return (numpy_normalise(vec) if self.normalize else vec,)

        def step(ids: Any, mask: Any) -> tuple[Any, ...]:
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
            if bf16:  # pool in float32: a bfloat16 sum over the tokens would lose digits
                hidden = hidden.float()
            vec = pool(hidden, mask, self.pooling)
            vec = normalise(vec) if self.normalize else vec.float()
            return (vec.cpu().numpy(),)

        parts = runner.run(texts, batch_size or self.batch_size, numpy_step if runner.backend in ARRAY_BACKENDS else step,
                           desc=desc, show_progress=show_progress)
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
            "model": model_location(self.model_name),
            "fingerprint": self._fingerprint(self.model_name),
            "max_length": self.max_length,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "query_prefix": self.query_prefix,
            "document_prefix": self.document_prefix,
            **backend_config(self.backend),
        }

