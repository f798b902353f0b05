"""The Client is a drop-in Searcher: the same validation and error types before any request, the
library's own exceptions (never httpx's or a bare TypeError), and it pickles (reconnecting)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from _serving import serving

from hybridret import Searcher  # noqa: E402
from hybridret.client import Client, ClientClosedError  # noqa: E402
from hybridret.errors import ConfigError, CorpusFormatError, HybridRetError  # noqa: E402
from hybridret.filters import FilterError  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample" / "corpus.jsonl"
KEY = "contract-key-0123456789abcdef"


@pytest.fixture(scope="module")
def served(tmp_path_factory, paired_encoder):
    """(url, index path): a real uvicorn server (key on writes) over 40 sample passages."""

    from hybridret.retriever import HybridRetriever
    from hybridret.serve.app import ServeConfig, create_app

    docs = []
    with open(SAMPLE, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < 40:
                d = json.loads(line)
                docs.append({"id": d["_id"], "title": d["title"], "text": d["text"], "metadata": {"n": i}})
    path = tmp_path_factory.mktemp("contract") / "idx"
    retriever = HybridRetriever(paired_encoder).index(docs, workdir=path, show_progress=False)
    with serving(create_app(retriever, ServeConfig(api_key=KEY))) as url:
        yield url, path


@pytest.fixture(scope="module")
def pair(served, paired_encoder):
    url, path = served
    client = Client(url, api_key=KEY)
    yield Searcher(path, encoder=paired_encoder), client
    client.close()


BAD_SEARCHES = [
    ((5,), {}), (([1, 2],), {}), ((b"bytes",), {}), (({"q": 1},), {}),
    (("q",), {"k": 0}), (("q",), {"k": "3"}), (("q",), {"k": True}), (("q",), {"k": 2.5}),
    (("q",), {"candidates": 0}), (("q",), {"method": 3}),
    (("q",), {"filter": {"n": {"$between": [1, 2]}}}), (("q",), {"filter": "not json"}),
    (("q",), {"fusion": 3}), (("q",), {"fusion": {"method": "linear", "weights": [1, 2]}}),
    (("q",), {"fusion": {"bogus": 1}}),
]


@pytest.mark.parametrize("args,kwargs", BAD_SEARCHES)
def test_bad_search_arguments_get_the_searchers_error(pair, args, kwargs):
    searcher, client = pair
    with pytest.raises(HybridRetError) as want:
        searcher.search(*args, **kwargs)
    with pytest.raises(HybridRetError) as got:
        client.search(*args, **kwargs)
    assert type(got.value) is type(want.value), (got.value, want.value)
    assert isinstance(got.value, ConfigError)


@pytest.mark.parametrize("docs,needle", [
    ("hello", "not a single str"),
    ({"id": "x", "text": "a single dict"}, "not a single dict"),
    ([{"id": "x"}], "documents[0] (counting from 0): missing field 'text'"),
    ([{"id": "x", "text": 5}], "documents[0]"),
    ([{"id": "x", "text": "t", "metadata": {"$bad": 1}}], "may not start with '$'"),
    (None, "iterable of documents"),
])
def test_bad_documents_are_refused_before_any_request(pair, docs, needle):
    _, client = pair
    with pytest.raises(CorpusFormatError) as err:
        client.add(docs)
    assert needle in str(err.value)
    with pytest.raises(CorpusFormatError):
        client.upsert(docs)


def test_documents_take_every_form_the_library_takes(pair):
    searcher, client = pair
    from hybridret.data import Document

    out = client.add([("t1", "a tuple passage about volcanoes"), ("t2", "Title", "a titled tuple passage"),
                      Document(id="t3", text="a Document passage"), {"_id": 7, "text": "an integer id"}])
    assert out["added"] == 4
    got = client.get(["t1", "t2", "t3", "7"])
    assert [g["id"] for g in got] == ["t1", "t2", "t3", "7"] and got[1]["title"] == "Title"
    assert client.get("t2", chunks=True) == [got[1]]  # not chunked: the document as stored
    client.delete(["t1", "t2", "t3", 7])
    assert client.get("t1") == [None]


@pytest.mark.parametrize("call", [lambda c: c.get(5), lambda c: c.get([1]), lambda c: c.delete(None),
                                  lambda c: c.delete([True]), lambda c: c.delete(b"x")])
def test_bad_ids_get_config_errors(pair, call):
    _, client = pair
    with pytest.raises(ConfigError):
        call(client)


def test_a_closed_client_raises_a_library_error(served):
    url, _ = served
    client = Client(url)
    assert client.health()["status"] == "ok"
    client.close()
    for call in (lambda: client.search("bees"), lambda: client.health(), lambda: client.get("x")):
        with pytest.raises(ClientClosedError, match="is closed"):
            call()
    assert issubclass(ClientClosedError, HybridRetError)


def test_a_client_pickles_and_reconnects(served, pair):
    url, _ = served
    searcher, _ = pair
    with Client(url, api_key=KEY) as client:
        copy = pickle.loads(pickle.dumps(client))
    assert copy.url == url and "contract-key" not in repr(copy)
    hits = copy.search("honey bees", k=3, method="bm25")
    assert hits.ids[0].tolist() == searcher.search("honey bees", k=3, method="bm25").ids[0].tolist()
    assert copy.add([{"id": "p1", "text": "written through an unpickled client"}])["added"] == 1  # the key came too
    copy.delete("p1")
    copy.close()


def test_a_client_with_a_custom_transport_refuses_to_pickle(served):
    import httpx

    client = Client(served[0], transport=httpx.HTTPTransport())
    with pytest.raises(ConfigError, match="custom transport"):
        pickle.dumps(client)
    client.close()


# -- property: same arguments, same answer or same error ---------------------------------------------------
retrievers = st.lists(st.sampled_from(["dense", "sparse", "bm25"]), min_size=1, max_size=3, unique=True)
fusions = st.one_of(
    st.none(),
    st.fixed_dictionaries({"method": st.sampled_from(["linear", "rrf"]), "retrievers": retrievers},
                          optional={"normalisation": st.sampled_from(["minmax", "zscore", "none", "bogus"]),
                                    "rrf_k": st.sampled_from([1.0, 60.0, -5.0]),
                                    "depth": st.sampled_from([1, 5, 50, 0, 20_000]),
                                    "weights": st.sampled_from([{"dense": 2.0}, {"sparse": 0.5, "bm25": 1.0},
                                                                {"dense": -1}, [1, 2]])}),
    st.fixed_dictionaries({"method": st.just("gqr")},
                          optional={"guide": st.sampled_from([{"sparse": 1.0}, {"bm25": 1.0}, {"sparse": 0.5, "bm25": 0.5},
                                                              {}, {"dense": 1.0}]),
                                    "guide_weighting": st.sampled_from(["fixed", "agreement", "x"]),
                                    "depth": st.sampled_from([10, 100])}),
)
queries = st.one_of(st.sampled_from(["honey bees", "the eiffel tower", "", "   "]),
                    st.lists(st.sampled_from(["volcano eruption", "chess", "", "programming language"]),
                             min_size=1, max_size=3))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=queries, k=st.integers(min_value=-1, max_value=50), method=st.sampled_from(
    ["hybrid", "dense", "sparse", "bm25", "linear", "rrf", "gqr"]), fusion=fusions,
    candidates=st.sampled_from([None, 0, 5, 100]),
    filt=st.sampled_from([None, {"n": {"$lt": 20}}, {"n": {"$in": [1, 2, 3]}}, {"n": {"$bad": 1}}]))
def test_client_and_searcher_agree(pair, q, k, method, fusion, candidates, filt):
    searcher, client = pair
    searcher.refresh()  # the server's index may have changed under other tests' writes
    if fusion is not None and method in ("dense", "sparse", "bm25"):
        fusion = None  # a single retriever takes no fusion settings
    kw = {"k": k, "method": method, "fusion": fusion, "candidates": candidates, "filter": filt}
    try:
        want = searcher.search(q, **kw)
    except HybridRetError as exc:
        with pytest.raises(HybridRetError) as got:
            client.search(q, **kw)
        assert isinstance(got.value, ConfigError) and isinstance(exc, ConfigError), (got.value, exc)
        assert isinstance(got.value, FilterError) == isinstance(exc, FilterError), (got.value, exc)
        return
    got = client.search(q, **kw)
    assert got.ids.shape == want.ids.shape
    assert got.ids.tolist() == want.ids.tolist()
