"""Grouping, pages, snippets and reranking through the CLI, the HTTP API (a real server on
loopback) and the Client: each equal to the library's answer on the same index."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from _tiny_models import tiny_cross_encoder  # noqa: E402

from hybridret.cli import main  # noqa: E402
from hybridret.client import Client  # noqa: E402
from hybridret.errors import ConfigError  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample" / "corpus.jsonl"
QUERIES = ["What happens when a star exhausts its hydrogen?", "how do tides work", "insulin discovery"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory, paired_encoder):
    """(url, retriever, index dir, reranker folder): a real uvicorn server with a reranker, over
    90 sample passages cut into "documents" of 1-4 consecutive passages (``parent_id``)."""
    import uvicorn

    from hybridret.retriever import HybridRetriever
    from hybridret.serve.app import ServeConfig, create_app

    docs = []
    with open(SAMPLE, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < 90:
                d = json.loads(line)
                docs.append({"id": d["_id"], "title": d["title"], "text": d["text"],
                             "metadata": {"parent_id": f"doc{(i * 7) // 19}", "n": i}})
    root = tmp_path_factory.mktemp("rag")
    folder = tiny_cross_encoder(root / "ce")
    retriever = HybridRetriever(paired_encoder).index(docs, workdir=root / "idx", show_progress=False)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(retriever, ServeConfig(rerank=str(folder))), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", retriever, root / "idx", folder
    server.should_exit = True
    thread.join(timeout=30)


def test_api_groups_pages_and_snippets(served):
    url, retriever = served[:2]
    local = retriever.search(QUERIES, k=4, method="hybrid", group_by="parent_id", group_size=2)
    body = {"queries": QUERIES, "k": 4, "group_by": "parent_id", "group_size": 2}
    data = httpx.post(f"{url}/search", json=body, timeout=60).json()
    for i, res in enumerate(data["results"]):
        assert [g["key"] for g in res["groups"]] == list(local.group_keys[i])
        assert [h["id"] for h in res["hits"]] == [h.id for h in local[i]]
        assert all(h["group"] == h["metadata"]["parent_id"] for h in res["hits"])
        assert sum(g["size"] for g in res["groups"]) == len(res["hits"])
        assert all(h["snippets"] and "highlights" in h["snippets"][0] for h in res["hits"])
    pages = [httpx.post(f"{url}/search", json={"query": QUERIES[0], "k": 3, "offset": o, "method": "bm25"},
                        timeout=60).json()["results"][0]["hits"] for o in (0, 3)]
    full = httpx.post(f"{url}/search", json={"query": QUERIES[0], "k": 6, "method": "bm25"},
                      timeout=60).json()["results"][0]["hits"]
    assert [h["id"] for h in pages[0] + pages[1]] == [h["id"] for h in full]
    assert [h["rank"] for h in pages[1]] == [4, 5, 6][:len(pages[1])]
    bad = httpx.post(f"{url}/search", json={"query": "x", "group_size": 2}, timeout=60)
    assert bad.status_code == 400 and "group_by" in bad.json()["error"]["message"]


def test_client_groups_pages_and_rerank_equal_the_library(served):
    url, retriever, _, folder = served
    with Client(url, timeout=60) as client:
        remote = client.search(QUERIES, k=3, method="rrf", group_by="parent_id", group_size=2)
        local = retriever.search(QUERIES, k=3, method="rrf", group_by="parent_id", group_size=2)
        assert remote.ids.shape == local.ids.shape == (3, 6)
        assert remote.ids.tolist() == local.ids.tolist()
        assert remote.group_keys.tolist() == local.group_keys.tolist()
        np.testing.assert_allclose(remote.group_scores, local.group_scores, rtol=1e-5)
        for i in range(3):
            assert [(g.key, g.rank, [h.id for h in g.hits]) for g in remote.groups(i)] == \
                [(g.key, g.rank, [h.id for h in g.hits]) for g in local.groups(i)]
            assert [s.words for h in remote[i] for s in h.snippets] == [s.words for h in local[i] for s in h.snippets]
        pages = [client.search(QUERIES, k=2, method="dense", offset=o, group_by="parent_id", group_size=2)
                 for o in (0, 2)]
        full = client.search(QUERIES, k=4, method="dense", group_by="parent_id", group_size=2)
        assert np.concatenate([p.group_keys for p in pages], axis=1).tolist() == full.group_keys.tolist()
        reranked = client.search(QUERIES, k=5, rerank=True, rerank_depth=12)
        want = retriever.search(QUERIES, k=5, rerank=str(folder), rerank_depth=12)
        assert reranked.ids.tolist() == want.ids.tolist()
        np.testing.assert_allclose(reranked.components["rerank"], want.components["rerank"], rtol=1e-4, atol=1e-5)
        with pytest.raises(ConfigError, match="rerank_depth"):
            client.search(QUERIES, k=5, rerank_depth=12)


def test_cli_groups_pages_and_snippets(served, capsys):
    retriever, path = served[1], served[2]
    args = ["-q", "search", str(path), QUERIES[1], "--method", "sparse", "--json"]
    assert main([*args, "--group-by", "parent_id", "--group-size", "2", "-k", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    local = retriever.search(QUERIES[1], k=3, method="sparse", group_by="parent_id", group_size=2)
    assert [g["key"] for g in out["groups"]] == list(local.group_keys[0])
    assert [h["id"] for h in out["hits"]] == [h.id for h in local[0]]
    pages = []
    for offset in ("0", "4"):
        assert main([*args, "-k", "4", "--offset", offset]) == 0
        pages += json.loads(capsys.readouterr().out)["hits"]
    assert main([*args, "-k", "8"]) == 0
    assert [h["id"] for h in pages] == [h["id"] for h in json.loads(capsys.readouterr().out)["hits"]]
    assert main(["-q", "search", str(path), "hydrogen", "--method", "bm25", "--group-by", "parent_id", "-k", "2"]) == 0
    text = capsys.readouterr().out
    assert "group 'doc" in text and "[hydrogen]" in text.lower()
    assert main(["-q", "search", str(path), "tides", "--group-size", "2"]) == 1
    assert "--group-by" in capsys.readouterr().err
    assert main(["-q", "search", str(path), "tides", "--rerank", str(served[3]), "--rerank-depth", "6", "--json",
                 "-k", "3"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [h["scores"]["rerank"] for h in hits] == sorted((h["scores"]["rerank"] for h in hits), reverse=True)


def test_diversify_through_the_api_the_client_the_cli_and_an_adapter(served, capsys):
    """MMR (``diversify``) through every front door equals the library's answer on the same index."""
    url, retriever, path = served[:3]
    local = retriever.search(QUERIES, k=4, diversify=0.5)
    grouped = retriever.search(QUERIES, k=3, diversify=0.5, group_by="parent_id", group_size=2)
    assert local.ids.tolist() != retriever.search(QUERIES, k=4).ids.tolist()  # it does reorder here
    data = httpx.post(f"{url}/search", json={"queries": QUERIES, "k": 4, "diversify": 0.5}, timeout=60).json()
    assert [[h["id"] for h in r["hits"]] for r in data["results"]] == local.ids.tolist()
    data = httpx.post(f"{url}/search", json={"queries": QUERIES, "k": 3, "diversify": 0.5, "group_by": "parent_id",
                                             "group_size": 2}, timeout=60).json()
    assert [[g["key"] for g in r["groups"]] for r in data["results"]] == grouped.group_keys.tolist()
    for bad in (1.5, "0.5", True):
        resp = httpx.post(f"{url}/search", json={"query": "x", "diversify": bad}, timeout=60)
        assert resp.status_code in (400, 422) and "diversify" in resp.text
    with Client(url, timeout=60) as client:
        assert client.search(QUERIES, k=4, diversify=0.5).ids.tolist() == local.ids.tolist()
        pages = [client.search(QUERIES, k=2, diversify=0.5, offset=o) for o in (0, 2)]
        assert np.concatenate([p.ids for p in pages], axis=1).tolist() == local.ids.tolist()
        with pytest.raises(ConfigError, match="diversify must be"):
            client.search("x", diversify=2)
    assert main(["-q", "search", str(path), QUERIES[0], "-k", "4", "--diversify", "0.5", "--json"]) == 0
    assert [h["id"] for h in json.loads(capsys.readouterr().out)["hits"]] == local.ids[0].tolist()
    assert main(["-q", "search", str(path), QUERIES[0], "--diversify", "7"]) == 1
    err = capsys.readouterr().err
    assert "diversify must be from 0 to 1" in err and "Traceback" not in err
    lc = pytest.importorskip("hybridret.integrations.langchain")
    with Client(url, timeout=60) as client:
        docs = lc.HybridRetLangChainRetriever(searcher=client, k=4, diversify=0.5).invoke(QUERIES[1])
    assert [d.metadata["id"] for d in docs] == local.ids[1].tolist()
    with pytest.raises(Exception, match="diversify must be"):
        lc.HybridRetLangChainRetriever(searcher=retriever, diversify=-1)
