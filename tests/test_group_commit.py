"""Group commit: several adds, upserts and deletes in one commit, each with its own outcome.

In the library (:func:`hybridret.group_commit.write_group` through ``HybridRetriever.write_group``)
and on a real server on loopback: concurrent writes share commits, a refused request fails alone,
a stopped group acknowledges nothing, and every acknowledged write is there afterwards."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import pytest

from hybridret import HybridRetriever
from hybridret.errors import ConfigError, DocumentNotFoundError, IndexExistsError, WriteCancelledError
from hybridret.group_commit import WriteRequest, conflict_keys
from hybridret.indexer import WriteResult


@pytest.fixture(scope="module")
def built(paired_encoder, small_corpus, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("group") / "idx"
    HybridRetriever(paired_encoder).index(small_corpus[:20], workdir=root, show_progress=False)
    return root


@pytest.fixture
def retriever(built, paired_encoder, tmp_path) -> HybridRetriever:
    """A fresh copy of the 20-document index."""
    shutil.copytree(built, tmp_path / "idx", ignore=shutil.ignore_patterns("*.lock", "leases"))
    return HybridRetriever.load(tmp_path / "idx", encoder=paired_encoder)


def test_one_commit_for_many_writes_each_with_its_own_outcome(retriever):
    before = retriever.searcher.snapshot.commit
    outcomes = retriever.write_group([
        WriteRequest("add", documents=[{"id": "n1", "text": "Bees dance to show where the flowers are."}]),
        WriteRequest("add", documents=[{"id": "d01", "text": "an id that is in the index"}]),  # refused alone
        WriteRequest("delete", ids=["nope"]),  # refused alone
        WriteRequest("upsert", documents=[{"id": "d02", "text": "A new text for the second document."},
                                          {"id": "n2", "text": "Glaciers carve valleys over thousands of years."}]),
        WriteRequest("delete", ids=["d03", "d04"]),
        WriteRequest("delete", ids=["d05", "gone"], missing="ignore"),
        WriteRequest("add", documents=[{"id": "n3", "text": "x"}, {"id": "n3", "text": "y"}]),  # duplicate id
    ])
    ok = [o for o in outcomes if isinstance(o, WriteResult)]
    assert [type(o) for o in outcomes] == [WriteResult, IndexExistsError, DocumentNotFoundError, WriteResult,
                                           WriteResult, WriteResult, type(outcomes[6])]
    assert not isinstance(outcomes[6], WriteResult) and "duplicate document id 'n3'" in str(outcomes[6])
    assert {o.commit for o in ok} == {before + 1}  # one commit for all (a merge may follow it)
    assert (outcomes[0].added, outcomes[3].added, outcomes[3].updated) == (1, 1, 1)
    assert outcomes[0].encoded == 1 and outcomes[3].encoded == 2
    assert (outcomes[4].deleted, outcomes[5].deleted, outcomes[5].missing) == (2, 1, ["gone"])
    got = {d["id"] if d else None for d in retriever.get(["n1", "n2", "d02", "d03", "d04", "d05", "n3"])}
    assert got == {"n1", "n2", "d02", None}
    assert retriever.get(["d02"])[0]["text"] == "A new text for the second document."
    assert retriever.get(["d01"])[0]["text"] != "an id that is in the index"
    assert retriever.num_docs == 20 + 2 - 3
    assert retriever.search("where the flowers are", k=1, method="bm25").ids[0][0] == "n1"
    assert retriever.check() == []


def test_a_stopped_group_commits_nothing_and_tells_every_request(retriever):
    before = retriever.searcher.snapshot.commit
    cancel = threading.Event()
    cancel.set()
    outcomes = retriever.write_group([WriteRequest("add", documents=[{"id": "n1", "text": "one"}]),
                                      WriteRequest("delete", ids=["d01"]),
                                      WriteRequest("add", documents=[{"id": "d02", "text": "exists"}])], cancel=cancel)
    assert isinstance(outcomes[0], WriteCancelledError) and isinstance(outcomes[1], WriteCancelledError)
    assert isinstance(outcomes[2], IndexExistsError)  # its own error, found before the group stopped
    retriever.refresh()
    assert retriever.searcher.snapshot.commit == before and retriever.num_docs == 20
    assert retriever.get(["n1"]) == [None] and retriever.get(["d01"])[0] is not None


def test_requests_of_one_group_must_touch_different_documents(retriever):
    outcomes = retriever.write_group([WriteRequest("upsert", documents=[{"id": "d01", "text": "first"}]),
                                      WriteRequest("delete", ids=["d01"])])
    assert isinstance(outcomes[0], WriteResult)
    assert isinstance(outcomes[1], ConfigError) and "that write #0 of the same group" in str(outcomes[1])
    assert retriever.get(["d01"])[0]["text"] == "first"
    assert conflict_keys(["a#1", "a", "b"]) == {"a", "b"}
    with pytest.raises(ConfigError, match="grouped write is one of"):
        WriteRequest("compact")


# -- on a real server ------------------------------------------------------------------------------
def test_concurrent_writes_share_commits_on_a_server(retriever):
    httpx = pytest.importorskip("httpx")
    from _serving import serving

    from hybridret.serve.app import ServeConfig, create_app

    async def burst(url: str) -> list:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            reqs = [http.post("/documents", json={"documents": [{"id": f"c{i}", "text": f"Comet number {i} "
                                                                 f"crossed the sky over the harbor."}]})
                    for i in range(16)]
            reqs += [http.request("DELETE", "/documents", json={"ids": [f"d{i:02d}"]}) for i in range(1, 5)]
            reqs += [http.post("/documents", json={"documents": [{"id": f"d{i:02d}", "text": f"Rewritten {i}."}],
                                                   "upsert": True}) for i in range(5, 9)]
            reqs.append(http.post("/documents", json={"documents": [{"id": "d10", "text": "exists"}]}))
            reqs.append(http.request("DELETE", "/documents", json={"ids": ["unknown"]}))
            return await asyncio.gather(*reqs)

    with serving(create_app(retriever, ServeConfig())) as url:
        answers = asyncio.run(burst(url))
        codes = [r.status_code for r in answers]
        assert codes == [200] * 24 + [409, 404], [r.text for r in answers if r.status_code not in (200,)]
        info = httpx.get(f"{url}/info").json()["writes_grouped"]
        assert info["group_commit"] is True and info["requests"] == 26
        assert info["write_calls"] <= 13, info  # grouped: far fewer commits than requests
        for i in range(16):
            hit = httpx.post(f"{url}/search", json={"query": f"Comet number {i}", "k": 1, "method": "bm25",
                                                    "filter": None}).json()["results"][0]["hits"]
            assert hit
        docs = httpx.get(f"{url}/documents", params={"ids": [f"c{i}" for i in range(16)] + ["d01", "d04", "d05"]})
        got = docs.json()["documents"]
        assert all(d is not None for d in got[:16]) and got[16] is None and got[17] is None
        assert got[18]["text"] == "Rewritten 5."
        assert httpx.get(f"{url}/health").json()["num_docs"] == 20 + 16 - 4


def test_group_commit_off_commits_each_write_alone(retriever):
    httpx = pytest.importorskip("httpx")
    from _serving import serving

    from hybridret.serve.app import ServeConfig, create_app

    async def burst(url: str) -> list:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            return await asyncio.gather(*[http.post("/documents", json={"documents": [{"id": f"c{i}", "text": "t"}]})
                                          for i in range(6)])

    with serving(create_app(retriever, ServeConfig(group_commit=False))) as url:
        assert [r.status_code for r in asyncio.run(burst(url))] == [200] * 6
        info = httpx.get(f"{url}/info").json()["writes_grouped"]
        assert info["group_commit"] is False and info["write_calls"] == info["requests"] == 6


def test_a_read_does_not_wait_for_a_refresh_in_progress(retriever, paired_encoder):
    """While one thread opens a newer commit (the server's writer after its commit), a search that
    notices the commit goes on with the snapshot it has instead of waiting for the lock."""
    from hybridret.search.searcher import Searcher

    searcher = Searcher(retriever.path, encoder=paired_encoder)
    retriever.add([{"id": "n1", "text": "a newer commit"}])  # another writer commits
    with searcher._refresh_lock:  # another thread is refreshing
        done = threading.Event()
        box: dict = {}

        def read() -> None:
            box["changed"] = searcher.refresh_if_changed()
            box["hits"] = searcher.search("photosynthesis", k=1, method="bm25").ids[0][0]
            done.set()

        threading.Thread(target=read, daemon=True).start()
        assert done.wait(10), "the read waited for the refresh in progress"
        assert box["changed"] is False and searcher.get(["n1"]) == [None]  # the snapshot it had
    assert searcher.refresh_if_changed() is True and searcher.get(["n1"])[0]["id"] == "n1"
