"""The pruned learned-sparse part (index/impact.py) returns the brute-force dot-product top-k: on seeded
synthetic corpora (always run), through a living index (segments, deletes, filters) and across 2 shards."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from hybridret import HybridRetriever
from hybridret.errors import ConfigError, IndexFormatError
from hybridret.index.impact import ImpactIndex, ImpactSearchStats, approx_recall

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_ray import ray_cluster  # noqa: E402,F401 - a local Ray cluster for the 2-shard test

VOCAB = 500


def corpus(seed: int, n: int, vocab: int = VOCAB, dups: bool = True) -> sp.csr_matrix:
    """Zipf-like term choice, log-normal weights (SPLADE-like skew), some duplicated rows (exact ties)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 0.9
    p /= p.sum()
    lens = rng.integers(1, 60, size=n)
    indptr = np.concatenate([[0], np.cumsum(lens)])
    terms = rng.choice(vocab, size=int(indptr[-1]), p=p)
    w = rng.lognormal(-1.0, 0.9, size=len(terms)).astype(np.float32)
    D = sp.csr_matrix((w, terms, indptr), shape=(n, vocab))
    D.sum_duplicates()
    if dups:
        D = D.tolil()
        for r in range(0, min(n // 2, 60), 3):  # later rows repeat earlier ones: ties by row
            D[n - 1 - r] = D[r]
        D = D.tocsr()
    return D


def queries(seed: int, nq: int, D: sp.csr_matrix) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(nq):
        if i % 5 == 0:  # a document as the query
            out.append(D[int(rng.integers(D.shape[0]))])
            continue
        t = np.unique(rng.integers(0, D.shape[1], size=int(rng.integers(1, 40))))
        out.append(sp.csr_matrix((rng.lognormal(-0.5, 0.8, len(t)).astype(np.float32), t, [0, len(t)]),
                                 shape=(1, D.shape[1])))
    return sp.vstack(out).tocsr()


def build(root: Path, D: sp.csr_matrix, chunk: int = 0) -> ImpactIndex:
    b = ImpactIndex.create(root, D.shape[1])
    step = chunk or max(1, D.shape[0])
    for s in range(0, D.shape[0], step):
        b.add(D[s:s + step])
    b.close()
    return ImpactIndex(root)


def brute(part: ImpactIndex, Q: sp.csr_matrix, k: int, allowed: np.ndarray | None = None):
    """Top-k of every row's exact score (the part's own score routine over all rows), > 0, ties by row."""
    n = part.num_docs
    every = np.tile(np.arange(n), (Q.shape[0], 1))
    S = part.score(Q, every)
    if allowed is not None:
        S[:, ~allowed] = 0
    rows, scores = [], []
    for s in S:
        order = np.lexsort((np.arange(n), -s))[:k]
        order = order[s[order] > 0]
        rows.append(order)
        scores.append(s[order])
    return rows, scores


def assert_exact(got, want):
    rows, scores = got
    for i, (r, s) in enumerate(zip(*want)):
        assert rows[i, :len(r)].tolist() == r.tolist(), i
        assert (rows[i, len(r):] == -1).all() and np.isneginf(scores[i, len(r):]).all()
        np.testing.assert_array_equal(scores[i, :len(r)], s)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 10, 50])
def test_exact_top_k_equals_brute_force(tmp_path, seed, k):
    D = corpus(seed, 3000)
    part = build(tmp_path / "p", D, chunk=700)
    Q = queries(seed + 10, 60, D)
    assert_exact(part.search(Q, k), brute(part, Q, k))


def test_pruning_engages_and_stays_exact(tmp_path):
    """A corpus big enough that whole layers are skipped on most queries: still the brute-force top-k."""
    D = corpus(7, 40_000, vocab=2000, dups=False)
    part = build(tmp_path / "p", D, chunk=9000)
    Q = queries(8, 60, D)
    st = ImpactSearchStats()
    got = part.search(Q, 10, stats=st)
    assert_exact(got, brute(part, Q, 10))
    # queries with more postings than documents get pruned (shorter ones are cheaper to scan)
    assert (st.postings < st.total).sum() >= 5, "pruning never skipped a layer"
    assert st.share < 0.9, st.share


@pytest.mark.parametrize("share", [0.5, 0.05, 0.002])
def test_allowed_mask_is_exact(tmp_path, share):
    D = corpus(3, 4000)
    part = build(tmp_path / "p", D)
    Q = queries(4, 40, D)
    allowed = np.random.default_rng(5).random(D.shape[0]) < share
    assert_exact(part.search(Q, 10, allowed=allowed), brute(part, Q, 10, allowed))
    assert set(part.search(Q, 10, allowed=allowed)[0].ravel().tolist()) - {-1} <= set(np.flatnonzero(allowed))


def test_threads_give_the_same_result(tmp_path):
    D = corpus(9, 3000)
    part = build(tmp_path / "p", D)
    Q = queries(11, 64, D)
    one = part.search(Q, 10, threads=1)
    many = part.search(Q, 10, threads=4)
    np.testing.assert_array_equal(one[0], many[0])
    np.testing.assert_array_equal(one[1], many[1])


def test_edge_queries(tmp_path):
    D = corpus(12, 500)
    part = build(tmp_path / "p", D)
    absent = int(np.setdiff1d(np.arange(VOCAB), D.indices)[0]) if len(np.setdiff1d(np.arange(VOCAB), D.indices)) else None
    rows = [sp.csr_matrix((1, VOCAB), dtype=np.float32)]  # empty query
    if absent is not None:
        rows.append(sp.csr_matrix(([1.0], [absent], [0, 1]), shape=(1, VOCAB), dtype=np.float32))
    rare = int(np.argmin(np.where(part.df > 0, part.df, 10**9)))
    rows.append(sp.csr_matrix(([2.0], [rare], [0, 1]), shape=(1, VOCAB), dtype=np.float32))  # k > matches
    Q = sp.vstack(rows).tocsr()
    got = part.search(Q, 200)
    assert (got[0][0] == -1).all()
    assert_exact(got, brute(part, Q, 200))
    dup = sp.csr_matrix(([1.0, 1.0], [rare, rare], [0, 2]), shape=(1, VOCAB), dtype=np.float32)  # repeated column
    np.testing.assert_array_equal(part.search(dup, 5)[1], part.search(Q[-1] * 1.0, 5)[1])


def test_scores_of_given_rows_match_search(tmp_path):
    D = corpus(13, 800)
    part = build(tmp_path / "p", D)
    Q = queries(14, 20, D)
    rows, scores = part.search(Q, 10)
    again = part.score(Q, rows)
    np.testing.assert_array_equal(np.where(rows >= 0, again, -np.inf), scores)
    assert (part.score(Q, np.full((20, 3), -1))[:, :] == 0).all()
    dense = (Q @ D.T).toarray()
    np.testing.assert_allclose(again[rows >= 0], np.take_along_axis(dense, np.maximum(rows, 0), 1)[rows >= 0],
                               rtol=1e-5, atol=1e-6)


def test_approx_mode_is_opt_in_and_measured(tmp_path):
    D = corpus(15, 20_000, vocab=2000, dups=False)
    part = build(tmp_path / "p", D)
    Q = queries(16, 50, D)
    rows, scores = part.search(Q, 10, mode="approx")
    again = part.score(Q, rows)  # whatever it returns carries exact scores
    np.testing.assert_array_equal(np.where(rows >= 0, again, -np.inf), scores)
    r = approx_recall(part, Q, 10)
    assert 0.5 <= r <= 1.0
    with pytest.raises(ConfigError, match="mode"):
        part.search(Q, 10, mode="fast")


def test_bad_input_is_refused(tmp_path):
    D = corpus(17, 100)
    b = ImpactIndex.create(tmp_path / "p", VOCAB)
    with pytest.raises(ConfigError, match="columns"):
        b.add(sp.csr_matrix((2, VOCAB + 1), dtype=np.float32))
    with pytest.raises(ConfigError, match="non-negative"):
        b.add(sp.csr_matrix(([-1.0], [3], [0, 1]), shape=(1, VOCAB)))
    with pytest.raises(ConfigError, match="finite"):
        b.add(sp.csr_matrix(([np.nan], [3], [0, 1]), shape=(1, VOCAB)))
    b.add(D)
    b.close()
    part = ImpactIndex(tmp_path / "p")
    with pytest.raises(ConfigError, match="non-negative"):
        part.search(sp.csr_matrix(([-1.0], [3], [0, 1]), shape=(1, VOCAB)), 5)
    with pytest.raises(ConfigError, match="columns"):
        part.search(sp.csr_matrix((1, 7), dtype=np.float32), 5)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="k must"):
            part.search(D[:1], bad)
    with pytest.raises(ConfigError, match="allowed mask"):
        part.search(D[:1], 5, allowed=np.ones(3, bool))
    with pytest.raises(ConfigError, match="not empty"):
        ImpactIndex.create(tmp_path / "p", VOCAB)
    with pytest.raises(ConfigError, match="fractions"):
        ImpactIndex.create(tmp_path / "q", VOCAB, fractions=(0.5, 0.2, 1.0))


def test_damaged_part_is_detected(tmp_path):
    D = corpus(18, 300)
    build(tmp_path / "p", D)
    meta = json.loads((tmp_path / "p" / "meta.json").read_text())
    (tmp_path / "p" / "meta.json").write_text(json.dumps(dict(meta, nnz=meta["nnz"] + 1)))
    with pytest.raises(IndexFormatError, match="do not match"):
        ImpactIndex(tmp_path / "p")
    (tmp_path / "p" / "meta.json").write_text(json.dumps(meta))
    w = np.load(tmp_path / "p" / "postings.w.npy")
    w[0] += 1.0
    np.save(tmp_path / "p" / "postings.w.npy", w)
    assert any("do not match the forward store" in p for p in ImpactIndex(tmp_path / "p").check())
    (tmp_path / "p" / "meta.json").write_text(json.dumps(dict(meta, format="hybridret-impact-v9")))
    with pytest.raises(IndexFormatError, match="unsupported"):
        ImpactIndex(tmp_path / "p")


# -- through a living index ------------------------------------------------------------------------------
QUERIES = ["how do vaccines work", "solar panels on a roof", "the history of the printing press", "python"]


def _docs(small_corpus):
    return [dict(d, metadata={"n": i, "half": "a" if i % 2 else "b"}) for i, d in enumerate(small_corpus)]


def _brute_index(r: HybridRetriever, k: int, keep=None):
    snap = r.searcher.snapshot
    ids = sorted(snap.live_ids(), key=lambda i: snap.row_of(i))
    docs = r.get(ids)
    texts = [(d.get("title", "") + " " + d["text"]).strip() for d in docs]
    enc = r.encoder
    S = (enc.encode_queries(QUERIES).sparse @ enc.encode_documents(texts).sparse.T).toarray()
    mask = np.array([keep(d) if keep else True for d in docs])
    out = []
    for s in S:
        s = np.where(mask, s, 0)
        order = np.lexsort((np.arange(len(ids)), -s))[:k]
        out.append([ids[j] for j in order if s[j] > 0])
    return out, S


@pytest.fixture(scope="module")
def living(paired_encoder, small_corpus, tmp_path_factory) -> HybridRetriever:
    docs = _docs(small_corpus)
    third = len(docs) // 3
    r = HybridRetriever(paired_encoder, max_segments=0).index(docs[:third], workdir=tmp_path_factory.mktemp("imp") / "i")
    r.add(docs[third:2 * third])
    r.add(docs[2 * third:])
    r.delete([docs[1]["id"], docs[third + 2]["id"], docs[-1]["id"]])
    return r


def test_a_living_index_writes_the_default_part_and_searches_exactly(living):
    snap = living.searcher.snapshot
    assert len(snap.segments) == 3 and snap.num_deleted == 3
    assert {type(s.part("sparse")).__name__ for s in snap.segments} == {"WindowImpactIndex"}  # v2 since issue #30
    assert living.manifest["parts"]["sparse"]["format"] == "hybridret-impact-v2"
    for keep, filt in ((None, None), (lambda d: d["metadata"]["half"] == "a", {"half": "a"})):
        want, _ = _brute_index(living, 5, keep)
        got = living.search(QUERIES, k=5, method="sparse", filter=filt)
        assert [[x for x in row if x] for row in got.ids.tolist()] == want


def test_compact_keeps_the_exact_results(living, tmp_path):
    before = living.search(QUERIES, k=5, method="sparse")
    other = HybridRetriever.load(living.searcher.root, encoder=living.encoder)
    other.compact()
    after = other.search(QUERIES, k=5, method="sparse")
    assert after.ids.tolist() == before.ids.tolist()
    np.testing.assert_allclose(after.scores, before.scores, rtol=1e-6)


def test_two_shards_equal_one_index(living, tmp_path, ray_cluster):  # noqa: F811 - the fixture imported above
    from hybridret.distributed.reshard import reshard
    from hybridret.distributed.searcher import ShardedSearcher

    reshard(living.searcher.root, tmp_path / "sharded", 2)
    searcher = ShardedSearcher.open(tmp_path / "sharded", encoder=living.encoder)
    try:
        for method in ("sparse", "sparse_approx", "hybrid"):
            got = searcher.search(QUERIES, k=5, method=method)
            want = living.search(QUERIES, k=5, method=method)
            assert got.ids.tolist() == want.ids.tolist(), method
            np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-6)
    finally:
        searcher.close()


def test_info_reports_the_approximate_modes_recall(living, capsys):
    from hybridret.cli import main

    assert main(["info", str(living.searcher.root), "--sparse-approx", "--sample", "12", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)["sparse_approx"]
    assert rep["queries"] == 12 and 0.0 <= rep["recall"] <= 1.0 and rep["k"] == 10
    assert main(["info", str(living.searcher.root), "--sparse-approx", "--sample", "5"]) == 0
    assert "sparse_approx: recall@10" in capsys.readouterr().out
