"""Raw errors at the edges (issue #32): malformed arguments at the library, Client and HTTP doors
are clear errors, the same at each door; a dry run writes nothing, so it works where nothing can
be written; a refusal names what is really there."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _text_only import TextOnly, build

from hybridret import HybridRetriever, IndexWriter, Searcher
from hybridret.errors import ConfigError, IndexExistsError

TESTS = Path(__file__).resolve().parent
DOCS = [{"id": "a", "text": "bees make honey", "kind": "x"}, {"id": "b", "text": "honey is sweet", "kind": "y"},
        {"id": "c", "text": "green tea", "kind": "x"}]


@pytest.fixture
def index(tmp_path: Path) -> Path:
    return build(tmp_path / "idx", DOCS)


# -- IndexWriter(expect=...) ---------------------------------------------------------------------------
@pytest.mark.parametrize("expect, match", [
    (["commit", 1], "expect must be the manifest"),
    ("manifest.json", "expect must be the manifest"),
    ({"commit": "3"}, r"expect\['commit'\] must be a commit number"),
    ({"commit": -1}, r"expect\['commit'\] must be a commit number"),
    ({"commit": True}, r"expect\['commit'\] must be a commit number"),
    ({"commit": 1, "index_id": 7}, r"expect\['index_id'\] must be a string"),
    ({"commit": 1, "commit_id": ["x"]}, r"expect\['commit_id'\] must be a string"),
    ({"commit": 1, "history": "abc"}, r"expect\['history'\] must be a list"),
])
def test_malformed_expect_is_a_config_error(index: Path, expect: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        IndexWriter(index, encoder=TextOnly(), expect=expect)  # type: ignore[arg-type]
    with IndexWriter(index, encoder=TextOnly()) as w:  # the lock was not left behind
        assert w.manifest is not None


def test_expect_of_a_loaded_manifest_still_works(index: Path) -> None:
    manifest = json.loads((index / "manifest.json").read_text())
    with IndexWriter(index, encoder=TextOnly(), expect=manifest) as w:
        w.delete(["c"])
    assert Searcher(index, encoder=TextOnly()).count() == 2


# -- ttl: one check at every door ----------------------------------------------------------------------
BAD_TTLS = [float("nan"), float("inf"), -1, 0, "5", True]


@pytest.mark.parametrize("ttl", BAD_TTLS)
def test_library_refuses_bad_ttl(index: Path, ttl: object) -> None:
    with IndexWriter(index, encoder=TextOnly()) as w:
        with pytest.raises(ConfigError, match="ttl must be a positive"):
            w.write([{"id": "n", "text": "new"}], mode="add", ttl=ttl)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", BAD_TTLS)
def test_client_refuses_bad_ttl_before_any_request(ttl: object) -> None:
    from hybridret.client import Client

    with Client("http://127.0.0.1:9") as client:  # nothing listens there: the check comes first
        with pytest.raises(ConfigError, match="ttl must be a positive"):
            client.add([{"id": "n", "text": "new"}], ttl=ttl)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="ttl must be a positive"):
            client.upsert([{"id": "n", "text": "new"}], ttl=ttl)  # type: ignore[arg-type]


def test_server_applies_the_library_ttl_check(index: Path) -> None:
    from fastapi.testclient import TestClient

    from hybridret.serve.app import create_app

    r = HybridRetriever.load(index, encoder=TextOnly())
    with TestClient(create_app(r)) as http:
        for ttl in ("5", True, -1, 0):
            resp = http.post("/documents", json={"documents": [{"id": "n", "text": "new"}], "ttl": ttl})
            assert resp.status_code in (400, 422), (ttl, resp.text)
            assert "ttl must be a positive" in resp.json()["error"]["message"], resp.text
        body = '{"documents": [{"id": "n", "text": "new"}], "ttl": NaN}'  # Python's json writes NaN
        resp = http.post("/documents", content=body, headers={"content-type": "application/json"})
        assert resp.status_code in (400, 422) and "ttl" in resp.text, resp.text
        assert r.searcher.count() == 3  # nothing was added
        ok = http.post("/documents", json={"documents": [{"id": "n", "text": "new"}], "ttl": 5})
        assert ok.status_code == 200, ok.text
    assert not math.isnan(float(r.get(["n"])[0]["metadata"]["expires_at"]))


# -- a dry run writes nothing --------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux) to drop root's override")
def test_dry_run_delete_works_on_a_read_only_index(index: Path) -> None:
    subprocess.run(["chmod", "-R", "a-w", str(index)], check=True)
    script = (f"import sys, json; sys.path.insert(0, {str(TESTS)!r}); from _text_only import TextOnly; "
              "from hybridret import HybridRetriever; r = HybridRetriever.load(sys.argv[1], encoder=TextOnly()); "
              "a = r.delete(filter={'kind': 'x'}, dry_run=True); b = r.delete(['b'], dry_run=True); "
              "print(json.dumps([a.deleted, a.matched, b.deleted, b.matched, r.searcher.count()]))")
    try:
        proc = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", sys.executable,
                               "-c", script, str(index)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.splitlines()[-1]) == [2, ["a", "c"], 1, ["b"], 3]
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(index)], check=True)


def test_dry_run_delete_matches_the_real_delete(index: Path) -> None:
    r = HybridRetriever.load(index, encoder=TextOnly())
    dry = r.delete(filter={"kind": "x"}, dry_run=True)
    assert (dry.deleted, dry.matched, r.searcher.count()) == (2, ["a", "c"], 3)
    real = r.delete(filter={"kind": "x"})
    assert real.deleted == 2 and r.searcher.count() == 1


# -- a refusal names what is there ---------------------------------------------------------------------
def test_chunked_add_over_an_unchunked_chunk_id_names_that_id(paired_encoder, tmp_path: Path) -> None:
    r = HybridRetriever(paired_encoder).index([{"id": "x#0", "text": "a page of its own about bees"}],
                                              workdir=tmp_path / "idx", show_progress=False)
    long = {"id": "x", "text": "Honey bees collect nectar from flowers. " * 40}
    with pytest.raises(IndexExistsError, match=r"'x' is cut into chunks with the ids 'x#0'.*already has a document "
                                               r"with the id 'x#0'") as info:
        r.add([long], chunk_tokens=32)
    assert "'x' is already in the index" not in str(info.value)
    assert r.get(["x#0"])[0]["text"] == "a page of its own about bees"  # what the message points to
    assert r.searcher.count() == 1  # nothing was written


def test_plain_add_of_an_existing_id_keeps_its_message(index: Path) -> None:
    with IndexWriter(index, encoder=TextOnly()) as w:
        with pytest.raises(IndexExistsError, match="document 'a' is already in the index"):
            w.write([{"id": "a", "text": "again"}], mode="add")
