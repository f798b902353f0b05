"""Resumable builds: encoded chunks cached on disk are reused after an interruption."""

from __future__ import annotations

import numpy as np
import pytest

from hybridret import HybridRetriever
from hybridret.encoders import EncodingCache
from hybridret.errors import ConfigError


class Interrupt(Exception):
    pass


def _stream(docs, stop_after=None):
    for i, d in enumerate(docs):
        if stop_after is not None and i == stop_after:
            raise Interrupt
        yield d


class CountingEncoder:
    """Wraps the real encoder and counts the documents it actually encodes."""

    def __init__(self, inner):
        self.inner, self.encoded = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode_documents(self, texts, **kw):
        self.encoded += len(texts)
        return self.inner.encode_documents(texts, **kw)


def test_interrupted_build_resumes_from_cache(paired_encoder, small_corpus, tmp_path):
    cache = tmp_path / "cache"
    enc = CountingEncoder(paired_encoder)
    r = HybridRetriever(encoder=enc)
    with pytest.raises(Interrupt):
        r.index(_stream(small_corpus, stop_after=25), chunk_size=8, encode_cache=cache, workdir=tmp_path / "a")
    assert enc.encoded == 24  # three full chunks were encoded and cached before the interruption
    assert len(list(cache.glob("chunk-*.npz"))) == 3
    enc.encoded = 0
    r.index(_stream(small_corpus), chunk_size=8, encode_cache=cache, workdir=tmp_path / "a")
    assert enc.encoded == len(small_corpus) - 24  # only the missing chunks
    fresh = HybridRetriever(encoder=paired_encoder).index(small_corpus, chunk_size=8, workdir=tmp_path / "b")
    queries = ["what causes tides", "python programming language"]
    for method in ("dense", "sparse", "hybrid"):
        a, b = r.search(queries, k=5, method=method), fresh.search(queries, k=5, method=method)
        np.testing.assert_array_equal(a.rows, b.rows)
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5)


def test_changed_corpus_is_reencoded(paired_encoder, small_corpus, tmp_path):
    cache = tmp_path / "cache"
    HybridRetriever(encoder=paired_encoder).index(small_corpus[:16], chunk_size=8, encode_cache=cache)
    enc = CountingEncoder(paired_encoder)
    changed = [dict(d, id=d["id"] + "-v2") if i >= 8 else d for i, d in enumerate(small_corpus[:16])]
    HybridRetriever(encoder=enc).index(changed, chunk_size=8, encode_cache=cache)
    assert enc.encoded == 8  # the first chunk is the same; the second holds other ids


def test_cache_from_other_settings_is_refused(paired_encoder, small_corpus, tmp_path):
    cache = tmp_path / "cache"
    HybridRetriever(encoder=paired_encoder).index(small_corpus[:8], chunk_size=8, encode_cache=cache)
    with pytest.raises(ConfigError, match="chunk size"):
        HybridRetriever(encoder=paired_encoder).index(small_corpus[:8], chunk_size=4, encode_cache=cache)
    with pytest.raises(ConfigError, match="another encoder"):
        EncodingCache(cache, {"type": "other"}, 8)
