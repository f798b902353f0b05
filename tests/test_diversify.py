"""The diversity stage (MMR, ``diversify=λ``) against a brute-force MMR written here, on a seeded
living index (real encoders, FAISS, tantivy): single retrievers over every live document, grouped
documents, pages, the fused methods' properties, and a small case checked by hand."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from hybridret import HybridRetriever
from hybridret.errors import ConfigError
from hybridret.retrievers import REGISTRY, score_rows, vectors_of
from hybridret.search.diversify import DIVERSIFY_POOL, mmr_order
from hybridret.search.request import SearchRequest

SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample"
QUERIES = ["What happens when a star exhausts its hydrogen?", "how do tides work", "insulin discovery",
           "the history of the printing press"]


@pytest.fixture(scope="module")
def kb(paired_encoder, tmp_path_factory) -> HybridRetriever:
    """70 sample passages plus a near-duplicate of every fifth (same text with a suffix: what makes
    a RAG prompt redundant), grouped in ``parent_id`` documents, in two segments with deletes."""
    rng = random.Random(34)
    base = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").open()][:70]
    docs = [{"id": d["_id"], "title": d.get("title", ""), "text": d["text"],
             "metadata": {"parent_id": f"doc{rng.randrange(30)}", "lang": ("en", "de")[i % 2]}}
            for i, d in enumerate(base)]
    docs += [{"id": d["id"] + "-copy", "title": d["title"], "text": d["text"] + " (mirror copy)",
              "metadata": dict(d["metadata"])} for d in docs[::5]]
    rng.shuffle(docs)
    r = HybridRetriever(paired_encoder).index(docs[:60], workdir=tmp_path_factory.mktemp("div") / "idx")
    r.add(docs[60:])
    r.delete([d["id"] for d in docs[::23]])
    assert r.num_docs < DIVERSIFY_POOL  # so a single retriever's pool is every live document
    return r


def brute_mmr(rel: np.ndarray, vecs: np.ndarray, lam: float, n: int) -> list[int]:
    """MMR written out: relevance min-max normalised, the next item the best of λ·rel − (1−λ)·max cos."""
    rel = (rel - rel.min()) / (rel.max() - rel.min()) if rel.max() > rel.min() else np.ones_like(rel)
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    chosen: list[int] = []
    while len(chosen) < min(n, len(rel)):
        best, best_gain = -1, -np.inf
        for i in range(len(rel)):
            if i in chosen:
                continue
            sim = max((float(unit[i] @ unit[j]) for j in chosen), default=0.0)
            gain = rel[i] if not chosen else lam * rel[i] - (1 - lam) * sim
            if gain > best_gain + 1e-12:
                best, best_gain = i, gain
        chosen.append(best)
    return chosen


def _every_doc(r: HybridRetriever, name: str, query: str, lang: str | None):
    """Every live (filter-matching) row the retriever can list with its exact score, best first (ties by row)."""
    snap = r.searcher.snapshot
    rows = np.array(sorted(snap.row_of(i) for i in snap.live_ids()), dtype=np.int64)
    if lang is not None:
        rows = np.array([r for r in rows.tolist() if snap.get(r)[2].get("lang") == lang], dtype=np.int64)
    q = r.searcher.encode_queries([query], {REGISTRY[name].needs} - {"text"})
    scores = score_rows(REGISTRY[name], snap, q, rows[None, :]).ravel().astype(np.float64)
    if name == "dense":
        scores = (q.dense @ vectors_of(snap, rows).T).ravel()
    if REGISTRY[name].positive_only:  # such a retriever lists only the rows it scores above 0
        rows, scores = rows[scores > 0], scores[scores > 0]
    order = np.lexsort((rows, -scores))
    return rows[order], scores[order]


def test_hand_checked_small_case():
    """Three hits: a, a near-copy of a, and b unlike both. Relevance 1.0 / 0.9 / 0.5 (normalised 1, 0.8, 0)."""
    a, a2, b = [1.0, 0.0], [0.995, 0.0998], [0.0, 1.0]
    vecs = np.array([[a, a2, b]], dtype=np.float32)
    rel, valid = np.array([[1.0, 0.9, 0.5]]), np.ones((1, 3), bool)
    assert mmr_order(rel, vecs, valid, 1.0, 3).tolist() == [[0, 1, 2]]  # λ = 1: the first stage's order
    # λ = 0.5: after a, the copy gains 0.5·0.8 − 0.5·0.995 < 0 = b's 0.5·0 − 0.5·0
    assert mmr_order(rel, vecs, valid, 0.5, 3).tolist() == [[0, 2, 1]]
    # λ = 0.9: the copy's 0.9·0.8 − 0.1·0.995 = 0.62 beats b's 0
    assert mmr_order(rel, vecs, valid, 0.9, 3).tolist() == [[0, 1, 2]]
    assert mmr_order(rel, vecs, np.array([[True, False, True]]), 0.5, 3).tolist() == [[0, 2, -1]]


@pytest.mark.parametrize("name", ["dense", "sparse", "bm25"])
@pytest.mark.parametrize("lam", [0.0, 0.5, 0.8])
def test_single_retrievers_equal_brute_force_mmr(kb, name, lam):
    snap = kb.searcher.snapshot
    for query in QUERIES:
        for lang in (None, "de"):
            rows, scores = _every_doc(kb, name, query, lang)
            want = brute_mmr(scores, vectors_of(snap, rows).astype(np.float64), lam, 8)
            got = kb.search(query, k=8, method=name, diversify=lam, filter={"lang": lang} if lang else None)
            pad = [-1] * (8 - len(want))  # fewer matching documents than k: the list ends early, never made up
            assert got.rows[0].tolist() == rows[want].tolist() + pad, (query, lang)
            n = len(want)  # the first stage's scores are kept
            np.testing.assert_allclose(got.scores[0][:n], scores[want], rtol=1e-4, atol=1e-4)


def test_grouped_diversifies_documents_by_their_best_chunk(kb):
    """Grouped (dense, exact groups): every group of the index is in the pool; a group's relevance is
    its best chunk's score and its vector that chunk's."""
    snap = kb.searcher.snapshot
    for query in QUERIES[:3]:
        rows, scores = _every_doc(kb, "dense", query, None)
        best: dict[str, tuple[int, float]] = {}
        for row, s in zip(rows.tolist(), scores.tolist()):
            key = snap.get(row)[2].get("parent_id")
            best.setdefault(key, (row, s))  # rows come best first: the first seen is the best chunk
        keys = list(best)
        want = brute_mmr(np.array([best[k][1] for k in keys]), vectors_of(snap, np.array([best[k][0] for k in keys]))
                         .astype(np.float64), 0.5, 5)
        got = kb.search(query, k=5, method="dense", diversify=0.5, group_by="parent_id", group_size=2)
        assert list(got.group_keys[0]) == [keys[i] for i in want]
        for g in got.groups(0):
            assert g.hits[0].id == snap.ids[best[g.key][0]]  # each group keeps its chunks, best first
            assert all(h.metadata["parent_id"] == g.key for h in g.hits)


@pytest.mark.parametrize("method", ["hybrid", "rrf", "dense"])
@pytest.mark.parametrize("group", [None, "parent_id"])
def test_pages_continue_the_same_mmr_order(kb, method, group):
    kw = {"method": method, "diversify": 0.6, "group_by": group}
    full = kb.search(QUERIES, k=6, **kw)
    pages = [kb.search(QUERIES, k=3, offset=o, **kw) for o in (0, 3)]
    assert np.concatenate([p.ids for p in pages], axis=1).tolist() == full.ids.tolist()
    if group:
        assert np.concatenate([p.group_keys for p in pages], axis=1).tolist() == full.group_keys.tolist()


@pytest.mark.parametrize("method", ["hybrid", "rrf", "linear", "sparse"])
def test_lambda_one_is_the_first_stage_and_lower_lambdas_are_less_redundant(kb, method):
    snap = kb.searcher.snapshot
    for group in ("parent_id", None):  # grouped: the same groups, the same chunks
        kw = {"group_by": group, "group_size": 2} if group else {}
        a, b = kb.search(QUERIES, k=5, method=method, **kw), kb.search(QUERIES, k=5, method=method, diversify=1.0, **kw)
        assert a.ids.tolist() == b.ids.tolist()
        np.testing.assert_allclose(a.scores, b.scores)
    plain = kb.search(QUERIES, k=8, method=method)
    same = kb.search(QUERIES, k=8, method=method, diversify=1.0)
    assert same.ids.tolist() == plain.ids.tolist()
    np.testing.assert_allclose(same.scores, plain.scores)

    def redundancy(hits):
        out = []
        for i in range(len(QUERIES)):
            rows = hits.rows[i][hits.rows[i] >= 0]
            v = vectors_of(snap, rows)
            v = v / np.linalg.norm(v, axis=1, keepdims=True)
            sims = v @ v.T
            out.append(sims[np.triu_indices(len(rows), 1)].mean())
        return float(np.mean(out))

    assert redundancy(kb.search(QUERIES, k=8, method=method, diversify=0.3)) < redundancy(plain)
    div = kb.search(QUERIES, k=8, method=method, diversify=0.3)
    for i in range(len(QUERIES)):  # the same pool: the most relevant hit first, nothing invented
        assert div.ids[i][0] == plain.ids[i][0]
        assert all(x.endswith("-copy") is False or x[:-5] not in div.ids[i] for x in div.ids[i])


def test_with_a_reranker_the_pool_is_the_reranked_list(kb):
    from hybridret.search.rerank import Reranker

    class Length(Reranker):
        def scores(self, query, passages):
            return [float(len(p)) for p in passages]

    rr = kb.search(QUERIES, k=5, rerank=Length(), rerank_depth=20)
    div = kb.search(QUERIES, k=5, rerank=Length(), rerank_depth=20, diversify=1.0)
    assert div.ids.tolist() == rr.ids.tolist()
    pool = kb.search(QUERIES, k=20, rerank=Length(), rerank_depth=20)
    snap = kb.searcher.snapshot
    got = kb.search(QUERIES, k=5, rerank=Length(), rerank_depth=20, diversify=0.4)
    for i in range(len(QUERIES)):
        rows = pool.rows[i][pool.rows[i] >= 0]
        want = brute_mmr(pool.scores[i][:len(rows)].astype(np.float64), vectors_of(snap, rows).astype(np.float64),
                         0.4, 5)
        assert got.rows[i].tolist() == rows[want].tolist()


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), True, "0.5", [0.5]])
def test_bad_lambda_is_a_config_error_naming_it(kb, bad):
    with pytest.raises(ConfigError, match="diversify must be"):
        SearchRequest("q", diversify=bad)
    with pytest.raises(ConfigError, match="diversify must be"):
        kb.search("q", diversify=bad)


def test_an_index_without_dense_vectors_says_so(tmp_path):
    from _text_only import build

    from hybridret import Searcher

    path = build(tmp_path / "bm25", [{"id": "a", "text": "cats"}, {"id": "b", "text": "dogs"}])
    with pytest.raises(ConfigError, match="diversify compares the candidates' stored dense vectors"):
        Searcher(path).search("cats", method="bm25", diversify=0.5)
