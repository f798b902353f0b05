"""GQR: the closed-form gradient, and the behaviours users rely on."""

from __future__ import annotations

import numpy as np
import pytest

from hybridret.errors import ConfigError
from hybridret.fusion.config import GQRConfig
from hybridret.fusion.gqr import gqr_refine, kl_loss_grad, masked_softmax


def _problem(n: int = 6, m: int = 12, d: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    D = rng.normal(size=(n, m, d))
    D /= np.linalg.norm(D, axis=-1, keepdims=True)
    q = rng.normal(size=(n, d))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    valid = np.ones((n, m), dtype=bool)
    valid[0, 9:] = False  # a query with fewer candidates (padding)
    guide = rng.gamma(2.0, 5.0, size=(n, m))  # sparse-like scale: 0..40
    return q, D, valid, guide


def test_masked_softmax_ignores_padding():
    p = masked_softmax(np.array([[0.0, np.log(3.0), 100.0]]), np.array([[True, True, False]]))
    np.testing.assert_allclose(p, [[0.25, 0.75, 0.0]])


def test_closed_form_gradient_matches_finite_differences():
    q, D, valid, guide = _problem()
    target = masked_softmax(guide / 5.0, valid)
    loss, grad = kl_loss_grad(q, D, valid, target, 0.1)
    eps = 1e-6
    for j in range(4):
        e = np.zeros_like(q)
        e[:, j] = eps
        up, _ = kl_loss_grad(q + e, D, valid, target, 0.1)
        down, _ = kl_loss_grad(q - e, D, valid, target, 0.1)
        np.testing.assert_allclose((up - down) / (2 * eps), grad[:, j], rtol=1e-4, atol=1e-7)
    assert (loss >= 0).all()


def test_alpha_zero_leaves_query_and_ranking_unchanged():
    q, D, valid, guide = _problem()
    out = gqr_refine(q, D, valid, guide, GQRConfig(alpha=0.0))
    np.testing.assert_allclose(out, q, rtol=1e-6)


def _spearman_to_guide(q, D, valid, guide):
    out = []
    for i in range(q.shape[0]):
        v = valid[i]
        s = D[i][v] @ q[i]
        rs = np.argsort(np.argsort(s))
        rg = np.argsort(np.argsort(guide[i][v]))
        out.append(np.corrcoef(rs, rg)[0, 1])
    return np.mean(out)


def test_raising_alpha_moves_dense_order_towards_the_guide():
    q, D, valid, guide = _problem(n=20, m=30, d=32, seed=3)
    base = _spearman_to_guide(q, D, valid, guide)
    agreement = [_spearman_to_guide(gqr_refine(q, D, valid, guide, GQRConfig(alpha=a, steps=100, lr=5e-3)), D, valid, guide)
                 for a in (0.2, 0.5, 0.9)]
    assert base < agreement[0] < agreement[1] < agreement[2]


def test_deterministic():
    q, D, valid, guide = _problem()
    a = gqr_refine(q, D, valid, guide)
    b = gqr_refine(q, D, valid, guide)
    np.testing.assert_array_equal(a, b)


def test_query_without_guide_signal_falls_back_to_dense():
    q, D, valid, guide = _problem()
    guide[2] = 0.0  # the guide matched nothing for query 2
    out = gqr_refine(q, D, valid, guide)
    np.testing.assert_allclose(out[2], q[2], rtol=1e-6)
    assert not np.allclose(out[1], q[1])  # the others were refined


def test_config_validation_and_round_trip():
    with pytest.raises(ConfigError):
        GQRConfig(alpha=1.5)
    with pytest.raises(ConfigError):
        GQRConfig(t_dense=0)
    with pytest.raises(ConfigError):
        GQRConfig(final="nope")
    cfg = GQRConfig(alpha=0.3, steps=10)
    assert GQRConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown"):
        GQRConfig.from_dict({"alpha": 0.5, "bogus": 1})


def _reference_refine(q0, D, valid, target, cfg):
    """GQR's Adam loop written the plain way (einsum over the whole batch), to check the blocked one."""
    q = q0.astype(np.float64).copy()
    m = np.zeros_like(q)
    v = np.zeros_like(q)
    for step in range(1, cfg.steps + 1):
        _, grad = kl_loss_grad(q, D, valid, target, cfg.t_dense)
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad * grad
        q -= cfg.lr * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
    return q


def test_blocked_refine_equals_the_plain_adam_loop():
    from hybridret.fusion.gqr import GQR_BLOCK

    n = GQR_BLOCK + 5  # two blocks, the second partly filled
    q, D, valid, guide = _problem(n=n, m=20, d=16, seed=5)
    valid[GQR_BLOCK:, 11:] = False  # the second block is cut to 11 columns
    valid[3, 4:] = False
    cfg = GQRConfig(steps=30, lr=2e-3)
    from hybridret.fusion.scores import normalise

    scores0 = np.einsum("nd,nmd->nm", q, D)
    target = (0.5 * masked_softmax(scores0 / cfg.t_dense, valid)
              + 0.5 * masked_softmax(normalise(guide, valid, "zscore"), valid))
    expected = _reference_refine(q, D, valid, target, cfg)
    np.testing.assert_allclose(gqr_refine(q, D, valid, guide, cfg), expected, atol=2e-5)


def test_guide_signal_single_raw_and_per_query_weighted_mixture():
    from hybridret.fusion.gqr import guide_signal

    valid = np.array([[True, True, True], [True, True, False]])
    exact = {"sparse": np.array([[1.0, 2.0, 3.0], [4.0, 0.0, 9.0]]), "bm25": np.array([[3.0, 3.0, 0.0], [0.0, 2.0, 5.0]])}
    np.testing.assert_allclose(guide_signal(exact, valid, {"sparse": 0.3}), [[1, 2, 3], [4, 0, 0]])
    # z-scores: sparse q0 [-1.2247, 0, 1.2247], q1 [1, -1, 0]; bm25 q0 [0.7071, 0.7071, -1.4142], q1 [-1, 1, 0]
    g = guide_signal(exact, valid, {"sparse": np.array([1.0, 3.0]), "bm25": np.array([1.0, 1.0])})
    s6 = np.sqrt(1.5)
    expected = [[0.5 * (-s6 + np.sqrt(0.5)), 0.5 * np.sqrt(0.5), 0.5 * (s6 - np.sqrt(2))], [0.75 - 0.25, -0.75 + 0.25, 0.0]]
    np.testing.assert_allclose(g, expected, atol=1e-4)
    with pytest.raises(ConfigError):
        guide_signal(exact, valid, {})


def test_adaptive_guide_follows_agreement():
    from hybridret.fusion.gqr import adaptive_guide

    # dense and sparse share their top 10; BM25's top 10 is elsewhere: BM25's weight shrinks
    m = 30
    dense = np.arange(m, 0, -1, dtype=float)[None]
    bm25 = np.arange(1, m + 1, dtype=float)[None]
    exact = {"dense": dense, "sparse": dense.copy(), "bm25": bm25}
    listed = {n: np.ones((1, m), dtype=bool) for n in exact}
    w = adaptive_guide({"sparse": 0.5, "bm25": 0.5}, exact, listed, ("dense", "sparse", "bm25"))
    # agreement: sparse (1 + 0)/2 = 0.5, bm25 0 -> 0.55 / 0.6 and 0.05 / 0.6
    np.testing.assert_allclose(w["sparse"], [0.55 / 0.6])
    np.testing.assert_allclose(w["bm25"], [0.05 / 0.6])
    assert adaptive_guide({"bm25": 0.5}, exact, listed, ("dense", "bm25")) == {"bm25": 0.5}
