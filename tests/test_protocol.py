"""The SearchBackend protocol (hybridret.types): the six search-shaped classes satisfy it (isinstance, and
the parameters of ``search``), answer alike through it, and the server picks its backend without
testing class names. ShardedSearcher / ShardedBackend are checked at class level (no Ray starts)."""

from __future__ import annotations

import inspect

import pytest

from hybridret.client import Client, RemoteHits
from hybridret.distributed.searcher import ShardedSearcher
from hybridret.errors import ConfigError
from hybridret.retriever import HybridRetriever
from hybridret.search.searcher import Searcher
from hybridret.types import Hits, SearchBackend, SearchResults

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from _serving import serving  # noqa: E402

from hybridret.serve.backends import LocalBackend, ServeBackend, ShardedBackend, load_backend  # noqa: E402

SIX = (Searcher, HybridRetriever, ShardedSearcher, Client, LocalBackend, ShardedBackend)
#: name, kind and default of the shared parameters of ``search``, after ``self``: the queries (or a
#: SearchRequest) and ``k`` (``None``: 10, or the request's); the options of a SearchRequest come last,
#: as ``**options`` (one definition of them: the request's fields)
SEARCH = [("queries", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
          ("k", inspect.Parameter.POSITIONAL_OR_KEYWORD, None)]
OPTIONS = ("options", inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty)


@pytest.fixture(scope="module")
def retriever(tmp_path_factory, paired_encoder, small_corpus):
    r = HybridRetriever(paired_encoder)
    r.index(small_corpus, workdir=tmp_path_factory.mktemp("protocol") / "idx", show_progress=False)
    return r


@pytest.fixture(scope="module")
def url(retriever):
    """A real uvicorn server on loopback over the retriever (as the serve and client tests run it)."""
    from hybridret.serve.app import create_app

    with serving(create_app(retriever)) as url:
        yield url


@pytest.mark.parametrize("cls", SIX, ids=[c.__name__ for c in SIX])
def test_each_class_has_the_search_signature(cls):
    assert issubclass(cls, SearchBackend)
    params = list(inspect.signature(cls.search).parameters.values())
    assert params[0].name == "self"
    shared = [(p.name, p.kind, p.default) for p in params[1:len(SEARCH) + 1]]
    assert shared == SEARCH, cls
    last = params[-1]
    assert (last.name, last.kind, last.default) == OPTIONS, cls
    for extra in params[len(SEARCH) + 1:-1]:  # partial=, with_text=: optional keywords only
        assert extra.kind == inspect.Parameter.KEYWORD_ONLY and extra.default is not inspect.Parameter.empty, extra
    get = list(inspect.signature(cls.get).parameters.values())
    assert [p.name for p in get[:2]] == ["self", "ids"], cls
    for extra in get[2:]:  # chunks=: optional keywords only, as for search
        assert extra.kind == inspect.Parameter.KEYWORD_ONLY and extra.default is not inspect.Parameter.empty, extra


def test_the_protocol_itself_has_that_signature():
    params = list(inspect.signature(SearchBackend.search).parameters.values())[1:]
    assert [(p.name, p.kind, p.default) for p in params] == [*SEARCH, OPTIONS]


def test_instances_satisfy_it_and_answer_alike(retriever, url):
    searcher = Searcher(retriever.path)
    local = LocalBackend(retriever)
    with Client(url, timeout=60) as client:
        backends: list[SearchBackend] = [searcher, retriever, local, client]
        assert all(isinstance(b, SearchBackend) for b in backends)
        assert isinstance(local, ServeBackend)
        # ShardedBackend at class level (ServeBackend has data members: no issubclass)
        assert ShardedBackend.sharded is True and isinstance(ShardedBackend.root, property)
        assert all(callable(getattr(ShardedBackend, m)) for m in
                   ("search", "get", "write", "health", "info", "refresh_every", "describe", "close"))
        queries = ["the tallest mountain", "how do bees make honey"]
        answers = []
        for b in backends:
            hits: SearchResults = b.search(queries, 3, method="rrf", filter=None, fusion=None, candidates=20)
            assert isinstance(hits, (Hits, RemoteHits)) and len(hits) == 2 and hits.method == "rrf"
            answers.append([[h.id for h in hits[i]] for i in range(len(hits))])
            assert [d["id"] if d else None for d in b.get(["d04", "nope"])] == ["d04", None]
        assert all(a == answers[0] for a in answers), answers
        assert answers[0][0][0] == "d04" and answers[0][1][0] == "d05"


def test_not_search_shaped_objects_fail_the_check():
    class OnlySearch:
        def search(self, queries, k=10):
            return None

    assert not isinstance(OnlySearch(), SearchBackend)  # no get()
    assert not isinstance("indexes/x", SearchBackend)


def test_load_backend_does_not_go_by_class_names(retriever):
    assert isinstance(load_backend(retriever), LocalBackend)
    local = LocalBackend(retriever)
    assert load_backend(local) is local

    class ShardedSearcher:  # noqa: F811 - a look-alike: the same name and attributes, not the real class
        shard_infos: list = []

        def search(self, *a, **kw):
            return None

        def get(self, ids):
            return []

    with pytest.raises(ConfigError, match="cannot serve a ShardedSearcher"):
        load_backend(ShardedSearcher())
    with pytest.raises(ConfigError, match="cannot serve a Searcher"):
        load_backend(Searcher(retriever.path))
