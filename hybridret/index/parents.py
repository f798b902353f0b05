"""Chunks by parent: the rows of a snapshot that are chunks of a given document (``parent_id``).

Chunking (:mod:`hybridret.chunking`) stores each chunk's document id in its ``parent_id`` metadata
field and is named ``parent_id#i``; upserting or deleting a document by id reaches all of its
chunks through this map, built once per segment (segments never change). Rows whose id does not
have that form are not chunks (a ``parent_id`` field of the user's own is left alone).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PARENT_ID", "chunk_rows", "segment_parents"]

PARENT_ID = "parent_id"


def segment_parents(seg: Any) -> dict[str, np.ndarray]:
    """``parent_id -> local rows`` of segment ``seg`` (empty when no row has a string ``parent_id``)."""
    cached = seg.__dict__.get("_parents")
    if cached is not None:
        return cached
    col = seg.columns.get(PARENT_ID) if getattr(seg, "columns", None) is not None else None
    out: dict[str, list[int]] = {}
    if col is not None:
        ids = seg.docs.ids
        for r in np.flatnonzero(col.is_str).tolist():
            parent = str(col.str[r])
            if str(ids[r]).startswith(parent + "#"):  # a chunk written by chunking, not a field of the user's
                out.setdefault(parent, []).append(r)
    done = {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}
    seg.__dict__["_parents"] = done
    return done


def chunk_rows(snap: Any, parent_id: str) -> list[int]:
    """Global rows of the live chunks of document ``parent_id`` in snapshot ``snap``, in row order."""
    out: list[int] = []
    for i, seg in enumerate(snap.segments):
        rows = segment_parents(seg).get(parent_id)
        if rows is None:
            continue
        live = snap.live[i]
        if live is not None:
            rows = rows[live[rows]]
        out.extend((rows + int(snap.offsets[i])).tolist())
    return out
