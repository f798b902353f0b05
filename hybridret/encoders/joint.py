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
TOWERS = ("query", "document")  # sub-folders of a separate-tower training output


class JointEncoder(Encoder):
    """A ``BertForMaskedLM``-style checkpoint used as both a dense and a sparse encoder.

    If the checkpoint folder holds ``dense_projection.pt`` (a ``torch.nn.Linear`` state dict, as
    written by hybridret's trainer) the pooled vector is projected through it.

    ``query_model`` gives queries their own checkpoint (asymmetric towers; same tokenizer, same
    dense size). A folder with ``query/`` and ``document/`` sub-folders, as hybridret's trainer
    writes for separate towers, is recognised and used that way.
    """

    def __init__(
        self,
        model: str,
        *,
        query_model: str | None = None,
        pooling: str = "mean",
        normalize: bool = True,
        max_length: int = 256,
        doc_top_k: int | None = None,
        query_top_k: int | None = None,
        batch_size: int = 32,
        device: str | None = None,
    ) -> None:
        check_pooling(pooling)
        self.model_name = model
        self.query_model = query_model
        doc_path, query_path = model, query_model
        root = Path(str(model)).expanduser()
        if query_model is None and all((root / t / "config.json").is_file() for t in TOWERS):
            doc_path, query_path = str(root / "document"), str(root / "query")
        self.runner = TransformerRunner(doc_path, "mlm", device=device, max_length=max_length)
        self.query_runner = self.runner if query_path is None else \
            TransformerRunner(query_path, "mlm", device=device, max_length=max_length)
        self.pooling = pooling
        self.normalize = normalize
        self.doc_top_k = doc_top_k
        self.query_top_k = query_top_k
        self.batch_size = batch_size
        self.keep, self.vocab = sparse_head(self.runner, doc_top_k, query_top_k)
        if self.query_runner is not self.runner:
            _, query_vocab = sparse_head(self.query_runner, doc_top_k, query_top_k)
            if query_vocab != self.vocab:
                raise EncoderError(f"query tower {query_path!r} and document tower {doc_path!r} have different vocabularies")
        self.projection, self.dense_dim = _load_projection(self.runner)
        if self.query_runner is self.runner:
            self.query_projection = self.projection
        else:
            self.query_projection, qdim = _load_projection(self.query_runner)
            if qdim != self.dense_dim:
                raise EncoderError(f"query tower gives {qdim}-d dense vectors, document tower {self.dense_dim}-d")

    @property
    def device(self) -> str:
        return self.runner.device

    def _encode(self, texts: Sequence[str], top_k: int | None, batch_size: int | None,
                show_progress: bool | None, desc: str, query: bool = False) -> EncodedBatch:
        runner = self.query_runner if query else self.runner
        projection = self.query_projection if query else self.projection
        model = runner.model

        def step(ids: Any, mask: Any) -> tuple[Any, ...]:
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            vec = pool(out.hidden_states[-1], mask, self.pooling)
            if projection is not None:
                vec = projection(vec.float())
            vec = normalise(vec) if self.normalize else vec.float()
            return vec.cpu().numpy(), to_csr(splade_weights(out.logits, mask, self.keep, top_k))

        parts = runner.run(texts, batch_size or self.batch_size, step, desc=desc, show_progress=show_progress)
        dense = assemble_dense([(p, r[0]) for p, r in parts], len(texts), self.dense_dim)
        sparse = assemble_sparse([(p, r[1]) for p, r in parts], len(texts), len(self.vocab))
        return EncodedBatch(dense=dense, sparse=sparse)

    @property
    def sparse_tokenizer(self) -> Any:
        return self.runner.tokenizer

    def encode_queries(self, texts: Sequence[str], *, batch_size: int | None = None,
                       show_progress: bool | None = None) -> EncodedBatch:
        return self._encode(texts, self.query_top_k, batch_size, show_progress, "joint queries", query=True)

    def encode_documents(self, texts: Sequence[str], *, batch_size: int | None = None,
                         show_progress: bool | None = None) -> EncodedBatch:
        return self._encode(texts, self.doc_top_k, batch_size, show_progress, "joint docs")

    def truncation_counts(self) -> dict[str, int]:
        runners = {id(r): r for r in (self.runner, self.query_runner)}.values()
        return {r.name: r.truncated for r in runners}

    def config(self) -> dict[str, Any]:
        out = {
            "type": "joint",
            "model": self.model_name,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "max_length": self.runner.max_length,
            "doc_top_k": self.doc_top_k,
            "query_top_k": self.query_top_k,
        }
        if self.query_model is not None:  # only when set, so existing index manifests stay equal
            out["query_model"] = self.query_model
        return out


def _load_projection(runner: TransformerRunner) -> tuple[Any, int]:
    """The optional ``dense_projection.pt`` of a checkpoint folder, and the resulting dense size."""
    import torch

    hidden = int(runner.model.config.hidden_size)
    proj_path = Path(runner.path) / PROJECTION_FILE
    if not proj_path.is_file():
        return None, hidden
    state = torch.load(proj_path, map_location=runner.device, weights_only=True)
    out_dim, in_dim = state["weight"].shape
    if in_dim != hidden:
        raise EncoderError(f"{proj_path}: projection expects {in_dim}-d states, model gives {hidden}-d")
    projection = torch.nn.Linear(in_dim, out_dim, bias="bias" in state).to(runner.device)
    projection.load_state_dict(state)
    projection.eval()
    return projection, int(out_dim)
