"""SPLADE-style learned sparse encoder: MLM logits -> max over tokens -> log(1 + ReLU)."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import EncoderError
from ..models import DEFAULT_SPARSE_MODEL, is_hub_id, model_location, resolve_model
from ._hf import DEFAULT_BACKEND, DeviceChoice, TransformerRunner, backend_config, check_backend, check_max_length
from ._numpy_heads import finish_splade, numpy_splade_weights
from .backends import ARRAY_BACKENDS
from .base import EncodedBatch, Encoder, loaded

__all__ = ["HEAD_ROWS", "SpladeEncoder", "mlm_parts", "sparse_vocab_mask", "splade_weights", "splade_weights_sliced"]

# Token rows per MLM-head product in splade_weights_sliced: the logits held at once are at most
# HEAD_ROWS x vocabulary floats (31 MB for a 30,522-token vocabulary), whatever the batch size.
HEAD_ROWS = 256


def _is_punctuation(token: str) -> bool:
    core = token[2:] if token.startswith("##") else token
    return bool(core) and all(unicodedata.category(ch).startswith(("P", "S")) for ch in core)


def sparse_vocab_mask(tokenizer: Any) -> np.ndarray:
    """Boolean mask over the vocabulary: ``True`` for tokens allowed in sparse vectors.

    Special tokens, ``[unused*]`` slots and pure punctuation/symbol tokens are masked out: they
    carry no lexical meaning and would only bloat the index.
    """
    vocab = tokenizer.get_vocab()
    size = max(len(tokenizer), max(vocab.values()) + 1)
    keep = np.ones(size, dtype=bool)
    special = set(tokenizer.all_special_ids)
    for token, idx in vocab.items():
        if idx in special or (token.startswith("[") and token.endswith("]")) or _is_punctuation(token):
            keep[idx] = False
    return keep


def vocab_list(tokenizer: Any, size: int) -> list[str]:
    vocab = [""] * size
    for token, idx in tokenizer.get_vocab().items():
        if idx < size:
            vocab[idx] = token
    return vocab


def splade_weights(logits: Any, mask: Any, keep: Any, top_k: int | None = None) -> Any:
    """Pool MLM logits ``(B, L, V)`` into SPLADE weights ``(B, V)``.

    ``max_L log(1 + relu(x)) == log(1 + relu(max_L x))`` because both maps are monotone, so the max is
    taken first on the raw logits (one ``(B, V)`` transform instead of ``(B, L, V)``). Padding
    positions are set to 0 in place, which cannot change the result after the ReLU.
    """
    logits.masked_fill_(~mask.bool().unsqueeze(-1), 0.0)
    return _weights(logits.max(dim=1).values.float(), keep, top_k)


def _weights(pooled: Any, keep: Any, top_k: int | None) -> Any:
    import torch

    weights = torch.log1p(torch.relu(pooled)) * keep
    if top_k is not None and top_k < weights.shape[1]:
        vals, idx = torch.topk(weights, top_k, dim=1)
        weights = torch.zeros_like(weights).scatter_(1, idx, vals)
    return weights


def mlm_parts(model: Any) -> tuple[Any, Any] | None:
    """``(body, head)`` of a masked-LM whose forward is ``head(body(...)[0])`` (the BERT family's
    ``cls``, the RoBERTa family's ``lm_head``), else ``None``."""
    body = getattr(model, "base_model", None)
    if body is None or body is model:
        return None
    for attr in ("cls", "lm_head"):
        head = getattr(model, attr, None)
        if head is not None and callable(head):
            return body, head
    return None


def splade_weights_sliced(hidden: Any, mask: Any, head: Any, keep: Any, top_k: int | None = None,
                          rows: int = HEAD_ROWS) -> Any:
    """The SPLADE weights of ``splade_weights(head(hidden), mask, keep, top_k)`` without the
    ``(B, L, V)`` logits: the head runs on each text's real tokens (padding is skipped), at most
    ``rows`` tokens at a time, keeping a running max per text. The max starts at 0, which the ReLU
    makes equivalent to the masked max. Peak memory: ``rows x V`` logits."""
    import torch

    if rows < 1:
        raise EncoderError(f"rows must be positive, got {rows}")
    valid = mask.bool()
    pooled: Any = None
    for i in range(hidden.shape[0]):
        states = hidden[i][valid[i]]
        for start in range(0, states.shape[0], rows):
            part = head(states[start : start + rows]).max(dim=0).values.float()
            if pooled is None:
                pooled = torch.zeros((hidden.shape[0], part.shape[0]), dtype=torch.float32, device=part.device)
            torch.maximum(pooled[i], part, out=pooled[i])
    if pooled is None:  # no tokens at all: nothing is known of the head's size but keep's
        pooled = torch.zeros((hidden.shape[0], keep.shape[0]), dtype=torch.float32, device=keep.device)
    return _weights(pooled, keep, top_k)


def to_csr(weights: Any) -> sp.csr_matrix:
    """Dense ``(B, V)`` torch weights -> float32 CSR with sorted indices and no explicit zeros."""
    w = weights.detach().to("cpu").numpy().astype(np.float32, copy=False)
    return sp.csr_matrix(w)


def assemble_sparse(parts: list[tuple[np.ndarray, sp.csr_matrix]], n: int, vocab_size: int) -> sp.csr_matrix:
    """Put length-sorted batch outputs back in input order."""
    if not parts:
        return sp.csr_matrix((n, vocab_size), dtype=np.float32)
    if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(n)):  # one batch in input order (a query)
        return parts[0][1]  # to_csr's output: float32, sorted indices
    positions = np.concatenate([p for p, _ in parts])
    stacked = sp.vstack([m for _, m in parts], format="csr")
    inverse = np.empty_like(positions)
    inverse[positions] = np.arange(len(positions))
    out = stacked[inverse]
    out.sort_indices()
    return out.astype(np.float32)


def check_top_k(doc_top_k: int | None, query_top_k: int | None) -> None:
    for name, value in (("doc_top_k", doc_top_k), ("query_top_k", query_top_k)):
        if value is not None and value < 1:
            raise EncoderError(f"{name} must be positive or None, got {value}")


def sparse_head(runner: TransformerRunner, doc_top_k: int | None, query_top_k: int | None) -> tuple[Any, list[str]]:
    """Validate top-k settings and return the vocabulary keep-mask (a float tensor on the model's
    device; a float32 array on the numpy backend) and the term list of a masked-LM runner's output layer."""
    check_top_k(doc_top_k, query_top_k)
    if runner.backend in ARRAY_BACKENDS:
        out_size = runner.model.vocab_out_size
        keep = sparse_vocab_mask(runner.tokenizer)
        keep = np.concatenate([keep, np.zeros(max(0, out_size - keep.shape[0]), dtype=bool)])[:out_size]
        return keep.astype(np.float32), vocab_list(runner.tokenizer, out_size)
    import torch

    head = runner.model.get_output_embeddings()
    if head is None:
        raise EncoderError(f"model {runner.name!r} has no masked-LM head; a *ForMaskedLM checkpoint is needed")
    weight = head.weight() if callable(head.weight) else head.weight  # an int8 Linear's weight is a method
    out_size = int(weight.shape[0])
    keep = sparse_vocab_mask(runner.tokenizer)
    keep = np.concatenate([keep, np.zeros(max(0, out_size - keep.shape[0]), dtype=bool)])[:out_size]
    return torch.from_numpy(keep.astype(np.float32)).to(runner.device), vocab_list(runner.tokenizer, out_size)


class SpladeEncoder(Encoder):
    """Sparse-only encoder around any masked-language model (default: SPLADE-tiny, packaged).

    ``doc_top_k`` / ``query_top_k`` optionally keep only the k heaviest terms per text. ``backend``:
    see :mod:`hybridret.encoders.backends`. The model loads on first use or :meth:`warm`.
    """

    def __init__(
        self,
        model: str = DEFAULT_SPARSE_MODEL,
        *,
        max_length: int = 256,
        doc_top_k: int | None = None,
        query_top_k: int | None = None,
        batch_size: int = 32,
        device: str | None = None,
        backend: str = DEFAULT_BACKEND,
    ) -> None:
        check_top_k(doc_top_k, query_top_k)
        self.backend = check_backend(backend)
        self.model_name = model
        self.path = resolve_model(model)
        self.max_length = check_max_length(model, self.path, max_length)
        self.doc_top_k = doc_top_k
        self.query_top_k = query_top_k
        self.batch_size = batch_size
        self._device_choice = DeviceChoice(backend, device)
        self._runner: TransformerRunner | None = None
        self._keep: Any = None
        self._vocab: list[str] = []
        if is_hub_id(self.path):  # nothing is known about a Hub model before it is downloaded
            self.warm()

    def _load(self) -> None:
        self._fingerprint(self.model_name)
        runner = TransformerRunner(self.model_name, "mlm", device=self.device, max_length=self.max_length,
                                   path=self.path, backend=self.backend, onnx_head="splade")
        self._keep, self._vocab = sparse_head(runner, self.doc_top_k, self.query_top_k)
        self.max_length = runner.max_length
        self._runner = runner

    runner = loaded("_runner", "The tokenizer and model (loaded on first use).")

    keep = loaded("_keep", "The sparse vocabulary mask (a float tensor on the device; an array on numpy).")

    vocab = loaded("_vocab", "The sparse vocabulary, term id -> token (loaded on first use).")

    @property
    def has_dense(self) -> bool:
        return False

    @property
    def has_sparse(self) -> bool:
        return True

    @property
    def device(self) -> str:
        return self._device_choice.get()

    def _loaded_runners(self) -> list[Any]:
        return [self._runner] if self._runner is not None else []

    def _sparse_runner(self) -> Any:
        return self.runner

    def _encode(self, texts: Sequence[str], top_k: int | None, batch_size: int | None, show_progress: bool | None,
                desc: str) -> sp.csr_matrix:
        runner = self.runner
        model, keep = runner.model, self._keep
        if runner.backend in ARRAY_BACKENDS:
            def numpy_step(ids: np.ndarray, mask: np.ndarray) -> tuple[Any, ...]:
                if runner.backend == "numpy":
                    return (sp.csr_matrix(numpy_splade_weights(model, model.hidden(ids, mask), mask, keep, top_k,
                                                               HEAD_ROWS)),)
                return (sp.csr_matrix(finish_splade(model.splade(ids, mask), keep, top_k)),)

            parts = runner.run(texts, batch_size or self.batch_size, numpy_step, desc=desc, show_progress=show_progress)
            return assemble_sparse([(p, r[0]) for p, r in parts], len(texts), len(self._vocab))
        split = mlm_parts(model)

        def step(ids: Any, mask: Any) -> tuple[Any, ...]:
            if split is None:  # an architecture whose head we cannot call apart: full logits
                return (to_csr(splade_weights(model(input_ids=ids, attention_mask=mask).logits, mask, keep, top_k)),)
            hidden = split[0](input_ids=ids, attention_mask=mask).last_hidden_state
            return (to_csr(splade_weights_sliced(hidden, mask, split[1], keep, top_k)),)

        parts = runner.run(texts, batch_size or self.batch_size, step, desc=desc, show_progress=show_progress)
        return assemble_sparse([(p, r[0]) for p, r in parts], len(texts), len(self._vocab))

    @property
    def sparse_tokenizer(self) -> Any:
        return self.runner.tokenizer

    def encode_queries(self, texts: Sequence[str], *, batch_size: int | None = None,
                       show_progress: bool | None = None) -> EncodedBatch:
        return EncodedBatch(sparse=self._encode(texts, self.query_top_k, batch_size, show_progress, "sparse queries"))

    def encode_documents(self, texts: Sequence[str], *, batch_size: int | None = None,
                         show_progress: bool | None = None) -> EncodedBatch:
        return EncodedBatch(sparse=self._encode(texts, self.doc_top_k, batch_size, show_progress, "sparse docs"))

    def config(self) -> dict[str, Any]:
        return {
            "type": "splade",
            "model": model_location(self.model_name),
            "fingerprint": self._fingerprint(self.model_name),
            "max_length": self.max_length,
            "doc_top_k": self.doc_top_k,
            "query_top_k": self.query_top_k,
            **backend_config(self.backend),
        }
