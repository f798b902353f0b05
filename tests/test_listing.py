"""Every document matching a filter (not the top-k of a query): Searcher / HybridRetriever
``documents()`` and ``count()``, ``POST /documents/list`` and ``Client.documents()`` / ``count()``
on a real loopback server: written order, deleted and expired documents left out, pages, one
commit per listing, errors."""

from __future__ import annotations

import pytest

from hybridret import HybridRetriever, Searcher
from hybridret.errors import ConfigError
from hybridret.filters import FilterError


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _docs(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"p{i:02d}", "title": f"Title {i}", "text": f"passage number {i} about topic {i % 3}",
             "metadata": {"n": i, "kind": ("a", "b", "c")[i % 3], "tags": ["even" if i % 2 == 0 else "odd"]}}
            for i in range(start, start + n)]


@pytest.fixture
def living(paired_encoder, tmp_path):
    clock = Clock()
    docs = _docs(12)
    docs[5]["metadata"]["expires_at"] = clock.now + 100
    r = HybridRetriever(paired_encoder, clock=clock).index(docs, workdir=tmp_path / "idx", show_progress=False)
    return r, clock


def test_documents_lists_every_match_in_written_order(living):
    r, clock = living
    assert [d["id"] for d in r.documents()] == [f"p{i:02d}" for i in range(12)]
    assert r.count() == r.num_docs == 12
    got = r.documents({"kind": "a"})
    assert [d["id"] for d in got] == ["p00", "p03", "p06", "p09"]
    assert got[1] == {"id": "p03", "title": "Title 3", "text": "passage number 3 about topic 0",
                      "metadata": {"n": 3, "kind": "a", "tags": ["odd"]}}
    assert r.count({"kind": "a"}) == 4 and r.count({"tags": "even", "n": {"$gte": 6}}) == 3
    # more than k of any search: a listing is not a search
    assert len(r.documents({"n": {"$gte": 0}})) == 12
    # pages are slices of the whole listing
    assert [d["id"] for d in r.documents(offset=3, limit=4)] == ["p03", "p04", "p05", "p06"]
    assert r.documents(offset=20) == [] and r.documents(limit=0) == []
    # deletes, upserts (the replaced document moves to the end), expiry
    r.delete(["p01"])
    r.upsert([{"id": "p00", "text": "passage number 0, rewritten", "metadata": {"n": 0, "kind": "a"}}])
    assert [d["id"] for d in r.documents({"kind": "a"})] == ["p03", "p06", "p09", "p00"]
    assert "p01" not in {d["id"] for d in r.documents()}
    clock.now += 1000  # p05 expired
    assert "p05" not in {d["id"] for d in r.documents()} and r.count() == 10 == r.num_docs
    searcher = Searcher(r.path, clock=clock)  # a read-only Searcher lists the same
    assert searcher.documents() == r.documents() and searcher.count({"kind": "b"}) == r.count({"kind": "b"}) == 3


def test_listing_arguments_are_checked(living, paired_encoder):
    r, _ = living
    for bad in ({"offset": -1}, {"offset": 1.5}, {"limit": -2}, {"limit": True}):
        with pytest.raises(ConfigError, match="offset|limit"):
            r.documents(**bad)
    with pytest.raises(FilterError, match=r"filter\.n\.\$bogus"):
        r.documents({"n": {"$bogus": 1}})
    with pytest.raises(FilterError):
        r.count('{"n": ')
    empty = HybridRetriever(paired_encoder)  # nothing written yet: nothing to list, bad arguments still refused
    assert empty.documents() == [] and empty.count({"kind": "a"}) == 0
    with pytest.raises(FilterError):
        empty.count({"$nope": 1})


def test_documents_through_a_real_server(paired_encoder, tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import httpx
    from _serving import serving

    import hybridret.client as client_module
    from hybridret.client import Client
    from hybridret.serve.app import ServeConfig, create_app

    r = HybridRetriever(paired_encoder).index(_docs(9), workdir=tmp_path / "idx", show_progress=False)
    with serving(create_app(r, ServeConfig(api_key="listing-key-0123456789", protect_reads=True))) as url:
        with Client(url, api_key="listing-key-0123456789") as client:
            assert client.documents() == r.documents() and client.count() == 9
            assert client.documents({"kind": "b"}, offset=1, limit=1) == r.documents({"kind": "b"}, offset=1, limit=1)
            assert client.count({"tags": "odd"}) == r.count({"tags": "odd"}) == 4
            monkeypatch.setattr(client_module, "_LIST_PAGE", 2)  # several pages per listing
            assert [d["id"] for d in client.documents()] == [f"p{i:02d}" for i in range(9)]
            assert [d["id"] for d in client.documents(offset=3, limit=5)] == ["p03", "p04", "p05", "p06", "p07"]
            with pytest.raises(FilterError, match=r"\$bogus"):  # checked before any request
                client.documents({"$bogus": 1})
            with pytest.raises(ConfigError, match="limit"):
                client.documents(limit=-1)
            raw = httpx.post(f"{url}/documents/list", json={"filter": {"$bogus": 1}},
                             headers={"Authorization": "Bearer listing-key-0123456789"})
            assert raw.status_code == 400 and raw.json()["error"]["type"] == "FilterError"
            raw = httpx.post(f"{url}/documents/list", json={"limit": 5000},
                             headers={"Authorization": "Bearer listing-key-0123456789"})
            assert raw.status_code == 422 and "limit" in raw.json()["error"]["message"]
            assert httpx.post(f"{url}/documents/list", json={}).status_code == 401  # a read: protect_reads

            # a commit landing between two pages: the listing starts again and returns one commit's documents
            class WriteBetweenPages(httpx.HTTPTransport):
                pages = 0

                def handle_request(self, request):
                    response = super().handle_request(request)
                    if request.url.path == "/documents/list":
                        WriteBetweenPages.pages += 1
                        if WriteBetweenPages.pages == 1:
                            r.add([{"id": "late", "text": "a document written while the listing ran"}])
                    return response

            with Client(url, api_key="listing-key-0123456789", transport=WriteBetweenPages()) as racing:
                got = [d["id"] for d in racing.documents()]
            assert got == [f"p{i:02d}" for i in range(9)] + ["late"] and WriteBetweenPages.pages > 5


def test_a_sharded_server_says_listing_is_not_supported_yet():
    from hybridret.serve.backends import ShardedBackend

    backend = ShardedBackend.__new__(ShardedBackend)  # the refusal needs no shard (nor Ray)
    with pytest.raises(ConfigError, match="not supported on a sharded index yet"):
        backend.documents({"kind": "a"}, offset=0, limit=10)
