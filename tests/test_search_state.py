"""Searching writes no shared state, and one thread budget reaches every part (issue #19).

* a search, of every method, with and without a filter, with and without a thread budget, leaves
  every segment's and every part's attributes as they were (the same objects, the same values),
  also on the old and the new snapshot after a delete and a refresh; what it derives from a commit
  goes into that snapshot's ``cache`` only;
* ``threads=1`` starts no thread anywhere (Python threads: ``threading.Thread.start`` recorded;
  FAISS's OpenMP threads: the process's OS threads counted in a fresh process) and returns the
  same results as the default budget;
* BM25's live statistics after a delete and a refresh are right on both snapshots held at once,
  with shared segments, from many threads.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from _text_only import TextOnly, build as build_text_only

from hybridret import HybridRetriever, IndexWriter, Searcher
from hybridret.errors import ConfigError
from hybridret.index.bm25 import BM25Store
from hybridret.index.learned import LearnedIndex
from hybridret.index.snapshot import Snapshot, SnapshotCache, open_snapshot
from hybridret.retrievers import REGISTRY, QueryBatch, Retriever, score_rows, search_rows
from hybridret.retrievers.bm25 import BM25Retriever, bm25_tokens, collection_stats, live_stats
from hybridret.retrievers.rm3 import RM3Retriever
from hybridret.search.run import fused_search
from hybridret.search.searcher import METHODS

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "hybridret" / "resources" / "sample"
LEGACY = Path(__file__).parent / "data" / "legacy"
K = 10
FILTER = {"n": 1}


# ------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def sample() -> tuple[list[dict], list[str]]:
    docs = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").open()]
    docs = [{"id": d["_id"], "title": d.get("title", ""), "text": d["text"], "metadata": {"n": i % 3}}
            for i, d in enumerate(docs)]
    return docs, [json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").open()]


@pytest.fixture(scope="module")
def built(paired_encoder, sample, tmp_path_factory) -> Path:
    """Two segments (200 + 100 documents), a few tombstones in the first; copied by each test."""
    docs, _ = sample
    root = tmp_path_factory.mktemp("state") / "idx"
    r = HybridRetriever(paired_encoder, max_segments=0).index(docs[:200], workdir=root)
    r.add(docs[200:])
    r.delete([d["id"] for d in docs[:200:17]])
    assert len(r.searcher.snapshot.segments) == 2
    return root


def _load(src: Path, tmp_path: Path, encoder: Any) -> HybridRetriever:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return HybridRetriever.load(dst, encoder=encoder)


# ------------------------------------------------------------------------------------ state probes

_VALUES = (int, float, str, bytes, bool, type(None), np.integer, np.floating)


def _state(obj: Any) -> dict[str, Any]:
    """Each attribute's identity, its value when it is a plain value, and the identities of what a
    dict or list attribute holds (a cache filling up changes them). Thread-locals and ``Once``
    holders are compared by identity: the per-thread score buffer and the values made once on first
    need are the documented exceptions (index/bm25.py, index/dense.py)."""
    out: dict[str, Any] = {}
    for name, v in vars(obj).items():
        out[name] = (type(v).__name__, id(v), v if isinstance(v, _VALUES) else None)
        if isinstance(v, dict):
            out[name + "{}"] = sorted((repr(k), id(x)) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            out[name + "[]"] = [id(x) for x in v]
    return out


def _objects(snap: Snapshot) -> dict[str, Any]:
    """Every segment of the snapshot, its document store and metadata columns, every part, and the
    index objects the parts hold (a legacy part's learned index or BM25 store), by a readable name."""
    out: dict[str, Any] = {}
    for seg in snap.segments:
        out[f"{seg.name}"] = seg
        out[f"{seg.name}.docs"] = seg.docs
        out[f"{seg.name}.columns"] = seg.columns
        todo = [(f"{seg.name}.{name}", part) for name, part in seg.parts.items()]
        while todo:
            label, obj = todo.pop()
            if label in out or id(obj) in {id(o) for o in out.values()}:
                continue
            out[label] = obj
            for attr, v in vars(obj).items():
                if type(v).__module__.startswith("hybridret.index") and hasattr(v, "__dict__"):
                    todo.append((f"{label}.{attr}", v))
    return out


def _states(*snaps: Snapshot) -> dict[str, Any]:
    out = {f"retriever {name}": _state(r) for name, r in REGISTRY.items()}
    for i, snap in enumerate(snaps):
        out[f"snapshot {i}"] = {k: v for k, v in _state(snap).items() if not k.startswith("cache")}
        out.update({f"snapshot {i} {label}": _state(o) for label, o in _objects(snap).items()})
    return out


def _assert_same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    changed = {k: sorted(a for a in before[k] if before[k].get(a) != after[k].get(a)) or sorted(after[k])
               for k in before if before[k] != after[k]}
    assert not changed, f"a search changed these objects' attributes: {changed}"


def _search_everything(r: HybridRetriever, snap: Snapshot, queries: list[str]) -> list[Any]:
    """Every method through the searcher (on its current snapshot), and through the retrievers and
    fusion on ``snap`` (any snapshot, also an older one); with and without a filter and a budget."""
    from hybridret.filters import parse_filter

    out: list[Any] = []
    s = r.searcher
    q = s.encode_queries(queries, {"dense", "sparse"})
    for threads in (None, 1):
        for filt in (None, FILTER):
            for method in METHODS:
                h = s.search(queries, K, method=method, filter=filt, threads=threads)
                out.append((method, filt, threads, h.ids.tolist(), h.scores))
            f = parse_filter(filt)
            for name in (*REGISTRY, "bm25+rm3"):
                ret = REGISTRY.get(name) or RM3Retriever()
                rows, scores = search_rows(ret, snap, q, K, f, threads=threads)
                exact = score_rows(ret, snap, q, rows, threads=threads)
                out.append((name, filt, threads, rows, scores, exact))
            cfg = s.fusion_config("hybrid", snap=snap)
            out.append(("fused", filt, threads, *fused_search(cfg, K, snap, q, filt=f, threads=threads)[:2]))
    return out


# ------------------------------------------------------------------------------------ no state

def test_search_leaves_every_segment_and_part_unchanged(built, paired_encoder, sample, tmp_path):
    _, queries = sample
    r = _load(built, tmp_path, paired_encoder)
    old = r.searcher.snapshot
    before = _states(old)
    _search_everything(r, old, queries)
    _assert_same_state(before, _states(old))
    assert len(old.cache) > 0  # BM25's live statistics and tf factors of this commit went here

    r.delete([d["id"] for d in sample[0][1:300:23]])  # commits, then refreshes the searcher
    new = r.searcher.snapshot
    assert new is not old and new.commit > old.commit
    assert all(a is b for a, b in zip(old.segments, new.segments))  # the segments are shared
    assert len(new.cache) == 0  # a newer snapshot starts with nothing derived from an older one
    before = _states(old, new)
    _search_everything(r, new, queries)
    _search_everything(r, old, queries)  # the old snapshot, still held, searched after the new one
    _assert_same_state(before, _states(old, new))


@pytest.mark.parametrize("name", ["format2", "format1-planes"])
def test_legacy_parts_are_left_unchanged_too(name, paired_encoder, sample, tmp_path):
    r = _load(LEGACY / name, tmp_path, paired_encoder)
    snap = r.searcher.snapshot
    before = _states(snap)
    for threads in (None, 1):
        for method in METHODS:
            r.search(sample[1], K, method=method, threads=threads)
    _assert_same_state(before, _states(snap))


# ------------------------------------------------------------------------------------ threads

@pytest.fixture
def started(monkeypatch) -> list[str]:
    """Names of the threads started while the test runs (``Thread.start`` recorded, then called)."""
    names: list[str] = []
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        names.append(self.name)
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return names


def _same(a: list[Any], b: list[Any]) -> None:
    """The same ids; the same scores, up to float rounding: under a budget smaller than the machine,
    exact dense scores come from FAISS instead of the torch matmul (another summation order)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[:3] == y[:3]
        assert np.array_equal(np.asarray(x[3]), np.asarray(y[3])), x[:3]
        for u, v in zip(x[4:], y[4:]):
            np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=2e-6, atol=1e-7, err_msg=str(x[:3]))


def _everything(r: HybridRetriever, queries: list[str], threads: int | None) -> list[Any]:
    out = []
    for filt in (None, FILTER):
        for method in METHODS:
            h = r.search(queries, K, method=method, filter=filt, threads=threads)
            out.append((method, str(filt), threads, h.ids.tolist(), h.scores))
    snap = r.searcher.snapshot
    q = QueryBatch(queries)
    out.append(("bm25+rm3", None, threads, *search_rows(RM3Retriever(), snap, q, K, threads=threads)))
    return [x[:2] + (None,) + x[3:] for x in out]


def test_threads_1_starts_no_thread_and_gives_the_default_results(built, paired_encoder, sample, tmp_path, started):
    _, queries = sample
    assert len(queries) >= 16  # BM25's blocks go to worker threads under the default budget
    r = _load(built, tmp_path, paired_encoder)
    r.searcher.encode_queries(queries, {"dense", "sparse"})  # the models loaded before counting
    started.clear()
    one = _everything(r, queries, threads=1)
    assert started == [], f"threads=1 started {started}"
    default = _everything(r, queries, threads=None)
    if (os.cpu_count() or 1) > 1:
        assert started, "the default budget started no thread: this probe would see nothing"
    _same(one, default)
    started.clear()
    s1 = Searcher(r.searcher.root, encoder=r.searcher._encoder, threads=1)  # the searcher's own budget
    for method in METHODS:
        h = s1.search(queries, K, method=method)
        assert h.ids.tolist() == next(x for x in default if x[0] == method and x[1] == "None")[3]
    assert started == []


def test_threads_1_in_the_parts_that_thread(tmp_path, started):
    """The learned-sparse index's per-query threads (tantivy) and the BM25 store's blocks."""
    rng = np.random.default_rng(0)
    V, n = 300, 2000
    D = sp.random(n, V, density=0.05, random_state=1, format="csr", dtype=np.float32)
    D.data = np.abs(D.data) + 0.01
    b = LearnedIndex.create(tmp_path / "learned", V)
    b.add(D)
    b.close()
    ix = LearnedIndex(tmp_path / "learned")
    Q = sp.random(40, V, density=0.05, random_state=2, format="csr", dtype=np.float32)
    Q.data = np.abs(Q.data) + 0.01
    started.clear()
    one = ix.search(Q, K, threads=1)
    store_root = build_text_only(tmp_path / "text", [{"id": f"d{i}", "text": " ".join(
        rng.choice(["cat", "dog", "fox", "river", "bank", "money", "quick"], size=int(rng.integers(1, 20))))}
        for i in range(500)])
    store = open_snapshot(store_root).segments[0].part("bm25")
    sq = store.own_queries([["cat", "dog"], ["fox"], ["river", "bank", "bank"], ["money", "quick"]] * 10)
    one_bm25 = store.search(sq, store.own_avgdl, K, threads=1)
    assert started == []
    default = ix.search(Q, K, threads=None)
    default_bm25 = store.search(sq, store.own_avgdl, K, threads=None)
    if (os.cpu_count() or 1) > 1:
        assert len(started) >= 2
    for a, b in ((one, default), (one_bm25, default_bm25)):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


_FAISS_PROBE = r"""
import os, sys
import numpy as np
from hybridret.index.dense import DenseIndex

def tasks():
    return len(os.listdir("/proc/self/task"))

rng = np.random.default_rng(0)
b = DenseIndex.create(sys.argv[1], 16)
b.add(rng.standard_normal((4000, 16)).astype(np.float32))
b.close()
ix = DenseIndex(sys.argv[1])
q = rng.standard_normal((4, 16)).astype(np.float32)
allowed = rng.random(4000) < 0.5
t0 = tasks()
one = [ix.search(q, 10, threads=1), ix.search(q, 10, threads=1, allowed=allowed), ix.search(np.tile(q, (4, 1)), 10, threads=1)]
t1 = tasks()
default = [ix.search(q, 10), ix.search(q, 10, allowed=allowed)]
t2 = tasks()
same = all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(one, default))
print(t0, t1, t2, same)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts OS threads through /proc")
def test_threads_1_starts_no_faiss_openmp_thread(tmp_path):
    """FAISS's OpenMP threads are OS threads, made on its first parallel search: in a fresh process,
    searches with ``threads=1`` (plain, filtered, batched) leave the OS thread count as it was."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_WAIT_POLICY="PASSIVE")
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", _FAISS_PROBE, str(tmp_path / "dense")], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    t0, t1, t2, same = int(out[0]), int(out[1]), int(out[2]), out[3]
    assert t1 == t0, f"threads=1 made {t1 - t0} OS threads"
    assert same == "True"
    if (os.cpu_count() or 1) > 1:
        assert t2 > t1, "the default budget made no OpenMP thread: this probe would see nothing"


def test_thread_budgets_are_checked(built, paired_encoder, sample, tmp_path):
    r = _load(built, tmp_path, paired_encoder)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match="threads"):
            r.search(sample[1][:1], K, threads=bad)
        with pytest.raises(ConfigError, match="threads"):
            Searcher(r.searcher.root, encoder=r.searcher._encoder, threads=bad)


def test_retrievers_without_a_threads_keyword_are_still_called(built, paired_encoder, sample, tmp_path):
    """A retriever written against the protocol before the budget existed keeps working."""

    class Plain(Retriever):
        name = "plain-bm25"
        needs = "text"
        part = "bm25"

        def prepare(self, snap, q, stats=None):
            return REGISTRY["bm25"].prepare(snap, q)

        def search_segment(self, snap, i, q, k, allowed, ctx):
            return REGISTRY["bm25"].search_segment(snap, i, q, k, allowed, ctx, threads=1)

        def score_segment(self, snap, i, q, rows, ctx):
            return REGISTRY["bm25"].score_segment(snap, i, q, rows, ctx)

    assert Plain.takes_threads == frozenset() and BM25Retriever.takes_threads == {"prepare", "search_segment",
                                                                                  "score_segment"}
    snap = _load(built, tmp_path, paired_encoder).searcher.snapshot
    q = QueryBatch(sample[1])
    rows, scores = search_rows(Plain(), snap, q, K, threads=1)
    want = search_rows(REGISTRY["bm25"], snap, q, K, threads=1)
    np.testing.assert_array_equal(rows, want[0])
    np.testing.assert_array_equal(score_rows(Plain(), snap, q, rows, threads=1), score_rows(REGISTRY["bm25"], snap, q,
                                                                                            rows, threads=1))


# ------------------------------------------------------------------------------------ BM25 per snapshot

WORDS = "cat dog dogs running runs fox jumps lazy river bank banks money finance quick brown the of".split()
BM25_QUERIES = ["cat dog", "running fox river", "banks money money", "dog", "quick brown fox", "lazy finance cat"]


def _docs(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"d{i:04d}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 25 if i % 7 else 120)))}
            for i in range(n)]


def _ranked(snap: Snapshot, threads: int | None = 1) -> list[list[tuple[str, float]]]:
    rows, scores = search_rows(REGISTRY["bm25"], snap, QueryBatch(BM25_QUERIES), 20, threads=threads)
    return [[(str(snap.ids[r]), float(s)) for r, s in zip(rr, ss) if r >= 0] for rr, ss in zip(rows, scores)]


def _counts(docs: list[dict], tokens: list[str]) -> tuple[int, dict[str, int]]:
    from hybridret.index._tantivy import bm25_analyzer

    an = bm25_analyzer()
    analysed = [set(an.analyze(d["text"])) for d in docs]
    return len(docs), {t: sum(t in a for a in analysed) for t in tokens if any(t in a for a in analysed)}


def _assert_ranked(got, want) -> None:
    for x, y in zip(got, want, strict=True):
        assert [i for i, _ in x] == [i for i, _ in y]
        np.testing.assert_allclose([s for _, s in x], [s for _, s in y], rtol=1e-6)


def test_bm25_statistics_on_the_old_and_the_new_snapshot_at_once(tmp_path):
    docs = _docs(600, seed=5)
    root = build_text_only(tmp_path / "idx", docs, parts=3, delete=[d["id"] for d in docs[::31]])
    old = open_snapshot(root)
    gone = [d["id"] for d in docs[5::13] if d["id"] not in {x["id"] for x in docs[::31]}]
    with IndexWriter(root, encoder=TextOnly()) as w:
        w.delete(gone)
    new = open_snapshot(root, reuse={s.name: s for s in old.segments})
    assert all(a is b for a, b in zip(old.segments, new.segments))
    live_old = [d for i, d in enumerate(docs) if i % 31]
    live_new = [d for d in live_old if d["id"] not in set(gone)]
    want_old = _ranked(open_snapshot(build_text_only(tmp_path / "fresh-old", live_old)))
    want_new = _ranked(open_snapshot(build_text_only(tmp_path / "fresh-new", live_new)))
    for snap, want in ((old, want_old), (new, want_new), (old, want_old), (new, want_new)):
        _assert_ranked(_ranked(snap), want)  # alternating: neither evicts nor stales the other
    tokens = sorted({t for q in bm25_tokens(old, BM25_QUERIES) for t in q})
    for snap, live in ((old, live_old), (new, live_new)):
        st = collection_stats(snap, tokens)
        n, df = _counts(live, tokens)
        assert st.num_docs == n and dict(st.df) == df
    kept = {i: old.cache.get(("bm25.live", "bm25", i), lambda: pytest.fail("recomputed"))
            for i in range(3) if len(old.deleted[i])}
    assert kept and all(live_stats(old, i) is v for i, v in kept.items())
    with ThreadPoolExecutor(8) as pool:  # both snapshots from many threads at once
        got = list(pool.map(lambda j: (j % 2, _ranked(new if j % 2 else old, threads=None if j % 3 else 1)),
                            range(48)))
    for which, ranked in got:
        _assert_ranked(ranked, want_new if which else want_old)
    assert all(old.cache.get(("bm25.live", "bm25", i), lambda: None) is v for i, v in kept.items())
    assert all(isinstance(s.part("bm25"), BM25Store) for s in new.segments)


def test_bm25_tf_factors_under_outside_statistics(tmp_path):
    """A coordinator's statistics (another avgdl per shard commit) score as a fresh snapshot does;
    each v1 segment of a snapshot keeps the latest two avgdl's tf factors, nothing on the store (a v2
    segment needs none)."""
    from hybridret.retrievers.bm25 import BM25Stats

    docs = _docs(300, seed=6)
    root = build_text_only(tmp_path / "idx", docs, parts=2, delete=[d["id"] for d in docs[::29]])
    snap = open_snapshot(root)
    r, q = REGISTRY["bm25"], QueryBatch(BM25_QUERIES)
    base = collection_stats(snap, [t for toks in bm25_tokens(snap, BM25_QUERIES) for t in toks])
    outside = [BM25Stats(base.num_docs * m, base.total_len * m + extra, {t: c * m for t, c in base.df.items()})
               for m, extra in ((2, 0), (3, 7_000), (2, 0), (5, 11))]
    for stats in outside:
        fresh = open_snapshot(root)  # nothing kept yet
        got = search_rows(r, snap, q, K, ctx=r.prepare(snap, q, stats=stats))
        want = search_rows(r, fresh, q, K, ctx=r.prepare(fresh, q, stats=stats))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    for i in range(2):
        if not snap.segments[i].part("bm25").needs_factors():
            # a v2 or v3 store (v3 is the default) searches its u8 impacts and re-scores from tf:
            # no float64 tf factors are made for it, under any statistics
            made: list[int] = []
            snap.cache.get(("bm25.tf", "bm25", i), lambda: made.append(1))
            assert made == [1]  # nothing was kept under that key before this call
            continue
        slot = snap.cache.get(("bm25.tf", "bm25", i), lambda: pytest.fail("no tf factors kept"))
        assert len(slot._by_avgdl) == 2 and outside[-1].avgdl in slot._by_avgdl


def test_snapshot_cache_computes_each_key_once():
    cache = SnapshotCache()
    calls: list[int] = []
    gate = threading.Barrier(8)

    def make() -> object:
        calls.append(1)
        return object()

    def work(i: int) -> object:
        gate.wait()
        return cache.get(("k", i % 2), make)

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(work, range(8)))
    assert len(calls) == 2 and len({id(x) for x in got}) == 2 and len(cache) == 2

    def fail() -> object:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        cache.get("bad", fail)
    assert "bad" not in cache and cache.get("bad", make) is not None
