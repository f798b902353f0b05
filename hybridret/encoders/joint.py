"""Joint hybrid encoder: one masked-LM backbone, two heads, one forward pass.

The dense vector pools the last hidden states (optionally through a linear projection); the
sparse vector is SPLADE pooling of the MLM head's logits. Any ``*ForMaskedLM`` checkpoint loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import EncoderError
from ..models import is_hub_id, model_location, resolve_model
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
from ._numpy_heads import numpy_normalise, numpy_pool, numpy_splade_weights
from .base import EncodedBatch, Encoder, loaded
from .dense import assemble_dense, normalise
from .splade import (
    HEAD_ROWS,
    assemble_sparse,
    check_top_k,
    mlm_parts,
    sparse_head,
    splade_weights,
    splade_weights_sliced,
    to_csr,
)

__all__ = ["JointEncoder"]

PROJECTION_FILE = "dense_projection.pt"
TOWERS = ("query", "document")  # sub-folders of a separate-tower training output


class JointEncoder(Encoder):
    """A ``BertForMaskedLM``-style checkpoint used as both a dense and a sparse encoder.

    If the checkpoint folder holds ``dense_projection.pt`` (a ``torch.nn.Linear`` state dict, as
    written by hybridret's trainer) the pooled vector is projected through it.

    ``query_model`` gives queries their own checkpoint (asymmetric towers; same tokenizer, same
    dense size). A folder with ``query/`` and ``document/`` sub-folders, as hybridret's trainer
    writes for separate towers, is recognised and used that way. The models load on first use or
    :meth:`warm`.
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
        backend: str = DEFAULT_BACKEND,
    ) -> None:
        check_pooling(pooling)
        check_top_k(doc_top_k, query_top_k)
        self.backend = check_backend(backend)
        self.model_name = model
        self.query_model = query_model
        doc_path, query_path = model, query_model
        root = Path(str(model)).expanduser()
        if query_model is None and all((root / t / "config.json").is_file() for t in TOWERS):
            doc_path, query_path = str(root / "document"), str(root / "query")
        self._paths = (resolve_model(doc_path), None if query_path is None else resolve_model(query_path))
        self._names = (doc_path, query_path)
        self.max_length = check_max_length(doc_path, self._paths[0], max_length)
        if self._paths[1] is not None:
            self.max_length = check_max_length(str(query_path), self._paths[1], self.max_length)
        self.pooling = pooling
        self.normalize = normalize
        self.doc_top_k = doc_top_k
        self.query_top_k = query_top_k
        self.batch_size = batch_size
        self._device_choice = DeviceChoice(backend, device)
        self._runner: TransformerRunner | None = None
        self._query_runner: TransformerRunner | None = None
        if any(p is not None and is_hub_id(p) for p in self._paths):
            self.warm()  # nothing is known about a Hub model before it is downloaded

    def _load(self) -> None:
        self._fingerprint(self.model_name)
        if self.query_model is not None:
            self._fingerprint(self.query_model)
        (doc_name, query_name), (doc_path, query_path) = self._names, self._paths
        runner = TransformerRunner(doc_name, "mlm", device=self.device, max_length=self.max_length, path=doc_path,
                                   backend=self.backend, numpy_blocker=_projection_blocker(doc_path))
        query_runner = runner if query_path is None else TransformerRunner(
            str(query_name), "mlm", device=self.device, max_length=runner.max_length, path=query_path,
            backend=runner.backend, numpy_blocker=_projection_blocker(query_path))
        self._keep, self._vocab = sparse_head(runner, self.doc_top_k, self.query_top_k)
        if query_runner is not runner:
            _, query_vocab = sparse_head(query_runner, self.doc_top_k, self.query_top_k)
            if query_vocab != self._vocab:
                raise EncoderError(f"query tower {query_path!r} and document tower {doc_path!r} have different vocabularies")
        self._projection, self._dim = _load_projection(runner)
        self._query_projection = self._projection
        if query_runner is not runner:
            self._query_projection, qdim = _load_projection(query_runner)
            if qdim != self._dim:
                raise EncoderError(f"query tower gives {qdim}-d dense vectors, document tower {self._dim}-d")
        self.max_length = min(runner.max_length, query_runner.max_length)
        self._query_runner = query_runner
        self._runner = runner

    runner = loaded("_runner", "The document tower's tokenizer and model (loaded on first use).")

    query_runner = loaded("_query_runner", "The query tower's tokenizer and model (the document tower's "
                                           "without a query model).")

    keep = loaded("_keep", "The sparse vocabulary mask (a float tensor on the device).")

    projection = loaded("_projection", "The document tower's dense projection (``None`` without one).")

    query_projection = loaded("_query_projection", "The query tower's dense projection (``None`` without one).")

    dense_dim = loaded("_dim", "Size of the dense vectors (loaded on first use).")

    vocab = loaded("_vocab", "The sparse vocabulary, term id -> token (loaded on first use).")

    @property
    def has_dense(self) -> bool:
        return True

    @property
    def has_sparse(self) -> bool:
        return True

    @property
    def device(self) -> str:
        return self._device_choice.get()

    def _loaded_runners(self) -> list[Any]:
        if self._runner is None:
            return []
        return list({id(r): r for r in (self._runner, self._query_runner)}.values())

    def _sparse_runner(self) -> Any:
        return self.runner

    def document_tokenizers(self) -> list[tuple[Any, int, str]]:
        runner = self.runner  # the document tower (the query tower reads no document)
        return [(runner.tokenizer, int(runner.max_length), "")]

    def _encode(self, texts: Sequence[str], top_k: int | None, batch_size: int | None,
                show_progress: bool | None, desc: str, query: bool = False) -> EncodedBatch:
        self.warm()
        runner = self._query_runner if query else self._runner
        projection = self._query_projection if query else self._projection
        model = runner.model
        if runner.backend == "numpy":  # no projection: _projection_blocker keeps such a model on torch
            def numpy_step(ids: np.ndarray, mask: np.ndarray) -> tuple[Any, ...]:
                hidden = model.hidden(ids, mask)
                weights = numpy_splade_weights(model, hidden, mask, self._keep, top_k, HEAD_ROWS)
                vec = numpy_pool(hidden, mask, self.pooling)
                return (numpy_normalise(vec) if self.normalize else vec), sp.csr_matrix(weights)

            parts = runner.run(texts, batch_size or self.batch_size, numpy_step, desc=desc, show_progress=show_progress)
        else:
            parts = runner.run(texts, batch_size or self.batch_size, self._torch_step(model, projection, top_k),
                               desc=desc, show_progress=show_progress)
        dense = assemble_dense([(p, r[0]) for p, r in parts], len(texts), self.dense_dim)
        sparse = assemble_sparse([(p, r[1]) for p, r in parts], len(texts), len(self.vocab))
        return EncodedBatch(dense=dense, sparse=sparse)

    def _torch_step(self, model: Any, projection: Any, top_k: int | None) -> Any:
        split = mlm_parts(model)

        def step(ids: Any, mask: Any) -> tuple[Any, ...]:
            if split is None:  # an architecture whose head we cannot call apart: full logits
                out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
                hidden, weights = out.hidden_states[-1], splade_weights(out.logits, mask, self._keep, top_k)
            else:
                hidden = split[0](input_ids=ids, attention_mask=mask).last_hidden_state
                weights = splade_weights_sliced(hidden, mask, split[1], self._keep, top_k)
            vec = pool(hidden.float() if self.backend == "torch-bf16" else hidden, mask, self.pooling)
            if projection is not None:
                vec = projection(vec.float())
            vec = normalise(vec) if self.normalize else vec.float()
            return vec.cpu().numpy(), to_csr(weights)

        return step

    @property
    def sparse_tokenizer(self) -> Any:
        return self.runner.tokenizer

    def encode_queries(self, texts: Sequence[str], *, batch_size: int | None = None,
                       show_progress: bool | None = None) -> EncodedBatch:
        return self._encode(texts, self.query_top_k, batch_size, show_progress, "joint queries", query=True)

    def encode_documents(self, texts: Sequence[str], *, batch_size: int | None = None,
                         show_progress: bool | None = None) -> EncodedBatch:
        return self._encode(texts, self.doc_top_k, batch_size, show_progress, "joint docs")

    def config(self) -> dict[str, Any]:
        out = {
            "type": "joint",
            "model": model_location(self.model_name),
            "fingerprint": self._fingerprint(self.model_name),
            "pooling": self.pooling,
            "normalize": self.normalize,
            "max_length": self.max_length,
            "doc_top_k": self.doc_top_k,
            "query_top_k": self.query_top_k,
            **backend_config(self.backend),
        }
        if self.query_model is not None:  # only when set, so existing index manifests stay equal
            out["query_model"] = model_location(self.query_model)
            out["query_fingerprint"] = self._fingerprint(self.query_model)
        return out


def _projection_blocker(path: str | None) -> str | None:
    """Why the numpy backend cannot run the checkpoint at ``path``: a dense projection, which is a
    torch file (``None``: none)."""
    if path is not None and (Path(path) / PROJECTION_FILE).is_file():
        return f"its {PROJECTION_FILE} is a torch file"
    return None


def _load_projection(runner: TransformerRunner) -> tuple[Any, int]:
    """The optional ``dense_projection.pt`` of a checkpoint folder, and the resulting dense size."""
    hidden = runner.hidden_size
    proj_path = Path(runner.path) / PROJECTION_FILE
    if not proj_path.is_file():
        return None, hidden
    import torch

    state = torch.load(proj_path, map_location=runner.device, weights_only=True)
    out_dim, in_dim = state["weight"].shape
    if in_dim != hidden:
        raise EncoderError(f"{proj_path}: projection expects {in_dim}-d states, model gives {hidden}-d")
    projection = torch.nn.Linear(in_dim, out_dim, bias="bias" in state).to(runner.device)
    projection.load_state_dict(state)
    projection.eval()
    return projection, int(out_dim)
