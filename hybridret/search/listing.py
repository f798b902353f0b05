"""Every stored document matching a filter, not the top-k of a query: what a document store's
``filter_documents`` / ``count_documents`` and a server's ``POST /documents/list`` need.

The filter (:mod:`hybridret.filters`) is evaluated as one boolean mask per segment over the
segment's metadata columns, intersected with its live rows (deleted and expired documents are
never listed), so counting costs a few vectorised comparisons per field and reads no text; only
the documents of the page asked for are read. Documents come in the snapshot's row order: the
order they were written in, an upserted (replaced) document moving to the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..filters import Filter, parse_filter
from ..index.snapshot import Snapshot

__all__ = ["DocumentPage", "check_page", "list_documents", "matching_rows"]


@dataclass
class DocumentPage:
    """One page of a listing: ``documents`` (``{"id", "title", "text", "metadata"}``, as
    :meth:`Searcher.get <hybridret.search.searcher.Searcher.get>` returns them), ``total`` (every matching
    document, not only this page's), the ``offset`` of the page and the ``commit`` it was read from."""

    documents: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    offset: int = 0
    commit: int = 0


def check_page(offset: Any, limit: Any) -> tuple[int, int | None]:
    """A listing's ``offset`` (a non-negative integer) and ``limit`` (``None``: no limit; ``0``:
    count only)."""
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise ConfigError(f"offset must be a non-negative integer, got {offset!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0):
        raise ConfigError(f"limit must be a non-negative integer or None (no limit), got {limit!r}")
    return int(offset), None if limit is None else int(limit)


def matching_rows(snap: Snapshot, filt: Filter | None) -> np.ndarray:
    """Global rows of the live documents of ``snap`` matching ``filt`` (all of them for ``None``),
    in row order."""
    if filt is not None:
        filt.check_fields(seg.columns for seg in snap.segments)
    out = []
    for i, seg in enumerate(snap.segments):
        live = snap.live[i]
        if filt is None:
            mask = live if live is not None else np.ones(seg.num_docs, dtype=bool)
        else:
            mask = filt.segment_mask(seg)
            if live is not None:
                mask = mask & live
        out.append(np.flatnonzero(mask).astype(np.int64) + int(snap.offsets[i]))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def list_documents(snap: Snapshot, filter: Filter | Mapping[str, Any] | str | None = None, *, offset: int = 0,
                   limit: int | None = None) -> DocumentPage:
    """The documents of ``snap`` matching ``filter`` from ``offset`` on, at most ``limit`` of them
    (``None``: all; ``0``: none, only the count). Pass the snapshot as seen now
    (:meth:`Searcher.current <hybridret.search.searcher.Searcher.current>`) so that expired documents are left out."""
    offset, limit = check_page(offset, limit)
    rows = matching_rows(snap, parse_filter(filter))
    page = rows[offset:] if limit is None else rows[offset:offset + limit]
    docs = []
    for row in page.tolist():
        title, text, meta = snap.get(row)
        docs.append({"id": str(snap.ids[row]), "title": title, "text": text, "metadata": meta})
    return DocumentPage(documents=docs, total=int(len(rows)), offset=offset, commit=snap.commit)
