"""The search plan (hybridret/search/plan.py): plan_search's defaults, fallbacks and errors, the generic
collection-statistics hook, and the one executor that the local and the sharded searcher share."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from _text_only import build

import hybridret.search.run as run_mod
import hybridret.search.searcher as searcher_mod
from hybridret.errors import ConfigError
from hybridret.fusion.builtin import HYBRID_DEFAULT
from hybridret.fusion.config import FusionConfig
from hybridret.fusion.gather import gather_candidates
from hybridret.index.snapshot import open_snapshot
from hybridret.retrievers import REGISTRY, QueryBatch
from hybridret.retrievers.rm3 import RM3Retriever
from hybridret.search.plan import default_fusion, plan_search
from hybridret.search.request import SearchRequest
from hybridret.search.run import fused_search
from hybridret.search.searcher import Searcher
from hybridret.search.source import SnapshotSource


def plan(texts, k, method, *, available, stored_fusion=None, require=True, where="this index", **options):
    """plan_search of the request ``SearchRequest(texts, k, method=method, **options)``."""
    return plan_search(SearchRequest(texts, k, method=method, **options), available=available,
                       stored_fusion=stored_fusion, require=require, where=where)

ALL = {"dense": True, "sparse": True, "bm25": True}
WORDS = "cat dog river bank money boat sail storm tree forest leaf lake wind green quick fox".split()
QUERIES = ["cat dog", "river bank money", "", "storm sail boat", "green forest", "fox", "lake wind", "  "]


def corpus(n: int = 60, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"d{i:03d}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))}
            for i in range(n)]


@pytest.fixture(scope="module")
def text_index(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("plan") / "one", corpus(), parts=2)


# -- plan_search ---------------------------------------------------------------------------------------
def test_hybrid_default_plan():
    p = plan(QUERIES, 10, "hybrid", available=ALL)
    assert p.fusion == HYBRID_DEFAULT and p.single is None and p.label == "hybrid:gqr"
    assert p.retrievers == ("dense", "sparse", "bm25") and p.needs == {"dense", "sparse"}
    assert p.depth == HYBRID_DEFAULT.depth and p.stats == ("bm25",) and p.vectors
    assert p.keep == (0, 1, 3, 4, 5, 6) and p.kept_texts == [QUERIES[i] for i in p.keep]
    assert plan(QUERIES, 500, "hybrid", available=ALL).depth == 500  # never shallower than k


def test_single_retriever_plans():
    p = plan(["a"], 7, "dense", available=ALL)
    assert (p.single, p.fusion, p.label, p.depth, p.needs, p.stats) == ("dense", None, "dense", 7, {"dense"}, ())
    p = plan(["a"], 7, "bm25", available=ALL, candidates=50)  # candidates: fused methods only
    assert p.depth == 7 and p.needs == frozenset() and p.stats == ("bm25",)


def test_fallbacks_when_bm25_or_sparse_is_absent():
    no_bm25 = plan(["a"], 10, "hybrid", available={**ALL, "bm25": False})
    assert no_bm25.fusion.guide == {"sparse": 0.5} and no_bm25.retrievers == ("dense", "sparse")
    assert no_bm25.stats == () and no_bm25.label == "hybrid:gqr"
    no_sparse = plan(["a"], 10, "hybrid", available={**ALL, "sparse": False})
    assert no_sparse.fusion.guide == {"bm25": 0.5} and no_sparse.needs == {"dense"}
    assert plan(["a"], 10, "linear", available={**ALL, "sparse": False}).fusion.retrievers == ("dense", "bm25")
    no_dense = plan(["a"], 10, "hybrid", available={**ALL, "dense": False})
    assert no_dense.label == "hybrid:linear" and no_dense.fusion.retrievers == ("sparse", "bm25")
    only_bm25 = plan(["a"], 10, "hybrid", available={"dense": False, "sparse": False, "bm25": True})
    assert (only_bm25.single, only_bm25.label, only_bm25.fusion) == ("bm25", "hybrid:bm25", None)
    assert default_fusion("hybrid", available={"dense": False, "sparse": True, "bm25": False}) is None


def test_candidates_override_and_stored_fusion():
    p = plan(["a"], 10, "rrf", available=ALL, candidates=5)
    assert p.fusion.depth == 5 and p.depth == 10  # the depth is never below k
    assert plan(["a"], 10, "rrf", available=ALL, candidates=40).depth == 40
    stored = FusionConfig(method="linear", retrievers=("dense", "bm25"), depth=30).to_dict()
    p = plan(["a"], 10, "hybrid", available=ALL, stored_fusion=stored)
    assert p.label == "hybrid:linear" and p.fusion.retrievers == ("dense", "bm25") and p.depth == 30
    assert plan(["a"], 10, "linear", available=ALL, stored_fusion=stored).fusion.depth == 30
    assert plan(["a"], 10, "rrf", available=ALL, stored_fusion=stored).fusion == FusionConfig(method="rrf")
    explicit = plan(["a"], 10, "rrf", available=ALL, fusion={"retrievers": ["sparse", "bm25"]})
    assert explicit.fusion.method == "rrf" and explicit.retrievers == ("sparse", "bm25")


def test_missing_component_errors():
    with pytest.raises(ConfigError, match="this index has no dense component"):
        plan(["a"], 10, "dense", available={**ALL, "dense": False})
    with pytest.raises(ConfigError, match="this sharded index has no BM25 component"):
        plan(["a"], 10, "rrf", available={**ALL, "bm25": False}, fusion={"retrievers": ["dense", "bm25"]},
                    where="this sharded index")
    with pytest.raises(ConfigError, match="no learned-sparse component"):
        plan(["a"], 10, "sparse", available={**ALL, "sparse": False})
    # an index without rows searches to nothing whatever the method
    assert plan(["a"], 10, "dense", available={**ALL, "dense": False}, require=False).single == "dense"


# -- the statistics hook ---------------------------------------------------------------------------------
def test_statistics_hook_sums_over_shards(tmp_path):
    """Two 'shards' scored with the sum of their ``statistics`` equal one index (the generic path a
    sharded search takes, without Ray)."""
    docs = corpus(90)
    one = open_snapshot(build(tmp_path / "one", docs))
    parts = [open_snapshot(build(tmp_path / "a", docs[:40], parts=2)), open_snapshot(build(tmp_path / "b", docs[40:]))]
    assert [REGISTRY[n].global_stats for n in ("dense", "sparse", "bm25")] == [False, False, True]
    assert REGISTRY["dense"].statistics(one, QueryBatch(["x"])) is None
    q = QueryBatch([t for t in QUERIES if t.strip()])
    bm25 = REGISTRY["bm25"]
    stats = {"bm25": bm25.statistics(parts[0], q) + bm25.statistics(parts[1], q)}
    assert stats["bm25"] == bm25.statistics(one, q)
    want_rows, want = SnapshotSource(one).top("bm25", 10, q)
    got = [SnapshotSource(s).top("bm25", 10, q, stats=stats)[1] for s in parts]
    merged = -np.sort(-np.concatenate(got, axis=1), axis=1)[:, :10]
    np.testing.assert_allclose(np.where(want_rows >= 0, want, -1), np.where(np.isfinite(merged), merged, -1), rtol=1e-6)
    # RM3 reads BM25's statistics but cannot be made exact on shards by one round of them
    rm3 = RM3Retriever()
    assert rm3.global_stats and not rm3.shardable and rm3.statistics(one, q) == stats["bm25"]


# -- execution ----------------------------------------------------------------------------------------------
def test_fused_search_is_the_plan_executor(text_index, monkeypatch):
    snap = open_snapshot(text_index)
    cfg = FusionConfig(method="rrf", retrievers=("bm25",), depth=12)
    q = QueryBatch([t for t in QUERIES if t.strip()])
    rows, scores, comps = fused_search(cfg, 5, snap, q)
    hits = Searcher(snapshot=snap).search([t for t in QUERIES if t.strip()], k=5, method="rrf", fusion=cfg)
    np.testing.assert_array_equal(rows, hits.rows)
    np.testing.assert_allclose(scores, hits.scores)
    monkeypatch.setattr(run_mod, "FUSION_CHUNK", 2)  # several chunks: the same results
    rows2, scores2, comps2 = fused_search(cfg, 5, snap, q)
    np.testing.assert_array_equal(rows, rows2)
    np.testing.assert_allclose(scores, scores2)
    np.testing.assert_allclose(comps["bm25"], comps2["bm25"])


def test_local_search_runs_the_plan(text_index):
    s = Searcher(text_index)
    with mock.patch.object(searcher_mod, "run_plan", wraps=run_mod.run_plan) as spy:
        hits = s.search(QUERIES, k=4, method="bm25")
        s.search(QUERIES[:2], k=4, method="rrf", fusion={"retrievers": ["bm25"]})
    assert spy.call_count == 2 and searcher_mod.run_plan is run_mod.run_plan
    assert hits.method == "bm25" and not hits.ids[2].any() and not hits.ids[7].any()  # blank: no hits
    assert hits.ids[0].all() and set(hits.components) == {"bm25"}
    assert np.isnan(hits.components["bm25"][2]).all()


def test_gather_candidates_passes_statistics(text_index):
    """``stats`` reaches every retriever's prepare: the snapshot's own statistics change nothing."""
    snap = open_snapshot(text_index)
    q = QueryBatch(["cat dog", "river bank"])
    own = gather_candidates(("bm25",), 8, snap, q)
    given = gather_candidates(("bm25",), 8, snap, q, stats={"bm25": REGISTRY["bm25"].statistics(snap, q)})
    np.testing.assert_array_equal(own.rows, given.rows)
    np.testing.assert_allclose(own.exact["bm25"], given.exact["bm25"], rtol=1e-6)


# -- the sharded side (a local Ray cluster) ----------------------------------------------------------------
@pytest.fixture(scope="module")
def sharded(text_index, tmp_path_factory):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'hybridret[ray]')")
    from hybridret.distributed.reshard import reshard
    from hybridret.distributed.searcher import ShardedSearcher

    started = not ray.is_initialized()
    state = tempfile.mkdtemp(prefix="ray-")
    if started:
        os.environ["RAY_AUTH_MODE"] = "disabled"
        token = Path.home() / ".ray" / "auth_token"
        had_token, had_folder = token.exists(), token.parent.exists()
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=state, log_to_driver=False)
    out = tmp_path_factory.mktemp("plan-sharded") / "s2"
    reshard(text_index, out, 2)
    s = ShardedSearcher.open(out)
    yield s
    s.close()
    if started:
        ray.shutdown()
        if not had_token:
            token.unlink(missing_ok=True)
        if not had_folder and token.parent.exists() and not any(token.parent.iterdir()):
            token.parent.rmdir()
    shutil.rmtree(state, ignore_errors=True)


def test_both_searchers_call_the_one_plan_function(text_index, sharded):
    import hybridret.distributed.searcher as dsearcher

    assert dsearcher.run_plan is run_mod.run_plan is searcher_mod.run_plan
    one = Searcher(text_index)
    with mock.patch.object(searcher_mod, "run_plan", wraps=run_mod.run_plan) as local_spy, \
            mock.patch.object(dsearcher, "run_plan", wraps=run_mod.run_plan) as sharded_spy:
        a = one.search(QUERIES, k=6, method="bm25")
        b = sharded.search(QUERIES, k=6, method="bm25")
    assert local_spy.call_count == 1 and sharded_spy.call_count == 1
    plans = [c.args[0] for c in (local_spy.call_args, sharded_spy.call_args)]
    assert plans[0] == plans[1]  # the same plan on both sides
    assert a.method == b.method == "bm25" and b.missing_shards == []
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5)  # BM25 with the shards' summed statistics
    assert not b.ids[2].any() and not b.ids[7].any()


def test_sharded_source_refusals(sharded, monkeypatch):
    from hybridret.distributed.source import ShardedSource

    source = ShardedSource(sharded.pool, list(sharded.commits.values()), sharded.shard_infos)
    research = plan(["a"], 5, "gqr", available=ALL, fusion={"method": "gqr", "gqr": {"final": "research"}})
    with pytest.raises(ConfigError, match="final='research' is not available on a sharded index"):
        source.check(research)
    monkeypatch.setitem(REGISTRY, "bm25+rm3", RM3Retriever())
    with pytest.raises(ConfigError, match="bm25\\+rm3 is not available on a sharded index"):
        source.check(plan(["a"], 5, "bm25+rm3", available={**ALL, "bm25+rm3": True}))
    with pytest.raises(ConfigError, match="this sharded index has no dense component"):
        sharded.search("cat", k=3, method="dense")
