"""The distributed path on a local Ray cluster: sharded search equals one index, routed writes,
fault recovery, the distributed build (equal to the local one, resumable) and the CLI."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'hybridret[ray]')")

from hybridret import HybridRetriever  # noqa: E402
from hybridret.distributed.build import build_sharded  # noqa: E402
from hybridret.distributed.layout import read_layout, shard_name, shard_of  # noqa: E402
from hybridret.distributed.merge import merge_lists  # noqa: E402
from hybridret.distributed.reshard import reshard  # noqa: E402
from hybridret.distributed.searcher import ShardedSearcher  # noqa: E402
from hybridret.distributed.shard import ShardUnavailableError  # noqa: E402
from hybridret.index.snapshot import open_snapshot  # noqa: E402
from hybridret.search.searcher import Searcher  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
BENCH = Path(__file__).resolve().parents[1] / "indexes"
METHODS = ("dense", "sparse", "bm25", "rrf", "linear", "gqr")
WORDS = ("river bank money loan water fish boat bridge city tower stone music piano violin orchestra concert "
         "forest tree leaf bird nest winter snow summer rain storm cloud engine motor car train rail station "
         "doctor nurse hospital medicine fever virus cell gene protein market price trade export coffee tea "
         "bread cheese wine garden flower bee honey planet star moon orbit rocket galaxy ocean wave coral "
         "island volcano lava mountain glacier desert sand camel").split()
QUERIES = ["river bank loan", "orchestra concert piano", "virus fever hospital", "rocket orbit moon",
           "coffee tea market price", "volcano lava island", "winter snow storm", "honey bee garden flower",
           "train station rail", "ocean coral wave", "", "glacier mountain desert"]


def synthetic_corpus(n: int = 150, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 16))]
        docs.append({"id": f"doc-{i:04d}", "title": " ".join(words[:2]).title(), "text": " ".join(words),
                     "group": "abc"[i % 3], "year": 2000 + (i * 7) % 25})
    return docs


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster (2 CPUs) for the module; its state folder and any token Ray writes
    under the home folder are removed afterwards."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    token = Path.home() / ".ray" / "auth_token"
    had_token, had_folder = token.exists(), token.parent.exists()
    state = tempfile.mkdtemp(prefix="ray-")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=state, log_to_driver=False)
    yield ray
    ray.shutdown()
    shutil.rmtree(state, ignore_errors=True)
    if not had_token:
        token.unlink(missing_ok=True)
    if not had_folder and token.parent.exists() and not any(token.parent.iterdir()):
        token.parent.rmdir()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("ray")


@pytest.fixture(scope="module")
def corpus():
    return synthetic_corpus()


@pytest.fixture(scope="module")
def local_index(work, corpus, paired_encoder):
    """The local build: one ordinary index of the whole corpus."""
    HybridRetriever(paired_encoder).index(corpus).save(work / "one")
    return Searcher(work / "one")


@pytest.fixture(scope="module")
def built3(ray_cluster, work, corpus, paired_encoder):
    """The distributed build: 3 shards, encoded on a Ray Data actor pool into a kept cache."""
    report = build_sharded(corpus, work / "s3", shards=3, encoder=paired_encoder, workers=1,
                           encode_cache=work / "cache3", batch_size=32)
    return report


@pytest.fixture(scope="module")
def searchers(ray_cluster, built3, local_index, work):
    reshard(work / "one", work / "s2", 2)
    out = {2: ShardedSearcher.open(work / "s2"), 3: ShardedSearcher.open(work / "s3")}
    yield out
    for s in out.values():
        s.close()


def assert_same(a, b, *, tol: float = 1e-4) -> None:
    """Same top-k ids and scores, up to the order of (near-)equal scores."""
    assert a.ids.shape == b.ids.shape
    np.testing.assert_allclose(np.nan_to_num(a.scores, neginf=-9), np.nan_to_num(b.scores, neginf=-9), atol=tol)
    for i in range(len(a)):
        sa = dict(zip(a.ids[i], a.scores[i]))
        sb = dict(zip(b.ids[i], b.scores[i]))
        kth = min(a.scores[i].min(), b.scores[i].min())
        clear_a = {d for d, s in sa.items() if d and s > kth + tol}
        clear_b = {d for d, s in sb.items() if d and s > kth + tol}
        assert clear_a == clear_b, f"query {i}: {sorted(clear_a ^ clear_b)}"
        for d in (set(sa) & set(sb)) - {""}:
            assert abs(sa[d] - sb[d]) <= tol
        for name in a.components:
            np.testing.assert_allclose(np.nan_to_num(np.sort(a.components[name][i])),
                                       np.nan_to_num(np.sort(b.components[name][i])), atol=tol)


# -- pure parts ---------------------------------------------------------------------------------------
def test_routing_is_a_stable_hash_of_the_id():
    # pinned values: the routing must never change between versions, machines or processes
    assert [shard_of(f"doc-{i:04d}", 3) for i in range(6)] == \
        [int.from_bytes(hashlib.blake2b(f"doc-{i:04d}".encode(), digest_size=8).digest(), "big") % 3
         for i in range(6)]
    assert shard_of("d01", 1) == 0
    assert {shard_of(f"x{i}", 4) for i in range(64)} == {0, 1, 2, 3}


def test_merge_lists_best_first_ties_by_id():
    a = (np.array([[1, 2]]), np.array([[0.9, 0.5]]), np.array([["b", "c"]], dtype=object))
    b = (np.array([[(1 << 40) | 7, -1]]), np.array([[0.9, -np.inf]]), np.array([["a", ""]], dtype=object))
    keys, scores, ids = merge_lists([a, b], 3, 1)
    assert ids.tolist() == [["a", "b", "c"]]
    assert keys.tolist() == [[(1 << 40) | 7, 1, 2]]
    np.testing.assert_allclose(scores, [[0.9, 0.9, 0.5]])



def test_layout_is_checked(tmp_path):
    from hybridret.distributed.layout import write_layout
    from hybridret.errors import ConfigError, IndexFormatError, IndexNotFoundError

    with pytest.raises(IndexNotFoundError):
        read_layout(tmp_path)
    write_layout(tmp_path, 2, {"type": "paired"})
    with pytest.raises(IndexFormatError, match="shard-000, shard-001"):
        read_layout(tmp_path)  # shards without an index
    with pytest.raises(ConfigError):
        write_layout(tmp_path, 0, None)


def test_ray_is_not_imported_with_hybridret():
    import subprocess
    import sys

    code = "import sys, hybridret, hybridret.distributed, hybridret.cli; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

# -- search equals one index -----------------------------------------------------------------------------
@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_search_equals_one_index(searchers, local_index, shards):
    sharded = searchers[shards]
    assert sharded.num_docs == local_index.num_docs
    for method in METHODS:
        one = local_index.search(QUERIES, k=10, method=method)
        many = sharded.search(QUERIES, k=10, method=method)
        assert many.method == one.method
        assert_same(one, many)
        assert many.missing_shards == []
    assert not sharded.search([""], k=3).ids[0].any()  # blank query: no hits


def test_bm25_uses_global_statistics(searchers, local_index, work):
    """Each shard alone scores BM25 with its own idf and length norm: different from one index.
    With the summed statistics every score equals the single index's."""
    one = local_index.search(QUERIES, k=10, method="bm25")
    alone = Searcher(work / "s3" / shard_name(0)).search(QUERIES, k=10, method="bm25")
    id_score = {d: s for row_i, row_s in zip(one.ids, one.scores) for d, s in zip(row_i, row_s) if d}
    differs = [abs(id_score[d] - s) for row_i, row_s in zip(alone.ids, alone.scores) for d, s in zip(row_i, row_s)
               if d in id_score]
    assert differs and max(differs) > 1e-3  # the correction matters on this corpus
    assert_same(one, searchers[3].search(QUERIES, k=10, method="bm25"))


def test_filtered_search_equals_one_index(searchers, local_index):
    for filt in ({"group": "b"}, {"year": {"$gte": 2015}}, {"$or": [{"group": "a"}, {"year": 2003}]}):
        for method in ("dense", "sparse", "bm25", "rrf", "gqr"):
            one = local_index.search(QUERIES, k=8, method=method, filter=filt)
            many = searchers[3].search(QUERIES, k=8, method=method, filter=filt)
            assert_same(one, many)


def test_hybrid_candidates_and_chunks_equal_one_index(searchers, local_index, monkeypatch):
    """The default ``hybrid`` (GQR with agreement-weighted guides), a ``candidates`` override and
    batches run a few queries at a time (hybridret.search.run's chunking, both sides) equal one index."""
    import hybridret.search.run as run
    from hybridret.distributed.source import ShardedSource

    for kw in ({"method": "hybrid"}, {"method": "rrf", "candidates": 5}, {"method": "linear", "candidates": 30}):
        one = local_index.search(QUERIES, k=10, **kw)
        many = searchers[2].search(QUERIES, k=10, **kw)
        assert many.method == one.method
        assert_same(one, many)
    assert one.method == "linear" and many.method == "linear"
    assert searchers[2].search(QUERIES[:2], k=3).method == "hybrid:gqr"
    monkeypatch.setattr(run, "FUSION_CHUNK", 4)
    monkeypatch.setattr(ShardedSource, "top_chunk", 4)
    for method in ("bm25", "gqr", "hybrid"):
        assert_same(local_index.search(QUERIES, k=10, method=method), searchers[3].search(QUERIES, k=10, method=method))


def test_gqr_research_is_refused_on_shards(searchers):
    from hybridret.errors import ConfigError

    with pytest.raises(ConfigError, match="final='research' is not available on a sharded index"):
        searchers[2].search(QUERIES, k=5, method="gqr", fusion={"method": "gqr", "gqr": {"final": "research"}})


def test_relevance_is_refused_on_shards_with_a_clear_error(searchers):
    """A sharded index has no calibrated relevance yet (docs/relevance.md): asked for, it is a
    ConfigError naming the limitation, before any shard is searched; a bad value is still named."""
    from hybridret.errors import ConfigError

    with pytest.raises(ConfigError, match="relevance=True is not supported on a sharded index"):
        searchers[2].search(QUERIES, k=5, relevance=True)
    with pytest.raises(ConfigError, match="relevance must be true or false"):
        searchers[2].search(QUERIES, k=5, relevance="yes")
    assert searchers[2].search(QUERIES[:2], k=5, relevance=False).relevance is None


def test_hit_views_and_get(searchers, local_index):
    one = local_index.search("orchestra concert piano", k=3, method="rrf")[0]
    many = searchers[2].search("orchestra concert piano", k=3, method="rrf")[0]
    assert [h.id for h in many] == [h.id for h in one]
    assert [(h.title, h.text, h.metadata) for h in many] == [(h.title, h.text, h.metadata) for h in one]
    assert [m.term for m in many[0].matched_terms] == [m.term for m in one[0].matched_terms]
    assert searchers[3].get(["doc-0005", "nope", "doc-0100"]) == local_index.get(["doc-0005", "nope", "doc-0100"])


@pytest.mark.skipif(not (DATA / "cranfield").is_dir(), reason="../shared/data/cranfield is not present")
def test_real_collection_slice(ray_cluster, work, paired_encoder):
    from hybridret.data import CorpusReader, load_queries

    docs = [d for _, d in zip(range(300), CorpusReader(DATA / "cranfield"))]
    bench = BENCH / "bench-cranfield"
    if bench.is_dir():  # reuse its stored vectors
        reshard(bench, work / "cran1", 1, ids=[d.id for d in docs])
        reshard(bench, work / "cran3", 3, ids=[d.id for d in docs])
    else:
        HybridRetriever(paired_encoder).index(docs[:150]).save(work / "cran")
        reshard(work / "cran", work / "cran1", 1)
        reshard(work / "cran", work / "cran3", 3)
    queries = list(load_queries(next((DATA / "cranfield").glob("queries.jsonl*"))).values())[:16]
    one = Searcher(work / "cran1" / shard_name(0))
    many = ShardedSearcher.open(work / "cran3")
    try:
        for method in METHODS:
            assert_same(one.search(queries, k=10, method=method), many.search(queries, k=10, method=method))
    finally:
        many.close()


# -- writes ------------------------------------------------------------------------------------------
def test_writes_route_to_the_owning_shard(ray_cluster, work, local_index, corpus):
    reshard(work / "one", work / "w3", 3)
    sharded = ShardedSearcher.open(work / "w3")
    mirror = HybridRetriever.load(work / "one")
    mirror.save(work / "mirror")
    mirror = HybridRetriever.load(work / "mirror")
    try:
        before = sharded.commits
        new = [{"id": f"new-{i}", "text": f"rocket orbit moon landing number {i}", "group": "z"} for i in range(6)]
        result = sharded.add(new)
        mirror.add(new)
        assert result["added"] == 6
        for d in new:
            owner = shard_of(d["id"], 3)
            for s in range(3):
                assert (d["id"] in open_snapshot(work / "w3" / shard_name(s))) == (s == owner)
        touched = {shard_name(shard_of(d["id"], 3)) for d in new}
        assert {n for n, c in sharded.commits.items() if c != before[n]} == touched
        with pytest.raises(Exception, match="already in"):
            sharded.add(new[:1])
        sharded.upsert([{"id": "doc-0003", "text": "volcano lava island eruption", "group": "z"}])
        mirror.upsert([{"id": "doc-0003", "text": "volcano lava island eruption", "group": "z"}])
        sharded.delete(["doc-0001", "new-2"])
        mirror.delete(["doc-0001", "new-2"])
        with pytest.raises(Exception, match="not in"):
            sharded.delete(["doc-0002", "never-there"])
        assert sharded.get(["doc-0002"])[0] is not None  # refused as a whole: nothing deleted
        for method in ("dense", "bm25", "rrf", "gqr"):
            assert_same(mirror.search(QUERIES, k=10, method=method), sharded.search(QUERIES, k=10, method=method))
        assert_same(mirror.search(QUERIES, k=5, method="sparse", filter={"group": "z"}),
                    sharded.search(QUERIES, k=5, method="sparse", filter={"group": "z"}))
    finally:
        sharded.close()


# -- faults ------------------------------------------------------------------------------------------
def test_killed_shard_actor_is_restarted(searchers):
    sharded = searchers[3]
    expect = sharded.search(QUERIES, k=10, method="rrf")
    ray.kill(sharded.actors[1], no_restart=False)  # Ray restarts it from its directory
    again = sharded.search(QUERIES, k=10, method="rrf")
    assert_same(expect, again, tol=1e-6)
    assert again.missing_shards == []


# -- distributed build -------------------------------------------------------------------------------
def test_distributed_build_equals_local_build(built3, work, local_index, corpus):
    layout = read_layout(work / "s3")
    assert layout.num_shards == 3 and built3["encoded"] == len(corpus)
    one = open_snapshot(work / "one")
    seen = 0
    for s in range(3):
        snap = open_snapshot(work / "s3" / shard_name(s))  # each shard is a normal index
        assert HybridRetriever.load(work / "s3" / shard_name(s)).num_docs == snap.num_docs
        for doc_id in snap.live_ids():
            assert shard_of(doc_id, 3) == s
            a, b = snap.row_of(doc_id), one.row_of(doc_id)
            va = snap.segments[0].dense.vectors[a]
            vb = one.segments[0].dense.vectors[b]
            np.testing.assert_allclose(va, vb, atol=1e-5)
            sa, sb = snap.segments[0].sparse.forward[a], one.segments[0].sparse.forward[b]
            assert sa.indices.tolist() == sb.indices.tolist()
            np.testing.assert_allclose(sa.data, sb.data, atol=1e-4)
            seen += 1
    assert seen == len(corpus)


def test_interrupted_build_resumes_from_the_cache(built3, work, corpus, paired_encoder):
    cache = work / "cache-part"
    shutil.copytree(work / "cache3", cache)
    files = sorted(cache.glob("enc-*.npz"))
    lost = files[: len(files) // 2]  # the files an interrupted build had not written yet
    n_lost = sum(int(np.load(f)["keys"].shape[0]) for f in lost)
    for f in lost:
        f.unlink()
    report = build_sharded(corpus, work / "resumed", shards=2, encoder=paired_encoder, workers=1,
                           encode_cache=cache, batch_size=32)
    assert 0 < report["encoded"] == n_lost < len(corpus)
    resumed = ShardedSearcher.open(work / "resumed")
    try:
        assert_same(Searcher(work / "one").search(QUERIES, k=10, method="gqr"),
                    resumed.search(QUERIES, k=10, method="gqr"))
    finally:
        resumed.close()


def test_cli_index_and_search_with_ray(built3, work, corpus, local_index, capsys):
    import json

    from hybridret.cli import main

    path = work / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in corpus), encoding="utf-8")
    # the kept cache of the 3-shard build: the CLI build encodes nothing again
    assert main(["index", str(path), "-o", str(work / "cli2"), "--ray", "--shards", "2", "--ray-workers", "1",
                 "--encode-cache", str(work / "cache3")]) == 0
    assert read_layout(work / "cli2").num_shards == 2
    capsys.readouterr()
    assert main(["search", str(work / "cli2"), "volcano", "lava", "island", "--method", "rrf", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    expect = local_index.search("volcano lava island", k=10, method="rrf")
    assert [h["id"] for h in got["hits"]] == list(expect.ids[0])
    # --queries FILE: the JSON lines of a local index, in batches (the same writer)
    qfile = work / "queries.txt"
    qfile.write_text("\n".join(QUERIES[:3]) + "\n", encoding="utf-8")
    out = work / "hits.jsonl"
    assert main(["-q", "search", str(work / "cli2"), "--queries", str(qfile), "--batch-size", "2", "--method", "rrf",
                 "-k", "5", "-o", str(out)]) == 0
    lines = [json.loads(li) for li in out.read_text(encoding="utf-8").splitlines()]
    expect = local_index.search(QUERIES[:3], k=5, method="rrf")
    assert [li["query_id"] for li in lines] == ["1", "2", "3"]
    assert [[h["id"] for h in li["hits"]] for li in lines] == [[h.id for h in expect[i]] for i in range(3)]
    capsys.readouterr()
    assert main(["-q", "search", str(work / "cli2"), "--queries", str(qfile), "--trec", str(work / "run.trec")]) == 1
    assert "--trec is not available with a sharded index" in capsys.readouterr().err


def test_grouped_paged_and_reranked_search_equals_one_index(searchers, local_index):
    """Grouping (by the numeric ``year`` field), pages and a reranker run the same plan and stages
    on 2 shards as on one index: same groups, same group scores, same chunks."""
    from hybridret.search.rerank import Reranker

    class ByLength(Reranker):
        def scores(self, query, passages):
            return np.array([float(len(p)) for p in passages])

    qs = [q for q in QUERIES if q]
    for method in ("dense", "sparse", "bm25", "rrf"):
        for filt in (None, {"group": "b"}):
            one = local_index.search(qs, k=4, method=method, filter=filt, group_by="year", group_size=2, offset=1)
            many = searchers[2].search(qs, k=4, method=method, filter=filt, group_by="year", group_size=2, offset=1)
            np.testing.assert_allclose(np.nan_to_num(many.group_scores, neginf=-9),
                                       np.nan_to_num(one.group_scores, neginf=-9), atol=1e-4)
            for i in range(len(qs)):
                a, b = one.groups(i), many.groups(i)
                assert [g.rank for g in a] == [g.rank for g in b]
                for ga, gb in zip(a, b):
                    tied = sum(abs(g.score - ga.score) < 1e-4 for g in a) > 1
                    if not tied:
                        assert ga.key == gb.key and isinstance(gb.key, int)
                        np.testing.assert_allclose([h.score for h in ga.hits], [h.score for h in gb.hits], atol=1e-4)
                    assert all(h.metadata["year"] == gb.key for h in gb.hits)
    one = local_index.search(qs, k=5, method="rrf", rerank=ByLength(), rerank_depth=15)
    many = searchers[2].search(qs, k=5, method="rrf", rerank=ByLength(), rerank_depth=15)
    np.testing.assert_allclose(many.scores, one.scores)
    assert all(h.scores["rerank"] == h.score for h in many[0])


def test_diversified_search_equals_one_index(searchers, local_index):
    """MMR (``diversify``) on 2 and 3 shards: the dense vectors come from the owning shards, the
    order is the one index's (dense and RRF, whose scores do not tie here), grouped or not, paged."""
    qs = [q for q in QUERIES if q]
    for method in ("dense", "rrf"):
        for kw in ({}, {"group_by": "year", "group_size": 2}, {"offset": 2}):
            one = local_index.search(qs, k=4, method=method, diversify=0.5, **kw)
            assert one.ids.tolist() != local_index.search(qs, k=4, method=method, **kw).ids.tolist()
            for n in (2, 3):
                many = searchers[n].search(qs, k=4, method=method, diversify=0.5, **kw)
                assert many.ids.tolist() == one.ids.tolist(), (method, kw, n)
                np.testing.assert_allclose(many.scores, one.scores, atol=1e-4)


def test_dead_shard_is_named_or_reported_missing(searchers):
    """Last: it kills a shard of the 2-shard searcher for good."""
    sharded = searchers[2]
    full = sharded.search(QUERIES, k=10, method="dense")
    ray.kill(sharded.actors[1], no_restart=True)
    with pytest.raises(ShardUnavailableError, match="shard-001") as err:
        sharded.search(QUERIES, k=10, method="dense")
    assert err.value.shards == ["shard-001"]
    part = sharded.search(QUERIES, k=10, method="rrf", partial=True)
    assert part.missing_shards == ["shard-001"]
    got = {d for row in part.ids for d in row if d}
    assert got and all(shard_of(d, 2) == 0 for d in got)
    kept = {d for row in full.ids for d in row if d and shard_of(d, 2) == 0}
    assert kept <= {d for row in sharded.search(QUERIES, k=10, method="dense", partial=True).ids for d in row}


# -- serving a sharded index over HTTP (hybridret serve DIR --ray) -----------------------------------
class _LoopbackServer:
    """A real uvicorn server on 127.0.0.1 in a thread of this process (which holds the Ray cluster)."""

    def __init__(self, app) -> None:
        import socket
        import threading

        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        import time

        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the test server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def test_serve_sharded_index_over_http(ray_cluster, work, local_index, paired_encoder):
    """The HTTP service over a 3-shard index: searches equal ShardedSearcher.search and one index,
    writes are routed (and need the key), /info names the shards, a dead shard is a 503 naming it."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from hybridret.client import AuthenticationError, Client
    from hybridret.errors import ConfigError, DocumentNotFoundError
    from hybridret.serve.app import ServeConfig, create_app

    key = "sharded-key-0123456789abcdef"
    reshard(work / "one", work / "http3", 3)
    HybridRetriever.load(work / "one", encoder=paired_encoder).save(work / "http-mirror")
    mirror = HybridRetriever.load(work / "http-mirror", encoder=paired_encoder)
    sharded = ShardedSearcher.open(work / "http3", encoder=paired_encoder)
    queries = [q for q in QUERIES if q]  # the server refuses empty queries (422)
    try:
        with _LoopbackServer(create_app(sharded, ServeConfig(api_key=key, batch_window_ms=2))) as srv, \
                Client(srv.url, api_key=key) as client:
            health = client.health()
            assert health == {"status": "ok", "num_docs": 150, "commit": None, "commits": sharded.commits}
            info = client.info()
            assert info["sharded"] is True and info["commits"] == sharded.commits
            assert [s["name"] for s in info["shards"]] == [shard_name(i) for i in range(3)]
            assert sum(s["num_docs"] for s in info["shards"]) == info["num_docs"] == 150
            assert info["available"] == {"dense": True, "sparse": True, "bm25": True, "sparse_approx": True}
            for method in METHODS:
                remote = client.search(queries, k=10, method=method)
                assert remote.method == local_index.search(queries[:1], k=1, method=method).method
                assert_same(remote, sharded.search(queries, k=10, method=method))
                assert_same(remote, local_index.search(queries, k=10, method=method))
            one = local_index.search("orchestra concert piano", k=3, method="rrf")[0]
            got = client.search("orchestra concert piano", k=3, method="rrf")[0]
            assert [(h.id, h.title, h.text, h.metadata) for h in got] == \
                [(h.id, h.title, h.text, h.metadata) for h in one]
            assert [m.term for m in got[0].matched_terms] == [m.term for m in one[0].matched_terms]
            assert_same(client.search(queries, k=8, method="gqr", filter={"group": "b"}),
                        local_index.search(queries, k=8, method="gqr", filter={"group": "b"}))
            assert client.get(["doc-0005", "nope"]) == local_index.get(["doc-0005", "nope"])
            with pytest.raises(ConfigError, match="not supported on a sharded index"):  # a 400, not a 500
                client.search(queries[:1], k=3, relevance=True)
            assert "relevance" not in client.search(queries[:1], k=3)[0][0].to_dict()

            # writes: routed to the owning shard, searchable once acknowledged
            new = [{"id": f"web-{i}", "text": f"rocket orbit moon landing flight {i}", "metadata": {"group": "z"}}
                   for i in range(4)]
            with Client(srv.url) as anonymous, pytest.raises(AuthenticationError):
                anonymous.add(new)
            before = sharded.commits
            result = client.add(new)
            mirror.add(new)
            assert result["added"] == 4 and result["num_docs"] == 154 and result["commit"] is None
            touched = {shard_name(shard_of(d["id"], 3)) for d in new}
            assert set(result["commits"]) == touched
            assert {n for n, c in client.info()["commits"].items() if c != before[n]} == touched
            for d in new:
                for s in range(3):
                    assert (d["id"] in open_snapshot(work / "http3" / shard_name(s))) == (s == shard_of(d["id"], 3))
            assert client.get(["web-2"])[0]["metadata"] == {"group": "z"}
            for method in ("rrf", "bm25", "gqr"):
                assert_same(client.search(queries, k=10, method=method), mirror.search(queries, k=10, method=method))
            assert client.search("rocket orbit moon landing flight", k=4, method="sparse",
                                 filter={"group": "z"}).ids[0].tolist().count("") == 0

            # delete (an unknown id refuses the whole call: 404), compact every shard
            with pytest.raises(DocumentNotFoundError):
                client.delete(["doc-0002", "never-there"])
            assert client.delete(["doc-0001", "web-1"])["deleted"] == 2
            mirror.delete(["doc-0001", "web-1"])
            assert client.get(["doc-0001", "doc-0002"])[0] is None and client.health()["num_docs"] == 152
            assert client.info()["num_deleted"] == 2
            assert client.compact()["num_docs"] == 152
            mirror.compact()
            assert client.info()["num_deleted"] == 0
            for method in METHODS:
                assert_same(client.search(queries, k=10, method=method), mirror.search(queries, k=10, method=method))

            # a shard that cannot answer: 503 naming it, never a 500; /health still answers
            ray.kill(sharded.actors[1], no_restart=True)
            r = httpx.post(f"{srv.url}/search", json={"queries": queries, "k": 5, "method": "dense"}, timeout=60)
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert err["type"] == "ShardUnavailableError" and err["shards"] == ["shard-001"]
            assert "shard-001" in err["message"] and "Traceback" not in r.text
            assert httpx.get(f"{srv.url}/health").json()["status"] == "ok"
    finally:
        sharded.close()


def test_cli_serve_sharded_errors(work, local_index, capsys):
    """One-line errors of hybridret serve --ray (no server starts)."""
    from hybridret.cli import main

    assert main(["serve", str(work / "one"), "--ray-address", "auto"]) != 0
    assert "--ray-address is for a sharded index" in capsys.readouterr().err
    assert main(["serve", str(work / "one"), "--ray"]) != 0
    err = capsys.readouterr().err
    assert "no sharded index" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_serve_joins_the_cluster(ray_cluster, work, local_index, start_server):
    """``hybridret serve DIR --ray --ray-address ADDR`` as a subprocess on this test's cluster."""
    import signal

    from hybridret.client import Client

    reshard(work / "one", work / "cli-http2", 2)
    address = ray.get_runtime_context().gcs_address
    proc, url = start_server(work / "cli-http2", "--ray", "--ray-address", address, "--no-batching")
    with Client(url) as client:
        assert [s["name"] for s in client.info()["shards"]] == [shard_name(0), shard_name(1)]
        for method in ("bm25", "gqr"):
            assert_same(client.search(QUERIES[:4], k=10, method=method),
                        local_index.search(QUERIES[:4], k=10, method=method))
        assert client.add([{"id": "cli-1", "text": "volcano lava island eruption"}])["added"] == 1
        assert client.search("volcano lava island eruption", k=1, method="bm25").ids[0, 0] == "cli-1"
    proc.send_signal(signal.SIGTERM)  # graceful: in-flight requests finish, the shard actors are stopped
    assert proc.wait(timeout=60) == 0
