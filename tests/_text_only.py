"""An encoder with neither head, shared by the BM25 tests: the index then holds only texts and BM25."""

from pathlib import Path

import numpy as np

from hybridret import IndexWriter
from hybridret.encoders.base import EncodedBatch, Encoder


class TextOnly(Encoder):
    """No dense and no sparse vectors: every document is indexed for BM25 only."""

    def encode_queries(self, texts, *, batch_size=None, show_progress=None):
        return EncodedBatch()

    def encode_documents(self, texts, *, batch_size=None, show_progress=None):
        return EncodedBatch()

    def config(self):
        return {"type": "text-only"}


def build(path: Path, docs: list[dict], parts: int = 1, delete: tuple[str, ...] | list[str] = (),
          scheme: str = "tfgrid") -> Path:
    """A text-only index of ``docs`` written as ``parts`` segments (no automatic merges), then
    ``delete`` tombstoned."""
    cuts = np.linspace(0, len(docs), parts + 1).astype(int)
    for j in range(parts):
        with IndexWriter(path, encoder=TextOnly(), settings={"max_segments": 0, "sparse_scheme": scheme}) as w:
            w.write(docs[cuts[j]:cuts[j + 1]], mode="build" if j == 0 else "add")
    if delete:
        with IndexWriter(path, encoder=TextOnly()) as w:
            w.delete(list(delete))
    return path
