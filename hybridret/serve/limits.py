"""Per-request work limits of the server's writes, checked before anything is encoded.

A request's body is bounded in bytes (``max_body_bytes``, before it is read), and its documents in
the work they make: the rows written (``max_request_chunks``: chunks in an index of chunks, else
documents) and the tokens the encoder reads (``max_request_tokens``). :func:`check_work` counts them
cheaply and refuses a request over either limit with a :class:`~hybridret.errors.WorkLimitError`
(HTTP 413) that names the limit, the count and how to raise it:

* in an index without chunking, a document is one row, and the encoder reads at most ``max_length``
  tokens of it: its tokens are counted as ``min(characters + 2, max_length)`` (a WordPiece or BPE
  token covers at least one character), no tokenizer needed;
* in an index of chunks, a document's tokens are counted with the dense model's tokenizer, a slice
  at a time, stopping as soon as the request is over the limit (so a 50 MB document costs a few
  slices, not a full tokenization); its chunks are estimated as
  ``ceil((tokens - overlap) / (chunk_tokens - overlap))`` (the chunker may cut a few more, at
  paragraph breaks).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import WorkLimitError

__all__ = ["DEFAULT_MAX_CHUNKS", "DEFAULT_MAX_TOKENS", "WorkCounter", "check_work"]

DEFAULT_MAX_CHUNKS = 10_000  # as many as the documents a request may hold
DEFAULT_MAX_TOKENS = 1 << 20  # about 4 MB of English text
SLICE_CHARS = 65536


@dataclass
class Work:
    rows: int
    tokens: int
    biggest: str | None  # the document with the most tokens
    biggest_tokens: int


class WorkCounter:
    """Counts the work of documents for one index: its chunking (from the manifest) and the dense
    model's tokenizer (loaded on first use, only for an index of chunks)."""

    def __init__(self, encoder: Any | None, chunking: dict[str, Any] | None) -> None:
        self.encoder = encoder
        self.chunking = chunking
        self._counter: Any = None
        self._lock = threading.Lock()

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._counter is None:
                from ..chunking import _Counter

                tokenizers = self.encoder.document_tokenizers() if self.encoder is not None else []
                self._counter = _Counter(*tokenizers[0]) if tokenizers else False
            return self._counter

    def max_length(self) -> int | None:
        if self.encoder is None:
            return None
        lengths = [int(t[1]) for t in self.encoder.document_tokenizers()] or [0]
        return max(lengths) or None

    def count(self, docs: Sequence[Any], budget: int) -> Work:
        """Rows and tokens of ``docs`` (each with ``id``, ``text`` and ``title``); counting stops
        once ``budget`` tokens are passed (the counts are then at least that)."""
        work = Work(0, 0, None, 0)
        chunked = bool(self.chunking)
        limit = None if chunked else self.max_length()
        for d in docs:
            text = f"{d.title}\n{d.text}" if d.title else d.text
            if not text.strip():
                continue
            if chunked:
                tokens = self._tokens(text, budget - work.tokens + 1)
                size, overlap = int(self.chunking["tokens"]), int(self.chunking.get("overlap", 0))
                rows = max(1, math.ceil(max(tokens - overlap, 1) / max(size - overlap, 1)))
            else:
                tokens = len(text) + 2 if limit is None else min(len(text) + 2, limit)
                rows = 1
            work.rows += rows
            work.tokens += tokens
            if tokens > work.biggest_tokens:
                work.biggest, work.biggest_tokens = str(d.id), tokens
            if work.tokens > budget:
                break
        return work

    def _tokens(self, text: str, budget: int) -> int:
        counter = self._tokenizer()
        if not counter:  # no tokenizer exposed: a character is at most a token
            return len(text) + 2
        total, start = 0, 0
        while start < len(text) and total <= budget:
            end = min(len(text), start + SLICE_CHARS)
            if end < len(text):  # cut at a space, so that no word is split between slices
                space = text.rfind(" ", start + SLICE_CHARS // 2, end)
                end = space if space > start else end
            total += len(counter.tok.encode(text[start:end], add_special_tokens=False).ids)
            start = end
        return total + 2


def check_work(counter: WorkCounter, docs: Sequence[Any], *, max_chunks: int, max_tokens: int) -> Work:
    """Refuse ``docs`` (one request's documents) over either limit, naming it; else their work."""
    work = counter.count(docs, max_tokens)
    what = "chunks" if counter.chunking else "documents"
    if work.tokens > max_tokens:
        raise WorkLimitError(
            f"this request holds more than {max_tokens:,} tokens to encode (document {work.biggest!r} alone: at "
            f"least {work.biggest_tokens:,}); the limit is {max_tokens:,} tokens per request (the server's "
            "max_request_tokens: hybridret serve --max-request-tokens N); nothing was written: split the documents "
            "over several requests or into smaller documents, or raise the limit")
    if work.rows > max_chunks:
        raise WorkLimitError(
            f"this request would write about {work.rows:,} {what}; the limit is {max_chunks:,} {what} per request "
            "(the server's max_request_chunks: hybridret serve --max-request-chunks N); nothing was written: split "
            "the documents over several requests, or raise the limit")
    return work
