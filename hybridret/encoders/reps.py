"""Representations by name: what encoders make, what else is registered, and row helpers.

Every representation is a matrix with one row per text, of one of two kinds:

* ``"dense"``: float32 ``(n, dim)`` (the dense head; a multi-vector representation is stored
  flattened, ``(n, m * d)``);
* ``"sparse"``: float32 CSR ``(n, dim)`` (the learned-sparse head: ``dim`` = vocabulary size).

The encoder of an index makes its heads (:meth:`~hybridret.encoders.base.Encoder.representations`).
A retriever that brings a representation of its own registers a :class:`Representation` (through
:func:`hybridret.retrievers.register`); :func:`encode` then makes it beside the encoder's heads,
for documents (writes, the encode cache, shard writers) and for queries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from ..errors import ConfigError
from .base import EncodedBatch, Encoder

__all__ = ["KINDS", "REPRESENTATIONS", "Representation", "check_name", "encode", "register_representation", "rep_spec",
           "stack_rows", "take_rows", "unregister_representation"]

KINDS = ("dense", "sparse")


class Representation(ABC):
    """A representation made outside the index's encoder (a registered retriever's own).

    Set :attr:`name`, :attr:`kind` (``"dense"`` or ``"sparse"``) and :attr:`dim`, and implement
    :meth:`encode_documents` (and :meth:`encode_queries` where queries differ). It must be
    deterministic: the encode cache and unchanged upserts reuse what it made."""

    name: ClassVar[str]
    kind: ClassVar[str] = "dense"
    dim: ClassVar[int]

    @abstractmethod
    def encode_documents(self, texts: Sequence[str]) -> Any:
        """``(len(texts), dim)`` rows of :attr:`kind` for documents."""

    def encode_queries(self, texts: Sequence[str]) -> Any:
        """The same for queries (default: as documents)."""
        return self.encode_documents(texts)

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "dim": int(self.dim)}


REPRESENTATIONS: dict[str, Representation] = {}


def check_name(name: Any, what: str = "part") -> str:
    """A part or representation name: a short identifier (it becomes a folder name)."""
    if not isinstance(name, str) or not name.isidentifier() or len(name) > 64 or name.startswith("_"):
        raise ConfigError(f"{what} names are identifiers of at most 64 characters, not starting with '_'; "
                          f"got {name!r}")
    return name


def register_representation(rep: Representation, *, replace: bool = False) -> Representation:
    check_name(getattr(rep, "name", None), "representation")
    if rep.kind not in KINDS:
        raise ConfigError(f"representation {rep.name!r}: kind must be 'dense' or 'sparse', got {rep.kind!r}")
    old = REPRESENTATIONS.get(rep.name)
    if old is not None and old is not rep and not replace:
        raise ConfigError(f"a representation named {rep.name!r} is already registered")
    REPRESENTATIONS[rep.name] = rep
    return rep


def unregister_representation(name: str) -> None:
    REPRESENTATIONS.pop(name, None)


def rep_spec(name: str, encoder_reps: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The kind and width of representation ``name``: an encoder head, or a registered one."""
    if name in encoder_reps:
        return dict(encoder_reps[name])
    rep = REPRESENTATIONS.get(name)
    if rep is None:
        raise ConfigError(f"no representation named {name!r}: the encoder makes {', '.join(encoder_reps) or 'none'}, "
                          f"and none is registered under that name")
    return rep.spec()


def encode(encoder: Encoder | None, names: Iterable[str], texts: Sequence[str], *, queries: bool,
           batch_size: int | None = None, show_progress: bool | None = None) -> EncodedBatch:
    """``texts`` encoded into the representations ``names``: the encoder's heads in one call (only
    the models needed), registered representations beside them. ``encoder`` may be ``None`` when
    no name is an encoder head."""
    wanted = list(dict.fromkeys(names))
    heads = set(encoder.heads()) if encoder is not None else set()
    from_encoder = {n for n in wanted if n in heads}
    out: dict[str, Any] = {}
    if from_encoder and texts:
        enc = encoder.only(from_encoder) if from_encoder != heads else encoder  # type: ignore[union-attr]
        call = enc.encode_queries if queries else enc.encode_documents
        batch = call(texts, batch_size=batch_size, show_progress=show_progress)
        out.update({n: batch.get(n) for n in from_encoder})
    for n in wanted:
        if n in from_encoder:
            continue
        rep = REPRESENTATIONS.get(n)
        if rep is None:
            raise ConfigError(f"no representation named {n!r}: the encoder does not make it and none is registered "
                              "under that name (register the retriever that brings it first)")
        values = rep.encode_queries(texts) if queries else rep.encode_documents(texts)
        out[n] = _checked(rep, values, len(texts))
    return EncodedBatch(out)


def _checked(rep: Representation, values: Any, n: int) -> Any:
    if rep.kind == "sparse":
        values = sp.csr_matrix(values, dtype=np.float32)
    else:
        values = np.asarray(values, dtype=np.float32)
    if values.ndim != 2 or values.shape != (n, int(rep.dim)):
        raise ConfigError(f"representation {rep.name!r} returned shape {values.shape}, expected ({n}, {rep.dim})")
    return values


def take_rows(kind: str, values: Any, rows: Sequence[int] | np.ndarray) -> Any:
    """Rows of a representation matrix (a copy for dense, CSR for sparse)."""
    idx = np.asarray(rows, dtype=np.int64)
    if kind == "sparse":
        return sp.csr_matrix(values)[idx]
    return np.asarray(values)[idx]


def stack_rows(kind: str, blocks: Sequence[Any]) -> Any:
    """Row blocks (each ``(m, dim)``, or a dense row ``(dim,)``) stacked into one matrix."""
    if kind == "sparse":
        return sp.vstack(list(blocks), format="csr").astype(np.float32)
    return np.vstack([np.atleast_2d(np.asarray(b, dtype=np.float32)) for b in blocks]).astype(np.float32)
