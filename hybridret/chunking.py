"""Chunking: long documents cut into passages the encoders read whole, with ids and offsets.

A :class:`Chunker` splits a document's text into chunks of at most ``tokens`` tokens of the dense
model's tokenizer (the first the encoder lists), preferring to cut at a paragraph (blank line),
then at a line or sentence end, then between words, and only inside a word when a word alone is
longer than a chunk. Each chunk also fits every other model the document goes through (the
learned-sparse one): a chunk whose title + text + special tokens would exceed any model's
``max_length`` is cut again, so no chunk is ever truncated by an encoder.

Up to ``overlap`` tokens of the end of one chunk are repeated at the start of the next: from a
sentence start if one lies in the first half of that stretch, else from the first word start in it
(none when a single word is longer than the overlap). Chunks are at least a quarter of ``tokens`` long unless the
document ends first (a heading is kept with what follows it).

Every chunk of document ``D`` is a document of its own, ``D#0``, ``D#1``, ... (a document short
enough is one chunk, ``D#0``, so ids do not change when it grows), with the parent's title and
metadata plus four reserved fields: ``parent_id`` (``D``), ``chunk`` (its number), ``start`` and
``end`` (character offsets into the parent's text: ``chunk.text == parent.text[start:end]``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .data import Document
from .errors import ConfigError, CorpusFormatError
from .index.metadata import MetadataError, check_metadata

__all__ = ["CHUNK_FIELDS", "Chunker", "ChunkSpec", "chunk_id"]

logger = logging.getLogger(__name__)

CHUNK_FIELDS = ("parent_id", "chunk", "start", "end")  # set on every chunk; reserved in its parent
_MIN_TOKENS = 8
_SENTENCE_END = ".!?;:…。！？"


def chunk_id(parent_id: str, i: int) -> str:
    """The id of chunk ``i`` of document ``parent_id``: ``"parent_id#i"``."""
    return f"{parent_id}#{i}"


@dataclass(frozen=True)
class ChunkSpec:
    """What an index records of its chunking (``manifest["chunking"]``), so that later writes cut
    documents the same way."""

    tokens: int
    overlap: int = 0

    def __post_init__(self) -> None:
        for name, v in (("chunk_tokens", self.tokens), ("chunk_overlap", self.overlap)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{name} must be an integer, got {v!r}")
        if self.tokens < _MIN_TOKENS:
            raise ConfigError(f"chunk_tokens must be at least {_MIN_TOKENS}, got {self.tokens}")
        if not 0 <= self.overlap <= self.tokens // 2:
            raise ConfigError(f"chunk_overlap must be between 0 and half of chunk_tokens ({self.tokens // 2}), "
                              f"got {self.overlap}")

    def to_dict(self) -> dict[str, int]:
        return {"tokens": self.tokens, "overlap": self.overlap}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChunkSpec:
        return cls(int(d["tokens"]), int(d.get("overlap", 0)))


class _Counter:
    """One model's tokenizer (a private copy of the fast tokenizer: thread-safe, never truncating)
    with how many tokens of text it reads: ``max_length`` less its special tokens and prefix."""

    def __init__(self, tokenizer: Any, max_length: int, prefix: str) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ConfigError(f"chunking needs a fast (Rust) tokenizer; {type(tokenizer).__name__} has none")
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(backend.to_str())
        self.tok.no_truncation()
        self.tok.no_padding()
        self.max_length = int(max_length)
        self.prefix = prefix
        self.name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return [o for o in self.tok.encode(text, add_special_tokens=False).offsets if o[1] > o[0]]

    def length(self, text: str) -> int:
        """Tokens the model reads for ``text``, special tokens and the prefix included."""
        return len(self.tok.encode(self.prefix + text, add_special_tokens=True).ids)


class Chunker:
    """Cut documents into chunks of at most ``tokens`` tokens (``overlap`` repeated between
    neighbours), measured on the tokenizers of ``encoder`` (its :meth:`document_tokenizers`; the
    first one, the dense model's, places the cuts) or on ``tokenizers``: ``(tokenizer,
    max_length, prefix)`` triples. ``tokens`` above what a model reads raises :class:`ConfigError`.

    >>> chunker = Chunker(200, 40, encoder=retriever.encoder)
    >>> [c.id for c in chunker.chunk(Document("report", long_text))]
    ['report#0', 'report#1', 'report#2']
    """

    def __init__(self, tokens: int, overlap: int = 0, *, encoder: Any = None,
                 tokenizers: Sequence[tuple[Any, int, str]] | None = None) -> None:
        self.spec = ChunkSpec(tokens, overlap)
        if tokenizers is None:
            if encoder is None:
                raise ConfigError("Chunker needs the encoder (or tokenizers=) to count tokens")
            tokenizers = encoder.document_tokenizers()
        if not tokenizers:
            raise ConfigError("this encoder exposes no tokenizer, which chunking needs to count tokens; "
                              "pass Chunker(..., tokenizers=[(tokenizer, max_length, prefix)])")
        self.counters = [_Counter(*t) for t in tokenizers]
        room = min(c.max_length - c.length("") for c in self.counters)
        if self.spec.tokens > room:
            limits = ", ".join(f"{c.name}: {c.max_length} tokens" for c in self.counters)
            raise ConfigError(f"chunk_tokens={self.spec.tokens} is more than the encoder reads ({limits}, less "
                              f"special tokens and prefixes: at most {room} tokens of text); use at most {room}")

    @property
    def tokens(self) -> int:
        return self.spec.tokens

    @property
    def overlap(self) -> int:
        return self.spec.overlap

    # -- spans ---------------------------------------------------------------------------------
    def spans(self, text: str, title: str = "") -> list[tuple[int, int]]:
        """Character spans ``(start, end)`` of the chunks of ``text`` (``[(0, 0)]`` for a blank one)."""
        offsets = self.counters[0].offsets(text)
        if not offsets:
            return [(0, 0)]
        budget = self._budget(title)
        levels = _levels(text, offsets)
        out: list[tuple[int, int]] = []
        for a, b in self._windows(levels, 0, len(offsets), budget):
            out.extend(self._fit(text, title, offsets, levels, a, b))
        return [(offsets[a][0], offsets[b - 1][1]) for a, b in out]

    def _budget(self, title: str) -> int:
        """Tokens of text a chunk may hold with this title in front of it."""
        if not title.strip():
            return self.spec.tokens
        used = max(c.length(title.strip() + " x") - c.length("x") for c in self.counters)
        budget = min(self.spec.tokens, min(c.max_length - c.length("") for c in self.counters) - used)
        if budget < _MIN_TOKENS:
            raise CorpusFormatError(f"the title {title[:60]!r} takes {used} tokens, leaving no room for text in a "
                                    "chunk; shorten the title", field="title")
        return budget

    def _windows(self, levels: list[int], a: int, b: int, budget: int) -> Iterator[tuple[int, int]]:
        """Token ranges ``[start, end)`` covering ``[a, b)``: each at most ``budget`` tokens, ending at
        the best boundary past a quarter of the budget, the next starting up to ``overlap`` before."""
        start, last = a, a
        overlap = min(self.spec.overlap, budget // 2)
        while start < b:
            limit = start + budget
            if limit >= b:
                yield start, b
                return
            low = max(start + max(1, budget // 4), last + 1)  # each chunk ends past the one before
            end = max(range(low, limit + 1), key=lambda j: (levels[j], j))
            last = end
            yield start, end
            nxt = end
            if overlap:  # a sentence start in the first half of the overlap, else the first word start
                first = max(start + 1, end - overlap)
                words = [j for j in range(first, end) if levels[j] >= 1]
                sentences = [j for j in words if levels[j] >= 2 and j <= end - overlap // 2]
                nxt = sentences[0] if sentences else words[0] if words else end
            start = nxt

    def _fit(self, text: str, title: str, offsets: list[tuple[int, int]], levels: list[int], a: int, b: int
             ) -> list[tuple[int, int]]:
        """``[a, b)`` if every model reads it whole, else it cut again with a smaller budget."""
        body = text[offsets[a][0]:offsets[b - 1][1]]
        full = f"{title.strip()} {body}".strip() if title.strip() else body
        excess = max(c.length(full) - c.max_length for c in self.counters)
        if excess <= 0 or b - a <= 1:
            if excess > 0:
                raise CorpusFormatError(f"a single token of {body[:40]!r} is longer than a model reads")
            return [(a, b)]
        smaller = max(1, (b - a) - excess - 1)
        out: list[tuple[int, int]] = []
        for x, y in self._windows(levels, a, b, smaller):
            out.extend(self._fit(text, title, offsets, levels, x, y))
        return out

    # -- documents -------------------------------------------------------------------------------
    def chunk(self, doc: Document) -> list[Document]:
        """The chunks of ``doc``: ids ``DOCID#i``, its title, its metadata plus ``parent_id``,
        ``chunk``, ``start`` and ``end``."""
        clash = [f for f in CHUNK_FIELDS if f in doc.metadata]
        if clash:
            raise CorpusFormatError(f"document {doc.id!r}: metadata field {clash[0]!r} is set by chunking (with "
                                    f"{', '.join(CHUNK_FIELDS)}); rename it", field=clash[0])
        out = []
        for i, (s, e) in enumerate(self.spans(doc.text, doc.title)):
            meta = {**doc.metadata, "parent_id": doc.id, "chunk": i, "start": s, "end": e}
            try:
                meta = check_metadata(meta)
            except MetadataError as exc:
                raise CorpusFormatError(f"document {doc.id!r}, chunk {i}: {exc}", field=exc.field) from None
            out.append(Document(id=chunk_id(doc.id, i), text=doc.text[s:e], title=doc.title, metadata=meta))
        return out


def _levels(text: str, offsets: list[tuple[int, int]]) -> list[int]:
    """How good a cut before each token is (index ``len(offsets)``: the end): 3 a paragraph (blank
    line), 2 a line or sentence end, 1 between words, 0 inside a word."""
    n = len(offsets)
    levels = [0] * (n + 1)
    levels[0] = levels[n] = 4
    for i in range(1, n):
        gap = text[offsets[i - 1][1]:offsets[i][0]]
        if not gap:
            continue
        if gap.count("\n") >= 2:
            levels[i] = 3
        elif "\n" in gap or (text[offsets[i - 1][1] - 1] in _SENTENCE_END and gap.isspace()):
            levels[i] = 2
        elif gap.isspace() or gap.strip():
            levels[i] = 1
    return levels
