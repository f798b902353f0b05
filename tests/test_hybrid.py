"""Fusion methods through the retriever: linear, RRF, GQR, tuning, and the eval/tune commands."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridret import ConfigError, HybridRetriever
from hybridret.cli import main
from hybridret.fusion.config import FusionConfig

QUERIES = ["how do plants make sugar from light", "who wrote hamlet", "frozen rivers carving valleys",
           "digital money on a blockchain", "the of and"]


@pytest.fixture(scope="module")
def retriever(paired_encoder, small_corpus, tmp_path_factory):
    r = HybridRetriever(paired_encoder)
    r.index(small_corpus)
    path = tmp_path_factory.mktemp("hyb") / "idx"
    r.save(path)
    return HybridRetriever.load(path, encoder=paired_encoder), path


@pytest.mark.parametrize("method", ["linear", "rrf", "gqr"])
def test_fusion_methods_shapes_and_order(retriever, method):
    r, _ = retriever
    hits = r.search(QUERIES, k=5, method=method)
    assert hits.rows.shape == (len(QUERIES), 5)
    assert hits.method == method
    for i in range(len(QUERIES)):
        s = hits.scores[i][np.isfinite(hits.scores[i])]
        assert (np.diff(s) <= 1e-6).all()
    assert hits.ids[1, 0] == "d24"  # hamlet -> Shakespeare, whatever the fusion


def test_rrf_matches_hand_computation(retriever):
    r, _ = retriever
    depth = 8
    dense = r.search(QUERIES, k=depth, method="dense")
    sparse = r.search(QUERIES, k=depth, method="sparse")
    hits = r.search(QUERIES, k=5, method="rrf", fusion={"method": "rrf", "depth": depth, "rrf_k": 60})
    for i in range(len(QUERIES)):
        score: dict[str, float] = {}
        for lst in (dense.ids[i], sparse.ids[i]):
            for rank, doc in enumerate([d for d in lst if d], 1):
                score[doc] = score.get(doc, 0.0) + 1.0 / (60 + rank)
        expected = sorted(score.values(), reverse=True)[:5]
        np.testing.assert_allclose(hits.scores[i][: len(expected)], expected, rtol=1e-6)


def test_three_signal_linear_carries_exact_bm25(retriever):
    r, _ = retriever
    cfg = FusionConfig("linear", ("dense", "sparse", "bm25"))
    hits = r.search(QUERIES[:4], k=4, method="linear", fusion=cfg)
    assert set(hits.components) == {"dense", "sparse", "bm25"}
    store = r.part("bm25")  # scored on its own, with its own statistics (one segment, no deletes)
    tokens = [list(store.analyzer.analyze(q)) for q in QUERIES[:4]]
    exact = store.score(store.own_queries(tokens), store.total_len / store.num_docs, hits.rows)
    np.testing.assert_allclose(hits.components["bm25"], exact, rtol=1e-4, atol=1e-6)
    dense = r.dense.score(r.encoder.encode_queries(QUERIES[:4]).dense, hits.rows)
    np.testing.assert_allclose(hits.components["dense"], dense, rtol=1e-5, atol=1e-6)


def test_gqr_alpha_zero_reproduces_dense(retriever):
    r, _ = retriever
    dense = r.search(QUERIES, k=5, method="dense")
    gqr = r.search(QUERIES, k=5, method="gqr", fusion={"method": "gqr", "gqr": {"alpha": 0.0}})
    np.testing.assert_array_equal(gqr.ids, dense.ids)


def test_gqr_without_guide_signal_falls_back_to_dense(retriever):
    r, _ = retriever
    # only stop words: BM25 matches nothing, so the guide is flat and the query stays as it is
    q = ["the of and"]
    dense = r.search(q, k=5, method="dense")
    gqr = r.search(q, k=5, method="gqr", fusion={"method": "gqr", "guide": {"bm25": 1.0}})
    np.testing.assert_array_equal(gqr.ids, dense.ids)


def test_gqr_is_deterministic_and_final_modes(retriever):
    r, _ = retriever
    a = r.search(QUERIES, k=5, method="gqr")
    b = r.search(QUERIES, k=5, method="gqr")
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.scores, b.scores)
    for final in ("research", "fuse"):
        h = r.search(QUERIES, k=5, method="gqr", fusion={"method": "gqr", "gqr": {"final": final}})
        assert h.ids[1, 0] == "d24"


@pytest.mark.parametrize("method", ["hybrid", "dense", "sparse", "bm25", "rrf"])
def test_edge_queries(retriever, method):
    r, _ = retriever
    assert r.search([], k=5, method=method).rows.shape == (0, 5)
    # empty text and k beyond the corpus: as many columns as live documents (memory follows the
    # result, never k), padded with -1 where a query has fewer hits, never an error
    hits = r.search(["", "zzzzqqq"], k=100, method=method)
    assert hits.rows.shape == (2, r.num_docs)
    assert ((hits.rows >= 0).sum(1) <= r.num_docs).all()
    assert set(hits.ids[hits.rows < 0].tolist()) <= {""}


def test_bad_fusion_settings(retriever):
    r, _ = retriever
    with pytest.raises(ConfigError, match="unknown fusion settings"):
        r.search("x", method="linear", fusion={"bogus": 1})
    with pytest.raises(ConfigError, match="unknown retrievers"):
        FusionConfig("linear", ("dense", "colbert"))
    with pytest.raises(ConfigError, match="guide"):
        FusionConfig("gqr", guide={"dense": 1.0})


def test_eval_and_tune_commands_store_and_use_the_best(retriever, tmp_path, capsys):
    _, path = retriever
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(QUERIES[:4])))
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq0\td01\t1\nq1\td24\t1\nq2\td35\t1\nq3\td26\t1\n")
    run_file = tmp_path / "run.trec"
    assert main(["-q", "eval", str(path), "--queries", str(queries), "--qrels", str(qrels), "--json",
                 "--save-run", str(run_file)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["queries"] == 4 and set(out["metrics"]) == {"ndcg@10", "mrr@10", "recall@100"}
    assert 0.0 <= out["metrics"]["ndcg@10"] <= 1.0
    from hybridret import load_qrels, load_run
    from hybridret.eval import evaluate

    saved = load_run(run_file)  # the written run scores the same as the command reported
    assert evaluate(saved, load_qrels(qrels), ["ndcg@10"])["ndcg@10"] == pytest.approx(out["metrics"]["ndcg@10"])
    assert main(["-q", "tune", str(path), "--queries", str(queries), "--qrels", str(qrels), "--json"]) == 0
    tuned = json.loads(capsys.readouterr().out)
    best = FusionConfig.from_dict(tuned["best"])
    reloaded = HybridRetriever.load(path)
    assert reloaded.fusion_config("hybrid") == best
    assert reloaded.search("who wrote hamlet", k=3).method == f"hybrid:{best.method}"
    # an explicit method still uses its own (default) settings when the tuned one is another method
    other = "rrf" if best.method != "rrf" else "linear"
    assert reloaded.fusion_config(other) == FusionConfig(method=other)
    # evaluating with queries that have no judgments is a clear error
    empty = tmp_path / "none.tsv"
    empty.write_text("query-id\tcorpus-id\tscore\nzz\td01\t1\n")
    assert main(["-q", "eval", str(path), "--queries", str(queries), "--qrels", str(empty)]) == 1
    assert "has judgments" in capsys.readouterr().err


def test_defaults_adapt_to_a_dense_only_encoder_with_bm25(paired_encoder, small_corpus):
    r = HybridRetriever(paired_encoder.dense)  # no sparse head; BM25 text is still indexed
    r.index(small_corpus)
    assert r.fusion_config("hybrid").guide == {"bm25": 0.5}
    assert r.fusion_config("linear").retrievers == ("dense", "bm25")
    for method in ("hybrid", "linear", "rrf"):
        hits = r.search(["who wrote hamlet"], k=3, method=method)
        assert hits.ids[0, 0] == "d24"
    with pytest.raises(ConfigError, match="learned-sparse"):
        r.search("x", method="sparse")


def test_hybrid_default_is_agreement_guided_gqr_and_old_configs_keep_fixed_weights(retriever):
    r, _ = retriever
    cfg = r.fusion_config("hybrid")
    assert cfg.method == "gqr" and cfg.guide_weighting == "agreement" and cfg.gqr.final_guide == 0.25
    # the explicit method keeps the old behaviour: fixed weights, ranking by the refined dense score alone
    assert r.fusion_config("gqr").guide_weighting == "fixed" and r.fusion_config("gqr").gqr.final_guide == 0.0
    old = FusionConfig().to_dict()
    old.pop("guide_weighting")  # a config stored before the field existed
    assert FusionConfig.from_dict({**old, "method": "gqr"}).guide_weighting == "fixed"
    assert FusionConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="guide_weighting"):
        FusionConfig("gqr", guide_weighting="vibes")
    hits = r.search(QUERIES, k=5)
    assert hits.method == "hybrid:gqr" and hits.ids[1, 0] == "d24"


def test_fuse_without_snapshot_from_candidate_vectors(retriever):
    """The coordinator contract: with Candidates.vectors, fuse needs no snapshot and gives the same result."""
    from hybridret.fusion.config import fuse
    from hybridret.fusion.gather import gather_candidates

    r, _ = retriever
    snap = r.searcher.snapshot
    q = r.encode_queries(QUERIES, {"dense", "sparse"})
    cfg = r.fusion_config("hybrid")
    with_vec = gather_candidates(cfg.union_retrievers, 8, snap, q, vectors=True)
    assert with_vec.vectors.shape == (*with_vec.rows.shape, 384) and not with_vec.vectors[~with_vec.valid].any()
    plain = gather_candidates(cfg.union_retrievers, 8, snap, q)
    assert plain.vectors is None
    for c in (cfg, FusionConfig("linear", ("dense", "sparse", "bm25")), FusionConfig("rrf")):
        a = fuse(c, with_vec, 5, None, q)
        b = fuse(c, plain, 5, snap, q)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_allclose(a[1], b[1], rtol=1e-6)
    with pytest.raises(ConfigError, match="vectors"):
        fuse(cfg, plain, 5, None, q)
    with pytest.raises(ConfigError, match="research"):
        fuse(cfg.with_(gqr={"final": "research"}), with_vec, 5, None, q)


def test_final_guide_by_hand():
    """GQR's ``final_guide``: rank by z(refined dense) + w * z(guide). With no Adam steps the refined
    query is the original one, so the scores can be written down: dense [0.6, 0.8, 0.0] has z-scores
    [0.392, 0.981, -1.373]; BM25 [3, 0, 0] has [1.414, -0.707, -0.707]."""
    from hybridret.fusion.scores import Candidates
    from hybridret.fusion.config import GQRConfig, fuse
    from hybridret.retrievers import QueryBatch

    vectors = np.eye(3, dtype=np.float32)[None]  # candidate i's vector is e_i
    q = QueryBatch(["q"], dense=np.array([[0.6, 0.8, 0.0]], dtype=np.float32))
    cands = Candidates(rows=np.array([[10, 11, 12]]),
                       exact={"dense": np.array([[0.6, 0.8, 0.0]]), "bm25": np.array([[3.0, 0.0, 0.0]])},
                       listed={"dense": np.array([[True, True, True]]), "bm25": np.array([[True, False, False]])},
                       vectors=vectors)
    z_dense = (np.array([0.6, 0.8, 0.0]) - 1.4 / 3) / np.sqrt(0.104 / 0.9)
    z_bm25 = np.array([2.0, -1.0, -1.0]) / np.sqrt(2.0)
    for w, order in ((0.0, [11, 10, 12]), (0.25, [11, 10, 12]), (0.5, [10, 11, 12])):
        cfg = FusionConfig("gqr", guide={"bm25": 1.0}, gqr=GQRConfig(steps=0, final_guide=w))
        rows, scores, comps = fuse(cfg, cands, 3, None, q)
        assert rows[0].tolist() == order
        if w:
            expect = dict(zip([10, 11, 12], z_dense + w * z_bm25))
            np.testing.assert_allclose(scores[0], [expect[r] for r in order], rtol=1e-5)
        np.testing.assert_allclose(comps["bm25"][0], [{10: 3.0, 11: 0.0, 12: 0.0}[r] for r in order])
    with pytest.raises(ConfigError, match="final_guide"):
        GQRConfig(final="fuse", final_guide=0.25)
    with pytest.raises(ConfigError, match="final_guide"):
        GQRConfig(final_guide=-1)


def test_fuse_dispatches_through_the_method_table():
    """Every built-in fusion method has an entry in FUSERS (GQR's is gqr.GQRFusion), fuse runs exactly
    that entry, an unknown method is a ConfigError, and a method registered from outside is usable."""
    from hybridret.fusion import FUSERS, FusionMethod, fuse, register_fusion, unregister_fusion
    from hybridret.fusion.gqr import GQRFusion
    from hybridret.fusion.scores import Candidates, select
    from hybridret.methods import FUSION_METHODS
    from hybridret.retrievers import QueryBatch

    assert FUSION_METHODS == tuple(FUSERS) == ("linear", "rrf", "gqr")
    assert isinstance(FUSERS["gqr"], GQRFusion) and FUSERS["gqr"].vectors
    with pytest.raises(TypeError):
        FUSERS["x"] = FUSERS["gqr"]  # read-only: methods are added with register_fusion
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(2, 6, 4)).astype(np.float32)
    dense = rng.normal(size=(2, 4)).astype(np.float32)
    rows = np.array([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, -1, -1]])
    valid = rows >= 0
    exact = {"dense": np.where(valid, np.einsum("nd,nmd->nm", dense, vectors), -np.inf),
             "sparse": rng.uniform(0, 5, size=(2, 6)), "bm25": rng.uniform(0, 9, size=(2, 6))}
    listed = {n: valid & (rng.uniform(size=(2, 6)) < 0.7) for n in exact}
    cands = Candidates(rows, exact, listed, vectors=np.where(valid[..., None], vectors, 0.0))
    q = QueryBatch(["a", "b"], dense=dense)
    for method in FUSION_METHODS:
        cfg = FusionConfig(method, retrievers=("dense", "sparse", "bm25"))
        got, want = fuse(cfg, cands, 3, None, q), FUSERS[method].fuse(cfg, cands, 3, None, q)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert got[0].shape == (2, 3) and set(got[2]) >= {"dense", "sparse", "bm25"}
    with pytest.raises(ConfigError, match="unknown fusion method 'vibes'; expected one of linear, rrf, gqr"):
        FusionConfig("vibes")
    rogue = FusionConfig("rrf")
    object.__setattr__(rogue, "method", "vibes")  # past FusionConfig's check: fuse still names the problem
    with pytest.raises(ConfigError, match="unknown fusion method 'vibes'"):
        fuse(rogue, cands, 3, None, q)

    class ByPosition(FusionMethod):
        name = "position"

        def fuse(self, config, cands, k, snap, q, *, filt=None, threads=None):
            return select(cands.rows, -np.arange(cands.rows.shape[1], dtype=float)[None].repeat(len(q), 0),
                          cands.exact, k)

    register_fusion(ByPosition())
    try:
        got = fuse(FusionConfig("position"), cands, 3, None, q)
        assert got[0].tolist() == [[0, 1, 2], [6, 7, 8]]
    finally:
        unregister_fusion("position")
    with pytest.raises(ConfigError, match="unknown fusion method 'position'"):
        FusionConfig("position")
