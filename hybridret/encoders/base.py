"""The encoder interface shared by dense, sparse, paired and joint encoders."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..models import LOAD_LOCK
from .identity import model_fingerprint

__all__ = ["ByName", "EncodedBatch", "Encoder", "loaded"]


def loaded(attr: str, doc: str) -> Any:
    """A read-only property that loads the encoder's models first (see :meth:`Encoder.warm`),
    then returns ``self.<attr>``: what lazy encoders expose (runners, vocabularies, dimensions)."""
    def get(self: Encoder) -> Any:
        self.warm()
        return getattr(self, attr)

    return property(get, doc=doc)


class ByName:
    """Representations by name (``reps``), ``None`` values dropped; ``dense`` / ``sparse`` read
    the two built-in heads (``None`` when absent). Shared by :class:`EncodedBatch` and
    :class:`~hybridret.retrievers.base.QueryBatch`."""

    def __init__(self, reps: Mapping[str, Any] | None = None, **named: Any) -> None:
        merged = dict(reps or {})
        merged.update(named)
        self.reps: dict[str, Any] = {k: v for k, v in merged.items() if v is not None}

    def get(self, name: str) -> Any:
        """Representation ``name`` (``None`` when it is absent)."""
        return self.reps.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.reps

    @property
    def dense(self) -> np.ndarray | None:
        return self.reps.get("dense")

    @property
    def sparse(self) -> sp.csr_matrix | None:
        return self.reps.get("sparse")


class EncodedBatch(ByName):
    """What an encoder returns for ``n`` texts: each representation by name.

    The built-in heads are ``"dense"`` (float32 ``(n, d)``, L2-normalised for the default models)
    and ``"sparse"`` (a float32 CSR matrix ``(n, vocab_size)`` of term weights); an encoder (or a
    registered :class:`~hybridret.encoders.reps.Representation`) may add others. ``dense=`` and
    ``sparse=`` are accepted as keywords and read as attributes (``None`` when absent).
    ``len(batch)`` is the number of texts.
    """

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.reps)

    def __len__(self) -> int:
        for v in self.reps.values():
            return int(v.shape[0])
        return 0

    def __repr__(self) -> str:
        return f"EncodedBatch({len(self)} rows, reps={sorted(self.reps)})"


class Encoder(ABC):
    """A query tower and a document tower, each giving a dense and/or a sparse vector.

    Subclasses set :attr:`dense_dim` (``None`` without a dense head) and :attr:`vocab` (the sparse
    vocabulary, term id -> token, ``None`` without a sparse head).

    Models load on first use (or on :meth:`warm`), once, however many threads ask at the same time:
    a subclass that loads lazily puts the loading in :meth:`_load`, which runs under
    :data:`~hybridret.models.LOAD_LOCK`, and calls :meth:`warm` before touching what it loads.
    """

    dense_dim: int | None = None
    vocab: list[str] | None = None
    _loaded: bool = False

    def warm(self) -> Encoder:
        """Load every model this encoder needs now rather than on first use; a no-op once loaded.
        Thread-safe. Returns the encoder."""
        if not self._loaded:
            with LOAD_LOCK:
                if not self._loaded:  # checked again: another thread may have loaded meanwhile
                    self._load()
                    self._loaded = True
        return self

    @property
    def loaded(self) -> bool:
        """Whether the models are loaded (see :meth:`warm`)."""
        return self._loaded

    def _load(self) -> None:  # noqa: B027 - a hook with a default, not an abstract method
        """Load the models (called once, under the load lock); eager encoders need not override it."""

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

    def representations(self) -> dict[str, dict[str, Any]]:
        """What this encoder makes, by name: ``{"kind": "dense" | "sparse", "dim": width}`` each
        (loads the models of lazy encoders to learn the sizes)."""
        out: dict[str, dict[str, Any]] = {}
        if self.has_dense:
            out["dense"] = {"kind": "dense", "dim": int(self.dense_dim)}  # type: ignore[arg-type]
        if self.has_sparse:
            out["sparse"] = {"kind": "sparse", "dim": len(self.vocab)}  # type: ignore[arg-type]
        return out

    def heads(self) -> tuple[str, ...]:
        """The names of the representations this encoder makes, without loading any model."""
        return tuple(n for n, has in (("dense", self.has_dense), ("sparse", self.has_sparse)) if has)

    def only(self, names: set[str] | frozenset[str]) -> Encoder:
        """An encoder that makes at least the representations ``names``, and as few others as it
        can (a paired encoder returns the one model that suffices); default: itself."""
        return self

    @property
    def has_dense(self) -> bool:
        return self.dense_dim is not None

    @property
    def has_sparse(self) -> bool:
        return self.vocab is not None

    def truncation_counts(self) -> dict[str, int]:
        """Texts cut to ``max_length`` so far, per underlying model (models not loaded yet cut none)."""
        return {r.name: r.truncated for r in self._loaded_runners()}

    def _fingerprint(self, name: str) -> str | None:
        """The weights fingerprint of model ``name``, taken once (at load or at the first config())."""
        cache: dict[str, str | None] = self.__dict__.setdefault("_fingerprints", {})
        if name not in cache:
            cache[name] = model_fingerprint(name)
        return cache[name]

    def _loaded_runners(self) -> list[Any]:
        """The transformer runners loaded so far."""
        return []

    def document_tokenizers(self) -> list[tuple[Any, int, str]]:
        """``(tokenizer, max_length, prefix)`` of every model a document goes through when indexed
        (loads the models): what chunking measures so that no chunk is truncated by any of them.
        ``[]`` for an encoder without transformer runners."""
        self.warm()
        return [(r.tokenizer, int(r.max_length), "") for r in self._loaded_runners()]

    def _sparse_runner(self) -> Any:
        """The runner whose tokenizer is the sparse vocabulary's (``None``: none, or not a runner)."""
        return None

    @property
    def sparse_tokenizer(self) -> Any:
        """The tokenizer behind the sparse vocabulary (``None`` without a sparse head)."""
        return None

    def text_term_ids(self, text: str) -> set[int]:
        """Sparse-vocabulary ids of the tokens that occur literally in ``text``; a matched term
        outside this set is an *expansion* term."""
        runner = self._sparse_runner()
        if runner is not None:
            return set(runner.plain_ids(text))  # under the runner's tokenizer lock
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
