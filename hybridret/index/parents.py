"""Chunks by parent: the rows of a snapshot that are chunks of a given document (``parent_id``).

Chunking (:mod:`hybridret.chunking`) stores each chunk's document id in its ``parent_id`` metadata
field and names it ``parent_id#i``; upserting or deleting a document by id reaches all of its
chunks through this lookup. Rows whose id does not have that form are not chunks (a ``parent_id``
field of the user's own is left alone).

A segment builds the lookup once, when opened (:func:`read_parents`, only when some row has a
``parent_id``): the chunk rows sorted by the hash of their parent id, so finding a document's
chunks is one binary search per segment, the candidates then compared by string.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PARENT_ID", "chunk_rows", "read_parents"]

PARENT_ID = "parent_id"
_NONE = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def read_parents(columns: Any, ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(hashes, rows)``: the chunk rows of a segment sorted by the hash of their ``parent_id``."""
    col = columns.get(PARENT_ID) if columns is not None else None
    if col is None:
        return _NONE
    rows = [r for r in np.flatnonzero(col.is_str).tolist() if str(ids[r]).startswith(col.str[r] + "#")]
    if not rows:
        return _NONE
    r = np.asarray(rows, dtype=np.int64)
    h = np.fromiter((hash(col.str[i]) for i in rows), dtype=np.int64, count=len(rows))
    order = np.argsort(h, kind="stable")
    return h[order], r[order]


def chunk_rows(snap: Any, parent_id: str) -> list[int]:
    """Global rows of the live chunks of document ``parent_id`` in snapshot ``snap``, in row order."""
    out: list[int] = []
    key = hash(parent_id)
    for i, seg in enumerate(snap.segments):
        hashes, rows = getattr(seg, "parents", None) or _NONE
        lo, hi = np.searchsorted(hashes, key, side="left"), np.searchsorted(hashes, key, side="right")
        if lo == hi:
            continue
        col = seg.columns.get(PARENT_ID)
        found = np.sort(np.asarray([r for r in rows[lo:hi].tolist() if col.str[r] == parent_id], dtype=np.int64))
        live = snap.live[i]
        if live is not None and len(found):
            found = found[live[found]]
        out.extend((found + int(snap.offsets[i])).tolist())
    return out
