"""The per-segment BM25 store (index/bm25.py) and the BM25 retriever over it: scores equal to
tantivy's on one index, several segments (or shards) under global statistics equal to one index,
tombstones subtracted exactly, pre-filter masks, empty and stop-word queries, unicode, old
and the numba and numpy paths agreeing bit for bit."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from _text_only import build

from hybridret.index.bm25 import FIELDNORMS, fieldnorm_to_id, id_to_fieldnorm
from hybridret.index.legacy.sparse import SparseIndex
from hybridret.index.snapshot import open_snapshot
from hybridret.retrievers import QueryBatch, score_rows, search_rows
from hybridret.retrievers.bm25 import BM25Retriever, BM25Stats, bm25_tokens, collection_stats

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
WORDS = ("cat dog dogs running runs ran quick brown fox jumps over lazy river bank banks money finance "
         "café naïve été über 東京 straße ünïcödé the a of and is").split()
QUERIES = ["cat dog", "running fox river", "banks money money", "café über 東京", "naïve été quick brown fox jumps",
           "dog", "straße", "unknownword cat", "the of and", "", "Dogs RUNNING!"]
K = 15


def synthetic(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        length = rng.randint(0, 30) if i % 9 else rng.randint(40, 300)  # long ones hit the fieldnorm buckets
        docs.append({"id": f"d{i:04d}", "text": " ".join(rng.choice(WORDS) for _ in range(length)) or "zzz"})
    return docs


def ranked(path: Path, queries: list[str], k: int = K, stats: BM25Stats | None = None) -> list[list[tuple[str, float]]]:
    snap = open_snapshot(path)
    r = BM25Retriever()
    q = QueryBatch(list(queries))
    rows, scores = search_rows(r, snap, q, k, ctx=r.prepare(snap, q, stats=stats))
    return [[(str(snap.ids[rw]), float(s)) for rw, s in zip(rr, ss) if rw >= 0] for rr, ss in zip(rows, scores)]


def assert_same(a, b, rtol=1e-6):
    for x, y in zip(a, b, strict=True):
        assert [i for i, _ in x] == [i for i, _ in y]
        np.testing.assert_allclose([s for _, s in x], [s for _, s in y], rtol=rtol)


def sparse_index(tmp_path: Path, texts: list[str]) -> SparseIndex:
    b = SparseIndex.create(tmp_path / "sparse", 1, scheme="planes")  # format 1: BM25 text in tantivy too
    b.add(sp.csr_matrix((len(texts), 1), dtype=np.float32), texts)
    b.close()
    return SparseIndex(tmp_path / "sparse")


def tantivy_view(tmp_path: Path) -> SparseIndex:
    """The same index read through tantivy's own BM25 path (as a segment without the store)."""
    ix = SparseIndex(tmp_path / "sparse")
    ix.bm25_store = None
    return ix


# ------------------------------------------------------------------------------- pure functions

def test_fieldnorm_table_is_tantivys():
    assert FIELDNORMS[:41].tolist() == list(range(41))
    assert FIELDNORMS[41:50].tolist() == [42, 44, 46, 48, 50, 52, 54, 56, 60]
    assert FIELDNORMS[-1] == 2_013_265_944 and len(FIELDNORMS) == 256 and (np.diff(FIELDNORMS) > 0).all()
    assert fieldnorm_to_id([0, 39, 40, 41, 42, 59, 60, 10**12]).tolist() == [0, 39, 40, 40, 41, 48, 49, 255]
    assert id_to_fieldnorm(fieldnorm_to_id(8216)) == 8216 and id_to_fieldnorm(fieldnorm_to_id(8215)) == 7704


def test_stats_add():
    a = BM25Stats(3, 10, {"x": 1, "y": 2})
    b = BM25Stats(2, 5, {"y": 1, "z": 2})
    assert a + b == BM25Stats(5, 15, {"x": 1, "y": 3, "z": 2}) and (a + b).avgdl == 3.0


# ------------------------------------------------------------------------------- one index vs tantivy

def test_store_scores_equal_tantivy(tmp_path):
    texts = [d["text"] for d in synthetic(400, seed=1)]
    ix = sparse_index(tmp_path, texts)
    tv = tantivy_view(tmp_path)
    rows = np.tile(np.arange(len(texts)), (len(QUERIES), 1))
    want = tv.score_bm25(QUERIES, rows)
    got = ix.score_bm25(QUERIES, rows)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert (want > 0).sum() > 1000
    r_new, s_new = ix.search_bm25(QUERIES, K)
    r_old, s_old = tv.search_bm25(QUERIES, K)
    np.testing.assert_allclose(s_new, s_old, rtol=1e-5)
    for q in range(len(QUERIES)):  # same rows, up to the order tantivy gives equal scores
        assert set(r_new[q][r_new[q] >= 0]) <= set(np.flatnonzero(want[q] >= s_old[q][-1] * (1 - 1e-5))) | {-1}
        valid = r_new[q] >= 0
        np.testing.assert_allclose(got[q, r_new[q][valid]], s_new[q][valid], rtol=1e-6)


def test_empty_and_stopword_queries(tmp_path):
    ix = sparse_index(tmp_path, [d["text"] for d in synthetic(50)])
    rows, scores = ix.search_bm25(["", "the of and", "a"], 5)
    assert (rows == -1).all() and np.isneginf(scores).all()
    assert not ix.score_bm25(["", "the of and"], np.tile(np.arange(50), (2, 1))).any()


def test_numpy_path_equals_numba(tmp_path, monkeypatch):
    pytest.importorskip("numba")
    ix = sparse_index(tmp_path, [d["text"] for d in synthetic(300, seed=2)])
    allowed = np.random.default_rng(0).random(300) < 0.3
    rows = np.random.default_rng(1).integers(-1, 300, size=(len(QUERIES), 50))

    def run():
        return [ix.search_bm25(QUERIES, K), ix.search_bm25(QUERIES, 300, allowed=allowed),
                (rows, ix.score_bm25(QUERIES, rows))]

    got = run()
    monkeypatch.setenv("HYBRIDRET_NUMBA", "0")
    want = run()
    for (r1, s1), (r2, s2) in zip(got, want):
        np.testing.assert_array_equal(r1, r2)
        np.testing.assert_array_equal(s1, s2)
    top, top_s = want[1]  # scoring the rows a search returned gives its scores, bit for bit
    np.testing.assert_array_equal(ix.score_bm25(QUERIES, top), np.where(top >= 0, top_s, 0))


@pytest.mark.parametrize("numba", ["1", "0"])
def test_allowed_mask_is_exact(tmp_path, monkeypatch, numba):
    monkeypatch.setenv("HYBRIDRET_NUMBA", numba)
    n = 300
    ix = sparse_index(tmp_path, [d["text"] for d in synthetic(n, seed=3)])
    full = ix.score_bm25(QUERIES, np.tile(np.arange(n), (len(QUERIES), 1)))
    for share in (0.02, 0.3, 1.0):
        allowed = np.random.default_rng(int(share * 100)).random(n) < share
        rows, scores = ix.search_bm25(QUERIES, K, allowed=allowed)
        for q in range(len(QUERIES)):
            s = np.where(allowed & (full[q] > 0), full[q], -np.inf)
            want = np.lexsort((np.arange(n), -s))[:K]  # best first, ties by row
            want = want[np.isfinite(s[want])]
            assert rows[q, :len(want)].tolist() == want.tolist()
            assert (rows[q, len(want):] == -1).all() and np.isneginf(scores[q, len(want):]).all()
            np.testing.assert_allclose(scores[q, :len(want)], s[want], rtol=1e-6)


# ------------------------------------------------------------------------------- across segments

@pytest.fixture(scope="module")
def docs():
    return synthetic(420, seed=4)


def test_segments_with_global_stats_equal_one_index(tmp_path, docs):
    one = build(tmp_path / "one", docs)
    many = build(tmp_path / "many", docs, parts=5)
    assert len(open_snapshot(many).segments) == 5
    assert_same(ranked(many, QUERIES), ranked(one, QUERIES))
    # and the one-segment index equals tantivy's own BM25 of one tantivy index over every document
    # (a format-1 segment keeps the text in tantivy too)
    tv = sparse_index(tmp_path / "one-v1", [d["text"] for d in docs])
    tv.bm25_store = None
    rows, scores = tv.search_bm25(QUERIES, K)
    for q, hits in enumerate(ranked(one, QUERIES)):
        np.testing.assert_allclose([s for _, s in hits], scores[q][rows[q] >= 0], rtol=1e-5)
    # exact scores of candidates (fusion's path) agree with the search's, across segments
    s2 = open_snapshot(many)
    r = BM25Retriever()
    qb = QueryBatch(QUERIES)
    ctx = r.prepare(s2, qb)
    top, sc = search_rows(r, s2, qb, K, ctx=ctx)
    np.testing.assert_array_equal(score_rows(r, s2, qb, top, ctx=ctx), np.where(top >= 0, sc, 0))


def test_tombstones_are_subtracted(tmp_path, docs):
    dead = [d["id"] for d in docs[::7]] + [d["id"] for d in docs[300:340]]
    living = build(tmp_path / "living", docs, parts=3, delete=dead)
    fresh = build(tmp_path / "fresh", [d for d in docs if d["id"] not in set(dead)])
    assert_same(ranked(living, QUERIES), ranked(fresh, QUERIES))
    toks = [t for q in bm25_tokens(open_snapshot(fresh), QUERIES) for t in q]
    assert collection_stats(open_snapshot(living), toks) == collection_stats(open_snapshot(fresh), toks)


def test_shards_with_summed_stats_equal_one_index(tmp_path, docs):
    one = build(tmp_path / "one", docs)
    shards = [build(tmp_path / "a", docs[:150], parts=2), build(tmp_path / "b", docs[150:])]
    snaps = [open_snapshot(s) for s in shards]
    toks = [t for q in bm25_tokens(snaps[0], QUERIES) for t in q]
    stats = collection_stats(snaps[0], toks) + collection_stats(snaps[1], toks)
    assert stats == collection_stats(open_snapshot(one), toks)
    merged = []
    for q in range(len(QUERIES)):
        hits = ranked(shards[0], QUERIES, stats=stats)[q] + ranked(shards[1], QUERIES, stats=stats)[q]
        merged.append(sorted(hits, key=lambda h: (-h[1], h[0]))[:K])  # ids sort as rows do here
    assert_same(merged, ranked(one, QUERIES))


# (a format-1 segment without the store, searched through tantivy: tests/test_legacy_format.py)


# ------------------------------------------------------------------------------- real data

@pytest.mark.skipif(not (SHARED / "cranfield" / "corpus.jsonl").is_file(), reason="needs /work/shared/data")
def test_real_collection_matches_tantivy(tmp_path):
    corpus = [json.loads(line) for line in (SHARED / "cranfield" / "corpus.jsonl").open()]
    texts = [f"{d.get('title', '')} {d['text']}".strip() for d in corpus]
    queries = [json.loads(line)["text"] for line in (SHARED / "cranfield" / "queries.jsonl").open()][:100]
    ix = sparse_index(tmp_path, texts)
    tv = tantivy_view(tmp_path)
    r_new, s_new = ix.search_bm25(queries, 10)
    r_old, s_old = tv.search_bm25(queries, 10)
    np.testing.assert_allclose(s_new, s_old, rtol=1e-5)
    assert (r_new == r_old).mean() > 0.95  # the rest: equal scores, which tantivy does not order by row
    np.testing.assert_allclose(ix.score_bm25(queries, r_old), tv.score_bm25(queries, r_old), rtol=1e-5)


def test_store_is_safe_under_threads(tmp_path, docs):
    """Many threads, many tombstone sets, one store: nothing is cached on it (statistics are
    computed per call, the retriever keeps them per snapshot), and each thread has its own score
    buffer, so every call gives the single-threaded answer."""
    from concurrent.futures import ThreadPoolExecutor

    store = open_snapshot(build(tmp_path / "t", docs)).segments[0].part("bm25")
    rng = np.random.default_rng(3)
    sets = [np.sort(rng.choice(store.num_docs, 20, replace=False)) for _ in range(40)]
    want = [store.live_stats(d)[:2] for d in sets]
    qs = store.own_queries([q.split() for q in QUERIES])
    avgdls = [store.own_avgdl, store.own_avgdl * 1.25]
    top = [store.search(qs, a, K) for a in avgdls]

    def work(i: int) -> bool:
        ok = store.live_stats(sets[i % 40])[:2] == want[i % 40]
        rows, scores = store.search(qs, avgdls[i % 2], K, threads=1 + i % 3)
        return ok and np.array_equal(rows, top[i % 2][0]) and np.array_equal(scores, top[i % 2][1])

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(400)))


def test_format_2_part_doc_freq_and_clear_error_without_bm25(tmp_path):
    from hybridret.errors import ConfigError

    b = SparseIndex.create(tmp_path / "with", 1)
    b.add(sp.csr_matrix((3, 1), dtype=np.float32), ["red fox", "red hen", "blue sky"])
    b.close()
    ix = SparseIndex(tmp_path / "with")
    assert ix.learned is not None and ix.doc_freq("red") == 2 and ix.doc_freq("absent") == 0
    b = SparseIndex.create(tmp_path / "without", 1, bm25=False)
    b.add(sp.csr_matrix((2, 1), dtype=np.float32))
    b.close()
    ix = SparseIndex(tmp_path / "without")
    for call in (lambda: ix.score_bm25(["red"], np.array([[0]])), lambda: ix.search_bm25(["red"], 1),
                 lambda: ix.doc_freq("red")):
        with pytest.raises(ConfigError, match="without BM25"):
            call()
