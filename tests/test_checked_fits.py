"""Fits and user-supplied functions are checked (issue #32): a relevance calibration whose fit is
degenerate is refused, never stored; the fitter converges where plain Newton steps diverged; a
reranker's scores must be one finite number per passage; `calibrate --method` offers only the
methods a calibration can be fitted on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _text_only import TextOnly, build

from hybridret import Searcher
from hybridret.errors import ConfigError
from hybridret.search.calibrate import MAX_LOGIT, Judged, calibrate, calibration_methods, check_fit, fit_calibration, fit_logistic
from hybridret.search.rerank import Reranker


def _deep_lists(seed: int = 0, queries: int = 30, depth: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Judged hits of a search deeper than the judged documents: one relevant hit near the top of
    each query's list, hundreds of non-relevant ones below (what `calibrate -k 1000` saw on a
    300-document index; plain Newton steps sent the intercept to -7.7e12 on it)."""
    rng = np.random.default_rng(seed)
    rank = np.tile(np.arange(1, depth + 1), queries).astype(float)
    y = np.zeros(queries * depth)
    for i in range(queries):
        y[i * depth + rng.integers(0, 3)] = 1
    dense = np.clip(0.6 - 0.05 * np.log(rank) + 0.05 * rng.standard_normal(len(y)) + 0.2 * y, -1, 1)
    return np.stack([dense, np.log(rank)], axis=1), y


def test_fit_converges_on_lists_deeper_than_the_judgments() -> None:
    x, y = _deep_lists()
    b0, w = fit_logistic(x, y)
    assert abs(b0) < MAX_LOGIT and np.abs(w).max() < MAX_LOGIT
    assert w[0] > 0 and w[1] < 0  # a higher cosine, a better rank: more likely relevant
    check_fit(b0, w, x, y, ("dense", "log_rank"))  # and it passes the degeneracy checks
    p = 1 / (1 + np.exp(-(b0 + x @ w)))
    assert abs(p.mean() - y.mean()) < 1e-3  # a logistic fit's mean probability is the base rate


def test_fit_is_unchanged_where_newton_steps_already_converged() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((400, 2))
    y = (x @ [1.5, -0.7] + rng.logistic(size=400) > 0).astype(float)
    b0, w = fit_logistic(x, y)
    # the penalized optimum: the gradient vanishes there
    a = np.hstack([np.ones((400, 1)), x])
    p = 1 / (1 + np.exp(-(a @ np.r_[b0, w])))
    grad = a.T @ (p - y) + np.r_[0.0, 1e-3 * 400 * w]
    assert np.abs(grad).max() < 1e-6


@pytest.mark.parametrize("b0, w, match", [
    (-7.7e12, [2.0, 0.6], "degenerate \\(intercept -7.7e\\+12"),
    (0.1, [1e6, -1.0], "degenerate \\(weight 1e\\+06 on dense"),
    (float("nan"), [1.0, 1.0], "did not converge"),
    (0.0, [float("inf"), 1.0], "did not converge"),
])
def test_degenerate_coefficients_are_refused(b0: float, w: list, match: str) -> None:
    x, y = _deep_lists(queries=3, depth=20)
    with pytest.raises(ConfigError, match=f"relevance model dense\\+log_rank .*{match}"):
        check_fit(b0, np.array(w), x, y, ("dense", "log_rank"))


def test_separable_judgments_are_refused_not_stored() -> None:
    rng = np.random.default_rng(1)
    n = 200
    labels = np.zeros(n, dtype=bool)
    labels[::10] = True
    bm25 = np.where(labels, 0.9, 0.2) + 0.05 * rng.random(n)  # every relevant hit scores above every other
    lists = Judged({"bm25": bm25, "log_rank": np.log(rng.integers(1, 10, n).astype(float))}, labels,
                   np.arange(n) // 10, None)
    with pytest.raises(ConfigError, match="separate the judged hits perfectly"):
        fit_calibration(lists)


# -- which methods can be calibrated -------------------------------------------------------------------
def test_calibrate_offers_and_accepts_only_methods_with_relevance_features(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    from hybridret.cli import main

    methods = calibration_methods()
    assert {"hybrid", "dense", "sparse", "bm25", "linear", "rrf", "gqr"} <= set(methods)
    assert "sparse_approx" not in methods
    with pytest.raises(ConfigError, match="cannot calibrate on method 'sparse_approx'.*choose one of hybrid"):
        calibrate(object(), {"q": "x"}, {"q": {"d": 1}}, method="sparse_approx")
    with pytest.raises(SystemExit) as code:
        main(["calibrate", str(tmp_path), "--queries", "q.tsv", "--qrels", "r.tsv", "--method", "sparse_approx"])
    assert code.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'sparse_approx'" in err and "'bm25'" in err


# -- rerankers' answers --------------------------------------------------------------------------------
class Returns(Reranker):
    def __init__(self, make) -> None:
        self.make = make

    def scores(self, query, passages):
        return self.make(passages)

    def __repr__(self) -> str:
        return "Returns()"


DOCS = [{"id": f"d{i}", "text": f"honey bees number {i} make honey"} for i in range(6)]


@pytest.fixture
def searcher(tmp_path: Path) -> Searcher:
    return Searcher(build(tmp_path / "idx", DOCS), encoder=TextOnly())


@pytest.mark.parametrize("make, match", [
    (lambda ps: [str(i) for i in range(len(ps))], "returned <U1 values \\('0', '1', '2'\\)"),
    (lambda ps: ["high"] * len(ps), "returned <U4 values"),
    (lambda ps: [True] * len(ps), "returned booleans"),
    (lambda ps: [None] * len(ps), "returned object values"),
    (lambda ps: [1.0] * (len(ps) - 1) + [float("nan")], "returned a non-finite score \\(nan for passage 4 of 5"),
    (lambda ps: [float("inf")] * len(ps), "returned a non-finite score \\(inf"),
    (lambda ps: [1.0], "returned 1 scores for 5 passages"),
    (lambda ps: np.ones((len(ps), 2)), "shape \\(5, 2\\)"),
])
def test_a_reranker_answer_that_cannot_rank_is_a_clear_error(searcher: Searcher, make, match: str) -> None:
    with pytest.raises(ConfigError, match=f"reranker Returns\\(\\) {match}" if "shape" not in match else match):
        searcher.search("honey", k=3, method="bm25", rerank=Returns(make), rerank_depth=5)


def test_a_reranker_returning_numbers_reorders(searcher: Searcher) -> None:
    hits = searcher.search("honey", k=3, method="bm25", rerank=Returns(lambda ps: [float(len(p)) for p in ps]),
                           rerank_depth=5)[0]
    assert len(hits) == 3 and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


# -- property: the fit never hands back a model it would refuse to store ---------------------------------
def test_fit_property_finite_or_refused() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    @hypothesis.settings(max_examples=60, deadline=None)
    @hypothesis.given(st.integers(0, 10_000), st.integers(2, 40), st.integers(1, 3), st.floats(0.0, 5.0))
    def prop(seed: int, n_pos: int, d: int, signal: float) -> None:
        rng = np.random.default_rng(seed)
        n = n_pos * 8
        y = np.zeros(n)
        y[:n_pos] = 1
        x = rng.standard_normal((n, d)) + signal * y[:, None]
        x[:, -1] = np.log(1 + rng.integers(0, 300, n))  # a log-rank-like column
        b0, w = fit_logistic(x, y)
        assert np.isfinite(b0) and np.isfinite(w).all()
        try:
            check_fit(b0, w, x, y, tuple(f"f{i}" for i in range(d)))
        except ConfigError as exc:  # refused, with the reason named
            assert "relevance model" in str(exc)
        else:
            assert abs(b0) <= MAX_LOGIT

    prop()
