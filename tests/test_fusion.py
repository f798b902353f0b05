"""Fusion functions against hand-computed numbers (and ranx's RRF where it is installed)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from hybridret.errors import ConfigError
from hybridret.fusion.scores import candidate_union, linear_fusion, normalise, rrf_fusion

T, F = True, False
NINF = -np.inf


# ------------------------------------------------------------------------------------ normalise


def test_minmax_ignores_invalid_entries():
    # valid scores are 3 and 1 -> (3-1)/2 = 1, (1-1)/2 = 0; the invalid 2 (inside the range) -> 0
    out = normalise(np.array([[3.0, 1.0, 2.0]]), np.array([[T, T, F]]), "minmax")
    assert_allclose(out, [[1.0, 0.0, 0.0]])
    # an invalid 100 must not stretch the range; NaN/-inf padding must not poison it
    scores = np.array([[4.0, 2.0, 0.0, 100.0], [np.nan, 2.0, 4.0, -np.inf]])
    valid = np.array([[T, T, T, F], [F, T, T, F]])
    assert_allclose(normalise(scores, valid, "minmax"), [[1.0, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])


def test_minmax_constant_and_empty_rows_are_zero():
    scores = np.array([[5.0, 5.0, 5.0, -7.0], [1.0, 2.0, 3.0, 4.0]])
    valid = np.array([[T, T, T, F], [F, F, F, F]])
    out = normalise(scores, valid, "minmax")
    assert_allclose(out, np.zeros((2, 4)))
    assert np.isfinite(out).all()


def test_zscore_population_std():
    # valid 3, 1 -> mean 2, population std 1 -> +1, -1
    assert_allclose(normalise(np.array([[3.0, 1.0, 2.0]]), np.array([[T, T, F]]), "zscore"), [[1.0, -1.0, 0.0]])
    # 2, 4, 4, 6 -> mean 4, var (4+0+0+4)/4 = 2 -> (x-4)/sqrt(2); second row constant -> 0
    scores = np.array([[2.0, 4.0, 4.0, 6.0], [7.0, 7.0, np.nan, 1e9]])
    valid = np.array([[T, T, T, T], [T, T, F, F]])
    r2 = 1.4142135623730951
    assert_allclose(normalise(scores, valid, "zscore"), [[-r2, 0.0, 0.0, r2], [0.0, 0.0, 0.0, 0.0]], atol=1e-12)


def test_none_only_zeroes_invalid():
    out = normalise(np.array([[3.0, -1.5, 2.0]]), np.array([[T, T, F]]), "none")
    assert_allclose(out, [[3.0, -1.5, 0.0]])
    out = normalise(np.array([[np.nan, 0.25]]), np.array([[F, T]]), "none")
    assert_allclose(out, [[0.0, 0.25]])


def test_unknown_normalisation():
    with pytest.raises(ConfigError):
        normalise(np.zeros((1, 2)), np.ones((1, 2), bool), "softmax")


# -------------------------------------------------------------------------------- linear fusion


def _two_retrievers():
    dense = np.array([[0.9, 0.5, 0.1, 0.0], [0.2, 0.4, 0.0, 0.0]])
    sparse = np.array([[2.0, 6.0, 12.0, 0.0], [3.0, 1.0, 9.0, 9.0]])
    valid = np.array([[T, T, T, F], [T, T, F, F]])
    return {"dense": dense, "sparse": sparse}, valid


def test_linear_fusion_minmax_weighted():
    scores, valid = _two_retrievers()
    # row 0: dense -> [1, .5, 0], sparse -> [0, .4, 1]; 0.7*d + 0.3*s = [.7, .47, .3]
    # row 1: dense -> [0, 1],     sparse -> [1, 0];     0.7*d + 0.3*s = [.3, .7]
    out = linear_fusion(scores, valid, {"dense": 0.7, "sparse": 0.3}, "minmax")
    assert_allclose(out, [[0.7, 0.47, 0.3, NINF], [0.3, 0.7, NINF, NINF]])


def test_linear_fusion_default_equal_weights_and_none():
    scores, valid = _two_retrievers()
    # equal weights 0.5/0.5 of the min-max values above
    assert_allclose(linear_fusion(scores, valid), [[0.5, 0.45, 0.5, NINF], [0.5, 0.5, NINF, NINF]])
    # raw scores: 1.0*dense + 0.1*sparse
    out = linear_fusion(scores, valid, {"dense": 1.0, "sparse": 0.1}, "none")
    assert_allclose(out, [[1.1, 1.1, 1.3, NINF], [0.5, 0.5, NINF, NINF]])


def test_linear_fusion_weights_errors_and_omissions():
    scores, valid = _two_retrievers()
    # a retriever left out of the weights counts for nothing
    assert_allclose(linear_fusion(scores, valid, {"dense": 1.0}), [[1.0, 0.5, 0.0, NINF], [0.0, 1.0, NINF, NINF]])
    with pytest.raises(ConfigError):
        linear_fusion(scores, valid, {"dense": 0.5, "bm25": 0.5})
    with pytest.raises(ConfigError):
        linear_fusion({}, valid)


# ------------------------------------------------------------------------------------------ RRF


def _rrf_inputs():
    # dense ranks row 0: d0=1 (0.9), d3=2 (0.7), d1=3 (0.5), d2=4 (0.1)
    # sparse ranks row 0 (d3 invalid despite its 100): d1=1 (3), d2=2 (2), d0=3 (1)
    # row 1: dense valid d0, d1 tied at 5 -> ranks 1, 2 by position; sparse valid only d1 -> rank 1
    scores = {
        "dense": np.array([[0.9, 0.5, 0.1, 0.7], [5.0, 5.0, 1.0, 0.0]]),
        "sparse": np.array([[1.0, 3.0, 2.0, 100.0], [1.0, 2.0, 0.0, 0.0]]),
    }
    valid = {
        "dense": np.array([[T, T, T, T], [T, T, F, F]]),
        "sparse": np.array([[T, T, T, F], [F, T, F, F]]),
    }
    return scores, valid


def test_rrf_k60():
    scores, valid = _rrf_inputs()
    out = rrf_fusion(scores, valid, k=60)
    expected = [
        [1 / 61 + 1 / 63, 1 / 63 + 1 / 61, 1 / 64 + 1 / 62, 1 / 62],
        [1 / 61, 1 / 62 + 1 / 61, NINF, NINF],
    ]
    assert_allclose(out, expected)
    assert_allclose(out[0], [0.03226646, 0.03226646, 0.03175403, 0.01612903], atol=1e-8)


def test_rrf_k1_and_weights():
    scores, valid = _rrf_inputs()
    assert_allclose(rrf_fusion(scores, valid, k=1),
                    [[1 / 2 + 1 / 4, 1 / 4 + 1 / 2, 1 / 5 + 1 / 3, 1 / 3], [1 / 2, 1 / 3 + 1 / 2, NINF, NINF]])
    # dense counts double; sparse keeps its default weight of 1
    assert_allclose(rrf_fusion(scores, valid, k=1, weights={"dense": 2.0}),
                    [[1.25, 1.0, 2 / 5 + 1 / 3, 2 / 3], [1.0, 2 / 3 + 1 / 2, NINF, NINF]])
    assert_allclose(rrf_fusion(scores, valid, k=0)[0], [1 + 1 / 3, 1 / 3 + 1, 1 / 4 + 1 / 2, 1 / 2])


def test_rrf_shared_valid_mask_and_errors():
    scores = {"a": np.array([[3.0, 2.0, 1.0]]), "b": np.array([[1.0, 2.0, 3.0]])}
    valid = np.array([[T, T, F]])
    # a: ranks 1, 2; b: among valid (1, 2) -> d1=1, d0=2
    assert_allclose(rrf_fusion(scores, valid, k=1), [[1 / 2 + 1 / 3, 1 / 3 + 1 / 2, NINF]])
    with pytest.raises(ConfigError):
        rrf_fusion(scores, valid, k=-1)
    with pytest.raises(ConfigError):
        rrf_fusion({}, valid)


def test_rrf_matches_ranx():
    ranx = pytest.importorskip("ranx")
    rng = np.random.default_rng(7)
    nq, m = 4, 12
    scores = {"dense": rng.random((nq, m)), "sparse": rng.random((nq, m)) * 10}  # no ties
    valid = {"dense": rng.random((nq, m)) < 0.7, "sparse": rng.random((nq, m)) < 0.6}
    ours = rrf_fusion(scores, valid, k=60)
    runs = []
    for name in ("dense", "sparse"):
        run = {f"q{i}": {f"d{j}": float(scores[name][i, j]) for j in range(m) if valid[name][i, j]}
               for i in range(nq)}
        runs.append(ranx.Run(run, name=name))
    fused = ranx.fuse(runs=runs, norm=None, method="rrf", params={"k": 60}).to_dict()
    for i in range(nq):
        for j in range(m):
            if valid["dense"][i, j] or valid["sparse"][i, j]:
                assert ours[i, j] == pytest.approx(fused[f"q{i}"][f"d{j}"], rel=1e-9)
            else:
                assert ours[i, j] == NINF and f"d{j}" not in fused[f"q{i}"]


# ------------------------------------------------------------------------------- candidate union


def test_candidate_union_order_dedup_padding():
    a = np.array([[3, 1, -1], [-1, -1, -1], [0, 1, 2]])
    b = np.array([[1, 4, 5], [2, -1, -1], [2, 1, 0]])
    out = candidate_union(a, b)
    assert out.dtype == np.int64
    assert_array_equal(out, [[3, 1, 4, 5], [2, -1, -1, -1], [0, 1, 2, -1]])


def test_candidate_union_edge_cases():
    assert_array_equal(candidate_union(np.array([[-1, -1]])), [[-1]])
    assert_array_equal(candidate_union(np.array([[7, 7, 7]])), [[7]])
    assert candidate_union(np.zeros((0, 3), dtype=np.int64)).shape == (0, 1)
    with pytest.raises(ConfigError):
        candidate_union()


# ------------------------------------------------------------------ refine: agreement (GQR guide weights)


def test_top_mask_picks_best_listed_ties_by_position():
    from hybridret.fusion.gqr import top_mask

    scores = np.array([[5.0, 9.0, 9.0, 1.0, 7.0]])
    listed = np.array([[T, T, T, T, F]])  # 7.0 is not in this retriever's own list
    assert_array_equal(top_mask(scores, listed, 2), [[F, T, T, F, F]])
    assert_array_equal(top_mask(scores, listed, 3), [[T, T, T, F, F]])
    # fewer listed than k: only the listed ones
    assert_array_equal(top_mask(scores, np.array([[F, T, F, F, F]]), 3), [[F, T, F, F, F]])
    with pytest.raises(ConfigError):
        top_mask(scores, listed, 0)


def test_agreement_hand_computed():
    from hybridret.fusion.gqr import agreement

    # 6 candidates, k = 2. tops: a = {0, 1}, b = {1, 2}, c = {4, 5}
    exact = {"a": np.array([[9.0, 8, 1, 1, 1, 1]]), "b": np.array([[1.0, 8, 9, 1, 1, 1]]),
             "c": np.array([[1.0, 1, 1, 1, 8, 9]])}
    listed = {n: np.ones((1, 6), dtype=bool) for n in exact}
    out = agreement(exact, listed, ["a", "b", "c"], k=2)
    # a: |a∩b|/2 = 0.5, |a∩c|/2 = 0 -> 0.25; b: same -> 0.25; c: 0
    assert_allclose(out["a"], [0.25])
    assert_allclose(out["b"], [0.25])
    assert_allclose(out["c"], [0.0])
    assert_allclose(agreement(exact, listed, ["a"], k=2)["a"], [1.0])  # nothing to agree with
    with pytest.raises(ConfigError, match="agreement needs"):
        agreement(exact, listed, ["a", "zz"])


def test_agreement_weights_hand_computed():
    from hybridret.fusion.gqr import agreement_weights

    agree = {"sparse": np.array([0.45, 0.0]), "bm25": np.array([0.15, 0.0])}
    w = agreement_weights({"sparse": 0.5, "bm25": 0.5}, agree, floor=0.05)
    # query 0: 0.5*0.5 = 0.25 and 0.5*0.2 = 0.1 -> 0.25/0.35, 0.1/0.35; query 1: nobody agrees -> equal
    assert_allclose(w["sparse"], [0.25 / 0.35, 0.5])
    assert_allclose(w["bm25"], [0.10 / 0.35, 0.5])
    w = agreement_weights({"sparse": 3.0, "bm25": 1.0}, agree)  # base weights multiply
    assert_allclose(w["sparse"], [1.5 / 1.7, 0.75])
    with pytest.raises(ConfigError):
        agreement_weights({"sparse": 1.0}, agree, floor=0.0)
