"""The numpy backend's output heads: dense pooling and SPLADE max pooling over the masked-LM logits.

The same maths as the torch heads in :mod:`~hybridret.encoders._hf` (``pool``),
:mod:`~hybridret.encoders.dense` (``normalise``) and :mod:`~hybridret.encoders.splade`
(``splade_weights_sliced``): a running max of the logits over each text's real tokens, at most
:data:`~hybridret.encoders.splade.HEAD_ROWS` tokens at a time, started at 0 (equivalent to the
masked max after the ReLU), then ``log(1 + x)`` and the vocabulary mask.
"""

from __future__ import annotations

import numpy as np

from ..errors import EncoderError
from ._numpy_bert import NumpyBert

__all__ = ["finish_splade", "numpy_normalise", "numpy_pool", "numpy_splade_weights"]


def numpy_pool(hidden: np.ndarray, mask: np.ndarray, pooling: str) -> np.ndarray:
    """``(B, L, H)`` token states -> ``(B, H)``: the mean over the mask, or the first token."""
    if pooling == "cls":
        return np.ascontiguousarray(hidden[:, 0], dtype=np.float32)
    m = mask.astype(np.float32)[:, :, None]
    total = np.einsum("blh,bl->bh", hidden, mask.astype(np.float32))
    return (total / np.maximum(m.sum(axis=1), np.float32(1e-9))).astype(np.float32)


def numpy_normalise(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (a zero row stays zero), as ``torch.nn.functional.normalize``."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, np.float32(1e-12))).astype(np.float32)


def numpy_splade_weights(model: NumpyBert, hidden: np.ndarray, mask: np.ndarray, keep: np.ndarray,
                   top_k: int | None = None, rows: int = 256) -> np.ndarray:
    """SPLADE weights ``(B, V)`` of a batch's last hidden states, without the ``(B, L, V)`` logits:
    peak memory ``rows x V`` floats."""
    if rows < 1:
        raise EncoderError(f"rows must be positive, got {rows}")
    valid = mask.astype(bool)
    states = model.transform(hidden[valid])  # (N, H): every real token, text by text
    owner = np.repeat(np.arange(hidden.shape[0]), valid.sum(axis=1))
    pooled = np.zeros((hidden.shape[0], keep.shape[0]), dtype=np.float32)
    for start in range(0, states.shape[0], rows):
        logits = model.logits(states[start : start + rows])
        who = owner[start : start + rows]
        starts = np.flatnonzero(np.r_[True, who[1:] != who[:-1]])  # each text's first row in this slice
        part = np.maximum.reduceat(logits, starts, axis=0)
        texts = who[starts]
        np.maximum(pooled[texts], part, out=part)
        pooled[texts] = part
    return finish_splade(pooled, keep, top_k)


def finish_splade(pooled: np.ndarray, keep: np.ndarray, top_k: int | None = None) -> np.ndarray:
    """SPLADE weights from ``max(0, max over a text's tokens of the logits)`` ``(B, V)``, in place:
    ``log1p``, the vocabulary mask, then the ``top_k`` heaviest terms per text (all when ``None``)."""
    np.log1p(pooled, out=pooled)
    pooled *= keep
    if top_k is not None and top_k < pooled.shape[1]:
        drop = np.argpartition(-pooled, top_k - 1, axis=1)[:, top_k:]
        np.put_along_axis(pooled, drop, np.float32(0.0), axis=1)
    return pooled
