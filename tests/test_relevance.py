"""Calibrated relevance (issue #21): a probability in [0, 1] per hit, non-increasing in the method's
score within a query, from the shipped calibration of the packaged models or one fitted with
``hybridret calibrate``; carried by JSON, the server, the Client, the CLI; used by LangChain's
relevance scores and ``score_threshold`` in process and through a real loopback server."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from hybridret import HybridRetriever, load_qrels, load_queries
from hybridret.errors import ConfigError
from hybridret.search.relevance import (DEFAULT_CALIBRATION, FEATURES, TOPS, Calibration, LogisticModel, calibration_for,
                                        fusion_key, hit_ranks, monotone)

sys.path.insert(0, str(Path(__file__).parent))
from _serving import serving  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample"
QUERIES = load_queries(SAMPLE / "queries.jsonl")
QRELS = load_qrels(SAMPLE / "qrels.tsv")
TEXTS = list(QUERIES.values())[:6]
DOCS = [{"id": d["_id"], "title": d.get("title", ""), "text": d["text"], "metadata": {"half": i % 2, "doc": f"p{i // 3}"}}
        for i, d in enumerate(json.loads(line) for line in (SAMPLE / "corpus.jsonl").open())]


@pytest.fixture(scope="module")
def retriever(tmp_path_factory) -> HybridRetriever:
    root = tmp_path_factory.mktemp("relevance") / "index"
    r = HybridRetriever.from_models()
    r.index(DOCS, workdir=root)
    return r


def _check_rows(hits) -> None:
    rel = hits.relevance
    assert rel is not None and rel.shape == hits.scores.shape
    for i in range(len(hits)):
        valid = hits.rows[i] >= 0
        assert np.isnan(rel[i][~valid]).all()
        r, s = rel[i][valid], hits.scores[i][valid]
        assert ((r >= 0) & (r <= 1)).all()
        order = np.argsort(-s, kind="stable")
        assert (np.diff(r[order]) <= 1e-12).all(), (s[order], r[order])  # never higher below
        view = hits[i]
        assert [h.relevance for h in view] == pytest.approx(list(r))


# -- the mapping --------------------------------------------------------------------------------------
def test_monotone_pools_violations_and_ties_and_keeps_the_mean():
    scores = np.array([[3.0, 2.0, 1.0, 0.0, -np.inf], [2.0, 2.0, 1.0, 0.5, 0.1]])
    prob = np.array([[0.2, 0.8, 0.5, 0.1, np.nan], [0.9, 0.1, 0.3, 0.6, 0.2]])
    out = monotone(scores, prob)
    assert out[0, :4] == pytest.approx([0.5, 0.5, 0.5, 0.1]) and math.isnan(out[0, 4])
    assert out[1] == pytest.approx([0.5, 0.5, 0.45, 0.45, 0.2])  # equal scores share one value
    assert np.nanmean(out, axis=1) == pytest.approx(np.nanmean(prob, axis=1))


def test_calibration_round_trips_and_bad_ones_are_named():
    cal = DEFAULT_CALIBRATION
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    subsets = {("dense",), ("sparse",), ("bm25",), ("dense", "sparse"), ("dense", "bm25"), ("sparse", "bm25"),
               ("dense", "sparse", "bm25")}  # every set of retrievers a search's hits may have
    assert set(cal.models) == {(s, False) for s in subsets} | {(FEATURES, True)}
    assert all("log_rank" in m.features for (_, fused), m in cal.models.items() if not fused)
    assert cal.models[(FEATURES, True)].features == (*FEATURES, *TOPS, "fused_dense")  # + the query-level inputs (#34)
    with pytest.raises(ConfigError, match="features"):
        LogisticModel.from_dict({"features": ["rerank"], "intercept": 0.0, "weights": [1.0]})
    with pytest.raises(ConfigError, match="features"):
        LogisticModel.from_dict({"features": ["log_rank"], "intercept": 0.0, "weights": [1.0]})  # no retriever
    with pytest.raises(ConfigError, match="fusion settings"):
        LogisticModel.from_dict({"features": ["dense", "score"], "intercept": 0.0, "weights": [1.0, 1.0]})
    with pytest.raises(ConfigError, match="fusion settings"):
        LogisticModel.from_dict({"features": ["dense"], "intercept": 0.0, "weights": [1.0], "fusion": {"method": "rrf"}})
    with pytest.raises(ConfigError, match="one model per set"):
        Calibration.from_dict({"models": [cal.to_dict()["models"][0]] * 2})
    with pytest.raises(ConfigError, match="finite"):
        LogisticModel.from_dict({"features": ["dense"], "intercept": float("nan"), "weights": [1.0]})
    with pytest.raises(ConfigError, match="unknown"):
        Calibration.from_dict({**cal.to_dict(), "extra": 1})


def test_other_models_need_a_calibration_but_bm25_does_not(retriever):
    manifest = dict(retriever.searcher.snapshot.manifest)
    assert calibration_for(manifest, ["dense", "sparse", "bm25"]) is DEFAULT_CALIBRATION
    other = {**manifest, "encoder": {**manifest["encoder"], "dense": {**manifest["encoder"]["dense"],
                                                                      "model": "bge-small", "fingerprint": "x"}}}
    with pytest.raises(ConfigError, match="hybridret calibrate"):
        calibration_for(other, ["dense", "bm25"])
    assert calibration_for(other, ["bm25"]) is DEFAULT_CALIBRATION  # BM25's scale does not depend on the encoder


def test_ranks_share_ties_and_count_the_pages_before():
    scores = np.array([[3.0, 2.0, 2.0, 1.0, -np.inf]])
    valid = np.array([[True, True, True, True, False]])
    assert hit_ranks(scores, valid)[0, :4] == pytest.approx([1, 2, 2, 4]) and np.isnan(hit_ranks(scores, valid)[0, 4])
    assert hit_ranks(scores, valid, before=10)[0, :4] == pytest.approx([11, 12, 12, 14])


def test_the_fused_score_model_serves_exactly_its_fusion(retriever):
    """The model with the fused score is used only for the fusion setting it was fitted for (its
    scale is that fusion's); every other list (another fusion, a reranked or single list) gets the
    model of the retrievers' features and rank."""
    fusion = fusion_key(retriever.searcher.fusion_config("hybrid"))
    assert DEFAULT_CALIBRATION.model(FEATURES, fusion) is DEFAULT_CALIBRATION.models[(FEATURES, True)]
    assert fusion == DEFAULT_CALIBRATION.models[(FEATURES, True)].fusion  # the shipped one serves the default search
    flat = [{"features": list(s), "intercept": 0.0, "weights": [0.0] * len(s)}
            for s in (("dense",), ("sparse",), ("bm25",), ("dense", "sparse"), ("dense", "bm25"), ("sparse", "bm25"),
                      ("dense", "sparse", "bm25"))]
    steep = {"features": [*FEATURES, "score"], "intercept": -4.0, "weights": [0.0, 0.0, 0.0, 1.0], "fusion": fusion}
    # (a model may use the raw fused score too; the shipped one gates it by the dense cosine: fused_dense)
    cal = Calibration.from_dict({"models": [*flat, steep]})
    fused = retriever.search(TEXTS, 8, relevance=cal)
    _check_rows(fused)
    assert np.nanstd(fused.relevance) > 0.05  # follows the fused score
    expected = 1 / (1 + np.exp(4.0 - fused.scores.astype(np.float64)))
    assert np.allclose(fused.relevance, monotone(fused.scores, np.where(fused.rows >= 0, expected, np.nan)),
                       equal_nan=True)
    for other in (retriever.search(TEXTS, 8, method="rrf", relevance=cal),
                  retriever.search(TEXTS, 8, fusion={"method": "gqr"}, relevance=cal),  # other GQR settings
                  retriever.search(TEXTS, 8, method="dense", relevance=cal)):
        assert np.allclose(other.relevance[other.rows >= 0], 0.5)  # the flat model of the features
    shallow = retriever.search(TEXTS, 8, candidates=40, relevance=cal)  # the depth is not part of the setting
    assert np.allclose(shallow.relevance, monotone(shallow.scores, np.where(
        shallow.rows >= 0, 1 / (1 + np.exp(4.0 - shallow.scores.astype(np.float64))), np.nan)), equal_nan=True)


# -- searches -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["hybrid", "dense", "sparse", "bm25", "rrf", "linear"])
def test_every_method_gets_relevance_in_unit_interval_monotone_in_its_score(retriever, method):
    hits = retriever.search(TEXTS + ["   "], 8, method=method, relevance=True)
    _check_rows(hits)
    assert np.isnan(hits.relevance[-1]).all()  # a blank query: no hits, all padding
    d = hits[0][0].to_dict()
    assert 0 <= d["relevance"] <= 1
    plain = retriever.search(TEXTS[:1], 8, method=method)
    assert plain.relevance is None and plain[0][0].relevance is None and "relevance" not in plain[0][0].to_dict()
    assert list(plain.ids[0]) == list(hits.ids[0])  # asking for relevance changes nothing else


def test_relevance_with_filters_grouping_pages_and_a_bad_value(retriever):
    hits = retriever.search(TEXTS, 5, filter={"half": 1}, relevance=True)
    _check_rows(hits)
    assert all(h.metadata["half"] == 1 for view in hits for h in view)
    grouped = retriever.search(TEXTS, 3, group_by="doc", group_size=2, relevance=True)
    _check_rows(grouped)
    page = retriever.search(TEXTS, 4, offset=4, relevance=True)
    _check_rows(page)
    with pytest.raises(ConfigError, match="relevance must be true or false"):
        retriever.search(TEXTS, 3, relevance="yes")


def test_relevant_hits_score_higher_and_nonsense_scores_low(retriever):
    """What a fixed threshold relies on: across the sample's judged queries, judged-relevant hits
    get a higher relevance than the others, and a query about nothing in the corpus gets a low one."""
    qids = [q for q in QUERIES if q in QRELS]
    hits = retriever.search([QUERIES[q] for q in qids], 10, relevance=True)
    rel = [(float(hits.relevance[i, j]), QRELS[q].get(str(hits.ids[i, j]), 0) > 0)
           for i, q in enumerate(qids) for j in range(hits.ids.shape[1]) if hits.rows[i, j] >= 0]
    pos = np.array([r for r, y in rel if y])
    neg = np.array([r for r, y in rel if not y])
    assert len(pos) >= 10 and pos.mean() > neg.mean() + 0.2
    off = retriever.search(["how to reset a forgotten router password", "best smartphone battery life 2024"], 5,
                           relevance=True)  # the sample is about astronomy, cooking, history, art...
    # the fused score alone is relative (z-scored over the candidates): it gave these lists 0.96; gated by the
    # dense cosine (fused_dense) they stay low
    assert np.nanmax(off.relevance) < min(np.quantile(pos, 0.25), 0.4)


def test_calibrate_fits_stores_and_search_uses_it(retriever):
    from hybridret.search.calibrate import calibrate

    cal = calibrate(retriever, QUERIES, QRELS, k=10)
    assert cal.holds_for(retriever.searcher.snapshot.manifest["encoder"]) and cal.fitted_on["queries"] == 30
    assert set(cal.models) == set(DEFAULT_CALIBRATION.models)  # every set of retrievers, and the fused score's
    assert cal.models[(FEATURES, True)].fusion == fusion_key(retriever.searcher.fusion_config("hybrid"))
    explicit = retriever.search(TEXTS, 5, relevance=cal).relevance
    retriever.set_relevance(cal)
    try:
        stored = retriever.search(TEXTS, 5, relevance=True).relevance
        assert np.allclose(stored, explicit, equal_nan=True)
        assert not np.allclose(stored, retriever.search(TEXTS, 5, relevance=DEFAULT_CALIBRATION).relevance,
                               equal_nan=True)
    finally:
        retriever.set_relevance(None)
    assert np.allclose(retriever.search(TEXTS, 5, relevance=True).relevance,
                       retriever.search(TEXTS, 5, relevance=DEFAULT_CALIBRATION).relevance, equal_nan=True)
    with pytest.raises(ConfigError, match="too few judged hits"):
        calibrate(retriever, {q: QUERIES[q] for q in list(QUERIES)[:2]}, QRELS, k=3)


def test_calibrate_deeper_than_the_index_fits_a_sound_model(retriever):
    """k beyond the index (every query's list holds all 300 documents): plain Newton steps once
    stored an intercept of -7.7e12 here (every relevance ~1e-8); the fit is sound now (issue #32)."""
    from hybridret.search.calibrate import MAX_LOGIT, calibrate

    cal = calibrate(retriever, QUERIES, QRELS, k=1000)
    for m in cal.models.values():
        assert abs(m.intercept) < MAX_LOGIT and max(abs(w) for w in m.weights) < MAX_LOGIT, m
    rel = retriever.search(TEXTS, 5, relevance=cal).relevance
    assert np.nanmax(rel) > 0.05  # a top hit is not called irrelevant


def test_cli_search_relevance(retriever, capsys):
    from hybridret.cli import main

    assert main(["-q", "search", str(retriever.searcher.root), TEXTS[0], "-k", "3", "--relevance", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = retriever.search(TEXTS[:1], 3, relevance=True)
    assert [h["relevance"] for h in out["hits"]] == pytest.approx(list(expected.relevance[0]))
    assert main(["-q", "search", str(retriever.searcher.root), TEXTS[0], "-k", "2", "--relevance"]) == 0
    assert "relevance 0." in capsys.readouterr().out or "relevance 1." in capsys.readouterr().out


# -- LangChain, in process and through a server -----------------------------------------------------------
def _langchain_checks(backend, reference) -> None:
    from hybridret.integrations.langchain import HybridRetLangChainRetriever, HybridRetVectorStore

    store = HybridRetVectorStore(backend)
    q = TEXTS[0]
    expected = reference.search([q], 6, relevance=True)
    pairs = store.similarity_search_with_relevance_scores(q, k=6)
    assert [d.id for d, _ in pairs] == list(expected.ids[0])
    assert [s for _, s in pairs] == pytest.approx(list(expected.relevance[0]))
    assert all(d.metadata["relevance"] == s for d, s in pairs)
    t = float(np.median(expected.relevance[0]))
    kept = store.similarity_search_with_relevance_scores(q, k=6, score_threshold=t)
    assert kept and [d.id for d, _ in kept] == [d.id for d, s in pairs if s >= t]
    docs = store.as_retriever(search_type="similarity_score_threshold",
                              search_kwargs={"score_threshold": t, "k": 6}).invoke(q)
    assert [d.id for d in docs] == [d.id for d, _ in kept]
    filtered = store.similarity_search_with_relevance_scores(q, k=6, filter={"half": 0})
    assert filtered and all(d.metadata["half"] == 0 and 0 <= s <= 1 for d, s in filtered)
    with pytest.raises(ConfigError, match="score_threshold"):
        store.similarity_search_with_relevance_scores(q, k=3, score_threshold=1.5)
    lc = HybridRetLangChainRetriever(searcher=backend, k=6, score_threshold=t)
    assert [d.id for d in lc.invoke(q)] == [d.id for d, _ in kept]


def test_langchain_relevance_in_process(retriever):
    _langchain_checks(retriever, retriever)


def test_langchain_and_client_relevance_through_a_server(retriever):
    from hybridret.client import Client
    from hybridret.serve.app import ServeConfig, create_app

    with serving(create_app(retriever, ServeConfig())) as url, Client(url) as client:
        import httpx

        plain = httpx.post(f"{url}/search", json={"queries": TEXTS[:2], "k": 3}, timeout=60).json()
        hits = [h for r in plain["results"] for h in r["hits"]]
        assert hits and all("relevance" not in h for h in hits)  # not asked for: no key at all, never null
        asked = httpx.post(f"{url}/search", json={"queries": TEXTS[:2], "k": 3, "relevance": True}, timeout=60).json()
        assert all(0 <= h["relevance"] <= 1 for r in asked["results"] for h in r["hits"])
        remote = client.search(TEXTS, 5, relevance=True)
        local = retriever.search(TEXTS, 5, relevance=True)
        assert np.allclose(remote.relevance, local.relevance, equal_nan=True)
        assert [h.relevance for h in remote[0]] == pytest.approx(list(local.relevance[0]))
        assert client.search(TEXTS[:1], 3).relevance is None
        grouped = client.search(TEXTS[:2], 2, group_by="doc", group_size=2, relevance=True)
        assert np.allclose(grouped.relevance, retriever.search(TEXTS[:2], 2, group_by="doc", group_size=2,
                                                               relevance=True).relevance, equal_nan=True)
        with pytest.raises(ConfigError, match="relevance"):
            client.search(TEXTS[:1], 3, relevance=1)
        _langchain_checks(client, retriever)


def test_a_hit_a_retriever_did_not_score_is_left_out_of_the_fit() -> None:
    """NaN features (a fused hit one retriever did not score) must not make NaN coefficients, which
    would be stored and break every later relevance search."""
    import numpy as np

    from hybridret.search.calibrate import Judged, _model

    rng = np.random.default_rng(0)
    dense = rng.normal(size=200)
    labels = (dense + rng.normal(scale=0.5, size=200) > 0).astype(float)
    bm25 = rng.normal(size=200)
    bm25[::7] = np.nan
    data = Judged(features={"dense": dense, "bm25": bm25}, labels=labels, query=np.arange(200) // 10, fusion=None)
    model = _model(data, ("dense", "bm25"))
    assert np.isfinite([model.intercept, *model.weights]).all() and model.weights[0] > 0
