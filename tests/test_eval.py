"""Metrics through pytrec_eval: hand-computed expectations and which queries count."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hybridret.errors import ConfigError
from hybridret.eval import evaluate, per_query, run_from_rows

QRELS = {"q1": {"a": 2, "b": 1}, "q2": {"c": 1}, "q3": {"z": 1}}


def test_hand_computed_ndcg_mrr_recall():
    run = {"q1": {"b": 3.0, "x": 2.0, "a": 1.0}, "q2": {"x": 2.0, "c": 1.0}}
    got = per_query(run, QRELS, ("ndcg@10", "mrr@10", "recall@100", "mrr@1"))
    # q1: gains b=1 at rank 1, a=2 at rank 3; ideal a=2, b=1 (trec_eval's gain is the grade itself)
    dcg = 1 / math.log2(2) + 2 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert got["ndcg@10"]["q1"] == pytest.approx(dcg / idcg)
    assert got["mrr@10"]["q1"] == 1.0 and got["mrr@10"]["q2"] == 0.5
    assert got["mrr@1"]["q2"] == 0.0  # cut at 1: c sits at rank 2
    assert got["recall@100"]["q2"] == 1.0
    assert set(got["ndcg@10"]) == {"q1", "q2"}  # q3 was never searched: left out, not counted as 0


def test_searched_but_empty_counts_zero_and_relevance_level():
    run = {"q1": {"b": 1.0}, "q3": {}}
    means = evaluate(run, QRELS, ("recall@100",))
    assert means["recall@100"] == pytest.approx((0.5 + 0.0) / 2)
    strict = evaluate(run, QRELS, ("recall@100",), relevance_level=2)  # only a (grade 2) counts in q1
    assert strict["recall@100"] == pytest.approx(0.0)


def test_errors_and_run_from_rows():
    with pytest.raises(ConfigError, match="unknown metric"):
        evaluate({"q1": {"a": 1.0}}, QRELS, ("bleu",))
    with pytest.raises(ConfigError, match="relevance judgments"):
        evaluate({"nope": {"a": 1.0}}, QRELS)
    run = run_from_rows(np.array([[1, 0, -1]]), np.array(["a", "b"], dtype=object), ["q1"])
    assert list(run["q1"]) == ["b", "a"] and run["q1"]["b"] > run["q1"]["a"]
