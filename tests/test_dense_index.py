"""DenseIndex on real FAISS: exactness of Flat, recall of approximate indexes, exact re-scoring,
errors, and persistence."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hybridret.errors import ConfigError, IndexFormatError
from hybridret.index.dense import DenseIndex, gpu_available

N, D, NQ, K = 3000, 64, 40, 10
# "np" = no polysemous training: the same IVF16 + 8-byte PQ codes, but training takes ~3 s instead
# of ~25 s on a small CPU (FAISS's polysemous step dominates otherwise).
IVFPQ = "IVF16,PQ8np"


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)
    return unit(rng.standard_normal((N, D))), unit(rng.standard_normal((NQ, D)))


@pytest.fixture(scope="module")
def truth(data) -> tuple[np.ndarray, np.ndarray]:
    docs, queries = data
    full = queries @ docs.T
    rows = np.argsort(-full, axis=1, kind="stable")[:, :K]
    return rows, np.take_along_axis(full, rows, axis=1)


def build(root: Path, docs: np.ndarray, factory: str, metric: str = "ip") -> Path:
    builder = DenseIndex.create(root, D, factory=factory, metric=metric, seed=0)
    for start in range(0, len(docs), 1000):  # streamed in several blocks
        builder.add(docs[start : start + 1000])
    builder.close()
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory, data) -> dict[str, Path]:
    docs, _ = data
    base = tmp_path_factory.mktemp("dense")
    return {f: build(base / f.replace(",", "_"), docs, f) for f in ("Flat", "HNSW32,Flat", IVFPQ)}


def recall(rows: np.ndarray, true_rows: np.ndarray) -> float:
    return float(np.mean([len(set(r[:K]) & set(t)) / K for r, t in zip(rows, true_rows)]))


def test_flat_equals_brute_force(built, data, truth):
    _, queries = data
    index = DenseIndex(built["Flat"])
    assert index.num_docs == N and index.dim == D and index.device == "cpu"
    assert not (built["Flat"] / "index.faiss").exists(), "Flat is rebuilt from vectors.npy, not stored twice"
    rows, scores = index.search(queries, K)
    assert rows.shape == (NQ, K) and rows.dtype == np.int64 and scores.dtype == np.float32
    np.testing.assert_array_equal(rows, truth[0])
    np.testing.assert_allclose(scores, truth[1], atol=1e-5, rtol=0)


def test_hnsw_recall(built, data, truth):
    _, queries = data
    index = DenseIndex(built["HNSW32,Flat"], search_params="efSearch=128")
    rows, scores = index.search(queries, K)
    assert recall(rows, truth[0]) >= 0.9
    np.testing.assert_allclose(scores, index.score(queries, rows), atol=1e-6)
    assert (np.diff(scores, axis=1) <= 0).all()


def test_ivfpq_is_trained_rescored_and_recalls(built, data, truth):
    docs, queries = data
    index = DenseIndex(built[IVFPQ], search_params="nprobe=16")
    assert index.index.is_trained and index.index.ntotal == N

    rows, scores = index.search(queries, 50)
    valid = rows >= 0
    assert valid.all()
    exact = np.einsum("nd,nkd->nk", queries, docs[rows])
    np.testing.assert_allclose(scores, exact, atol=1e-5, rtol=0)  # exact, not PQ-approximate
    assert (np.diff(scores, axis=1) <= 0).all(), "re-sorted by the exact score"
    # over-fetch + exact re-scoring recovers the true neighbours...
    assert recall(rows[:, :K], truth[0]) >= 0.5
    # ...which the raw PQ order does not: re-scoring is doing real work
    raw_rows, raw_scores = index.search(queries, 50, rescore=False)
    assert recall(rows[:, :K], truth[0]) > recall(raw_rows[:, :K], truth[0])
    assert not np.allclose(raw_scores, np.einsum("nd,nkd->nk", queries, docs[raw_rows]), atol=1e-4)


def test_score_is_exact_and_minus_one_is_minus_inf(built, data):
    docs, queries = data
    index = DenseIndex(built["HNSW32,Flat"])
    rows = np.array([[0, 5, -1, 2999], [-1, -1, 7, 7]] * 2, dtype=np.int64)
    got = index.score(queries[:4], rows)
    assert got.shape == rows.shape and got.dtype == np.float32
    for i in range(4):
        for j in range(4):
            if rows[i, j] < 0:
                assert got[i, j] == -np.inf
            else:
                assert got[i, j] == pytest.approx(float(queries[i] @ docs[rows[i, j]]), abs=1e-6)


def test_k_larger_than_corpus_pads(tmp_path, data):
    docs, queries = data
    index = DenseIndex(build(tmp_path / "tiny", docs[:5], "Flat"))
    rows, scores = index.search(queries[:3], 8)
    assert rows.shape == (3, 8)
    assert (rows[:, :5] >= 0).all() and (rows[:, 5:] == -1).all()
    assert np.isfinite(scores[:, :5]).all() and (scores[:, 5:] == -np.inf).all()
    assert sorted(rows[0, :5].tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(ConfigError):
        index.search(queries[:1], 0)


def test_l2_metric(tmp_path, data):
    docs, queries = data
    index = DenseIndex(build(tmp_path / "l2", docs[:500], "Flat", metric="l2"))
    rows, scores = index.search(queries[:5], 5)
    dist = ((docs[:500][None, :, :] - queries[:5, None, :]) ** 2).sum(-1)
    np.testing.assert_array_equal(rows, np.argsort(dist, axis=1, kind="stable")[:, :5])
    np.testing.assert_allclose(scores, -np.take_along_axis(dist, rows, axis=1), atol=1e-5)
    np.testing.assert_allclose(index.score(queries[:5], rows), scores, atol=1e-5)


def test_bad_factory_string(tmp_path):
    with pytest.raises(ConfigError, match="factory"):
        DenseIndex.create(tmp_path / "bad", D, factory="NotAnIndex42")
    with pytest.raises(ConfigError):
        DenseIndex.create(tmp_path / "bad2", D, factory="Flat", metric="cosine")


def test_bad_input_shapes(built, data, tmp_path):
    _, queries = data
    index = DenseIndex(built["Flat"])
    with pytest.raises(ConfigError):
        index.search(np.zeros((2, D + 1), dtype=np.float32), K)
    with pytest.raises(ConfigError):
        index.search(np.zeros(D, dtype=np.float32), K)
    with pytest.raises(ConfigError):
        index.score(np.zeros((2, D - 1), dtype=np.float32), np.zeros((2, 3), dtype=np.int64))
    builder = DenseIndex.create(tmp_path / "w", D)
    with pytest.raises(ConfigError):
        builder.add(np.zeros((3, D + 2), dtype=np.float32))
    with pytest.raises(ConfigError):
        builder.add(np.full((1, D), np.nan, dtype=np.float32))
    builder.abort()


@pytest.mark.parametrize("factory", ["Flat", "HNSW32,Flat", IVFPQ])
def test_reopen_gives_identical_results(built, data, factory):
    _, queries = data
    a = DenseIndex(built[factory]).search(queries, K)
    b = DenseIndex(built[factory]).search(queries, K)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_truncated_vectors_raise_index_format_error(tmp_path, data):
    docs, _ = data
    root = build(tmp_path / "trunc", docs[:200], "HNSW32,Flat")
    DenseIndex(root)  # fine before the damage
    path = root / "vectors.npy"
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size - 4 * D * 3)  # lose the last three rows
    with pytest.raises(IndexFormatError):
        DenseIndex(root)
    with open(path, "r+b") as fh:
        fh.truncate(50)  # not even a whole header
    with pytest.raises(IndexFormatError):
        DenseIndex(root)


def test_missing_or_corrupt_faiss_file(tmp_path, data):
    docs, _ = data
    root = build(tmp_path / "hnsw", docs[:200], "HNSW32,Flat")
    (root / "index.faiss").write_bytes(b"garbage" * 10)
    with pytest.raises(IndexFormatError):
        DenseIndex(root)
    os.remove(root / "index.faiss")
    with pytest.raises(IndexFormatError):
        DenseIndex(root)


@pytest.mark.skipif(not gpu_available(), reason="needs FAISS with a usable GPU")
def test_gpu_flat_matches_cpu(built, data, truth):
    _, queries = data
    gpu = DenseIndex(built["Flat"], device="cuda")
    assert gpu.device == "cuda"
    rows, scores = gpu.search(queries, K)
    assert recall(rows, truth[0]) >= 0.99
    np.testing.assert_allclose(scores, gpu.score(queries, rows), atol=1e-4)


@pytest.mark.skipif(not gpu_available(), reason="needs FAISS with a usable GPU")
def test_gpu_search_above_faiss_gpu_k_limit(built, data):
    from hybridret.index.dense import GPU_MAX_K

    _, queries = data
    gpu, cpu = DenseIndex(built["Flat"], device="cuda"), DenseIndex(built["Flat"], device="cpu")
    k = min(GPU_MAX_K + 100, gpu.num_docs)
    if k <= GPU_MAX_K:
        pytest.skip("the test corpus is smaller than FAISS GPU's k limit")
    rows, scores = gpu.search(queries[:4], k)
    np.testing.assert_allclose(scores, cpu.search(queries[:4], k)[1], atol=1e-4)


def test_batched_flat_search_matches_brute_force_across_blocks(tmp_path, monkeypatch):
    import hybridret.index.dense as dense_mod

    rng = np.random.default_rng(3)
    docs = rng.standard_normal((10_000, 16)).astype(np.float32)
    queries = rng.standard_normal((12, 16)).astype(np.float32)  # a batch: the matmul path
    b = DenseIndex.create(tmp_path / "d", 16)
    b.add(docs)
    b.close()
    monkeypatch.setattr(dense_mod, "_MATMUL_BLOCK", 1)  # 4,096-document blocks: merging is exercised
    index = DenseIndex(tmp_path / "d")
    rows, scores = index.search(queries, 25)
    full = queries @ docs.T
    expect = np.sort(full, axis=1)[:, ::-1][:, :25]
    np.testing.assert_allclose(scores, expect, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(full, rows, 1), scores, rtol=1e-5, atol=1e-5)
    one_rows, one_scores = index.search(queries[:1], 25)  # one query: FAISS's own scan, same answer
    np.testing.assert_array_equal(one_rows[0], rows[0])
    small = DenseIndex.create(tmp_path / "s", 16)
    small.add(docs[:5])
    small.close()
    rows, scores = DenseIndex(tmp_path / "s").search(queries, 8)  # k above the corpus size: padded
    assert (rows[:, 5:] == -1).all() and np.isinf(scores[:, 5:]).all() and (rows[:, :5] >= 0).all()
