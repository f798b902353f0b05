"""Snippets and the matched-term view, decided at the level of words (never word pieces).

A word is a run of letters and digits (as BM25's tokenizer splits text); two words *match* when
BM25's analyzer (lowercase, English stop words, English stemmer) gives them a common token, so
``"Stars"`` matches the query word ``"star"`` and ``"the"`` matches nothing.

* :func:`make_snippets`: the best window(s) of ``words`` words of a hit's text, ranked by how many
  distinct query words they hold (then by how many matches), with every matched word's span.
* :func:`literal_terms`: which learned-sparse terms of a hit occur in its text as words (the
  others are *expansions*): a vocabulary term such as ``"star"`` is literal when some word of the
  text matches it (``"Stars"`` does); a word piece that is not a word start (``"##s"``) or holds no
  letter or digit is literal when the text's own word pieces hold it.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from ..types import MatchedTerm, Snippet

__all__ = ["DEFAULT_SNIPPET_WORDS", "EXPANSION_FLOOR", "Snippet", "WordMatcher", "literal_terms", "make_snippets",
           "shown_expansions"]

WORD = re.compile(r"[^\W_]+", re.UNICODE)
DEFAULT_SNIPPET_WORDS = 32
EXPANSION_FLOOR = 0.05
"""Expansion terms whose contribution is below this share of the hit's learned-sparse score are not
shown beside a hit (the CLI and the search page count them instead): see :func:`shown_expansions`."""
_PIECE_MARKS = ("##", "\u2581", "\u0120")  # WordPiece continuation, SentencePiece / byte-level BPE word starts


class WordMatcher:
    """Analyses words with BM25's analyzer (one per thread), remembering the words it has seen."""

    def __init__(self, limit: int = 200_000) -> None:
        self._local = threading.local()
        self._cache: dict[str, tuple[str, ...]] = {}
        self._limit = limit

    def _analyzer(self) -> Any:
        a = getattr(self._local, "analyzer", None)
        if a is None:
            from ..index._tantivy import bm25_analyzer

            a = self._local.analyzer = bm25_analyzer()
        return a

    def tokens(self, word: str) -> tuple[str, ...]:
        """The analysed tokens of one word (empty for a stop word)."""
        got = self._cache.get(word)
        if got is None:
            got = tuple(self._analyzer().analyze(word))
            if len(self._cache) >= self._limit:
                self._cache.clear()
            self._cache[word] = got
        return got

    def stems(self, text: str) -> set[str]:
        """Every analysed token of the words of ``text``."""
        out: set[str] = set()
        for m in WORD.finditer(text):
            out.update(self.tokens(m.group()))
        return out


def make_snippets(text: str, stems: Iterable[str], matcher: WordMatcher, *, words: int = DEFAULT_SNIPPET_WORDS,
                  count: int = 1) -> list[Snippet]:
    """Up to ``count`` non-overlapping windows of ``words`` words of ``text``, best first: the most
    distinct matched words (``stems`` are the analysed query words), then the most matches, then
    the earliest. Windows without a match are returned only when no window has one (then the
    text's opening words)."""
    if not text or words < 1 or count < 1:
        return []
    want = set(stems)
    spans = [(m.start(), m.end()) for m in WORD.finditer(text)]
    if not spans:
        return []
    hit = [bool(want) and bool(want.intersection(matcher.tokens(text[a:b]))) for a, b in spans]
    keys = [next(iter(want.intersection(matcher.tokens(text[a:b]))), None) if h else None
            for (a, b), h in zip(spans, hit)]
    n, w = len(spans), min(words, len(spans))
    taken = [False] * n
    out: list[Snippet] = []
    for _ in range(count):
        best, best_at = None, -1
        seen: Counter[str] = Counter()
        total = 0
        for j in range(n):  # slide the window [j - w + 1, j]
            if keys[j] is not None:
                seen[keys[j]] += 1
                total += 1
            drop = j - w
            if drop >= 0 and keys[drop] is not None:
                seen[keys[drop]] -= 1
                total -= 1
                if not seen[keys[drop]]:
                    del seen[keys[drop]]
            start = j - w + 1
            if start < 0 or any(taken[start:j + 1]):
                continue
            score = (len(seen), total)
            if best is None or score > best:
                best, best_at = score, start
        if best_at < 0 or (best is not None and best[0] == 0 and out):
            break
        for j in range(best_at, best_at + w):
            taken[j] = True
        a, b = spans[best_at][0], spans[best_at + w - 1][1]
        lit = tuple((s - a, e - a) for (s, e), h in zip(spans[best_at:best_at + w], hit[best_at:best_at + w]) if h)
        out.append(Snippet(text=text[a:b], start=a, end=b, highlights=lit))
        if best is not None and best[0] == 0:
            break
    return out


def _bare(term: str) -> str | None:
    """A vocabulary term as a word (``None`` for a word piece that does not start a word)."""
    if term.startswith("##"):
        return None
    for mark in _PIECE_MARKS[1:]:
        if term.startswith(mark):
            term = term[len(mark):]
    return term if WORD.fullmatch(term) else None


def literal_terms(terms: Sequence[str], text: str, matcher: WordMatcher, piece_ids: Any,
                  term_ids: Sequence[int]) -> list[bool]:
    """Per vocabulary term, whether it occurs in ``text`` at word level (see the module docstring);
    ``piece_ids()`` gives the text's own word-piece ids (asked only for pieces that are not words)."""
    text_stems: set[str] | None = None
    words_lower: set[str] | None = None
    pieces: set[int] | None = None
    out = []
    for term, tid in zip(terms, term_ids):
        bare = _bare(term)
        if bare is None:
            if pieces is None:
                pieces = set(piece_ids())
            out.append(int(tid) in pieces)
            continue
        toks = matcher.tokens(bare)
        if toks:
            if text_stems is None:
                text_stems = matcher.stems(text)
            out.append(bool(text_stems.intersection(toks)))
        else:  # a stop word: literal when the text holds the word itself
            if words_lower is None:
                words_lower = {m.group().lower() for m in WORD.finditer(text)}
            out.append(bare.lower() in words_lower)
    return out


def matched_view(enc: Any, q: Any, indices: Any, data: Any, text: str, matcher: WordMatcher) -> list[Any]:
    """The learned-sparse terms shared by query row ``q`` (CSR) and a document vector
    (``indices``, ``data``), heaviest contribution first, each marked literal or expansion at word
    level (:func:`literal_terms`)."""
    import numpy as np

    shared, qi, di = np.intersect1d(q.indices, indices, assume_unique=True, return_indices=True)
    if not len(shared):
        return []
    vocab = enc.vocab or []
    names = [vocab[t] for t in shared.tolist()]
    literal = literal_terms(names, text, matcher, lambda: enc.text_term_ids(text) if text else set(), shared.tolist())
    terms = [MatchedTerm(term=name, query_weight=float(q.data[a]), doc_weight=float(data[b]), expansion=not lit)
             for name, a, b, lit in zip(names, qi, di, literal)]
    terms.sort(key=lambda m: -m.contribution)
    return terms


def shown_expansions(terms: Sequence[MatchedTerm], floor: float = EXPANSION_FLOOR
                     ) -> tuple[list[MatchedTerm], list[MatchedTerm]]:
    """The expansion terms of a hit worth showing and those under the floor, each list by contribution
    (query weight x document weight), heaviest first. A term is shown when its contribution is at least
    ``floor`` (5%) of the hit's learned-sparse score, the sum of every matched term's contribution
    (literal ones included): an expansion that adds 1% of the score says little about why the hit ranks
    where it does, and odd ones (``phone`` on an IPv4 question) are usually such."""
    total = sum(m.contribution for m in terms)
    exp = sorted((m for m in terms if m.expansion), key=lambda m: -m.contribution)
    keep = [m for m in exp if total > 0 and m.contribution >= floor * total]
    return keep, exp[len(keep):]


def hit_snippets(query: str, text: str, matched: Sequence[Any], matcher: WordMatcher) -> list[Snippet]:
    """A hit's snippet: the best window of its text for the query's words and the learned-sparse
    terms it holds literally."""
    stems = matcher.stems(query)
    for m in matched:
        if not m.expansion:
            bare = _bare(m.term)
            if bare is not None:
                stems.update(matcher.tokens(bare))
    return make_snippets(text, stems, matcher)
