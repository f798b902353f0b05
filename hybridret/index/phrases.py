"""The ``phrases`` part: a tantivy index with positions over each row's *analysed* tokens, so that
a ``$text`` phrase filter (:mod:`.textmatch`) finds the rows holding its tokens consecutively
with one tantivy phrase query instead of re-analysing candidate texts.

Each row is written as its tokens from the BM25 analyzer (:func:`.analysis.bm25_analyzer`:
lowercased, stop words removed, stemmed) joined by spaces, into a field tokenized on whitespace
with positions: a token's position is its index in the analysed list, so "consecutive" means
consecutive after analysis, exactly what :func:`.textmatch.holds_sequence` checks (tantivy's own
analysis would keep gaps where stop words were). A fast field ``row`` maps tantivy's documents back
to the segment's rows. Single words are answered from the BM25 part's postings (cheaper), not here.

Files: ``meta.json`` (format ``hybridret-phrases-v1``, ``num_docs``, ``tokens``) and ``tantivy/``.
"""

from __future__ import annotations

import shutil
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from ._tantivy import open_tantivy
from .analysis import bm25_analyzer
from .storage import atomic_write_json, read_json

__all__ = ["FORMAT", "PhraseIndex", "PhraseIndexBuilder"]

FORMAT = "hybridret-phrases-v1"
FIELD = "t"
_HEAP = 64_000_000  # tantivy writer heap (one thread: rows keep their order)


def _schema() -> Any:
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_unsigned_field("row", stored=False, indexed=False, fast=True)
    sb.add_text_field(FIELD, stored=False, tokenizer_name="whitespace", index_option="position")
    return sb.build()


class PhraseIndexBuilder:
    """Streams the full texts of one segment's rows into a new ``phrases`` part folder."""

    def __init__(self, root: Path) -> None:
        import tantivy

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=False)
        (self.root / "tantivy").mkdir()
        self.analyzer = bm25_analyzer()
        self.index = tantivy.Index(_schema(), path=str(self.root / "tantivy"))
        self.writer: Any = self.index.writer(heap_size=_HEAP, num_threads=1)
        self.rows = 0
        self.tokens = 0

    def add(self, texts: Sequence[str]) -> None:
        import tantivy

        analyze = self.analyzer.analyze
        for text in texts:
            toks = analyze(text) if text else []
            doc = tantivy.Document()
            doc.add_unsigned("row", self.rows)
            doc.add_text(FIELD, " ".join(toks))
            self.writer.add_document(doc)
            self.rows += 1
            self.tokens += len(toks)

    def close(self) -> None:
        self.writer.commit()
        self.writer.wait_merging_threads()
        self.writer = None
        atomic_write_json(self.root / "meta.json", {"format": FORMAT, "num_docs": self.rows, "tokens": self.tokens})

    def abort(self) -> None:
        if self.writer is not None:
            try:
                self.writer.rollback()
            except (ValueError, RuntimeError):
                pass
            self.writer = None
        shutil.rmtree(self.root, ignore_errors=True)


class PhraseIndex:
    """One segment's ``phrases`` part, opened read-only (thread-safe: tantivy searchers are)."""

    def __init__(self, root: str | Path) -> None:
        import tantivy

        self.root = Path(root)
        meta = read_json(self.root / "meta.json")
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise IndexFormatError(f"{self.root}: unsupported phrase index format "
                                   f"{meta.get('format') if isinstance(meta, dict) else meta!r}")
        self.meta = meta
        self._n = int(meta["num_docs"])
        self.index, view = open_tantivy(self.root / "tantivy")
        weakref.finalize(self, shutil.rmtree, str(view), True)
        self.schema = self.index.schema
        self.searcher = self.index.searcher()
        if self.searcher.num_docs != self._n:
            raise IndexFormatError(f"{self.root}: tantivy holds {self.searcher.num_docs} documents, "
                                   f"meta.json says {self._n}")
        self._phrase = tantivy.Query.phrase_query

    @property
    def num_docs(self) -> int:
        return self._n

    def rows(self, terms: Sequence[str]) -> np.ndarray:
        """Rows (ascending) whose analysed tokens hold ``terms`` (two or more) consecutively."""
        query = self._phrase(self.schema, FIELD, list(terms))
        hits = self.searcher.search(query, limit=max(1, self._n), count=False).hits
        if not hits:
            return np.zeros(0, dtype=np.int64)
        rows = np.asarray(self.searcher.fast_field_values("row", [addr for _, addr in hits]), dtype=np.int64)
        rows.sort()
        return rows
