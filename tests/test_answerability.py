"""Answerability and query-level relevance inputs (issue #34): each leg's best exact score over the
(filtered) index per query (``run_plan(tops=True)``), the shipped answerability model applied to
them by hand, the same answerability on every page / ``k`` / grouping, ``Hits.answerability``
through JSON, the server, the Client and the CLI, and on the bundled sample: on-topic questions
are more answerable, and their relevant hits more relevant, than off-topic questions' hits."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from hybridret import HybridRetriever, load_qrels, load_queries
from hybridret.errors import ConfigError
from hybridret.search.calibrate import Judged, fit_answerability, judged_hits
from hybridret.search.relevance import (DEFAULT_CALIBRATION, TOPS, Calibration, LogisticModel, bm25_bounds,
                                        sparse_self_scores)
from hybridret.types import result_json

sys.path.insert(0, str(Path(__file__).parent))
from _serving import NO_CHROMIUM, chromium, headless_chrome, serving  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample"
QUERIES = load_queries(SAMPLE / "queries.jsonl")
QRELS = load_qrels(SAMPLE / "qrels.tsv")
DOCS = [{"id": d["_id"], "title": d.get("title", ""), "text": d["text"], "metadata": {"half": i % 2}}
        for i, d in enumerate(json.loads(line) for line in (SAMPLE / "corpus.jsonl").open())]
# none of the sample's 15 topics (astronomy, cooking, medicine, computing, history, geography, biology, music,
# sports, economics, climate, architecture, chemistry, literature, transportation) answers these
OFF_TOPIC = ["How do I reset the admin password of my home wifi router?",
             "Which knitting needle size should I use for chunky wool?",
             "What is the return policy for shoes bought online at Zalando?",
             "How do I get red wine stains out of a beige carpet?",
             "Which fishing lure works best for trout in a cold mountain lake?",
             "How often should I water a cactus kept on a windowsill?",
             "What is the best way to remove a stripped screw from drywall?",
             "How do I unclog a bathroom sink drain without chemicals?"]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


@pytest.fixture(scope="module")
def retriever(tmp_path_factory) -> HybridRetriever:
    root = tmp_path_factory.mktemp("answerability") / "index"
    r = HybridRetriever.from_models()
    r.index(DOCS, workdir=root)
    return r


def test_leg_tops_and_answerability_computed_by_hand(retriever):
    texts = [QUERIES["q01"], QUERIES["q02"], OFF_TOPIC[0], "   "]
    n = retriever.searcher.num_docs
    full = {m: retriever.search(texts, n, method=m) for m in ("dense", "sparse", "bm25")}  # every document, by list
    hits = retriever.search(texts, 3, relevance=True)
    snap = retriever.searcher.snapshot
    scale = {"dense": np.ones(len(texts)), "sparse": sparse_self_scores(hits.query_sparse, len(texts)),
             "bm25": bm25_bounds(snap, texts)}
    tops = {}
    for leg, h in full.items():
        best = np.array([np.max(h.scores[i][h.rows[i] >= 0]) if (h.rows[i] >= 0).any() else np.nan
                         for i in range(len(texts))], dtype=np.float64)
        tops[f"top_{leg}"] = np.where(scale[leg] > 0, best / np.where(scale[leg] > 0, scale[leg], 1), 0.0)
    model = DEFAULT_CALIBRATION.answer_model(["dense", "sparse", "bm25"])
    assert model is not None and set(model.features) <= set(TOPS)
    z = model.intercept + sum(w * np.nan_to_num(tops[f]) for f, w in zip(model.features, model.weights))
    want = _sigmoid(z)
    got = hits.answerability
    assert got is not None and got.shape == (len(texts),)
    assert got[:3] == pytest.approx(want[:3], abs=1e-5)
    assert math.isnan(got[3])  # a blank query: no answerability
    # the hits' relevance model reads the same query-level inputs: its value by hand for the top hit
    fused = DEFAULT_CALIBRATION.models[(("dense", "sparse", "bm25"), True)]
    assert {"top_dense", "top_sparse", "top_bm25"} <= set(fused.features)


def test_answerability_is_the_same_on_every_page_k_grouping_and_rerank_free_method(retriever):
    q = [QUERIES["q05"], OFF_TOPIC[1]]
    base = retriever.search(q, 10, relevance=True).answerability
    for options in ({"offset": 5}, {"group_by": "half", "group_size": 2}):
        assert retriever.search(q, 3, relevance=True, **options).answerability == pytest.approx(base)
    assert retriever.search(q, 1, relevance=True).answerability == pytest.approx(base)
    assert retriever.search(q, 10).answerability is None  # only asked for with relevance
    single = retriever.search(q, 10, method="bm25", relevance=True).answerability
    assert single is not None and ((single >= 0) & (single <= 1)).all()  # BM25's own model


def test_a_filter_changes_the_best_documents_the_inputs_are_read_from(retriever):
    q = [QUERIES["q01"]]
    from hybridret.search.request import SearchRequest

    _, _, res = retriever.searcher._run(SearchRequest(q, 5, relevance=True, filter={"half": 1}))
    full = retriever.search(q, 150, method="dense", filter={"half": 1})
    assert res.tops["dense"][0] == pytest.approx(float(full.scores[0][0]), abs=1e-5)


def test_on_topic_questions_are_more_answerable_and_their_relevant_hits_more_relevant(retriever):
    judged = [t for q, t in QUERIES.items() if QRELS.get(q)]
    hits = retriever.search(judged + OFF_TOPIC, 10, relevance=True)
    a = hits.answerability
    on, off = a[:len(judged)], a[len(judged):]
    # ROC-AUC of answerability, on-topic vs off-topic questions: well above chance
    pairs = (on[:, None] > off[None, :]).mean() + 0.5 * (on[:, None] == off[None, :]).mean()
    assert pairs >= 0.8, (on, off)
    assert np.median(on) > 0.5 > np.median(off)
    qids = [q for q in QUERIES if QRELS.get(q)]
    relevant = [hits.relevance[i, j] for i, q in enumerate(qids) for j, d in enumerate(hits.ids[i])
                if QRELS[q].get(str(d), 0) >= 1]
    off_rel = hits.relevance[len(judged):][hits.rows[len(judged):] >= 0]
    assert np.median(relevant) > np.quantile(off_rel, 0.9)  # one threshold keeps the answers, drops the junk


def test_answerability_models_round_trip_and_bad_ones_are_named():
    cal = DEFAULT_CALIBRATION
    assert cal.answer and Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    assert all(set(m.features) <= set(TOPS) for m in cal.answer.values())
    bad = {**cal.to_dict(), "answerability": [{"features": ["dense"], "intercept": 0.0, "weights": [1.0]}]}
    with pytest.raises(ConfigError, match="query-level"):
        Calibration.from_dict(bad)
    with pytest.raises(ConfigError, match="list of models"):
        Calibration.from_dict({**cal.to_dict(), "answerability": "yes"})
    assert LogisticModel.from_dict({"features": ["top_bm25"], "intercept": 0.0, "weights": [1.0]}).retrievers == ("bm25",)


def test_fit_answerability_learns_the_direction_and_needs_both_kinds():
    rng = np.random.default_rng(0)
    top = np.concatenate([rng.normal(0.6, 0.1, 60), rng.normal(0.2, 0.1, 60)])
    y = np.arange(120) < 60
    lists = Judged({"dense": top}, y, np.arange(120), None, queries={"top_dense": top}, answerable=y)
    models = fit_answerability(lists)
    m = models[("dense",)]
    assert m.features == ("top_dense",) and m.weights[0] > 0
    p = m.predict({"top_dense": np.array([0.7, 0.1])})
    assert p[0] > 0.8 and p[1] < 0.2
    assert fit_answerability(Judged({"dense": top}, y, np.arange(120), None, queries={"top_dense": top},
                                    answerable=np.ones(120, bool))) == {}  # judged queries only: nothing to fit


def test_judged_hits_label_off_topic_queries_unanswerable(retriever):
    q = {k: v for k, v in list(QUERIES.items())[:6]}
    d = judged_hits(retriever.searcher, q, QRELS, k=5, off_topic=OFF_TOPIC[:3])
    assert d.answerable is not None and d.answerable.tolist() == [True] * 6 + [False] * 3
    assert not d.labels[d.query >= 6].any()  # every hit of an off-topic query is non-relevant
    assert set(TOPS) <= set(d.queries)


def test_answerability_in_json_cli_server_and_client(retriever, capsys):
    import httpx

    from hybridret.cli import main
    from hybridret.client import Client
    from hybridret.serve.app import ServeConfig, create_app

    hits = retriever.search([QUERIES["q01"], OFF_TOPIC[2]], 3, relevance=True)
    out = result_json(hits, 0)
    assert out["answerability"] == pytest.approx(float(hits.answerability[0]))
    assert "answerability" not in result_json(retriever.search([QUERIES["q01"]], 3), 0)
    root = str(retriever.searcher.root)
    assert main(["-q", "search", root, OFF_TOPIC[2], "-k", "2", "--relevance", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["answerability"] == pytest.approx(float(hits.answerability[1]))
    assert main(["-q", "search", root, OFF_TOPIC[2], "-k", "2", "--relevance"]) == 0
    assert "likely nothing relevant" in capsys.readouterr().out
    with serving(create_app(retriever, ServeConfig())) as url, Client(url) as client:
        plain = httpx.post(f"{url}/search", json={"query": QUERIES["q01"], "k": 3}, timeout=60).json()
        assert "answerability" not in plain["results"][0]  # not asked for: no key at all, never null
        remote = client.search([QUERIES["q01"], OFF_TOPIC[2], " "], 3, relevance=True)
        assert remote.answerability[:2] == pytest.approx(hits.answerability, abs=1e-6)
        assert math.isnan(remote.answerability[2])
        assert client.search(QUERIES["q01"], 3).answerability is None


def test_the_shipped_calibration_is_checksummed_json_and_an_edited_file_is_refused(tmp_path):
    from hybridret.search.relevance import RESOURCE, calibration_file, load_calibration

    shipped = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / RESOURCE
    data = json.loads(shipped.read_text())
    assert data["sha256"].startswith("sha256:") and load_calibration(shipped) == DEFAULT_CALIBRATION
    data["models"][0]["intercept"] += 1.0  # an edit that keeps the JSON valid
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="sha256"):
        load_calibration(edited)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        load_calibration(tmp_path / "bad.json")
    again = tmp_path / "again.json"
    again.write_text(calibration_file(DEFAULT_CALIBRATION))
    assert load_calibration(again) == DEFAULT_CALIBRATION




@pytest.mark.skipif(chromium() is None, reason=NO_CHROMIUM)
def test_search_page_shows_relevance_and_the_nothing_relevant_state(retriever):
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from hybridret.serve.app import ServeConfig, create_app

    with serving(create_app(retriever, ServeConfig())) as url:
        driver = headless_chrome(webdriver)
        try:
            driver.get(url + "/")
            expected = retriever.search([OFF_TOPIC[3], QUERIES["q01"]], 10, relevance=True)
            for i, query in enumerate((OFF_TOPIC[3], QUERIES["q01"])):
                box = driver.find_element(By.ID, "q")
                box.clear()
                box.send_keys(query)
                driver.find_element(By.ID, "go").click()
                WebDriverWait(driver, 30).until(
                    lambda d: d.find_element(By.ID, "answer").is_displayed()
                    and len(d.find_elements(By.CSS_SELECTOR, "#results .hit .relevance")) == 10
                    and f"{expected.answerability[i]:.2f}" in d.find_element(By.ID, "answer").text)
                answer = driver.find_element(By.ID, "answer").text
                hits = driver.find_elements(By.CSS_SELECTOR, "#results .hit")
                shown = [float(h.find_element(By.CSS_SELECTOR, ".relevance").text.split()[-1]) for h in hits]
                assert shown == pytest.approx(list(expected.relevance[i]), abs=0.006)
                dimmed = ["below" in (h.get_attribute("class") or "") for h in hits]
                assert dimmed == [r < 0.5 for r in expected.relevance[i]]
                if expected.answerability[i] < 0.5:
                    assert answer.startswith("Nothing relevant found")
                else:
                    assert "Nothing relevant" not in answer
            assert expected.answerability[0] < 0.5 <= expected.answerability[1]  # the two states were both seen
        finally:
            driver.quit()
