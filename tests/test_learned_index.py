"""The tf-grid learned-sparse index (index/learned.py) must return the brute-force dot-product top-k."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from hybridret.errors import ConfigError
from hybridret.index.learned import LearnedIndex, SparseSearchStats, fieldnorm_table
from hybridret.index.storage import load_npy

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
VOCAB = 400
ABSENT = 398  # no document has this term
RARE = 399  # one document has this term


def _corpus(seed: int = 0, n: int = 600) -> sp.csr_matrix:
    """Zipf-like term choice, log-normal weights, and some duplicated rows (exact ties)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, VOCAB + 1) ** 0.8
    p /= p.sum()
    rows = []
    for _ in range(n):
        terms = np.unique(rng.choice(VOCAB, size=int(rng.integers(1, 40)), p=p))
        w = rng.lognormal(-1.0, 0.8, size=len(terms)).astype(np.float32)
        rows.append((terms, w))
    for dup in range(0, 60, 3):  # rows 540.. repeat earlier rows: ties by row
        rows[n - 1 - dup] = rows[dup]
    indptr = np.cumsum([0] + [len(t) for t, _ in rows])
    D = sp.csr_matrix((np.concatenate([w for _, w in rows]), np.concatenate([t for t, _ in rows]), indptr),
                      shape=(n, VOCAB), dtype=np.float32)
    D.data[(D.indices == ABSENT) | (D.indices == RARE)] = 0
    D = D.tolil()
    D[5, RARE] = 0.0001  # a tiny weight, the only posting of its term
    D = D.tocsr()
    D.eliminate_zeros()
    return D


def _queries(seed: int, nq: int, D: sp.csr_matrix) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(nq):
        if i % 4 == 0:  # a document used as a query: its own row scores highest
            out.append(D[int(rng.integers(D.shape[0]))])
            continue
        terms = np.unique(rng.integers(0, VOCAB, size=int(rng.integers(1, 25))))
        out.append(sp.csr_matrix((rng.lognormal(-0.5, 0.7, len(terms)).astype(np.float32), terms, [0, len(terms)]),
                                 shape=(1, VOCAB)))
    return sp.vstack(out).tocsr()


def _build(root: Path, D: sp.csr_matrix, **kw) -> LearnedIndex:
    b = LearnedIndex.create(root, D.shape[1], **kw)
    for s in range(0, D.shape[0], 250):  # a streamed build, several chunks
        b.add(D[s : s + 250])
    b.close()
    return LearnedIndex(root)


def _brute(D: sp.csr_matrix, Q: sp.csr_matrix, k: int, allowed: np.ndarray | None = None):
    S = (Q @ D.T).toarray().astype(np.float32)
    if allowed is not None:
        S[:, ~allowed] = 0
    rows = np.full((Q.shape[0], k), -1)
    scores = np.full((Q.shape[0], k), -np.inf, dtype=np.float32)
    for i in range(Q.shape[0]):
        order = np.lexsort((np.arange(S.shape[1]), -S[i]))[:k]  # best first, ties by row
        order = order[S[i, order] > 0]
        rows[i, : len(order)], scores[i, : len(order)] = order, S[i, order]
    return rows, scores


def _assert_same(got, ref, *, ids: bool = True) -> None:
    rows, scores = got
    ref_rows, ref_scores = ref
    np.testing.assert_array_equal(np.isfinite(scores), np.isfinite(ref_scores))
    fin = np.isfinite(ref_scores)
    np.testing.assert_allclose(scores[fin], ref_scores[fin], rtol=1e-5)
    if ids:
        np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_array_equal(rows[~fin], -1)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    D = _corpus()
    return D, _build(tmp_path_factory.mktemp("learned") / "idx", D)


def test_fieldnorm_table_matches_tantivys_known_values():
    t = fieldnorm_table()
    assert t[:41].tolist() == list(range(41))
    assert t[41:50].tolist() == [42, 44, 46, 48, 50, 52, 54, 56, 60]
    assert t[[103, 112, 115, 255]].tolist() == [3864, 8216, 11288, 2_013_265_944]
    assert np.all(np.diff(t) > 0)


def test_top10_equals_brute_force_ids_and_scores(built):
    D, index = built
    Q = _queries(1, 120, D)
    stats = SparseSearchStats()
    got = index.search(Q, 10, threads=1, stats=stats)
    _assert_same(got, _brute(D, Q, 10))
    assert stats.queries == 120 and len(stats.fetched) == 120 and min(stats.rounds) >= 1
    # a duplicated row ties its original: both come back, the lower row first
    i = np.flatnonzero(np.all(D[0].toarray() == D[D.shape[0] - 1].toarray()))
    assert len(i) == 1
    r, _ = index.search(D[0], 2, threads=1)
    assert r[0].tolist() == [0, D.shape[0] - 1]


def test_threads_depth_and_top100_stay_exact(built):
    D, index = built
    Q = _queries(2, 40, D)
    _assert_same(index.search(Q, 100, threads=2), _brute(D, Q, 100))
    _assert_same(index.search(Q, 10, depth=10, max_depth=20), _brute(D, Q, 10))  # deep fetches, brute force


def test_allowed_masks_are_exact_prefilters(built):
    D, index = built
    Q = _queries(3, 40, D)
    rng = np.random.default_rng(3)
    for share in (0.3, 0.01):
        allowed = rng.random(D.shape[0]) < share
        _assert_same(index.search(Q, 10, allowed=allowed), _brute(D, Q, 10, allowed))
    none = np.zeros(D.shape[0], dtype=bool)
    rows, scores = index.search(Q, 5, allowed=none)
    assert (rows == -1).all() and np.isneginf(scores).all()
    with pytest.raises(ConfigError):
        index.search(Q, 5, allowed=none[:10])


def test_k_larger_than_matches_and_empty_queries(built):
    D, index = built
    q = sp.csr_matrix(([1.0], [RARE], [0, 1]), shape=(1, VOCAB))
    empty = sp.csr_matrix((1, VOCAB), dtype=np.float32)
    absent = sp.csr_matrix(([2.0], [ABSENT], [0, 1]), shape=(1, VOCAB))  # a term no document has
    Q = sp.vstack([q, absent, empty]).tocsr()  # an empty last row too
    rows, scores = index.search(Q, 10)
    assert rows[0, 0] >= 0 and (rows[0, 1:] == -1).all() and np.isneginf(scores[0, 1:]).all()
    assert (rows[1:] == -1).all() and np.isneginf(scores[1:]).all()
    _assert_same((rows, scores), _brute(D, Q, 10))
    r2, _ = index.search(Q, 10, exact=False)
    assert r2[0, 0] == rows[0, 0] and (r2[1:] == -1).all()
    with pytest.raises(ConfigError):
        index.search(-q, 10)
    with pytest.raises(ConfigError):
        index.search(sp.csr_matrix((1, VOCAB + 1)), 10)
    with pytest.raises(ConfigError):
        index.search(q, 0)


def test_quantised_mode_returns_the_grid_dot_products_top_k(built):
    D, index = built
    Q = _queries(4, 80, D)
    G = index.grid_forward()
    assert G.nnz == D.nnz and np.all(G.data >= D.data * (1 - 1e-6))  # rounded up: an upper bound
    got = index.search(Q, 10, exact=False)
    _assert_same(got, _brute(G, Q, 10))


def test_tantivy_score_equals_the_grid_dot_product(built):
    D, index = built
    Q = _queries(5, 30, D)
    G = index.grid_forward()
    rows, scores = index.search(Q, 20, exact=False)
    ref = np.take_along_axis((Q @ G.T).toarray(), np.maximum(rows, 0), axis=1)
    fin = np.isfinite(scores)
    assert np.max(np.abs(scores[fin] - ref[fin]) / ref[fin]) < 1e-6


def test_weights_above_the_grid_top_stay_exact(tmp_path):
    D = _corpus(seed=7)
    D.data[::50] *= 6  # well above max_weight
    index = _build(tmp_path / "idx", D, max_weight=1.0, levels=63, fillers_per_doc=20)
    assert index.meta["slack_terms"] > 0
    Q = _queries(8, 60, D)
    _assert_same(index.search(Q, 10), _brute(D, Q, 10))


def test_nearest_rounding_is_exact_through_slack(tmp_path):
    D = _corpus(seed=9)
    index = _build(tmp_path / "idx", D, rounding="nearest", fillers_per_doc=60)
    Q = _queries(10, 60, D)
    _assert_same(index.search(Q, 10), _brute(D, Q, 10))
    _assert_same(index.search(Q, 10, exact=False), _brute(index.grid_forward(), Q, 10))


def test_reopen_round_trip_score_and_exhaustive(built):
    D, index = built
    again = LearnedIndex(index.root)
    assert again.num_docs == D.shape[0]
    assert (again.forward != D).nnz == 0
    meta = json.loads((index.root / "meta.json").read_text())
    assert meta["format"] == "hybridret-learned-v1" and meta["total_docs"] == D.shape[0] * (1 + meta["fillers_per_doc"])
    assert meta["doc_length"] in fieldnorm_table().tolist()
    np.testing.assert_array_equal(load_npy(index.root / "df.npy"), np.diff(D.tocsc().indptr))
    Q = _queries(11, 30, D)
    _assert_same(again.search(Q, 10), index.search(Q, 10))
    rows = np.array([[0, 3, -1], [7, -1, -1]] * 15)
    np.testing.assert_allclose(again.score(Q, rows), np.where(rows >= 0, np.take_along_axis(
        (Q @ D.T).toarray(), np.maximum(rows, 0), axis=1), 0), rtol=1e-5)
    allowed = np.random.default_rng(0).random(D.shape[0]) < 0.5
    _assert_same(again.search_exhaustive(Q, 10, allowed=allowed), _brute(D, Q, 10, allowed))


def test_empty_segment_and_empty_rows(tmp_path):
    empty = _build(tmp_path / "none", sp.csr_matrix((0, VOCAB), dtype=np.float32))
    assert empty.num_docs == 0
    rows, scores = empty.search(_queries(13, 3, _corpus()), 4)
    assert (rows == -1).all() and np.isneginf(scores).all()
    D = sp.vstack([_corpus(seed=14, n=100), sp.csr_matrix((3, VOCAB), dtype=np.float32)]).tocsr()  # blank last rows
    index = _build(tmp_path / "blank", D, fillers_per_doc=5)
    Q = _queries(15, 20, D)
    _assert_same(index.search(Q, 10), _brute(D, Q, 10))


def test_fillers_shrink_to_fit_tantivys_document_limit_and_vanish_without_terms(tmp_path, monkeypatch):
    import hybridret.index.learned as learned

    monkeypatch.setattr(learned, "MAX_TANTIVY_DOCS", 1000)  # stands in for 2^31 - 2
    D = _corpus(seed=16, n=120)
    index = _build(tmp_path / "big", D)  # 141 fillers per document would need 17,040 documents
    assert index.meta["fillers_per_doc"] == 1000 // 120 - 1 and index.meta["total_docs"] <= 1000
    Q = _queries(17, 20, D)
    _assert_same(index.search(Q, 10), _brute(D, Q, 10))  # coarser grid, same exact top-k
    blank = _build(tmp_path / "blank", sp.csr_matrix((50, VOCAB), dtype=np.float32))  # e.g. a BM25-only index
    assert blank.meta["filler_docs"] == 0 and blank.num_docs == 50


def test_builder_rejects_bad_input(tmp_path):
    b = LearnedIndex.create(tmp_path / "a", VOCAB)
    with pytest.raises(ConfigError):
        b.add(sp.csr_matrix(([-1.0], [3], [0, 1]), shape=(1, VOCAB)))
    with pytest.raises(ConfigError):
        b.add(sp.csr_matrix((1, VOCAB + 1)))
    b.abort()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("")
    with pytest.raises(ConfigError):
        LearnedIndex.create(tmp_path / "b", VOCAB)
    with pytest.raises(ConfigError):
        LearnedIndex.create(tmp_path / "c", VOCAB, rounding="down")


def _real_forward() -> sp.csr_matrix:
    for name in ("bench-living-msmarco", "bench-cisi"):
        base = ROOT / "indexes" / name  # format 1 (sparse/) or format 2 (sparse/learned/) segments
        segs = sorted([*base.glob("seg-*/sparse/forward.data.npy"), *base.glob("seg-*/sparse/learned/forward.data.npy")])
        if segs:
            f = segs[0].parent
            indptr = load_npy(f / "forward.indptr.npy")
            vocab = json.loads((f / "meta.json").read_text())["vocab_size"]
            D = sp.csr_matrix((load_npy(f / "forward.data.npy"), load_npy(f / "forward.indices.npy"), indptr),
                              shape=(len(indptr) - 1, vocab))
            return sp.csr_matrix(D[:3000], copy=True)
    pytest.skip("no ready-built index with a sparse forward store under indexes/")


@pytest.mark.slow
def test_real_vectors_exact_and_tantivy_error(tmp_path):
    if not SHARED.is_dir():
        pytest.skip(f"shared data not available: {SHARED} is missing")
    D = _real_forward()
    from hybridret.encoders import SpladeEncoder

    texts = [json.loads(line)["text"] for name in ("msmarco-dl19-pool", "cisi")
             for line in (SHARED / name / "queries.jsonl").open(encoding="utf-8")]
    try:
        Q = sp.csr_matrix(SpladeEncoder().encode_queries(texts[:80], batch_size=32).sparse)
    except Exception as exc:  # no local model files: nothing to compare against
        pytest.skip(f"SPLADE encoder unavailable: {exc}")
    index = _build(tmp_path / "idx", D)
    stats = SparseSearchStats()
    _assert_same(index.search(Q, 10, stats=stats), _brute(D, Q, 10))
    assert stats.brute_force == 0
    rows, scores = index.search(Q, 10, exact=False)
    G = index.grid_forward()
    ref = np.take_along_axis((Q @ G.T).toarray(), np.maximum(rows, 0), axis=1)
    fin = np.isfinite(scores)
    assert np.max(np.abs(scores[fin] - ref[fin]) / ref[fin]) < 1e-6
