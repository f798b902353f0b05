"""Index storage: segments of named parts (FAISS dense vectors, learned-sparse terms, BM25 postings)."""

from .bm25 import BM25Store
from .dense import DenseIndex
from .learned import LearnedIndex
from .legacy.sparse import SparseIndex

__all__ = ["BM25Store", "DenseIndex", "LearnedIndex", "SparseIndex"]
