"""SearchRequest: every argument of a search checked once, the same for every way in.

A bad option is a ConfigError naming it, from the request itself and from each ``search`` (a Searcher,
a HybridRetriever, the Client before anything is sent); a request searches exactly as its options do;
``body()`` is what ``POST /search`` takes."""

from __future__ import annotations

import numpy as np
import pytest
from _text_only import TextOnly, build

from hybridret import ConfigError, Filter, HybridRetriever, Searcher
from hybridret.client import Client
from hybridret.fusion import FusionConfig
from hybridret.search.request import OPTIONS, SearchRequest

DOCS = [{"id": f"d{i}", "text": text, "metadata": {"lang": "en" if i % 2 else "fr"}}
        for i, text in enumerate(["the cat sat on the mat", "dogs chase cats", "a river bank in spring",
                                  "the bank raised its rates", "cats and dogs and birds", "spring flowers"])]

BAD = [
    ({"queries": b"bytes"}, "queries must be a string or a list of strings"),
    ({"queries": ["ok", 3]}, "query #1 is a int"),
    ({"k": 0}, "k must be positive"),
    ({"k": True}, "k must be a positive integer"),
    ({"method": 3}, "method must be a string"),
    ({"filter": "{not json"}, "filter is not valid JSON"),
    ({"fusion": {"depth": 0}}, "fusion depth must be between 1"),
    ({"fusion": {"method": "vibes"}}, "unknown fusion method 'vibes'"),
    ({"candidates": -1}, "candidates must be positive"),
    ({"threads": 0}, "threads must be a positive integer"),
    ({"offset": -1}, "offset must be an integer from 0"),
    ({"group_size": 2}, "group_size needs group_by"),
    ({"group_by": "$x"}, "group_by must be a metadata field name"),
    ({"rerank_depth": 5}, "rerank_depth needs rerank"),
    ({"relevance": "yes"}, "relevance must be true or false"),
    ({"diversify": 1.5}, "diversify must be from 0 to 1"),
]


@pytest.mark.parametrize("bad,message", BAD, ids=[next(iter(b)) + "-" + str(i) for i, (b, _) in enumerate(BAD)])
def test_each_bad_argument_is_a_config_error_naming_it(bad, message):
    kw = {"queries": "q", **bad}
    with pytest.raises(ConfigError, match=message):
        SearchRequest(**kw)


def test_an_unknown_option_names_the_options():
    with pytest.raises(ConfigError, match="unknown search option 'methd'; the options are candidates, .*filter"):
        SearchRequest.of("q", 3, methd="rrf")
    assert OPTIONS == {"method", "filter", "fusion", "candidates", "threads", "offset", "group_by", "group_size",
                       "rerank", "rerank_depth", "relevance", "diversify"}


def test_values_are_kept_in_one_form():
    r = SearchRequest.of("q", 3, filter='{"lang": "en"}', fusion={"method": "rrf"}, group_by="lang", rerank=False)
    assert r.queries == ("q",) and r.k == 3 and isinstance(r.filter, Filter) and r.fusion == FusionConfig("rrf")
    assert r.group is not None and r.group.size == 3 and r.rerank is None and r.rerank_depth is None
    assert SearchRequest.of(r) is r and SearchRequest.of(r, 5).k == 5 and SearchRequest.of(r, offset=2).offset == 2
    assert r.options() == {"filter": r.filter, "fusion": r.fusion, "group_by": "lang", "group_size": 3}


def test_body_is_what_post_search_takes():
    r = SearchRequest.of(["a", "b"], 4, method="rrf", filter={"lang": "en"}, candidates=20, rerank=True, relevance=True)
    assert r.body() == {"k": 4, "method": "rrf", "queries": ["a", "b"], "filter": {"lang": "en"}, "candidates": 20,
                        "rerank": True, "rerank_depth": 50, "relevance": True}
    with pytest.raises(ConfigError, match="threads is a setting of the server"):
        SearchRequest.of("a", threads=2).body()
    with pytest.raises(ConfigError, match="rerank must be true or false through a server"):
        SearchRequest.of("a", rerank="/some/folder").body()


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return build(tmp_path_factory.mktemp("request") / "idx", DOCS)


def test_a_request_searches_as_its_options_do(index):
    s = Searcher(index)
    req = SearchRequest(("cats", "bank"), 3, method="bm25", filter={"lang": "en"}, offset=1)
    a, b = s.search(req), s.search(["cats", "bank"], 3, method="bm25", filter={"lang": "en"}, offset=1)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_allclose(a.scores, b.scores)
    r = HybridRetriever.load(index, encoder=TextOnly())
    np.testing.assert_array_equal(r.search(req).ids, a.ids)
    assert s.search(req, 1).ids.shape == (2, 1)  # k given beside a request replaces the request's


@pytest.mark.parametrize("bad,message", BAD[2:], ids=[next(iter(b)) for b, _ in BAD[2:]])
def test_every_way_in_checks_alike(index, bad, message):
    """The same checks from a Searcher, a HybridRetriever and a Client (before any request is sent:
    no server runs here)."""
    for search in (Searcher(index).search, HybridRetriever.load(index, encoder=TextOnly()).search,
                   Client("http://127.0.0.1:9", timeout=1).search):
        with pytest.raises(ConfigError, match=message):
            search("q", **bad)
