"""An encoder with neither head, shared by the BM25 tests: the index then holds only texts and BM25."""

from hybridret.encoders.base import EncodedBatch, Encoder


class TextOnly(Encoder):
    """No dense and no sparse vectors: every document is indexed for BM25 only."""

    def encode_queries(self, texts, *, batch_size=None, show_progress=None):
        return EncodedBatch()

    def encode_documents(self, texts, *, batch_size=None, show_progress=None):
        return EncodedBatch()

    def config(self):
        return {"type": "text-only"}
