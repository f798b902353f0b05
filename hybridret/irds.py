"""Optional: read a collection through ``ir_datasets`` when that package and its data are present.

``ir_datasets`` is never required, and nothing here downloads: a dataset whose files are not
already in ``ir_datasets``' local store is reported as missing (the library would otherwise try
the network).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from .data import Document
from .errors import ConfigError

__all__ = ["load_ir_dataset"]

logger = logging.getLogger(__name__)


def _text(doc: Any) -> tuple[str, str]:
    title = str(getattr(doc, "title", "") or "")
    for field in ("text", "body", "contents", "abstract", "passage"):
        value = getattr(doc, field, None)
        if value:
            return title, str(value)
    return title, ""


def load_ir_dataset(dataset_id: str) -> tuple[Iterator[Document], dict[str, str], dict[str, dict[str, int]]]:
    """``(documents, queries, qrels)`` of an ``ir_datasets`` id such as ``"msmarco-passage/trec-dl-2019"``.

    Documents are streamed as :class:`Document` (title and text from the usual fields); queries
    are ``{qid: text}``; qrels ``{qid: {docid: grade}}`` (empty if the dataset has none).

    Raises:
        ConfigError: ``ir_datasets`` is not installed, the id is unknown, or its files are not on
            this machine.
    """
    try:
        import ir_datasets
    except ImportError:
        raise ConfigError("reading an ir_datasets id needs the 'ir_datasets' package (pip install ir_datasets)") from None
    try:
        ds = ir_datasets.load(dataset_id)
    except KeyError:
        raise ConfigError(f"unknown ir_datasets id {dataset_id!r}") from None
    for part in ("docs", "queries", "qrels"):
        if not getattr(ds, f"has_{part}")():
            continue
        handler = getattr(ds, f"{part}_handler")()
        missing = [where for where in (_missing(d) for d in _downloads(handler)) if where]
        if missing:
            raise ConfigError(f"ir_datasets {dataset_id!r}: {part} files are not on this machine "
                              f"({', '.join(missing[:3])}); fetch them with ir_datasets first or use the files directly")
    if not ds.has_docs() or not ds.has_queries():
        raise ConfigError(f"ir_datasets {dataset_id!r} has no {'documents' if not ds.has_docs() else 'queries'}")
    queries = {str(q.query_id): str(getattr(q, "text", "") or getattr(q, "title", "")) for q in ds.queries_iter()}
    qrels: dict[str, dict[str, int]] = {}
    if ds.has_qrels():
        for qr in ds.qrels_iter():
            qrels.setdefault(str(qr.query_id), {})[str(qr.doc_id)] = int(qr.relevance)

    def docs() -> Iterator[Document]:
        for d in ds.docs_iter():
            title, text = _text(d)
            yield Document(id=str(d.doc_id), text=text, title=title)

    return docs(), queries, qrels


def _downloads(handler: Any) -> list[Any]:
    """The download objects behind an ir_datasets handler (best effort; handlers differ)."""
    found = []
    for attr in ("_docs_dlc", "_queries_dlc", "_qrels_dlc", "_dlc"):
        dlc = getattr(handler, attr, None)
        if dlc is not None:
            found.append(dlc)
    return found


def _missing(dlc: Any) -> str | None:
    """Where ``dlc``'s file would be if it is not on disk; ``None`` when present or unknowable."""
    from pathlib import Path

    if not hasattr(dlc, "path"):
        return None
    try:
        where = dlc.path(force=False)
    except TypeError:
        try:
            where = dlc.path()
        except FileNotFoundError as exc:
            return str(exc)
    except FileNotFoundError as exc:
        return str(exc)
    except Exception:  # a download object that cannot say where it would live: let ir_datasets try
        return None
    return None if Path(where).exists() else str(where)
