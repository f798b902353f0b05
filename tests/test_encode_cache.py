"""The content-keyed encoding cache: resumed builds, rebuilds and changed texts."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hybridret import HybridRetriever
from hybridret.encoders import EncodingCache
from hybridret.encoders.cache import content_key


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


QUERIES = ["what causes tides", "python programming language"]


def _same(a, b):
    for method in ("dense", "sparse", "hybrid"):
        x, y = a.search(QUERIES, k=5, method=method), b.search(QUERIES, k=5, method=method)
        np.testing.assert_array_equal(x.ids, y.ids)
        np.testing.assert_allclose(x.scores, y.scores, rtol=1e-5)


def test_interrupted_build_resumes_from_cache(paired_encoder, small_corpus, tmp_path):
    cache = tmp_path / "cache"
    enc = CountingEncoder(paired_encoder)
    r = HybridRetriever(encoder=enc)
    with pytest.raises(Interrupt):
        r.index(_stream(small_corpus, stop_after=25), chunk_size=8, encode_cache=cache, workdir=tmp_path / "a")
    assert enc.encoded == 24  # three full chunks were encoded and cached before the interruption
    assert not (tmp_path / "a" / "manifest.json").exists()  # nothing was committed
    enc.encoded = 0
    r.index(_stream(small_corpus), chunk_size=8, encode_cache=cache, workdir=tmp_path / "a")
    assert enc.encoded == len(small_corpus) - 24  # only the documents that are missing
    fresh = HybridRetriever(encoder=paired_encoder).index(small_corpus, chunk_size=8, workdir=tmp_path / "b")
    _same(r, fresh)


def test_any_order_or_chunking_reuses_everything(paired_encoder, small_corpus, tmp_path):
    cache = tmp_path / "cache"
    HybridRetriever(encoder=paired_encoder).index(small_corpus, chunk_size=8, encode_cache=cache)
    enc = CountingEncoder(paired_encoder)
    shuffled = list(small_corpus)
    random.Random(0).shuffle(shuffled)
    HybridRetriever(encoder=enc).index(shuffled, chunk_size=5, encode_cache=cache)
    assert enc.encoded == 0


def test_changed_text_under_the_same_id_is_reencoded(paired_encoder, small_corpus, tmp_path):
    """The bug this cache replaced: keyed on ids, a changed text got its old vectors back."""
    cache = tmp_path / "cache"
    HybridRetriever(encoder=paired_encoder).index(small_corpus[:16], chunk_size=8, encode_cache=cache)
    changed = [dict(d, title="Basalt", text="Volcanic lava flows cool into basalt rock.") if d["id"] == "d03" else d
               for d in small_corpus[:16]]
    enc = CountingEncoder(paired_encoder)
    r = HybridRetriever(encoder=enc).index(changed, chunk_size=8, encode_cache=cache)
    assert enc.encoded == 1
    for method in ("dense", "sparse"):
        assert r.search("basalt lava", k=1, method=method).ids[0, 0] == "d03"
        assert r.search("python programming language", k=1, method=method).ids[0, 0] != "d03"


def test_keys_include_the_encoder(paired_encoder, small_corpus, tmp_path):
    cache = tmp_path / "cache"
    HybridRetriever(encoder=paired_encoder).index(small_corpus[:8], encode_cache=cache)
    other = EncodingCache(cache, {"type": "other"})
    found, _ = other.get(other.keys([d["title"] + " " + d["text"] for d in small_corpus[:8]]))
    assert found == []  # one folder may hold several encoders' vectors, never mixed
    mine = EncodingCache(cache, paired_encoder.config())
    found, rows = mine.get(mine.keys([small_corpus[0]["title"] + " " + small_corpus[0]["text"]]))
    assert found == [0] and rows[0]["dense"].shape == (paired_encoder.dense_dim,) and rows[0]["sparse"].shape[0] == 1
    assert content_key({"a": 1}, "x") != content_key({"a": 2}, "x") != content_key({"a": 1}, "y")
