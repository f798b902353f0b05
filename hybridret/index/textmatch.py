"""Full-text filter matching in one segment: which rows' text holds analysed words or phrases.

A ``$text`` filter (:mod:`hybridret.filters`) names *terms*: each word or phrase is analysed by the
BM25 analyzer (:func:`~.analysis.bm25_analyzer`: split on non-alphanumerics, tokens over 40 bytes
dropped, lowercased, English stop words removed, stemmed), the same one that built the segment's
BM25 postings from each document's ``full_text`` (title and text). A row holds a sequence of terms
when the analysed tokens of its text contain them *consecutively* (one term: anywhere).

How (chosen by ``benchmarks/text_filter.py``, figures in docs/filters.md):

* **one term**: the rows of its postings in the BM25 part (exact: the same tokens of the same text;
  faster than any tantivy query, most of all for common words and ``none``);
* **several terms** (a phrase): one phrase query to the segment's ``phrases`` part
  (:mod:`.phrases`: tantivy with positions over the analysed tokens). A segment written before that
  part existed (or with ``phrase_index=False``) takes the rows holding every term (postings
  intersected, rarest first) and analyses each candidate's stored text again, exact as well but
  slower in proportion to the candidates; ``compact`` (rewriting every segment) gives it the part. The result
  is kept per phrase (:data:`CACHE_PHRASES` most recent), the segment never changing;
* **no BM25 part** (an index built with ``bm25=False``, or a legacy tantivy-only one): every stored
  text is analysed once, on the first ``$text`` filter, into postings kept for the segment's life.

A segment without stored texts (``store_text=False``) answers words from its postings, and refuses
phrases with a :class:`~hybridret.filters.FilterError` naming the filter's field; one with neither
stored texts nor a BM25 part refuses every ``$text`` condition. Nothing is ever ignored.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import TextUnavailable
from ._once import Once

__all__ = ["CACHE_PHRASES", "TextMatcher", "TextUnavailable", "full_text", "holds_sequence"]

logger = logging.getLogger(__name__)

CACHE_PHRASES = 256  # phrase results kept per segment (rows as int32: small next to a mask)


def full_text(title: str, text: str) -> str:
    """The text BM25 analysed for a row: ``Document.full_text`` (title, a space, text; stripped)."""
    title = title.strip()
    return f"{title} {text.strip()}".strip() if title else text.strip()


def holds_sequence(tokens: Sequence[str], terms: Sequence[str]) -> bool:
    """Whether ``terms`` occur in ``tokens`` consecutively (``terms`` non-empty)."""
    m = len(terms)
    first = terms[0]
    for i in range(len(tokens) - m + 1):
        if tokens[i] == first and list(tokens[i:i + m]) == list(terms):
            return True
    return False


class TextMatcher:
    """Answers "which rows hold these terms consecutively" for one opened segment (thread-safe)."""

    def __init__(self, segment: Any) -> None:
        from .bm25 import BM25Store
        from .phrases import PhraseIndex

        self.segment = segment
        self.n = int(segment.num_docs)
        stores = [p for p in segment.parts.values() if isinstance(p, BM25Store)]
        self.store: BM25Store | None = stores[0] if stores else None
        positional = [p for p in segment.parts.values() if isinstance(p, PhraseIndex)]
        self.positions: PhraseIndex | None = positional[0] if positional else None
        self.has_text = bool(segment.docs.has_text)
        self._own: Once[tuple[dict[str, int], list[np.ndarray]]] = Once()  # postings made from texts
        self._phrases: OrderedDict[tuple[str, ...], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.analyzer: Any = None

    # -- postings ---------------------------------------------------------------------------------
    def _analyze(self, row: int) -> list[str]:
        if self.analyzer is None:
            from .analysis import bm25_analyzer

            self.analyzer = bm25_analyzer()
        text = full_text(*self.segment.docs.get(row))
        return list(self.analyzer.analyze(text)) if text else []

    def _own_postings(self) -> tuple[dict[str, int], list[np.ndarray]]:
        logger.info("%s: no BM25 part; analysing its %d stored texts for $text filters", self.segment.root, self.n)
        vocab: dict[str, int] = {}
        lists: list[list[int]] = []
        for row in range(self.n):
            for tok in set(self._analyze(row)):
                t = vocab.setdefault(tok, len(vocab))
                if t == len(lists):
                    lists.append([])
                lists[t].append(row)
        return vocab, [np.asarray(rows, dtype=np.int64) for rows in lists]

    def postings(self, term: str) -> np.ndarray:
        """Rows (ascending) whose text holds the analysed term ``term``."""
        if self.store is not None:
            t = self.store.vocab.get(term)
            if t is None:
                return np.zeros(0, dtype=np.int64)
            return np.asarray(self.store.docs[self.store.indptr[t]:self.store.indptr[t + 1]], dtype=np.int64)
        if not self.has_text:
            raise TextUnavailable(f"segment {self.segment.name} has neither a BM25 part nor stored texts, so no "
                                  "full-text condition can be checked; rebuild the index with bm25=True or "
                                  "store_text=True")
        vocab, lists = self._own.get(self._own_postings)
        t = vocab.get(term)
        return lists[t] if t is not None else np.zeros(0, dtype=np.int64)

    # -- masks ------------------------------------------------------------------------------------
    def rows(self, terms: tuple[str, ...]) -> np.ndarray:
        """Rows (ascending) holding ``terms`` consecutively."""
        if len(terms) == 1:
            return self.postings(terms[0])
        with self._lock:
            hit = self._phrases.get(terms)
            if hit is not None:
                self._phrases.move_to_end(terms)
                return hit
        if self.positions is not None:
            return self._keep(terms, self.positions.rows(terms))
        lists = sorted((self.postings(t) for t in set(terms)), key=len)
        cand = lists[0]
        for other in lists[1:]:
            if not len(cand):
                break
            cand = np.intersect1d(cand, other, assume_unique=True)
        if len(cand) and not self.has_text:
            raise TextUnavailable(f"segment {self.segment.name} stores no texts (indexed with store_text=False), "
                                  "so a phrase (several terms in a row) cannot be checked; use single words, or "
                                  "rebuild the index with store_text=True")
        found = np.asarray([r for r in cand.tolist() if holds_sequence(self._analyze(r), terms)], dtype=np.int64)
        return self._keep(terms, found)

    def _keep(self, terms: tuple[str, ...], found: np.ndarray) -> np.ndarray:
        with self._lock:
            self._phrases[terms] = found
            while len(self._phrases) > CACHE_PHRASES:
                self._phrases.popitem(last=False)
        return found

    def mask(self, terms: tuple[str, ...]) -> np.ndarray:
        """Boolean mask over the segment's rows: ``True`` where the text holds ``terms`` consecutively."""
        out = np.zeros(self.n, dtype=bool)
        out[self.rows(terms)] = True
        return out
