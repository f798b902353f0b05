"""The encoder interface shared by dense, sparse, paired and joint encoders."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["EncodedBatch", "Encoder"]


@dataclass
class EncodedBatch:
    """What an encoder returns for ``n`` texts.

    ``dense`` is float32 ``(n, d)`` (L2-normalised for the default models) and ``sparse`` a float32
    CSR matrix ``(n, vocab_size)`` of term weights; either is ``None`` when the encoder has no such
    head.
    """

    dense: np.ndarray | None = None
    sparse: sp.csr_matrix | None = None

    def __len__(self) -> int:
        if self.dense is not None:
            return int(self.dense.shape[0])
        if self.sparse is not None:
            return int(self.sparse.shape[0])
        return 0


class Encoder(ABC):
    """A query tower and a document tower, each giving a dense and/or a sparse vector.

    Subclasses set :attr:`dense_dim` (``None`` without a dense head) and :attr:`vocab` (the sparse
    vocabulary, term id -> token, ``None`` without a sparse head).
    """

    dense_dim: int | None = None
    vocab: list[str] | None = None

    @abstractmethod
    def encode_queries(
        self, texts: Sequence[str], *, batch_size: int | None = None, show_progress: bool | None = None
    ) -> EncodedBatch:
        """Encode search queries."""

    @abstractmethod
    def encode_documents(
        self, texts: Sequence[str], *, batch_size: int | None = None, show_progress: bool | None = None
    ) -> EncodedBatch:
        """Encode documents (passages)."""

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """A JSON-serialisable description from which :func:`encoder_from_config` rebuilds the encoder."""

    @property
    def has_dense(self) -> bool:
        return self.dense_dim is not None

    @property
    def has_sparse(self) -> bool:
        return self.vocab is not None

    def truncation_counts(self) -> dict[str, int]:
        """Texts cut to ``max_length`` so far, per underlying model."""
        runners = [getattr(self, "runner", None)] + [getattr(getattr(self, n, None), "runner", None)
                                                     for n in ("dense", "sparse")]
        return {r.name: r.truncated for r in runners if r is not None}

    @property
    def sparse_tokenizer(self) -> Any:
        """The tokenizer behind the sparse vocabulary (``None`` without a sparse head)."""
        return None

    def text_term_ids(self, text: str) -> set[int]:
        """Sparse-vocabulary ids of the tokens that occur literally in ``text``; a matched term
        outside this set is an *expansion* term."""
        tok = self.sparse_tokenizer
        if tok is None:
            return set()
        return set(tok(text, add_special_tokens=False, truncation=False)["input_ids"])

    def sparse_terms(self, row: sp.csr_matrix) -> dict[str, float]:
        """Map one sparse row to ``{token: weight}``, heaviest first."""
        if self.vocab is None:
            return {}
        order = np.argsort(-row.data, kind="stable")
        return {self.vocab[int(row.indices[i])]: float(row.data[i]) for i in order}
