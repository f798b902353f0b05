"""The v3 BM25 store (``hybridret-bm25-v3``, the default: u8 impacts in row windows,
``index/bm25_windows.py``) and the v2 store (``hybridret-bm25-v2``: u8 quantized impacts beside the
rows, ``index/bm25_impacts.py``) against the exhaustive path and numpy brute force, on seeded random corpora: rows, tie order and
float32 scores bit-identical under the statistics the blocks were built with and under statistics
that drifted far from them (avgdl x0.05 .. x20, N and df changed), with allowed masks, one-term,
repeated-token, unknown-token and empty queries, k beyond the matches; and through the retriever on
living indexes (several segments, tombstones, filters, a large segment of very different lengths
added after the first was built), where the answer must equal a fresh one-segment build's."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import numpy as np
import pytest
from _text_only import TextOnly, build

from hybridret import IndexWriter
from hybridret.errors import ConfigError, IndexFormatError
from hybridret.filters import parse_filter
import hybridret.index.bm25_impacts as bi
import hybridret.index.bm25_windows as bw
from hybridret.index.bm25 import FORMAT_V2, FORMAT_V3, K1, BM25Store, BM25StoreBuilder, QueryTerms, idf
from hybridret.index.bm25_impacts import drift
from hybridret.index.snapshot import open_snapshot
from hybridret.retrievers import QueryBatch, score_rows, search_rows
from hybridret.retrievers.bm25 import BM25Retriever

pytest.importorskip("numba")


class Pretokenized:
    def analyze(self, tokens: list[str]) -> list[str]:
        return tokens


def zipf_docs(n: int, seed: int, vocab: int = 1200) -> list[list[str]]:
    """Zipf-like tokens; 10 % long documents; 5 % exact copies (exact ties)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    lengths = np.where(rng.random(n) < 0.1, rng.integers(80, 400, n), rng.integers(1, 40, n))
    ids = rng.choice(vocab, size=int(lengths.sum()), p=p / p.sum())
    docs = [[f"w{i}" for i in d] for d in np.split(ids, np.cumsum(lengths)[:-1])]
    for i in rng.choice(n, size=n // 20, replace=False):
        docs[i] = list(docs[i % 50])
    return docs


def make_queries(docs: list[list[str]], rng: np.random.Generator, count: int = 50) -> list[list[str]]:
    out: list[list[str]] = []
    for i in range(count):
        uniq = list(dict.fromkeys(docs[int(rng.integers(len(docs)))]))
        q = [uniq[j] for j in rng.choice(len(uniq), size=min(len(uniq), int(rng.integers(1, 8))), replace=False)]
        if i % 5 == 1:
            q.append(q[0])
        if i % 7 == 2:
            q.append("never-seen")
        if i % 11 == 3:
            q.append("w0")  # the commonest token
        out.append(q)
    return out + [[], ["never-seen"]]


def brute(store: BM25Store, q: QueryTerms, local: np.ndarray, w: np.ndarray, avgdl: float, k: int,
          allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """numpy: every row's score (query-term order, float64), top-k by (-score, row), as float32."""
    fac = store.tf_factors(avgdl).fac
    rows = np.full((len(q), k), -1, np.int64)
    scores = np.full((len(q), k), -np.inf, np.float32)
    for i in range(len(q)):
        acc = np.zeros(store.num_docs)
        for j in range(q.ptr[i], q.ptr[i + 1]):
            t = local[q.tok[j]]
            if t < 0 or w[j] <= 0:
                continue
            lo, hi = store.indptr[t], store.indptr[t + 1]
            acc[store.docs[lo:hi]] += w[j] * fac[lo:hi]
        cand = np.flatnonzero((acc > 0) & (allowed if allowed is not None else True))
        order = np.lexsort((cand, -acc[cand]))[:k]
        rows[i, :len(order)] = cand[order]
        scores[i, :len(order)] = acc[cand[order]]
    return rows, scores


def same(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> None:
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(np.asarray(a[1], np.float32).view(np.int32),
                                  np.asarray(b[1], np.float32).view(np.int32))


def build_store(root: Path, docs: list[list[str]], version: int, shift: int | None = None) -> BM25Store:
    with pytest.MonkeyPatch.context() as m:
        if shift is not None:
            m.setattr(bw, "SHIFT", shift)
        b = BM25StoreBuilder(root, Pretokenized(), impacts=True, version=version)
        b.add(docs)
        b.close()
    return BM25Store(b.root)


@pytest.fixture(scope="module", params=[0, 1])
def corpus(request, tmp_path_factory):
    seed = request.param
    docs = zipf_docs(5000, seed)
    store = build_store(Path(tmp_path_factory.mktemp(f"bm25v2-{seed}")) / "store", docs, 2)
    return store, docs, np.random.default_rng(200 + seed)


@pytest.fixture(scope="module", params=[(0, 7), (1, 10), (0, 16)], ids=["w7", "w10", "w16"])
def corpus3(request, tmp_path_factory):
    """v3 stores in windows of 128 and 1,024 rows (the 5,000 rows span many; short terms are walked,
    long ones bounded) and the library's own (one window)."""
    seed, shift = request.param
    docs = zipf_docs(5000, seed)
    store = build_store(Path(tmp_path_factory.mktemp(f"bm25v3-{seed}-{shift}")) / "store", docs, 3, shift)
    assert store.meta["window_shift"] == shift and store.meta["long_terms"] > 0
    assert (store.windows.long_row < 0).any()  # short terms too
    return store, docs, np.random.default_rng(300 + seed)


# avgdl and N multipliers: own statistics, then drifted far both ways (the blocks keep their build avgdl)
DRIFTS = [(1.0, 1.0), (20.0, 1.0), (0.05, 1.0), (3.0, 7.0), (0.5, 0.3)]


@pytest.fixture(params=[(8, 0.45), (10, 0.0), (16, 0.9)], ids=["w8", "w10-g0", "w16-g.9"])
def windows(request, monkeypatch):
    """Accumulator windows of 256 / 1,024 rows (so the 5,000 rows span many) and the library's own;
    the essential-term share at both ends (it changes the work, never the answer)."""
    monkeypatch.setattr(bi, "WINDOW_SHIFT", request.param[0])
    monkeypatch.setattr(bi, "GAMMA", request.param[1])


@pytest.mark.parametrize("change", DRIFTS, ids=[f"avgdl{a}-N{n}" for a, n in DRIFTS])
def test_impacts_equal_exhaustive_and_brute_force(corpus, windows, change):
    store, docs, rng = corpus
    assert store.meta["format"] == FORMAT_V2 and store.impacts is not None and not store.needs_factors()
    check_equal(store, docs, rng, change)


@pytest.fixture(params=[None, 0.0, 1.01], ids=["by-query", "all-maxscore", "all-windows"])
def kernels(request, monkeypatch):
    """v3 queries through the kernel the store picks per query, or every query through the MaxScore
    kernel, or every one through the window kernel (either way the same answer)."""
    if request.param is not None:
        monkeypatch.setattr(bw, "MAXSCORE_SHARE", request.param)


@pytest.mark.parametrize("change", DRIFTS, ids=[f"avgdl{a}-N{n}" for a, n in DRIFTS])
def test_windows_equal_exhaustive_and_brute_force(corpus3, kernels, change):
    store, docs, rng = corpus3
    assert store.meta["format"] == FORMAT_V3 and store.windows is not None and not store.needs_factors()
    check_equal(store, docs, rng, change)


def check_equal(store: BM25Store, docs: list[list[str]], rng: np.random.Generator, drift_: tuple[float, float]) -> None:
    """The pruned path = the exhaustive path = numpy brute force, bit for bit, under ``drift_``
    (avgdl and N multipliers, df shifted) with masks, k from 1 to beyond the matches."""
    qs = make_queries(docs, rng)
    qt = QueryTerms.of(qs)
    local = store.lookup(qt.tokens)
    df = store._df_pad[local] + (rng.integers(0, 50, len(local)) if drift_ != (1.0, 1.0) else 0)
    n = max(int(store.num_docs * drift_[1]), int(df.max(initial=0)) + 1)
    w = qt.count * (1.0 + K1) * idf(df, n)[qt.tok]
    sq = qt.restrict(local, w)
    avgdl = store.own_avgdl * drift_[0]
    masks = [None, rng.random(store.num_docs) < 0.5, rng.random(store.num_docs) < 0.01]
    for k in (1, 10, 100, 4000):
        for allowed in masks:
            got = store.search(sq, avgdl, k, allowed=allowed)
            same(got, store.search(sq, avgdl, k, allowed=allowed, prune=False))
            if k <= 100:
                same(got, brute(store, qt, local, np.where(local[qt.tok] >= 0, w, 0.0), avgdl, k, allowed))
    rows = store.search(sq, avgdl, 50)[0]
    np.testing.assert_array_equal(store.score(sq, avgdl, rows).view(np.int32),
                                  store.score(sq, avgdl, rows, fac=store.tf_factors(avgdl)).view(np.int32))


def test_threads_and_repeated_calls_agree(corpus, windows, corpus3, kernels):
    for store, docs, rng in (corpus, corpus3):
        check_threads(store, docs, rng)


def check_threads(store: BM25Store, docs: list[list[str]], rng: np.random.Generator) -> None:
    qs = make_queries(docs, rng, 80)
    sq = store.own_queries(qs)
    one = store.search(sq, store.own_avgdl, 10, threads=1)
    same(one, store.search(sq, store.own_avgdl, 10, threads=4))
    same(one, store.search(sq, store.own_avgdl, 10, threads=1))  # the reused scratch is clean


def test_drift_bounds_every_factor():
    """Every tf factor under avgdl A lies within [min(1, A/A0), max(1, A/A0)] times its value under
    A0, and that value within half a unit of its stored impact / 255."""
    from hybridret.index.bm25 import norm_table

    tf = np.arange(1, 300, dtype=np.float64)[:, None]
    for a0 in (0.0, 0.5, 3.0, 40.0, 500.0):
        f0 = tf / (tf + norm_table(a0)[None, :])
        q = np.rint(f0 * 255.0)
        assert (np.abs(f0 - q / 255.0) <= 0.5 / 255.0 + 1e-12).all()
        for a in (0.0, 0.1, a0 / 3, a0, a0 * 1.5, a0 * 40):
            f = tf / (tf + norm_table(a)[None, :])
            rmin, rmax = drift(a, a0)
            assert (f <= f0 * rmax * (1 + 1e-12)).all() and (f >= f0 * rmin * (1 - 1e-12)).all()


def test_v1_store_still_read_and_searched(tmp_path):
    docs = zipf_docs(800, 7)
    b = BM25StoreBuilder(tmp_path / "v1", Pretokenized())
    b.add(docs)
    b.close()
    v1 = BM25Store(b.root)
    assert v1.impacts is None and v1.windows is None and v1.needs_factors()
    sq = v1.own_queries(make_queries(docs, np.random.default_rng(1)))
    for version, shift, damaged in ((2, None, "terms.kth_impact.npy"), (3, 7, "terms.long_bounds.npy")):
        store = build_store(tmp_path / f"v{version}", docs, version, shift)
        same(v1.search(sq, v1.own_avgdl, 10), store.search(sq, store.own_avgdl, 10))
        (store.root / damaged).unlink()
        with pytest.raises((IndexFormatError, OSError)):
            BM25Store(store.root)
    with pytest.raises(ConfigError, match="version 2 or 3"):
        BM25StoreBuilder(tmp_path / "v9", Pretokenized(), impacts=True, version=9)


# ---------------------------------------------------------------- living indexes, through the retriever

WORDS = [f"t{i}" for i in range(300)]


def texts(n: int, seed: int, lo: int, hi: int, prefix: str) -> list[dict]:
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(len(WORDS))]
    return [{"id": f"{prefix}{i:05d}", "text": " ".join(rng.choices(WORDS, weights, k=rng.randint(lo, hi))),
             "metadata": {"grp": i % 3}} for i in range(n)]


QUERIES = ["t1 t7 t40", "t3", "t250 t251 t0", "t5 t5 t9 t77 t120", "t2 t299", "nothing here", "", "t0 t1 t2 t3 t4"]


def exhaustive(monkeypatch):
    """Every BM25 store searched with ``prune=False`` (the reference path)."""
    orig = BM25Store.search
    monkeypatch.setattr(BM25Store, "search", functools.partialmethod(lambda self, *a, **kw: orig(
        self, *a, **{**kw, "prune": False})))


def hits(path: Path, filt=None, k: int = 20):
    snap = open_snapshot(path)
    r = BM25Retriever()
    qb = QueryBatch(QUERIES)
    ctx = r.prepare(snap, qb)
    rows, scores = search_rows(r, snap, qb, k, parse_filter(filt), ctx=ctx)
    np.testing.assert_array_equal(score_rows(r, snap, qb, rows, ctx=ctx).view(np.int32),
                                  np.where(rows >= 0, scores, 0).astype(np.float32).view(np.int32))
    return [[(str(snap.ids[rw]), float(s)) for rw, s in zip(rr, ss) if rw >= 0] for rr, ss in zip(rows, scores)]


def ordered(x):
    """Hits as a fresh build ranks them (ties by row = by id here: ids ascend with rows)."""
    return [sorted(h, key=lambda p: (-p[1], p[0])) for h in x]


@pytest.mark.parametrize("first,second", [((1, 12), (150, 400)), ((150, 400), (1, 12))],
                         ids=["short-then-long", "long-then-short"])
def test_living_index_with_drifting_stats_equals_fresh_build(tmp_path, monkeypatch, first, second):
    """A small segment built first, then a 4x larger one of very different lengths (the first
    segment's blocks were quantized under an avgdl ~10x off), tombstones and filters: the pruned
    v3 path (the default) returns what the exhaustive path and a fresh one-segment build return,
    bit for bit."""
    monkeypatch.setattr(bw, "SHIFT", 7)  # 128-row windows: the segments span several
    a = texts(300, 1, *first, "a")
    b = texts(1200, 2, *second, "b")
    dead = [d["id"] for d in a[::5]] + [d["id"] for d in b[100:400]]
    living = build(tmp_path / "living", a, parts=2)
    with IndexWriter(living, encoder=TextOnly(), settings={"max_segments": 0}) as w:
        w.write(b, mode="add")
        w.delete(dead)
    snap = open_snapshot(living)
    assert len(snap.segments) == 3
    assert all(s.part("bm25").meta["format"] == FORMAT_V3 for s in snap.segments)
    keep = [d for d in a + b if d["id"] not in set(dead)]
    fresh = build(tmp_path / "fresh", keep)
    for filt in (None, {"grp": 1}):
        got = hits(living, filt)
        assert got == ordered(hits(fresh, filt))
        with monkeypatch.context() as m:
            exhaustive(m)
            assert got == hits(living, filt)
