"""Indexes: FAISS dense vectors, tantivy learned-sparse + BM25, document store, manifest."""

from .dense import DenseIndex
from .sparse import SparseIndex

__all__ = ["DenseIndex", "SparseIndex"]
