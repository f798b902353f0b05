"""Full-text filters (``$text``): against a brute-force reference on seeded corpora, combined with
metadata filters, through deletes, upserts, several segments and compaction; bad input errors."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from _serving import NO_CHROMIUM, chromium, headless_chrome
from _text_only import TextOnly, build

from hybridret import IndexWriter, Searcher
from hybridret.filters import FilterError, parse_filter
from hybridret.index.analysis import bm25_analyzer
from hybridret.index.textmatch import full_text, holds_sequence

WORDS = ["error", "code", "the", "of", "windows", "update", "failed", "0x80070005", "running", "runs", "run",
         "cat", "cats", "in", "disk", "full", "Error", "CODE", "network"]
ANALYZER = bm25_analyzer()


def corpus(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
        title = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 2)))
        docs.append({"id": f"d{i}", "title": title, "text": text, "lang": rng.choice(["en", "de"]),
                     "year": rng.randint(2018, 2024)})
    return docs


# -- the reference: the same analyzer, token lists scanned in Python ----------------------------------------
def tokens(doc: dict) -> list[str]:
    text = full_text(doc.get("title", ""), doc["text"])
    return list(ANALYZER.analyze(text)) if text else []


def holds(doc: dict, entry: str) -> bool:
    return holds_sequence(tokens(doc), list(ANALYZER.analyze(entry)))


def ref_text(doc: dict, spec: dict) -> bool:
    phrases = [spec["phrase"]] if isinstance(spec.get("phrase"), str) else spec.get("phrase", [])
    return (all(holds(doc, p) for p in phrases) and all(holds(doc, w) for w in spec.get("all", []))
            and (not spec.get("any") or any(holds(doc, w) for w in spec["any"]))
            and not any(holds(doc, w) for w in spec.get("none", [])))


def ref(doc: dict, f: dict) -> bool:
    """Brute-force evaluation of the filters these tests use."""
    ok = True
    for key, value in f.items():
        if key == "$text":
            ok &= ref_text(doc, value)
        elif key == "$and":
            ok &= all(ref(doc, g) for g in value)
        elif key == "$or":
            ok &= any(ref(doc, g) for g in value)
        elif key == "$not":
            ok &= not ref(doc, value)
        else:
            ok &= doc.get(key) == value
    return ok


def random_filters(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    content = [w for w in WORDS if list(ANALYZER.analyze(w))]
    out: list[dict] = []
    for _ in range(count):
        spec: dict = {}
        for key in rng.sample(["phrase", "all", "any", "none"], rng.randint(1, 3)):
            if key == "phrase":
                spec[key] = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 3)))
                if not list(ANALYZER.analyze(spec[key])):
                    spec[key] = "error code"
            else:
                spec[key] = rng.sample(content, rng.randint(1, 2))
        f: dict = {"$text": spec}
        shape = rng.randint(0, 3)
        if shape == 1:
            f = {"$and": [f, {"lang": "en"}]}
        elif shape == 2:
            f = {"$or": [f, {"year": 2020}]}
        elif shape == 3:
            f = {"$not": f}
        out.append(f)
    return out


def live_ids(docs: list[dict], deleted: set[str], f: dict) -> list[str]:
    return sorted((d["id"] for d in docs if d["id"] not in deleted and ref(d, f)), key=lambda i: int(i[1:]))


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    docs = corpus(7, 300)
    deleted = {f"d{i}" for i in range(0, 300, 7)}
    path = build(tmp_path_factory.mktemp("tf") / "ix", docs, parts=3, delete=sorted(deleted))
    s = Searcher(path)
    assert len(s.snapshot.segments) == 3
    assert all(seg.part("phrases") is not None for seg in s.snapshot.segments)  # written by default
    return docs, deleted, s


def test_phrase_and_words_match_brute_force(seeded):
    docs, deleted, s = seeded
    filters = random_filters(11, 120)
    nonempty = 0
    for f in filters:
        want = live_ids(docs, deleted, f)
        got = [d["id"] for d in s.documents(f)]
        assert sorted(got, key=lambda i: int(i[1:])) == want, f
        assert s.count(f) == len(want), f
        nonempty += bool(want) and len(want) < 300 - len(deleted)
    assert nonempty > 40  # the filters are selective, not trivially all or nothing


def test_bm25_top_k_is_the_exact_top_k_of_matching_documents(seeded):
    docs, deleted, s = seeded
    for f in random_filters(5, 40):
        allowed = set(live_ids(docs, deleted, f))
        full = s.search("error code windows", k=300, method="bm25")[0]
        want = [h.id for h in full if h.id in allowed][:5]
        got = [h.id for h in s.search("error code windows", k=5, method="bm25", filter=f)[0]]
        assert got == want, f


def test_semantics_by_hand(tmp_path):
    docs = [{"id": "a", "text": "The error code 0x80070005 appeared"},
            {"id": "b", "text": "error in the code"},                 # stop words drop out: "error code"
            {"id": "c", "text": "code error 0x80070005"},
            {"id": "d", "text": "Cats and dogs", "title": "Running"},  # the title is part of the text
            {"id": "e", "text": "ERROR-CODE"}]
    s = Searcher(build(tmp_path / "ix", docs))

    def ids(f):
        return sorted(d["id"] for d in s.documents(f))

    assert ids({"$text": {"phrase": "error code"}}) == ["a", "b", "e"]
    assert ids({"$text": {"phrase": "Error Code 0x80070005"}}) == ["a"]
    assert ids({"$text": {"phrase": "code error"}}) == ["c"]
    assert ids({"$text": {"phrase": ["error", "0x80070005"]}}) == ["a", "c"]   # a list: every phrase
    assert ids({"$text": {"all": ["error", "0x80070005"]}}) == ["a", "c"]
    assert ids({"$text": {"any": ["cat", "appeared"]}}) == ["a", "d"]          # stems: cats -> cat
    assert ids({"$text": {"all": ["run"], "none": ["dog"]}}) == []
    assert ids({"$text": {"none": ["error"]}}) == ["d"]
    assert ids({"$text": {"any": ["error-code"]}}) == ["a", "b", "e"]          # several tokens: a phrase
    with pytest.raises(FilterError, match=r"filter\.text: .*not a metadata field.*use \{\"\$text\""):
        s.documents({"text": "error"})


def test_living_index_adds_upserts_deletes_and_compaction(tmp_path):
    docs = corpus(3, 120)
    path = build(tmp_path / "ix", docs, parts=2)
    f = {"$text": {"phrase": "windows update", "none": ["failed"]}}
    live = {d["id"]: d for d in docs}

    def check():
        s = Searcher(path)
        got = sorted(d["id"] for d in s.documents(f))
        assert got == sorted(i for i, d in live.items() if ref(d, f))
        return s

    check()
    new = [{"id": "n1", "text": "Windows Update succeeded"}, {"id": "d1", "text": "windows update failed"},
           {"id": "d2", "text": "the windows of the update"}]
    with IndexWriter(path, encoder=TextOnly(), settings={"max_segments": 0}) as w:
        w.write(new, mode="upsert")
    live.update({d["id"]: d for d in new})
    s = check()
    assert len(s.snapshot.segments) == 3
    with IndexWriter(path, encoder=TextOnly()) as w:
        w.delete(filter={"$text": {"phrase": "windows update succeeded"}})   # delete by a text filter
    del live["n1"]
    check()
    with IndexWriter(path, encoder=TextOnly()) as w:
        w.compact()
    s = check()
    assert len(s.snapshot.segments) == 1


def test_segments_without_the_phrases_part_answer_the_same_and_compact_adds_it(tmp_path):
    """An index written before the part existed (phrase_index=False here) answers phrases by the
    positional check of stored texts; later writes keep its layout (the manifest's parts are those
    of every segment), and a compaction gives it the part; every state agrees with the reference."""
    docs = corpus(5, 200)
    with IndexWriter(tmp_path / "ix", encoder=TextOnly(), settings={"phrase_index": False, "max_segments": 0}) as w:
        w.write(docs[:100], mode="build")
    old = Searcher(tmp_path / "ix")
    assert old.snapshot.segments[0].part("phrases") is None
    filters = random_filters(8, 60)
    for f in filters:
        assert sorted(d["id"] for d in old.documents(f)) == sorted(live_ids(docs[:100], set(), f)), f
    with IndexWriter(tmp_path / "ix", encoder=TextOnly(), settings={"phrase_index": True, "max_segments": 0}) as w:
        w.write(docs[100:], mode="add")
    mixed = Searcher(tmp_path / "ix")
    assert [seg.part("phrases") is not None for seg in mixed.snapshot.segments] == [False, False]
    for f in filters:
        assert sorted(d["id"] for d in mixed.documents(f)) == sorted(live_ids(docs, set(), f)), f
    with IndexWriter(tmp_path / "ix", encoder=TextOnly()) as w:
        w.compact()
    done = Searcher(tmp_path / "ix")
    assert [seg.part("phrases") is not None for seg in done.snapshot.segments] == [True]
    for f in filters:
        assert sorted(d["id"] for d in done.documents(f)) == sorted(live_ids(docs, set(), f)), f


def test_index_without_bm25_part_answers_from_stored_texts(tmp_path):
    docs = corpus(9, 80)
    with IndexWriter(tmp_path / "ix", encoder=TextOnly(), settings={"bm25": False}) as w:
        w.write(docs, mode="build")
    s = Searcher(tmp_path / "ix")
    assert s.snapshot.segments[0].part("bm25") is None
    for f in random_filters(2, 30):
        assert sorted(d["id"] for d in s.documents(f)) == sorted(live_ids(docs, set(), f)), f


def test_without_stored_text_words_work_and_phrases_say_why(tmp_path):
    docs = corpus(4, 60)
    with IndexWriter(tmp_path / "ix", encoder=TextOnly(), settings={"store_text": False}) as w:
        w.write(docs, mode="build")
    s = Searcher(tmp_path / "ix")
    f = {"$text": {"all": ["error"], "none": ["cat"]}}
    assert sorted(d["id"] for d in s.documents(f)) == sorted(live_ids(docs, set(), f))
    with pytest.raises(FilterError, match=r"filter\.\$text\.phrase: .*stores no texts.*store_text=True"):
        s.search("error", k=3, method="bm25", filter={"$text": {"phrase": "error code"}})


@pytest.mark.parametrize("spec,needle", [
    ({"$text": "error"}, "filter.$text: expected an object with one or more of phrase, all, any, none"),
    ({"$text": {}}, "filter.$text: expected an object"),
    ({"$text": {"phrases": "a b"}}, "filter.$text.phrases: unknown $text key (expected phrase, all, any, none)"),
    ({"$text": {"all": "error"}}, 'filter.$text.all: expected a non-empty list of words, e.g. ["a", "b"]'),
    ({"$text": {"any": []}}, "filter.$text.any: expected a non-empty list"),
    ({"$text": {"phrase": ""}}, "filter.$text.phrase: expected a non-empty string"),
    ({"$text": {"phrase": "of the"}}, "filter.$text.phrase: 'of the' has no searchable word"),
    ({"$text": {"none": ["error", "the"]}}, "filter.$text.none[1]: 'the' has no searchable word"),
    ({"$text": {"all": ["error", 3]}}, "filter.$text.all[1]: expected a non-empty string"),
    ({"$and": [{"lang": "en"}, {"$text": {"phrase": 1}}]}, "filter.$and[1].$text.phrase: expected a string"),
    ({"body": {"$text": "x"}}, "filter.body.$text: unknown operator"),
    ({"$txt": {"phrase": "x"}}, "unknown operator '$txt' (expected $and, $or, $not, $text or a field name)"),
])
def test_bad_text_filters_say_where(spec, needle):
    with pytest.raises(FilterError) as exc:
        parse_filter(spec)
    assert needle in str(exc.value)


def test_metadata_only_evaluation_refuses_text():
    from hybridret.index.metadata import MetadataColumns

    f = parse_filter({"$text": {"all": ["error"]}})
    assert f.has_text and not parse_filter({"lang": "en"}).has_text
    with pytest.raises(FilterError, match="filter.\\$text: full-text conditions"):
        f.mask(MetadataColumns([{}], 1))


def test_dense_and_hybrid_respect_text_filters(tmp_path, paired_encoder, small_corpus):
    with IndexWriter(tmp_path / "ix", encoder=paired_encoder, settings={"max_segments": 0}) as w:
        w.write(small_corpus[:20], mode="build")
        w.write(small_corpus[20:], mode="add")
    s = Searcher(tmp_path / "ix", encoder=paired_encoder)
    f = {"$or": [{"$text": {"any": ["ocean", "wolves"]}}, {"$text": {"phrase": "roasted cacao"}}]}
    want = sorted(d["id"] for d in small_corpus if ref(d, f))
    assert want and len(want) < 10
    for method in ("dense", "hybrid", "rrf", "bm25", "sparse"):
        got = [h.id for h in s.search("animals and the sea", k=10, method=method, filter=f)[0]]
        assert set(got) <= set(want), method
        if method == "dense":  # dense scores every allowed document
            assert sorted(got) == want
    hits = s.search("animals", k=10, method="dense", filter={"$not": f})[0]
    assert not set(h.id for h in hits) & set(want) and len(hits) == 10


def test_unchanged_segments_answer_phrases_from_the_cache(seeded):
    _, _, s = seeded
    seg = s.snapshot.segments[0]
    first = seg.text.rows(("error", "code"))
    assert seg.text.rows(("error", "code")) is first
    assert np.all(np.diff(first) > 0)


KB = [{"id": "kb1", "text": "Windows Update fails with error code 0x80070005 (access denied).", "os": "windows"},
      {"id": "kb2", "text": "Error 0x80070005 in the Store app: reset the cache.", "os": "windows"},
      {"id": "kb3", "text": "The code reviewer found an error in the update script.", "os": "linux"}]


@pytest.fixture(scope="module")
def kb():
    from hybridret import HybridRetriever

    retriever = HybridRetriever.from_models()
    retriever.index([dict(d) for d in KB])
    return retriever


def test_library_example(kb):
    hits = kb.search("update failed", k=5, filter={"$text": {"phrase": "error code 0x80070005"}})[0]
    assert [h.id for h in hits] == ["kb1"]
    hits = kb.search("update failed", k=5, method="dense",
                     filter={"$text": {"all": ["error", "update"], "none": ["store"]}, "os": "linux"})[0]
    assert [h.id for h in hits] == ["kb3"]


def test_http_api_and_client(kb):
    import httpx
    from _serving import serving

    from hybridret.client import Client
    from hybridret.serve.app import ServeConfig, create_app

    with serving(create_app(kb, ServeConfig(batching=False))) as url:
        body = {"query": "access denied", "k": 5, "method": "dense",
                "filter": {"$or": [{"$text": {"phrase": "error 0x80070005"}}, {"os": "linux"}]}}
        r = httpx.post(f"{url}/search", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert sorted(h["id"] for h in r.json()["results"][0]["hits"]) == ["kb2", "kb3"]
        r = httpx.post(f"{url}/search", json={"query": "x", "filter": {"$text": {"all": ["the"]}}}, timeout=60)
        assert r.status_code == 400 and "filter.$text.all[0]: 'the' has no searchable word" in r.text
        client = Client(url)
        try:
            hits = client.search("cache", k=5, filter={"$text": {"any": ["store", "reviewer"]}})
            assert sorted(h.id for h in hits[0]) == ["kb2", "kb3"]
            assert client.count({"$text": {"all": ["error"]}, "os": "windows"}) == 2
            with pytest.raises(FilterError, match=r"filter\.\$text\.none: expected a non-empty list"):
                client.search("x", k=3, filter={"$text": {"none": "cache"}})  # refused before any request
        finally:
            client.close()




@pytest.mark.skipif(chromium() is None, reason=NO_CHROMIUM)
def test_search_page_filter_box_takes_text_filters(kb):
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")
    from _serving import serving
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from hybridret.serve.app import ServeConfig, create_app

    with serving(create_app(kb, ServeConfig(batching=False))) as url:
        driver = headless_chrome(webdriver)
        try:
            driver.get(url + "/")
            WebDriverWait(driver, 20).until(ec.text_to_be_present_in_element((By.ID, "status"), "documents"))
            assert "$text" in driver.find_element(By.ID, "filter").get_attribute("title")
            driver.find_element(By.ID, "q").send_keys("access denied")
            driver.find_element(By.ID, "filter").send_keys('{"$text": {"phrase": "error code"}}')
            driver.find_element(By.ID, "go").click()
            WebDriverWait(driver, 30).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#results .hit")) >= 1)
            assert [h.get_attribute("data-id") for h in driver.find_elements(By.CSS_SELECTOR, "#results .hit")] == ["kb1"]
            box = driver.find_element(By.ID, "filter")
            box.clear()
            box.send_keys('{"$text": {"all": ["the"]}}')
            driver.find_element(By.ID, "go").click()
            WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "error").is_displayed())
            assert "filter.$text.all[0]" in driver.find_element(By.ID, "error").text
        finally:
            driver.quit()


def test_framework_adapters(kb):
    """LangChain takes hybridret filters as they are; LlamaIndex's text_match on the key "text"
    becomes a phrase; Haystack has no full-text operator, so a condition on "content" says to use $text."""
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    pytest.importorskip("haystack")
    from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

    from hybridret.integrations import HybridRetLangChainRetriever, HybridRetLlamaIndexRetriever
    from hybridret.integrations import haystack_filter_to_hybridret as haystack_tr

    lc = HybridRetLangChainRetriever(searcher=kb.searcher, k=5, filter={"$text": {"any": ["store", "reviewer"]}})
    assert sorted(d.metadata["id"] for d in lc.invoke("cache")) == ["kb2", "kb3"]
    li = HybridRetLlamaIndexRetriever(kb.searcher, similarity_top_k=5, filters=MetadataFilters(filters=[
        MetadataFilter(key="text", value="Error Code", operator=FilterOperator.TEXT_MATCH),
        MetadataFilter(key="os", value="windows")]))
    assert [n.node.node_id for n in li.retrieve("access denied")] == ["kb1"]
    with pytest.raises(FilterError, match="on the metadata field 'os': hybridret matches words in a document's text"):
        HybridRetLlamaIndexRetriever(kb.searcher, filters=MetadataFilters(
            filters=[MetadataFilter(key="os", value="win", operator=FilterOperator.TEXT_MATCH)]))
    assert haystack_tr({"$text": {"phrase": "error code"}}) == {"$text": {"phrase": "error code"}}
    with pytest.raises(FilterError, match=r"no full-text operator.*\$text"):
        haystack_tr({"field": "content", "operator": "==", "value": "error"})


# -- two shards (a local Ray cluster) --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sharded(seeded, tmp_path_factory):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'hybridret[ray]')")
    import os
    import shutil
    import tempfile

    from hybridret.distributed.reshard import reshard
    from hybridret.distributed.searcher import ShardedSearcher

    _, _, single = seeded
    started = not ray.is_initialized()
    state = tempfile.mkdtemp(prefix="ray-")
    if started:
        os.environ["RAY_AUTH_MODE"] = "disabled"
        token = Path.home() / ".ray" / "auth_token"
        had_token, had_folder = token.exists(), token.parent.exists()
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=state, log_to_driver=False)
    out = tmp_path_factory.mktemp("tf-sharded") / "s2"
    reshard(single.root, out, 2)
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


def test_two_shards_answer_as_one_index(seeded, sharded):
    docs, deleted, single = seeded
    for f in random_filters(23, 25):
        allowed = set(live_ids(docs, deleted, f))
        got = sharded.search("error code windows network", k=300, method="bm25", filter=f)[0]
        one = single.search("error code windows network", k=300, method="bm25", filter=f)[0]
        assert {h.id for h in got} <= allowed, f
        assert {h.id for h in got} == {h.id for h in one}, f  # every allowed document with a score
        np.testing.assert_allclose([h.score for h in got], [h.score for h in one], rtol=1e-5)  # ties may swap
    f = {"$text": {"phrase": "windows update"}}
    before = [h.id for h in sharded.search("windows", k=300, method="bm25", filter=f)[0]]
    assert before
    sharded.delete(before[:1])
    after = [h.id for h in sharded.search("windows", k=300, method="bm25", filter=f)[0]]
    assert sorted(after) == sorted(before[1:])
