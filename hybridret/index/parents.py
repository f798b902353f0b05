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

__all__ = ["PARENT_ID", "assemble", "chunk_rows", "document_counts", "document_of", "read_parents"]

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


def _live_chunks(snap: Any, i: int) -> tuple[Any, np.ndarray]:
    """Segment ``i``'s ``parent_id`` column and its live chunk rows (local)."""
    seg = snap.segments[i]
    _, rows = getattr(seg, "parents", None) or _NONE
    live = snap.live[i]
    if live is not None and len(rows):
        rows = rows[live[rows]]
    return seg.columns.get(PARENT_ID) if len(rows) else None, rows


def document_counts(snap: Any) -> tuple[int, int]:
    """``(documents, chunks)`` live in snapshot ``snap``: the chunks of one document count as one
    document, a row that is no chunk as one document of its own; ``chunks`` counts chunk rows.
    Computed once per snapshot (one pass over the chunk rows' ``parent_id``)."""

    def count() -> tuple[int, int]:
        parents: set[str] = set()
        chunks = 0
        for i in range(len(snap.segments)):
            col, rows = _live_chunks(snap, i)
            if len(rows):
                parents.update(col.str[r] for r in rows.tolist())
                chunks += len(rows)
        return int(snap.num_docs) - chunks + len(parents), chunks

    cache = getattr(snap, "cache", None)
    return cache.get(("document_counts",), count) if cache is not None else count()


def document_of(snap: Any, row: int) -> str:
    """The document a global row belongs to: its ``parent_id`` when it is a chunk, else its id."""
    doc_id = str(snap.ids[row])
    s = int(np.searchsorted(snap.offsets, row, side="right") - 1)
    seg = snap.segments[s]
    col = seg.columns.get(PARENT_ID) if seg.columns is not None else None
    local = row - int(snap.offsets[s])
    if col is not None and col.is_str[local] and doc_id.startswith(col.str[local] + "#"):
        return str(col.str[local])
    return doc_id


_CHUNK_FIELDS = ("parent_id", "chunk", "start", "end")  # hybridret.chunking.CHUNK_FIELDS


def _gap(n: int) -> str:
    """What stands for ``n`` characters between two chunks (not stored: whitespace the cut fell in)."""
    return "" if n <= 0 else " " if n == 1 else "\n" * n


def assemble(doc_id: str, parts: list[dict[str, Any]], *, chunks: bool = False) -> dict[str, Any]:
    """A document re-assembled from its stored chunks (``{"id", "title", "text", "metadata"}`` each):
    chunks in order of their ``chunk`` number, each placed at its ``start`` offset, so overlapping
    text counts once and ``text[start:end]`` is each chunk's text. What lies between two chunks (the
    whitespace a cut fell in) is not stored: one character comes back as a space, more as line
    breaks. Chunks without offsets are joined by a blank line. The metadata is the document's (the
    chunk fields left out); ``num_chunks`` counts the chunks; ``chunks=True`` lists them too."""
    order = sorted(parts, key=lambda c: (c["metadata"].get("chunk") if isinstance(c["metadata"].get("chunk"), int)
                                          else 1 << 62, c["id"]))
    text: list[str] = []
    pos = 0
    for c in order:
        start, end = c["metadata"].get("start"), c["metadata"].get("end")
        body = c["text"] or ""
        if not isinstance(start, int) or not isinstance(end, int) or end - start != len(body):
            text.append(("\n\n" if text else "") + body)  # no usable offsets: paragraphs
            pos = sum(len(t) for t in text)
            continue
        if start >= pos:
            text.append(_gap(start - pos) + body)
        elif end > pos:
            text.append(body[pos - start:])  # the overlap is there already
        pos = max(pos, end)
    first = order[0]
    meta = {k: v for k, v in first["metadata"].items() if k not in _CHUNK_FIELDS}
    out: dict[str, Any] = {"id": doc_id, "title": first["title"], "text": "".join(text), "metadata": meta,
                           "num_chunks": len(order)}
    if chunks:
        out["chunks"] = order
    return out
