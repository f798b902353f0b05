"""A running ``hybridret serve`` and the outside world: commits made by another process (the CLI)
are served from the next request on, ``GET /documents`` takes comma-separated ids, and ``/docs``
works without a network (Swagger UI's files served locally)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hybridret import HybridRetriever
from hybridret.client import Client

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built(tmp_path_factory, paired_encoder, small_corpus) -> Path:
    root = tmp_path_factory.mktemp("fresh") / "idx"
    HybridRetriever(paired_encoder).index(small_corpus, workdir=root)
    return root


@pytest.fixture
def index(built, tmp_path) -> Path:
    out = tmp_path / "idx"
    shutil.copytree(built, out)
    return out


def _cli(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "hybridret", "-q", *argv], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


def test_server_serves_a_commit_made_by_the_cli(index, start_server, tmp_path):
    _, url = start_server(index)
    with Client(url) as client:
        assert client.get(["okapi"]) == [None]
        before = client.health()["commit"]
        doc = tmp_path / "new.jsonl"
        doc.write_text(json.dumps({"_id": "okapi", "title": "Okapi",
                                   "text": "The okapi is a striped forest giraffe of the Congo."}) + "\n", encoding="utf-8")
        res = _cli("add", str(index), str(doc))
        assert res.returncode == 0, res.stderr
        res = _cli("delete", str(index), "d39")
        assert res.returncode == 0, res.stderr
        # no --refresh-every and no wait: the next request sees both commits
        assert client.get(["okapi"])[0]["title"] == "Okapi"
        assert client.search("striped forest giraffe", k=1, method="bm25").ids[0][0] == "okapi"
        assert "d39" not in set(client.search("chocolate cacao", k=5, method="bm25").ids[0])
        assert client.health()["commit"] == before + 2


def test_get_documents_takes_comma_separated_ids(index, start_server):
    _, url = start_server(index)
    with httpx.Client(base_url=url, timeout=60) as http:
        docs = http.get("/documents", params={"ids": "d01,d02"}).json()["documents"]
        assert [d["id"] for d in docs] == ["d01", "d02"]
        docs = http.get("/documents?ids=d03&ids=d04,nope").json()["documents"]
        assert [d and d["id"] for d in docs] == ["d03", "d04", None]


def test_docs_page_needs_no_network(index, start_server):
    from hybridret.serve.docs import swagger_ui_folder

    if swagger_ui_folder() is None:
        pytest.skip("swagger-ui-py is not installed (it comes with the serve and test extras)")
    _, url = start_server(index)
    with httpx.Client(base_url=url, timeout=60) as http:
        page = http.get("/docs")
        assert page.status_code == 200
        sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert sources and all(s.startswith("/") for s in sources), sources  # nothing from another host
        for path in sources:
            asset = http.get(path)
            assert asset.status_code == 200 and len(asset.content) > 100, path
        assert "swagger-ui-bundle.js" in page.text
        assert http.get("/openapi.json").json()["info"]["title"] == "hybridret"
