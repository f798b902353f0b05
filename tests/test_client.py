"""hybridret.client.Client against a real server on loopback: the Searcher's interface over HTTP."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from _serving import serving  # noqa: E402

from hybridret.client import AuthenticationError, Client, RemoteHits, ServerUnavailableError  # noqa: E402
from hybridret.errors import ConfigError, DocumentNotFoundError, HybridRetError, IndexExistsError  # noqa: E402
from hybridret.filters import FilterError  # noqa: E402
from hybridret.types import Hit, MatchedTerm  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample" / "corpus.jsonl"
KEY = "client-key-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(url, retriever): a real uvicorn server (API key on writes) over 60 sample passages."""

    from hybridret.retriever import HybridRetriever
    from hybridret.serve.app import ServeConfig, create_app

    docs = []
    with open(SAMPLE, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < 60:
                d = json.loads(line)
                docs.append({"id": d["_id"], "title": d["title"], "text": d["text"], "metadata": {"n": i}})
    retriever = HybridRetriever.from_models()
    retriever.index(docs, workdir=tmp_path_factory.mktemp("client") / "idx", show_progress=False)
    with serving(create_app(retriever, ServeConfig(api_key=KEY))) as url:
        yield url, retriever


@pytest.fixture(scope="module")
def client(served):
    with Client(served[0], api_key=KEY, timeout=60) as c:
        yield c


def test_search_matches_the_local_searcher(client, served):
    retriever = served[1]
    queries = ["What happens when a star exhausts its hydrogen?", "how do tides work", "the Kuiper belt"]
    for method in ("hybrid", "sparse", "bm25", "rrf"):
        remote = client.search(queries, k=5, method=method)
        local = retriever.search(queries, k=5, method=method)
        assert isinstance(remote, RemoteHits) and len(remote) == 3
        assert remote.ids.shape == (3, 5) and remote.scores.shape == (3, 5)
        assert remote.ids.tolist() == local.ids.tolist()
        np.testing.assert_allclose(remote.scores, local.scores, rtol=1e-5)
        assert remote.method == local.method
        for name, comp in local.components.items():
            np.testing.assert_allclose(remote.components[name], comp, rtol=1e-5)
        for r_view, l_view in zip(remote, local):
            assert [h.id for h in r_view] == [h.id for h in l_view]
            assert [h.metadata for h in r_view] == [h.metadata for h in l_view]


def test_hits_are_library_hit_objects(client):
    hits = client.search("red giant star", k=3)
    assert hits.queries == ["red giant star"] and hits.ids.shape == (1, 3)
    top = hits[0][0]
    assert isinstance(top, Hit) and top.id == "s0001" and top.rank == 1 and top.title == "Red Giant Stars"
    assert top.matched_terms and all(isinstance(m, MatchedTerm) for m in top.matched_terms)
    assert any(m.expansion for m in top.matched_terms) and any(not m.expansion for m in top.matched_terms)
    assert top.to_dict()["id"] == "s0001"
    filtered = client.search(["stars"], k=10, method="dense", filter={"n": {"$gte": 50}})
    assert all(h.metadata["n"] >= 50 for h in filtered[0])
    shallow = client.search(["stars"], k=2, method="linear", candidates=5,
                            fusion={"method": "linear", "retrievers": ["dense", "sparse"]})
    assert set(shallow[0][0].scores) == {"dense", "sparse"}


def test_writes_round_trip(client):
    assert client.health()["status"] == "ok"
    n = client.info()["num_docs"]
    r = client.add([{"id": "c-1", "text": "The axolotl can regrow its limbs and parts of its brain.",
                     "metadata": {"n": 1000}}])
    assert r["added"] == 1 and r["num_docs"] == n + 1
    assert client.search("which salamander regrows limbs", k=1, method="bm25").ids[0, 0] == "c-1"
    with pytest.raises(IndexExistsError, match="c-1"):
        client.add([{"id": "c-1", "text": "again"}])
    r = client.upsert([{"id": "c-1", "text": "The axolotl is a salamander that stays aquatic as an adult."}])
    assert r["updated"] == 1
    with pytest.raises(DocumentNotFoundError) as err:
        client.delete(["c-1", "ghost"])
    assert err.value.ids == ["ghost"]
    assert client.info()["num_docs"] == n + 1
    r = client.delete(["c-1", "ghost"], missing="ignore")
    assert r["deleted"] == 1 and r["missing"] == ["ghost"]
    r = client.compact()
    assert r["num_docs"] == n and len(client.info()["segments"]) == 1


def test_server_errors_become_library_exceptions(client, served):
    with pytest.raises(ConfigError, match="k"):
        client.search("x", k=0)
    with pytest.raises(ConfigError, match="method"):
        client.search("x", method="vector")
    with pytest.raises(FilterError, match=r"filter\.\$bogus"):
        client.search("x", filter={"$bogus": 1})
    blank = client.search("   ")  # as a Searcher: a blank query gets no hits, never an error
    assert len(blank) == 1 and blank[0] == [] and (blank.ids == "").all()
    with Client(served[0]) as anonymous:
        assert anonymous.search("stars", k=1).ids.shape == (1, 1)  # reads are open
        with pytest.raises(AuthenticationError, match="Bearer"):
            anonymous.add([{"id": "nope", "text": "no key"}])
    with Client(served[0], api_key="wrong-key-but-long-enough") as wrong:
        with pytest.raises(AuthenticationError):
            wrong.compact()
        assert "wrong-key" not in repr(wrong)
    with Client(f"http://127.0.0.1:{free_port()}", timeout=2) as gone:
        with pytest.raises(ServerUnavailableError):
            gone.health()
    assert issubclass(ServerUnavailableError, HybridRetError) and issubclass(AuthenticationError, HybridRetError)


def test_documents_by_id(client, served):
    retriever = served[1]
    some = retriever.searcher.snapshot.live_ids()[:2]
    got = client.get([*some, "no-such-id"])
    assert [d["id"] for d in got[:2]] == some and got[2] is None
    assert got == retriever.get([*some, "no-such-id"])
    assert client.get(some[0]) == got[:1] and client.get([]) == []
