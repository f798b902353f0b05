"""bm25+rm3 (retrievers/rm3.py): the relevance model and the interpolation against hand-computed
weights, the feedback documents being BM25's top ``fb_docs``, and search / exact scoring equal to a
brute-force weighted BM25 over the live documents (several segments, a tombstone)."""

from __future__ import annotations

import math
import random
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from _text_only import build

from hybridret.errors import ConfigError
from hybridret.index.bm25 import K1, B, fieldnorm_to_id, id_to_fieldnorm
from hybridret.index.snapshot import open_snapshot
from hybridret.retrievers import QueryBatch, score_rows, search_rows
from hybridret.retrievers.bm25 import BM25Retriever, bm25_tokens
from hybridret.retrievers.rm3 import RM3Retriever, expansion, relevance_model

WORDS = ("cat dog dogs running runs ran quick brown fox jumps over lazy river bank banks money finance "
         "tree forest leaf green water lake boat sail wind storm the a of and").split()
QUERIES = ["cat dog", "running fox river", "banks money money", "boat sail", "green forest tree leaf", "unknownword cat",
           "the of and", ""]


def synthetic(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"d{i:04d}", "title": rng.choice(WORDS) if i % 3 == 0 else "",
             "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40 if i % 7 else 120)))} for i in range(n)]


def full_text(d: dict) -> str:
    return f"{d['title'].strip()} {d['text'].strip()}".strip() if d["title"].strip() else d["text"].strip()


# ------------------------------------------------------------------------------- hand-computed weights

def test_relevance_model_two_documents():
    # d1 = a a b c (|d| 4, score 3), d2 = a d (|d| 2, score 1): normalised scores 0.75, 0.25
    # P(a) = .75 * 2/4 + .25 * 1/2 = .5, P(b) = P(c) = .75 / 4 = .1875, P(d) = .25 / 2 = .125
    assert relevance_model([["a", "a", "b", "c"], ["a", "d"]], [3.0, 1.0], 10) == pytest.approx(
        {"a": 0.5, "b": 0.1875, "c": 0.1875, "d": 0.125})
    # top 3 (b and c tie: by token), renormalised by .875
    rm = relevance_model([["a", "a", "b", "c"], ["a", "d"]], [3.0, 1.0], 3)
    assert list(rm) == ["a", "b", "c"] and rm == pytest.approx({"a": 4 / 7, "b": 3 / 14, "c": 3 / 14})
    # empty documents and non-positive scores contribute nothing; nothing left: no model
    assert relevance_model([[], ["x"]], [5.0, 1.0], 10) == {"x": 1.0}
    assert relevance_model([["x"]], [0.0], 10) == {} and relevance_model([], [], 10) == {}


def test_interpolation():
    rm = {"a": 4 / 7, "b": 3 / 14, "c": 3 / 14}
    got = expansion(["a", "x", "x"], rm, 0.5)  # P(a|q) = 1/3, P(x|q) = 2/3
    assert got == pytest.approx({"a": 1 / 6 + 2 / 7, "x": 1 / 3, "b": 3 / 28, "c": 3 / 28})
    assert sum(got.values()) == pytest.approx(1.0)
    assert expansion(["a", "x", "x"], {}, 0.5) == pytest.approx({"a": 1 / 3, "x": 2 / 3})  # no feedback: the query
    assert expansion(["a", "x"], rm, 1.0) == pytest.approx({"a": 0.5, "x": 0.5})
    assert expansion(["a", "x"], rm, 0.0) == pytest.approx(rm)  # original-only terms get weight 0: dropped
    assert expansion([], {}, 0.5) == {}


def test_bad_parameters():
    for kw in ({"fb_docs": 0}, {"fb_terms": 0}, {"original_query_weight": 1.5}, {"original_query_weight": -0.1}):
        with pytest.raises(ConfigError):
            RM3Retriever(**kw)


# ------------------------------------------------------------------------------- over an index

def brute_force(docs: list[dict], tokens_of: dict[str, list[str]], weights: dict[str, float], live: list[str]
                ) -> dict[str, float]:
    """Weighted BM25 of every live document: sum_t w_t (1 + k1) idf_t tf / (tf + k1 (1 - b + b dl / avgdl)),
    dl quantised by tantivy's fieldnorm table, statistics over the live documents."""
    n = len(live)
    avgdl = sum(len(tokens_of[d]) for d in live) / n
    tf = {d: Counter(tokens_of[d]) for d in live}
    out = {}
    for d in live:
        dl = float(id_to_fieldnorm(fieldnorm_to_id(len(tokens_of[d]))))
        s = 0.0
        for t, w in weights.items():
            df = sum(1 for x in live if tf[x][t])
            if not df or not tf[d][t]:
                continue
            idf = math.log1p((n - df + 0.5) / (df + 0.5))
            s += w * (1 + K1) * idf * tf[d][t] / (tf[d][t] + K1 * (1 - B + B * dl / avgdl))
        if s > 0:
            out[d] = s
    return out


@pytest.mark.parametrize("parts, delete", [(1, ()), (3, ("d0005", "d0100"))])
def test_feedback_search_and_scores_equal_brute_force(tmp_path, parts, delete):
    docs = synthetic(240)
    path = build(tmp_path / "ix", docs, parts=parts, delete=delete)
    snap = open_snapshot(path)
    assert len(snap.segments) == parts
    live = [d["id"] for d in docs if d["id"] not in delete]
    tokens_of = dict(zip([d["id"] for d in docs], bm25_tokens(snap, [full_text(d) for d in docs])))
    q = QueryBatch(list(QUERIES))
    rm3 = RM3Retriever(fb_docs=5, fb_terms=8)
    ctx = rm3.prepare(snap, q)
    # the feedback documents are BM25's top 5; the weights, the hand formulas over their texts
    rows, scores = search_rows(BM25Retriever(), snap, q, 5)
    for i, toks in enumerate(bm25_tokens(snap, QUERIES)):
        fb = [str(snap.ids[r]) for r in rows[i] if r >= 0]
        rm = relevance_model([tokens_of[d] for d in fb], scores[i][: len(fb)], 8)
        assert ctx.weights[i] == pytest.approx(expansion(toks, rm, 0.5))
        assert len(ctx.weights[i]) <= len(set(toks)) + 8
    assert not ctx.weights[-1] and not ctx.weights[-2]  # empty and stop-word queries: nothing to search
    assert set(ctx.weights[5]) > {"cat"}  # an unknown word does not stop feedback
    got_rows, got_scores = search_rows(rm3, snap, q, 20, ctx=ctx)
    all_rows = np.tile(np.array([snap.row_of(d) for d in live]), (len(QUERIES), 1))
    exact = score_rows(rm3, snap, q, all_rows, ctx)
    for i in range(len(QUERIES)):
        want = brute_force(docs, tokens_of, ctx.weights[i], live)
        np.testing.assert_allclose(exact[i], [want.get(d, 0.0) for d in live], rtol=1e-5, atol=1e-7)
        top = sorted(want.items(), key=lambda kv: (-kv[1], snap.row_of(kv[0])))[:20]
        ids = [str(snap.ids[r]) for r in got_rows[i] if r >= 0]
        assert len(ids) == len(top)
        np.testing.assert_allclose(got_scores[i][: len(ids)], [s for _, s in top], rtol=1e-5)
        assert ids == [d for d, _ in top] or sorted(ids) == sorted(d for d, _ in top)  # float32 near-ties
        # search and exact scoring agree bit for bit
        np.testing.assert_array_equal(score_rows(rm3, snap, q.slice(i, i + 1), got_rows[i:i + 1], rm3.prepare(
            snap, q.slice(i, i + 1)))[0][got_rows[i] >= 0], got_scores[i][got_rows[i] >= 0])


def test_expansion_changes_the_ranking(tmp_path):
    docs = [{"id": "a", "title": "", "text": "boat sail wind"}, {"id": "b", "title": "", "text": "boat sail wind storm"},
            {"id": "c", "title": "", "text": "storm lake water"}, {"id": "d", "title": "", "text": "green forest"}]
    snap = open_snapshot(build(tmp_path / "ix", docs))
    q = QueryBatch(["boat"])
    rows, _ = search_rows(RM3Retriever(fb_docs=2), snap, q, 4)
    # "storm" and "wind" come from the feedback documents a and b: c (no "boat") is now found; d is not
    assert [str(snap.ids[r]) for r in rows[0] if r >= 0][2:] == ["c"]


def test_segment_without_store_is_a_clear_error(tmp_path):
    path = tmp_path / "ix"  # sparse format 1, written before the BM25 posting store (tests/data/legacy)
    shutil.copytree(Path(__file__).parent / "data" / "legacy" / "format1-planes", path)
    snap = open_snapshot(path)
    assert not RM3Retriever().available(snap) and BM25Retriever().available(snap)
    with pytest.raises(ConfigError, match="compact"):
        RM3Retriever().prepare(snap, QueryBatch(["cat"]))
