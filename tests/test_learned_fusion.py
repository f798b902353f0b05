"""benchmarks/_learned_fusion.py: the headroom analysis of issue #13, with hand-computed cases."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _learned_fusion as LF  # noqa: E402

from hybridret.fusion.scores import Candidates  # noqa: E402

NAMES = ("dense", "sparse", "bm25")


def _cands() -> Candidates:
    """One query, three candidates (the third is padding)."""
    rows = np.array([[4, 7, -1]])
    exact = {"dense": np.array([[0.9, 0.1, -np.inf]]), "sparse": np.array([[1.0, 3.0, 0.0]]),
             "bm25": np.array([[2.0, 0.0, 0.0]])}
    listed = {"dense": np.array([[True, True, False]]), "sparse": np.array([[False, True, False]]),
              "bm25": np.array([[True, False, False]])}
    return Candidates(rows, exact, listed)


def test_rrf_terms_by_hand():
    c = _cands()
    # dense lists both: ranks 1 and 2 -> 60/61, 60/62; sparse lists only row 7 (rank 1); padding 0
    np.testing.assert_allclose(LF._rrf_terms(c.exact["dense"], c.listed["dense"]), [[60 / 61, 60 / 62, 0.0]])
    np.testing.assert_allclose(LF._rrf_terms(c.exact["sparse"], c.listed["sparse"]), [[0.0, 60 / 61, 0.0]])


def test_signals_and_grid_by_hand():
    c = _cands()
    z = LF.signals(c, np.array([[0.5, 0.3, -np.inf]]), NAMES)
    # two valid candidates: z-scores are +1 / -1 (population standard deviation), padding 0
    np.testing.assert_allclose(z["dense"], [[1.0, -1.0, 0.0]])
    np.testing.assert_allclose(z["sparse"], [[-1.0, 1.0, 0.0]])
    np.testing.assert_allclose(z["refined"], [[1.0, -1.0, 0.0]])
    grid = LF.linear_grid(z, c.valid)
    assert len(grid) == 3 ** 4 - 1
    np.testing.assert_allclose(grid[(1, 2, 0, 0)], [[1 - 2, -1 + 2, -np.inf]])  # dense + 2 sparse
    np.testing.assert_allclose(grid[(0, 0, 0, 1)][:, :2], z["refined"][:, :2])


def test_features_layout():
    c = _cands()
    z = LF.signals(c, np.array([[0.5, 0.3, -np.inf]]), NAMES)
    cand, query = LF.features(c, z, NAMES)
    assert cand.shape == (1, 3, 7) and query.shape == (1, 4)
    np.testing.assert_allclose(cand[..., LF.PRIOR_COLUMN], z["refined"])
    # top-10 agreement: dense's top (rows 4, 7) shares one row with sparse and one with BM25 -> (1/10 + 1/10) / 2
    np.testing.assert_allclose(query[0], [1.0, 0.1, 0.05, 0.05])


def test_grades_of():
    rows = np.array([[4, 7, -1], [7, -1, -1]])
    g = LF.grades_of(rows, [f"d{i}" for i in range(8)], ["q1", "q2"], {"q1": {"d7": 2}, "q2": {"d4": 1}})
    np.testing.assert_array_equal(g, [[0, 2, 0], [0, 0, 0]])


def _synthetic(seed: int, n: int = 60, m: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Feature 0 marks the relevant candidate perfectly; the prior column is noise."""
    rng = np.random.default_rng(seed)
    grades = np.zeros((n, m), dtype=np.int64)
    grades[np.arange(n), rng.integers(0, m, n)] = 1
    cand = rng.normal(size=(n, m, 7))
    cand[..., 0] = grades * 3.0 + rng.normal(scale=0.1, size=(n, m))
    return cand, np.ones((n, 1)), grades, np.ones((n, m), dtype=bool)


def test_combiner_learns_the_informative_feature_and_its_prior():
    pytest.importorskip("torch")
    data = [_synthetic(0), _synthetic(1)]
    W = LF.train_combiner(data, l2=1e-3)
    assert W.shape == (7, 1)
    assert W[0, 0] > 1.0 and W[LF.PRIOR_COLUMN, 0] < 1.0  # the noise column moves off its prior of 1 towards 0
    held = _synthetic(2)
    top = np.argmax(LF.combine(W, held[0], held[1], held[3]), axis=1)
    assert (held[2][np.arange(len(top)), top] == 1).mean() > 0.95
    # a very strong pull towards the prior leaves the default's ranking: the refined score alone
    W_prior = LF.train_combiner(data, l2=1e6)
    expect = np.zeros((7, 1))
    expect[LF.PRIOR_COLUMN, 0] = 1.0
    np.testing.assert_allclose(W_prior, expect, atol=1e-5)
