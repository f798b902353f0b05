"""The size-chosen dense part (factory "auto"): Flat below the threshold, a tuned IVF-RaBitQ index
above it whose candidates are re-scored exactly; filters with an exact fallback; the writer, compaction,
migration of a Flat index, shards and ``hybridret info --dense-recall``. Real FAISS throughout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hybridret.errors import ConfigError, IndexFormatError
from hybridret.index.dense import DenseIndex
from hybridret.index.dense_auto import compressed_factory, exact_topk, recall_at, resolve_factory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_ray import ray_cluster  # noqa: E402,F401 - a local Ray cluster for the 2-shard test

D, K = 48, 10
SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample"


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clustered(n: int, seed: int) -> np.ndarray:
    """Unit vectors around 60 centres: neighbourhoods like a text embedding's, not uniform noise."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((60, D))
    return unit(centres[rng.integers(60, size=n)] + 0.8 * rng.standard_normal((n, D)))


@pytest.fixture(scope="module")
def corpus() -> tuple[np.ndarray, np.ndarray]:
    docs = clustered(6000, 1)
    rng = np.random.default_rng(2)
    queries = unit(docs[rng.integers(len(docs), size=60)] + 0.15 * rng.standard_normal((60, D)))
    return docs, queries


@pytest.fixture(scope="module")
def compressed(corpus, tmp_path_factory) -> DenseIndex:
    root = tmp_path_factory.mktemp("auto") / "dense"
    b = DenseIndex.create(root, D, factory="auto", min_rows=1000)
    b.add(corpus[0][:2500])
    b.add(corpus[0][2500:])
    b.close()
    return DenseIndex(root)


def test_size_rule_by_hand():
    # 4 * sqrt(n) rounded to a power of two, with at least 39 training vectors per list
    assert compressed_factory(1_000_000) == "IVF4096,RaBitQfs"
    assert compressed_factory(8_841_823) == "IVF4096,RaBitQfs"  # 4 * 2974 -> 16384, capped
    assert compressed_factory(100_000) == "IVF1024,RaBitQfs"  # 4 * 316 = 1265 -> 2^10
    assert compressed_factory(1000) == "IVF16,RaBitQfs"  # 4 * 31.6 = 126 -> 128, 39 * 16 <= 1000 < 39 * 32
    assert compressed_factory(50) == "IVF1,RaBitQfs"
    assert resolve_factory("auto", 99_999) == "Flat"
    assert resolve_factory("AUTO", 100_000) == "IVF1024,RaBitQfs"
    assert resolve_factory("auto", 5000, min_rows=5000) == "IVF128,RaBitQfs"  # 283 -> 256, but 39 * 256 > 5000
    assert resolve_factory("HNSW32,Flat", 10) == "HNSW32,Flat"  # an explicit factory is never replaced


def test_exact_topk_by_hand():
    vectors = np.array([[1, 0], [0, 1], [0.6, 0.8], [-1, 0]], dtype=np.float32)
    q = np.array([[1, 0], [0, 1]], dtype=np.float32)
    rows, scores = exact_topk(vectors, q, 3)
    assert rows.tolist() == [[0, 2, 1], [1, 2, 0]]
    np.testing.assert_allclose(scores, [[1, 0.6, 0], [1, 0.8, 0]], atol=1e-6)
    rows, _ = exact_topk(vectors, q, 2, exclude=np.array([0, -1]), rows=np.array([0, 2, 3]))
    assert rows.tolist() == [[2, 3], [2, 0]]
    rows, scores = exact_topk(vectors, q[:1], 3, metric="l2")  # negative squared distance
    assert rows[0].tolist() == [0, 2, 1]
    np.testing.assert_allclose(scores[0], [0, -0.8, -2], atol=1e-6)
    assert recall_at(np.array([[0, 2, 5]]), np.array([[0, 1, -1]])) == 0.5


def test_exact_topk_ties_by_row_and_far_l2():
    vectors = np.array([[1, 0], [1, 0], [1, 0], [0, 1]], dtype=np.float32)
    rows, _ = exact_topk(vectors, np.array([[1, 0]], dtype=np.float32), 2)
    assert rows.tolist() == [[0, 1]]  # equal scores: the lower row first, as every path orders them
    far = np.array([[100.0, 100.0], [100.5, 100.0]], dtype=np.float32)
    rows, scores = exact_topk(far, far[:1], 2, metric="l2")
    assert rows.tolist() == [[0, 1]] and scores[0, 0] == 0.0 and scores[0, 1] == -0.25  # no cancellation


def test_min_rows_zero_compresses_every_size():
    from hybridret.index.formats import builtin_parts

    parts = builtin_parts({"faiss_factory": "auto", "faiss_auto_min_rows": 0}, {"dense": {"kind": "dense"}})
    assert parts["dense"].options["min_rows"] == 0
    assert resolve_factory("auto", 1000, min_rows=0) == "IVF16,RaBitQfs"


def test_small_segment_is_flat(corpus, tmp_path):
    b = DenseIndex.create(tmp_path / "d", D, factory="auto", min_rows=10_000)
    b.add(corpus[0][:3000])
    b.close()
    part = DenseIndex(tmp_path / "d")
    assert part.factory == "Flat" and not part.compressed and part.meta["requested_factory"] == "auto"
    assert not (tmp_path / "d" / "index.faiss").exists()
    rows, scores = part.search(corpus[1], K)
    ref_rows, ref_scores = exact_topk(corpus[0][:3000], corpus[1], K)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-6)


def test_compressed_segment_meta(compressed):
    meta = compressed.meta
    assert compressed.compressed and meta["factory"] == "IVF128,RaBitQfs" and meta["requested_factory"] == "auto"
    assert meta["nprobe"] >= 1 and meta["candidates"] >= K and meta["tuned_recall_at_10"] >= 0.99
    assert meta["min_rows"] == 1000


def test_scores_are_exact_and_recall_high(compressed, corpus):
    docs, queries = corpus
    rows, scores = compressed.search(queries, K, threads=1)
    assert (rows >= 0).all()
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", queries, docs[rows]), rtol=1e-6, atol=1e-6)
    assert (np.diff(scores, axis=1) <= 0).all()  # best first, by the exact score
    ref_rows, _ = exact_topk(docs, queries, K)
    assert recall_at(rows, ref_rows) >= 0.9
    # batch and one query at a time agree
    one = np.vstack([compressed.search(queries[i:i + 1], K, threads=1)[0] for i in range(5)])
    assert (one == rows[:5]).all()
    # a deeper list re-scores proportionally more candidates, and is still ordered and exact
    deep_rows, deep_scores = compressed.search(queries[:3], 100)
    assert (deep_rows >= 0).all() and len({*deep_rows[0].tolist()}) == 100
    np.testing.assert_allclose(deep_scores, np.einsum("qd,qkd->qk", queries[:3], docs[deep_rows]), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("share", [0.002, 0.03, 0.5, 0.97])
def test_filters_exact_fallback_and_never_short(compressed, corpus, share):
    docs, queries = corpus
    rng = np.random.default_rng(int(share * 1000))
    allowed = rng.random(len(docs)) < share
    n_allowed = int(allowed.sum())
    for k in (K, n_allowed + 3):
        rows, scores = compressed.search(queries, k, allowed=allowed)
        valid = rows >= 0
        assert allowed[rows[valid]].all()
        assert (valid.sum(axis=1) == min(k, n_allowed)).all()  # never silently shorter than k
        ref_rows, ref_scores = exact_topk(docs, queries, min(k, n_allowed), rows=np.flatnonzero(allowed))
        got = np.where(valid, scores, -np.inf)[:, :min(k, n_allowed)]
        if share < 0.05 or k > n_allowed:  # the exhaustive path: equal to brute force over the allowed rows
            np.testing.assert_allclose(got, ref_scores, rtol=1e-5, atol=1e-6)
        else:
            assert recall_at(rows[:, :K], ref_rows[:, :K]) >= 0.9


def test_filter_through_ivf_is_never_short(compressed, corpus):
    """The IVF path with a filter (forced here for few rows): allowed rows far from the query, fewer
    than k of them. Every one is returned, none outside the filter: no silently shorter list."""
    docs, queries = corpus
    far = np.argsort(docs @ queries[0])[:30]  # the 30 rows least like query 0
    allowed = np.zeros(len(docs), dtype=bool)
    allowed[far] = True
    import hybridret.index.dense as dense_mod

    old = dense_mod.EXACT_VALUES
    dense_mod.EXACT_VALUES = 0  # take the IVF path however few rows are allowed
    try:
        rows, scores = compressed.search(queries[:4], 50, allowed=allowed)
    finally:
        dense_mod.EXACT_VALUES = old
    assert ((rows >= 0).sum(axis=1) == 30).all()
    assert all(set(r[r >= 0].tolist()) == set(far.tolist()) for r in rows)
    ref_rows, ref_scores = exact_topk(docs, queries[:4], 30, rows=np.flatnonzero(allowed))
    np.testing.assert_allclose(scores[:, :30], ref_scores, rtol=1e-5, atol=1e-6)


def test_l2_metric(corpus, tmp_path):
    docs, queries = corpus
    b = DenseIndex.create(tmp_path / "l2", D, factory="auto", metric="l2", min_rows=100)
    b.add(docs[:3000] * 2.0)
    b.close()
    part = DenseIndex(tmp_path / "l2")
    assert part.compressed
    rows, scores = part.search(queries, K)
    want = -((docs[:3000][rows] * 2.0 - queries[:, None, :]) ** 2).sum(-1)
    np.testing.assert_allclose(scores, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(scores, part.score(queries, rows), rtol=1e-6, atol=1e-6)  # the same exact score
    ref_rows, _ = exact_topk(docs[:3000] * 2.0, queries, K, metric="l2")
    assert recall_at(rows, ref_rows) >= 0.9


@pytest.mark.parametrize("change", [{"candidates": "many"}, {"nprobe": None}, {"nprobe": 0}])
def test_damaged_tuning_is_refused(compressed, tmp_path, change):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(compressed.root, root)
    meta = json.loads((root / "meta.json").read_text())
    meta.update(change)
    (root / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(IndexFormatError, match="nprobe|candidates"):
        DenseIndex(root)


def test_exact_search_checks_its_arguments(compressed, corpus):
    with pytest.raises(ConfigError, match="k must be positive"):
        compressed.exact_search(corpus[1], 0)
    with pytest.raises(ConfigError, match="allowed mask"):
        compressed.exact_search(corpus[1], 5, allowed=np.ones(compressed.num_docs + 1, dtype=bool))


def test_bad_settings_are_refused():
    from hybridret.indexer import DEFAULT_SETTINGS, check_settings

    for bad in ({"faiss_auto_min_rows": -1}, {"faiss_auto_min_rows": "10"}, {"faiss_factory": ""}):
        with pytest.raises(ConfigError):
            check_settings({**DEFAULT_SETTINGS, **bad}, bad)


# ------------------------------------------------------------------------------- through the writer
@pytest.fixture(scope="module")
def sample_docs() -> list[dict]:
    docs = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").open()]
    return [{"id": d["_id"], "title": d.get("title", ""), "text": d["text"], "metadata": {"n": i % 10}}
            for i, d in enumerate(docs)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory, paired_encoder, sample_docs) -> Path:
    from hybridret import HybridRetriever

    path = tmp_path_factory.mktemp("dense-auto-cache")
    HybridRetriever(paired_encoder).index(sample_docs, encode_cache=path)
    return path


def _dense_brute(retriever, queries: list[str], k: int, allowed_ids: set[str] | None = None) -> list[list[str]]:
    """Exact dense top-k over the live documents, from the stored vectors."""
    snap = retriever.searcher.snapshot
    q = retriever.encoder.encode_queries(queries).get("dense")
    ids, vecs = [], []
    for seg, live in zip(snap.segments, snap.live):
        rows = np.arange(seg.num_docs) if live is None else np.flatnonzero(live)
        ids += [str(x) for x in seg.docs.ids[rows]]
        vecs.append(np.asarray(seg.part("dense").vectors[rows]))
    X = np.vstack(vecs)
    keep = np.array([allowed_ids is None or i in allowed_ids for i in ids])
    s = np.where(keep[None, :], q @ X.T, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return [[ids[j] for j in row if np.isfinite(s[i, j])] for i, row in enumerate(order)]


def test_writer_compact_and_filters(paired_encoder, sample_docs, cache, tmp_path):
    from hybridret import HybridRetriever

    r = HybridRetriever(paired_encoder, faiss_auto_min_rows=200)
    r.index(sample_docs[:260], encode_cache=cache)
    r.save(tmp_path / "idx")
    seg = r.searcher.snapshot.segments[0].part("dense")
    assert seg.compressed and seg.factory.endswith("RaBitQfs")
    queries = ["chocolate and cacao", "ocean tides and the moon", "history of rome", "computer programming"]
    hits = r.search(queries, k=5, method="dense")
    q = paired_encoder.encode_queries(queries).get("dense")
    got = r.get(hits.ids[0].tolist())
    assert [g["id"] for g in got] == hits.ids[0].tolist()
    assert recall_at(np.array([[hash(x) for x in row] for row in hits.ids.tolist()]),
                     np.array([[hash(x) for x in row] for row in _dense_brute(r, queries, 5)])) >= 0.9
    # the scores returned are the exact float scores
    snap = r.searcher.snapshot
    vec = snap.segments[0].part("dense").vectors_of(hits.rows[0])
    np.testing.assert_allclose(hits.scores[0], vec @ q[0], rtol=1e-5, atol=1e-6)
    # a selective metadata filter: equal to brute force over the matching documents
    hits = r.search(queries, k=8, method="dense", filter={"n": 3})
    allowed = {d["id"] for d in sample_docs[:260] if d["metadata"]["n"] == 3}
    assert hits.ids.tolist() == _dense_brute(r, queries, 8, allowed)
    # deletes, then an add (a small segment: Flat), then compact: one compressed segment again
    r.delete([d["id"] for d in sample_docs[:20]])
    r.add(sample_docs[260:], encode_cache=cache)
    kinds = [s.part("dense").factory for s in r.searcher.snapshot.segments]
    assert kinds[0].endswith("RaBitQfs") and kinds[1] == "Flat"
    hits = r.search(queries, k=5, method="dense")
    assert not {d["id"] for d in sample_docs[:20]} & {x for row in hits.ids.tolist() for x in row}
    r.compact()
    (merged,) = r.searcher.snapshot.segments
    assert merged.part("dense").compressed and merged.num_docs == 280
    assert r.search(queries, k=5, method="dense").ids.tolist()[0] == _dense_brute(r, queries, 5)[0]


def test_migrate_a_flat_index_and_choose_at_compact(paired_encoder, sample_docs, cache, tmp_path):
    from hybridret import HybridRetriever

    r = HybridRetriever(paired_encoder, faiss_factory="Flat", faiss_auto_min_rows=200)
    r.index(sample_docs, encode_cache=cache)
    r.save(tmp_path / "flat")
    before = r.search(["chocolate"], k=5, method="dense")
    r = HybridRetriever.load(tmp_path / "flat")
    r.compact()  # nothing to do: one segment, no deletes, the index keeps its own Flat
    assert r.searcher.snapshot.segments[0].part("dense").factory == "Flat"
    r.compact(migrate=True)  # the former default moves to the size rule
    part = r.searcher.snapshot.segments[0].part("dense")
    assert part.compressed and json.loads((tmp_path / "flat" / "manifest.json").read_text())["settings"][
        "faiss_factory"] == "auto"
    assert r.search(["chocolate"], k=5, method="dense").ids[0][0] == before.ids[0][0]
    r.compact(faiss_factory="Flat")  # and back, explicitly
    assert r.searcher.snapshot.segments[0].part("dense").factory == "Flat"
    with pytest.raises(ConfigError):
        r.compact(faiss_factory="NoSuchIndex42")


def test_cli_info_dense_recall_and_compact_faiss(paired_encoder, sample_docs, cache, tmp_path):
    from hybridret import HybridRetriever

    r = HybridRetriever(paired_encoder, faiss_auto_min_rows=200)
    r.index(sample_docs, encode_cache=cache)
    r.save(tmp_path / "idx")
    run = [sys.executable, "-m", "hybridret"]
    out = subprocess.run([*run, "info", str(tmp_path / "idx"), "--dense-recall", "--sample", "40", "--json"],
                         capture_output=True, text=True, check=True)
    rep = json.loads(out.stdout)["dense_recall"]
    (seg,) = rep["segments"]
    assert seg["compressed"] and seg["rows"] == 300 and seg["recall"] >= 0.9 and rep["queries"] == 40
    out = subprocess.run([*run, "info", str(tmp_path / "idx"), "--dense-recall", "--sample", "20"],
                         capture_output=True, text=True, check=True)
    assert "RaBitQfs" in out.stdout and "recall" in out.stdout
    out = subprocess.run([*run, "compact", str(tmp_path / "idx"), "--faiss", "Flat"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(next((tmp_path / "idx").glob("seg-*/dense/meta.json")).read_text())["factory"] == "Flat"


def test_two_shards(paired_encoder, sample_docs, cache, tmp_path, ray_cluster):  # noqa: F811 - imported fixture
    """A sharded index whose shards hold compressed dense segments: exact scores, high recall against
    brute force over every shard, filters exact over few matching documents."""
    from hybridret import HybridRetriever
    from hybridret.distributed.reshard import reshard
    from hybridret.distributed.searcher import ShardedSearcher

    one = HybridRetriever(paired_encoder, faiss_auto_min_rows=100)
    one.index(sample_docs, encode_cache=cache)
    one.save(tmp_path / "one")
    reshard(tmp_path / "one", tmp_path / "two", 2)
    for shard in sorted((tmp_path / "two").glob("shard-*")):
        meta = json.loads(next(shard.glob("seg-*/dense/meta.json")).read_text())
        assert meta["factory"].endswith("RaBitQfs") and meta["candidates"] >= 10, shard
    queries = ["chocolate and cacao", "ocean tides and the moon", "history of rome"]
    searcher = ShardedSearcher.open(tmp_path / "two", encoder=paired_encoder)
    try:
        got = searcher.search(queries, k=5, method="dense")
        want = _dense_brute(one, queries, 5)
        hit = sum(len(set(g) & set(w)) for g, w in zip(got.ids.tolist(), want))
        assert hit / 15 >= 0.9
        one_scores = one.search(queries, k=5, method="dense")  # exact scores: the same for the same documents
        for g_ids, g_s, o_ids, o_s in zip(got.ids.tolist(), got.scores, one_scores.ids.tolist(), one_scores.scores):
            mine = dict(zip(o_ids, o_s))
            for i, s in zip(g_ids, g_s):
                if i in mine:
                    assert abs(mine[i] - s) < 1e-5
        filt = searcher.search(queries, k=8, method="dense", filter={"n": 3})
        allowed = {d["id"] for d in sample_docs if d["metadata"]["n"] == 3}
        assert filt.ids.tolist() == _dense_brute(one, queries, 8, allowed)
    finally:
        searcher.close()
