"""The pruned top-k of the BM25 store (MaxScore with block-max bounds, ``_bm25_kernels.topk_pruned``)
against the exhaustive kernel (``prune=False``) and a brute-force numpy computation, on seeded
random corpora: Zipf-like tokens, short and long documents, exact ties, allowed masks, outside
statistics (another avgdl and df, as the sharded and tombstoned paths score with), repeated query
tokens, one-term queries, unknown terms, k beyond the matching documents. Rows, tie order and
float32 scores must be identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridret.errors import ConfigError
from hybridret.index.bm25 import BLOCK, K1, BM25Store, BM25StoreBuilder, QueryTerms, SegmentQueries, TfFactors, idf

pytest.importorskip("numba")

KS = (1, 10, 100)


class Pretokenized:
    """Documents given as token lists (the store's analyzer plays no part in pruning)."""

    def analyze(self, tokens: list[str]) -> list[str]:
        return tokens


def zipf_docs(n: int, seed: int, vocab: int = 1500, s: float = 1.1) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** s
    lengths = np.where(rng.random(n) < 0.1, rng.integers(80, 400, n), rng.integers(1, 40, n))
    ids = rng.choice(vocab, size=int(lengths.sum()), p=p / p.sum())
    docs = [[f"w{i}" for i in d] for d in np.split(ids, np.cumsum(lengths)[:-1])]
    for i in rng.choice(n, size=n // 20, replace=False):  # exact copies: many exact ties
        docs[i] = list(docs[i % 50])
    return docs


@pytest.fixture(scope="module", params=[0, 1, 2])
def corpus(request, tmp_path_factory) -> tuple[BM25Store, list[list[str]], np.random.Generator]:
    seed = request.param
    docs = zipf_docs(6000, seed)
    b = BM25StoreBuilder(Path(tmp_path_factory.mktemp(f"bm25-{seed}")) / "store", Pretokenized())
    b.add(docs)
    b.close()
    return BM25Store(b.root), docs, np.random.default_rng(100 + seed)


def queries(docs: list[list[str]], rng: np.random.Generator, count: int = 60) -> list[list[str]]:
    """3-6 tokens of a random document, some with a repeated token, an unknown one, or a very common
    one; plus one-term and empty queries."""
    out: list[list[str]] = []
    for i in range(count):
        uniq = list(dict.fromkeys(docs[int(rng.integers(len(docs)))]))
        q = [uniq[j] for j in rng.choice(len(uniq), size=min(len(uniq), int(rng.integers(3, 7))), replace=False)]
        if i % 5 == 1:
            q.append(q[0])
        if i % 7 == 2:
            q.insert(1, "unknown-token")
        if i % 4 == 3:
            q.append(f"w{int(rng.integers(0, 5))}")
        out.append(q)
    return out + [["w0"], ["w3"], [uniq[0]], ["unknown-token"], [], ["w1", "w1", "w1"], ["w0", "w1", "w2", "w4"]]


def segment_queries(store: BM25Store, tokens: list[list[str]], n: int | None = None,
                    df: dict[str, int] | None = None) -> SegmentQueries:
    """The queries in the store's term ids, weighted with its own statistics or outside ones."""
    qt = QueryTerms.of(tokens)
    local = store.lookup(qt.tokens)
    if df is None:
        d = store._df_pad[local]
    else:
        d = np.array([df.get(t, 0) for t in qt.tokens], dtype=np.int64)
    n = store.num_docs if n is None else n
    w = qt.count * (1.0 + K1) * np.where(d > 0, idf(np.maximum(d, 1), n), 0.0)[qt.tok]
    return qt.restrict(local, w)


def brute_force(store: BM25Store, q: SegmentQueries, fac: np.ndarray, k: int, allowed: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Every document's score, float64 in query-term order (the store's arithmetic), then the
    best k by score and row."""
    nq = len(q.ptr) - 1
    rows = np.full((nq, k), -1, dtype=np.int64)
    scores = np.full((nq, k), -np.inf, dtype=np.float32)
    for i in range(nq):
        s = np.zeros(store.num_docs)
        for j in range(q.ptr[i], q.ptr[i + 1]):
            lo, hi = store.indptr[q.term[j]], store.indptr[q.term[j] + 1]
            s[store.docs[lo:hi]] += q.weight[j] * fac[lo:hi]
        ok = s > 0 if allowed is None else (s > 0) & allowed
        cand = np.flatnonzero(ok)
        top = cand[np.lexsort((cand, -s[cand]))][:k]
        rows[i, :len(top)] = top
        scores[i, :len(top)] = s[top]
    return rows, scores


def assert_same(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1].dtype == np.float32 and want[1].dtype == np.float32
    np.testing.assert_array_equal(got[1].view(np.int32), want[1].view(np.int32))  # bit for bit


def check(store: BM25Store, q: SegmentQueries, avgdl: float, fac: TfFactors, allowed: np.ndarray | None) -> None:
    for k in KS:
        pruned = store.search(q, avgdl, k, allowed=allowed, fac=fac)
        assert_same(pruned, store.search(q, avgdl, k, allowed=allowed, fac=fac, prune=False))
        assert_same(pruned, brute_force(store, q, fac.fac, k, allowed))


def test_tf_factor_maxima(corpus):
    store, _, _ = corpus
    f = store.tf_factors(store.own_avgdl)
    assert f is store.tf_factors(store.own_avgdl)  # the store's own statistics: made once
    assert len(f.block_max) == store.block_ptr[-1] == int(np.sum(-(-store.df // BLOCK)))
    for t in np.random.default_rng(0).choice(len(store.df), 50, replace=False).tolist() + [int(np.argmax(store.df))]:
        lo, hi = store.indptr[t], store.indptr[t + 1]
        blocks = [f.fac[a:min(a + BLOCK, hi)].max() for a in range(lo, hi, BLOCK)]
        assert f.block_max[store.block_ptr[t]:store.block_ptr[t + 1]].tolist() == blocks
        assert f.term_max[t] == f.fac[lo:hi].max()


def test_pruned_equals_exhaustive_and_brute_force(corpus):
    store, docs, rng = corpus
    q = segment_queries(store, queries(docs, rng))
    fac = store.tf_factors(store.own_avgdl)
    check(store, q, store.own_avgdl, fac, None)
    for share in (0.3, 0.02):
        check(store, q, store.own_avgdl, fac, rng.random(store.num_docs) < share)


def test_outside_statistics(corpus):
    """Another avgdl and another df / N (a coordinator's sums over shards, live counts after
    tombstones): the bounds come from the factors of that avgdl."""
    store, docs, rng = corpus
    toks = queries(docs, rng, 40)
    n = store.num_docs * 3 + 17
    df = {t: int(store.df[store.vocab[t]]) * 3 + int(rng.integers(0, 40)) for t in store.vocab}
    q = segment_queries(store, toks, n=n, df=df)
    for avgdl in (store.own_avgdl * 1.7, store.own_avgdl * 0.6):
        fac = store.tf_factors(avgdl)
        assert fac is not store.tf_factors(avgdl)  # other statistics: the caller keeps them
        check(store, q, avgdl, fac, None)
        check(store, q, avgdl, fac, rng.random(store.num_docs) < 0.5)


def test_pruning_engages(corpus):
    """The corpora exercise every phase: lists skipped, look-ups, rows rescored after summing in
    another order than the query's."""
    from hybridret.index import _bm25_kernels

    store, docs, rng = corpus
    q = segment_queries(store, queries(docs, rng))
    fac = store.tf_factors(store.own_avgdl)
    nq = len(q.ptr) - 1
    work = np.zeros(3, np.int64)
    _bm25_kernels.topk_pruned(q.ptr, q.term, q.weight, store.indptr, store.docs, fac.fac, store.block_ptr,
                              fac.block_max, fac.term_max, np.zeros(store.num_docs),
                              np.empty(store.num_docs, np.int32), np.zeros(0, np.bool_), 10,
                              np.full((nq, 10), -1, np.int64), np.full((nq, 10), -np.inf), work)
    assert work[0] < 0.6 * store.df[q.term].sum() and work[1] > 0 and work[2] > 0


def test_edge_queries(corpus):
    store, docs, _ = corpus
    fac = store.tf_factors(store.own_avgdl)
    words = list(store.vocab)
    rare = [words[t] for t in np.argsort(store.df, kind="stable")[:3]]  # the fewest documents
    toks = [[], ["unknown-token"], rare[:1], rare, rare + ["w0", "w1"], ["w0"] * 4 + ["w2", "w0"]]
    q = segment_queries(store, toks)
    check(store, q, store.own_avgdl, fac, None)
    rows, scores = store.search(q, store.own_avgdl, 100, fac=fac)
    assert (rows[:2] == -1).all() and np.isneginf(scores[:2]).all()  # nothing matches
    assert 0 < (rows[2] >= 0).sum() == store.df[store.vocab[rare[0]]] < 100  # k > matching documents
    # one term id twice in a query (not made by QueryTerms, but the kernel adds both, in order)
    w0, w1 = store.vocab["w0"], store.vocab["w1"]
    dup = SegmentQueries(np.array([0, 3]), np.array([w0, w1, w0]), np.array([0.7, 1.3, 0.4]))
    check(store, dup, store.own_avgdl, fac, None)
    nothing = np.zeros(store.num_docs, dtype=bool)
    assert (store.search(q, store.own_avgdl, 10, fac=fac, allowed=nothing)[0] == -1).all()


def test_threads_and_bare_factors(corpus):
    store, docs, rng = corpus
    q = segment_queries(store, queries(docs, rng, 64))
    fac = store.tf_factors(store.own_avgdl)
    one = store.search(q, store.own_avgdl, 10, fac=fac)
    assert_same(store.search(q, store.own_avgdl, 10, fac=fac, threads=4), one)
    assert_same(store.search(q, store.own_avgdl, 10, fac=fac.fac), one)  # a bare array: maxima made here
    assert_same(store.search(q, store.own_avgdl, 10), one)
    np.testing.assert_array_equal(store.score(q, store.own_avgdl, one[0], fac=fac), np.where(one[0] >= 0, one[1], 0))
    with pytest.raises(ConfigError, match="avgdl"):
        store.search(q, store.own_avgdl * 2, 10, fac=fac)
    with pytest.raises(ConfigError, match="postings"):
        store.search(q, store.own_avgdl, 10, fac=fac.fac[:-1])


def test_numpy_path_equals_pruned(corpus, monkeypatch):
    store, docs, rng = corpus
    q = segment_queries(store, queries(docs, rng, 20))
    fac = store.tf_factors(store.own_avgdl)
    allowed = rng.random(store.num_docs) < 0.4
    want = [store.search(q, store.own_avgdl, k, fac=fac, allowed=allowed) for k in KS]
    monkeypatch.setenv("HYBRIDRET_NUMBA", "0")
    for k, w in zip(KS, want):
        assert_same(store.search(q, store.own_avgdl, k, fac=fac, allowed=allowed), w)
