"""hybridret: hybrid dense + learned-sparse retrieval with exact scores and query-time fusion.

Mental model: encode -> index -> search -> save/load::

    from hybridret import HybridRetriever
    retriever = HybridRetriever.from_models()       # packaged all-MiniLM-L6-v2 + SPLADE-tiny
    retriever.index(documents)                      # dicts, Documents, (id, text) pairs or str
    hits = retriever.search(["a question"], k=10)   # hybrid; also "dense", "sparse", "bm25"
    retriever.upsert(more); retriever.delete(ids)   # a living index: atomic commits, snapshots
    retriever.save("indexes/mine")
"""

import logging

from ._version import __version__
from .chunking import Chunker
from .data import CorpusReader, Document, iter_corpus, load_beir, load_qrels, load_queries
from .encoders import DenseEncoder, EncodedBatch, Encoder, JointEncoder, PairedEncoder, SpladeEncoder
from .errors import (
    ConfigError,
    CorpusFormatError,
    DocumentNotFoundError,
    EncoderError,
    HybridRetError,
    IndexExistsError,
    IndexFormatError,
    IndexLockedError,
    IndexNotFoundError,
    IndexReadOnlyError,
    MissingDependencyError,
    ModelNotFoundError,
)
from .filters import Filter, FilterError, parse_filter
from .index import DenseIndex, SparseIndex
from .indexer import IndexWriter, WriteResult
from .irds import load_ir_dataset
from .models import resolve_model
from .retriever import METHODS, HybridRetriever
from .runs import load_run, write_run
from .search.rerank import CrossEncoderReranker, Reranker
from .search.searcher import Searcher
from .types import Group, Hit, Hits, MatchedTerm, Snippet

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "METHODS",
    "Chunker",
    "ConfigError",
    "CorpusFormatError",
    "CorpusReader",
    "CrossEncoderReranker",
    "DenseEncoder",
    "DenseIndex",
    "Document",
    "DocumentNotFoundError",
    "EncodedBatch",
    "Encoder",
    "EncoderError",
    "Filter",
    "FilterError",
    "Group",
    "Hit",
    "Hits",
    "HybridRetError",
    "HybridRetriever",
    "IndexExistsError",
    "IndexFormatError",
    "IndexLockedError",
    "IndexNotFoundError",
    "IndexReadOnlyError",
    "IndexWriter",
    "JointEncoder",
    "MatchedTerm",
    "MissingDependencyError",
    "ModelNotFoundError",
    "PairedEncoder",
    "Reranker",
    "Searcher",
    "Snippet",
    "SparseIndex",
    "SpladeEncoder",
    "WriteResult",
    "__version__",
    "iter_corpus",
    "load_beir",
    "load_ir_dataset",
    "load_qrels",
    "load_queries",
    "load_run",
    "parse_filter",
    "resolve_model",
    "write_run",
]
