"""The one text analyzer of the project: what BM25 indexes and searches with, and what ``$text``
filters match (tantivy's simple tokenizer, tokens over 40 bytes dropped, lowercase, English stop
words removed, English stemming). Kept apart from the tantivy plumbing of :mod:`._tantivy` so that
the filter parser (:mod:`hybridret.filters`, below the index layer) can analyse a filter's words."""

from __future__ import annotations

from typing import Any

__all__ = ["BM25_TOKENIZER", "bm25_analyzer"]

BM25_TOKENIZER = "hybridret_en"


def bm25_analyzer() -> Any:
    """A new ``tantivy.TextAnalyzer``; ``analyze(text)`` gives the token list (positions implicit)."""
    import tantivy

    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stopword("english"))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )
