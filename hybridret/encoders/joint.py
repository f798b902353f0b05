"""Joint hybrid encoder: one masked-LM backbone, two heads, one forward pass.

The dense vector pools the last hidden states (optionally through a linear projection); the
sparse vector is SPLADE pooling of the MLM head's logits. Any ``*ForMaskedLM`` checkpoint loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import EncoderError
from ._hf import TransformerRunner, check_pooling, pool
from .base import EncodedBatch, Encoder
from .dense import assemble_dense, normalise
from .splade import assemble_sparse, sparse_head, splade_weights, to_csr

__all__ = ["JointEncoder"]

PROJECTION_FILE = "dense_projection.pt"


class JointEncoder(Encoder):
    """A ``BertForMaskedLM``-style checkpoint used as both a dense and a sparse encoder.

    If the checkpoint folder holds ``dense_projection.pt`` (a ``torch.nn.Linear`` state dict, as
    written by hybridret's trainer) the pooled vector is projected through it.
    """

    def __init__(
        self,
        model: str,
        *,
        pooling: str = "mean",
        normalize: bool = True,
        max_length: int = 256,
        doc_top_k: int | None = None,
        query_top_k: int | None = None,
        batch_size: int = 32,
        device: str | None = None,
    ) -> None:
        import torch

        check_pooling(pooling)
        self.model_name = model
        self.runner = TransformerRunner(model, "mlm", device=device, max_length=max_length)
        self.keep, self.vocab = sparse_head(self.runner, doc_top_k, query_top_k)
        self.pooling = pooling
        self.normalize = normalize
        self.doc_top_k = doc_top_k
        self.query_top_k = query_top_k
        self.batch_size = batch_size
        hidden = int(self.runner.model.config.hidden_size)
        self.projection = None
        proj_path = Path(self.runner.path) / PROJECTION_FILE
        if proj_path.is_file():
            state = torch.load(proj_path, map_location=self.runner.device, weights_only=True)
            out_dim, in_dim = state["weight"].shape
            if in_dim != hidden:
                raise EncoderError(f"{proj_path}: projection expects {in_dim}-d states, model gives {hidden}-d")
            self.projection = torch.nn.Linear(in_dim, out_dim, bias="bias" in state).to(self.runner.device)
            self.projection.load_state_dict(state)
            self.projection.eval()
            hidden = int(out_dim)
        self.dense_dim = hidden

    @property
    def device(self) -> str:
        return self.runner.device

    def _encode(self, texts: Sequence[str], top_k: int | None, batch_size: int | None,
                show_progress: bool | None, desc: str) -> EncodedBatch:
        model = self.runner.model

        def step(ids: Any, mask: Any) -> tuple[Any, ...]:
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            vec = pool(out.hidden_states[-1], mask, self.pooling)
            if self.projection is not None:
                vec = self.projection(vec.float())
            vec = normalise(vec) if self.normalize else vec.float()
            return vec.cpu().numpy(), to_csr(splade_weights(out.logits, mask, self.keep, top_k))

        parts = self.runner.run(texts, batch_size or self.batch_size, step, desc=desc, show_progress=show_progress)
        dense = assemble_dense([(p, r[0]) for p, r in parts], len(texts), self.dense_dim)
        sparse = assemble_sparse([(p, r[1]) for p, r in parts], len(texts), len(self.vocab))
        return EncodedBatch(dense=dense, sparse=sparse)

    @property
    def sparse_tokenizer(self) -> Any:
        return self.runner.tokenizer

    def encode_queries(self, texts: Sequence[str], *, batch_size: int | None = None,
                       show_progress: bool | None = None) -> EncodedBatch:
        return self._encode(texts, self.query_top_k, batch_size, show_progress, "joint queries")

    def encode_documents(self, texts: Sequence[str], *, batch_size: int | None = None,
                         show_progress: bool | None = None) -> EncodedBatch:
        return self._encode(texts, self.doc_top_k, batch_size, show_progress, "joint docs")

    def config(self) -> dict[str, Any]:
        return {
            "type": "joint",
            "model": self.model_name,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "max_length": self.runner.max_length,
            "doc_top_k": self.doc_top_k,
            "query_top_k": self.query_top_k,
        }
