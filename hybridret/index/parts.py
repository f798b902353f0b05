"""Segment parts by name, and the registry of part formats that opens and writes them.

A segment is a document store (ids, texts, metadata, text hashes) plus a ``dict`` of named
**parts** (``"dense"``, ``"sparse"``, ``"bm25"``, or one that a registered retriever brings). Each
part lives in its own folder with a ``meta.json`` whose ``"format"`` names the :class:`PartType`
that reads it; one class per format. The readers of the built-in formats, and the lookup of a format's reader
(:func:`~hybridret.index.formats.part_type`, :func:`~hybridret.index.formats.open_part`), are in
:mod:`.formats`. A part is built from one *source*: a representation that the
encoder (or a registered :class:`~hybridret.encoders.reps.Representation`) makes, by name, or the
documents' ``"text"``.

What an index builds is a table of :class:`PartSpec` (manifest key ``"parts"``): part name ->
format, source and the format's options. The writer, merges, the encode cache and the shard
encoder loop over it; nothing in them names ``dense`` or ``sparse``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..encoders.reps import check_name
from ..errors import ConfigError, IndexFormatError

__all__ = ["PART_TYPES", "TEXT", "Part", "PartBuilder", "PartSpec", "PartType", "check_name", "register_part_type"]

TEXT = "text"  # the source of parts built from the documents' text rather than a representation


class Part(Protocol):
    """An opened, read-only part: at least its number of rows and its ``meta.json``."""

    meta: dict[str, Any]

    @property
    def num_docs(self) -> int: ...


class PartBuilder(Protocol):
    """Streams one segment's rows into a new part folder; :meth:`close` finishes it."""

    def add(self, values: Any) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


@dataclass(frozen=True)
class PartSpec:
    """One part an index writes in every segment: its ``format``, the ``source`` it is built from
    (a representation name, or ``"text"``) and the format's ``options``."""

    format: str
    source: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "source": self.source, "options": dict(self.options)}

    @classmethod
    def from_dict(cls, name: str, data: Any) -> PartSpec:
        if not isinstance(data, Mapping) or not isinstance(data.get("format"), str) or \
                not isinstance(data.get("source"), str) or not isinstance(data.get("options", {}), Mapping):
            raise IndexFormatError(f"manifest part {name!r}: expected {{format, source, options}}, got {data!r}")
        return cls(data["format"], data["source"], dict(data.get("options") or {}))


@dataclass(frozen=True)
class PartType:
    """How one part format is written and read.

    ``kind`` is what it is built from: ``"dense"`` (float32 ``(n, d)`` rows of a representation),
    ``"sparse"`` (CSR ``(n, V)`` rows) or ``"text"`` (the documents' full texts). ``create(root,
    dim, options)`` returns a :class:`PartBuilder` (``dim``: the representation's width, ``None``
    for text); ``open(root, device)`` returns the part; ``stored(part, rows)`` gives back the
    source values of local ``rows`` when the part keeps them exactly (so merges and unchanged
    upserts never re-encode), ``None`` for formats that do not."""

    format: str
    kind: str
    create: Callable[[Path, int | None, Mapping[str, Any]], PartBuilder]
    open: Callable[[Path, str | None], Part]
    stored: Callable[[Any, np.ndarray], Any] | None = None


PART_TYPES: dict[str, PartType] = {}


def register_part_type(pt: PartType, *, replace: bool = False) -> PartType:
    """Make a part format known (the built-in ones register when :mod:`hybridret.index.formats` loads)."""
    if pt.kind not in ("dense", "sparse", TEXT):
        raise ConfigError(f"part format {pt.format!r}: kind must be 'dense', 'sparse' or 'text', got {pt.kind!r}")
    old = PART_TYPES.get(pt.format)
    if old is not None and old is not pt and not replace:
        raise ConfigError(f"part format {pt.format!r} is already registered")
    PART_TYPES[pt.format] = pt
    return pt
