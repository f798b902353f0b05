"""Learned-sparse top-k through tantivy must equal the brute-force dot-product top-k."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from hybridret.errors import ConfigError
from hybridret.index.legacy.sparse import SparseIndex, SparseSearchStats

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
POOL = SHARED / "msmarco-dl19-pool"
N_DOCS = 2000


def _read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            out.append(json.loads(line))
            if limit is not None and len(out) >= limit:
                break
    return out


@pytest.fixture(scope="module")
def real_vectors():
    """SPLADE-tiny vectors of 2,000 real MS MARCO passages and ~270 real queries."""
    if not POOL.is_dir():
        pytest.skip(f"../shared/data not available: {POOL} is missing")
    from hybridret.encoders import SpladeEncoder

    enc = SpladeEncoder()
    docs = _read_jsonl(POOL / "corpus.jsonl", N_DOCS)
    texts = [(d.get("title", "") + " " + d["text"]).strip() for d in docs]
    queries = [q["text"] for q in _read_jsonl(POOL / "queries.jsonl")]
    queries += [q["text"] for q in _read_jsonl(SHARED / "cranfield" / "queries.jsonl", 225)]
    D = enc.encode_documents(texts, batch_size=64).sparse
    Q = enc.encode_queries(queries, batch_size=64).sparse
    return D, Q, texts


def _build(tmp_path: Path, D: sp.csr_matrix, texts=None, **kw) -> SparseIndex:
    b = SparseIndex.create(tmp_path / "sparse", D.shape[1], **kw)
    for s in range(0, D.shape[0], 700):  # several chunks, like a streamed build
        b.add(D[s : s + 700], texts[s : s + 700] if texts else None)
    b.close()
    return SparseIndex(tmp_path / "sparse")


def _assert_exact_topk(index: SparseIndex, D: sp.csr_matrix, Q: sp.csr_matrix, k: int) -> None:
    rows, scores = index.search(Q, k)
    brute = (Q @ D.T).toarray()
    for i in range(Q.shape[0]):
        ref = np.sort(brute[i])[::-1][:k]
        ref = ref[ref > 0]
        got = scores[i][np.isfinite(scores[i])]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=f"query {i}")
        # the ids are right up to ties: each returned doc really has the returned score
        valid = rows[i] >= 0
        np.testing.assert_allclose(brute[i, rows[i, valid]], scores[i, valid], rtol=1e-5, atol=1e-6)
        assert len(set(rows[i, valid].tolist())) == valid.sum()


@pytest.mark.slow
def test_exact_top10_equals_brute_force_on_real_passages(real_vectors, tmp_path):
    D, Q, texts = real_vectors
    index = _build(tmp_path, D, texts)
    _assert_exact_topk(index, D, Q, 10)
    stats = SparseSearchStats()
    index.search(Q, 10, stats=stats)
    assert stats.queries == Q.shape[0]
    assert stats.brute_force == 0  # the proof held through tantivy alone


@pytest.mark.slow
@pytest.mark.parametrize("bits,max_weight", [(3, 5.0), (8, 0.5)])
def test_exactness_survives_coarse_levels_and_weight_overflow(real_vectors, tmp_path, bits, max_weight):
    """3 bit planes = very coarse upper bounds (deeper fetches); max_weight 0.5 clips most weights
    (the per-term overflow slack must keep the proof sound)."""
    D, Q, _ = real_vectors
    index = _build(tmp_path, D, None, bits=bits, max_weight=max_weight, bm25=False)
    _assert_exact_topk(index, D, Q[:80], 10)


@pytest.mark.slow
@pytest.mark.parametrize("buckets", [4, 16])
def test_exactness_with_the_bucket_scheme(real_vectors, tmp_path, buckets):
    """One token per (document, term) in geometric weight buckets: exact top-k too."""
    D, Q, _ = real_vectors
    index = _build(tmp_path, D, None, scheme="buckets", buckets=buckets, bm25=False)
    rows, scores = index.search(Q, 10)
    brute = (Q @ D.T).toarray()
    for i in range(Q.shape[0]):
        ref = np.sort(brute[i])[::-1][:10]
        ref = ref[ref > 0]
        np.testing.assert_allclose(scores[i][np.isfinite(scores[i])], ref, rtol=1e-5, atol=1e-6, err_msg=f"query {i}")


@pytest.mark.slow
def test_exact_top100(real_vectors, tmp_path):
    D, Q, _ = real_vectors
    index = _build(tmp_path, D, None, bm25=False)
    _assert_exact_topk(index, D, Q[:60], 100)


def _toy(tmp_path: Path) -> tuple[SparseIndex, sp.csr_matrix]:
    D = sp.csr_matrix(np.array([[1.0, 0, 0.5, 0], [0, 2.0, 0, 0], [0.2, 0.2, 0.2, 0], [0, 0, 0, 0]], dtype=np.float32))
    texts = ["red apple pie", "green pear", "apples and pears and pies", "nothing here"]
    return _build(tmp_path, D, texts), D


def test_toy_scores_ties_padding_and_zero_docs(tmp_path):
    index, D = _toy(tmp_path)
    Q = sp.csr_matrix(np.array([[1.0, 1.0, 0, 0], [0, 0, 0, 3.0]], dtype=np.float32))
    rows, scores = index.search(Q, 4)
    # query 0: doc0 = 1.0, doc1 = 2.0, doc2 = 0.4; doc3 scores 0 and is never returned
    assert rows[0].tolist() == [1, 0, 2, -1]
    np.testing.assert_allclose(scores[0, :3], [2.0, 1.0, 0.4], rtol=1e-6)
    assert scores[0, 3] == -np.inf
    # query 1 uses a term no document has: no hits, no error
    assert rows[1].tolist() == [-1, -1, -1, -1]
    np.testing.assert_allclose(index.score(Q, np.array([[0, 3, -1], [0, 1, 2]])), [[1.0, 0, 0], [0, 0, 0]], atol=1e-7)


def test_bm25_search_and_exact_candidate_scores(tmp_path):
    index, _ = _toy(tmp_path)
    rows, scores = index.search_bm25(["apple pies", "the and of"], k=3)
    assert set(rows[0][rows[0] >= 0].tolist()) == {0, 2}  # stemming: apples -> appl, pies -> pie
    assert (rows[1] == -1).all()  # only stop words: nothing to match
    got = dict(zip(rows[0].tolist(), scores[0].tolist()))
    exact = index.score_bm25(["apple pies"], np.array([[2, 0, 1, -1]]))
    np.testing.assert_allclose(exact[0, :2], [got[2], got[0]], rtol=1e-4)
    assert exact[0, 2] == 0.0 and exact[0, 3] == 0.0


def test_bad_queries_and_shapes(tmp_path):
    index, _ = _toy(tmp_path)
    with pytest.raises(ConfigError, match="columns"):
        index.search(sp.csr_matrix(np.ones((1, 7), dtype=np.float32)), 3)
    with pytest.raises(ConfigError, match="non-negative"):
        index.search(sp.csr_matrix(np.array([[-1.0, 0, 0, 0]], dtype=np.float32)), 3)
    with pytest.raises(ConfigError, match="k must be positive"):
        index.search(sp.csr_matrix(np.ones((1, 4), dtype=np.float32)), 0)


def test_results_identical_after_reopen_and_threading(tmp_path):
    index, _ = _toy(tmp_path)
    Q = sp.csr_matrix(np.array([[1.0, 1.0, 1.0, 0]] * 5, dtype=np.float32))
    a = index.search(Q, 3, threads=1)
    b = SparseIndex(tmp_path / "sparse").search(Q, 3, threads=4)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
