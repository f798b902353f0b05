"""The HTTP server (hybridret serve): every endpoint on a real uvicorn server on loopback, bad input
fuzzed, auth, writes under concurrent searches, micro-batching counted, SIGTERM during a write, and
the search page in a real headless Chromium."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import re
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from _serving import NO_CHROMIUM, chromium, headless_chrome

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "hybridret" / "resources" / "sample" / "corpus.jsonl"
KEY = "test-key-0123456789abcdef"
N_INDEXED = 100


def sample_docs(start: int, stop: int) -> list[dict]:
    out = []
    with open(SAMPLE, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if start <= i < stop:
                d = json.loads(line)
                out.append({"id": d["_id"], "title": d.get("title", ""), "text": d["text"],
                            "metadata": {"part": "a" if i % 2 == 0 else "b", "n": i}})
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadServer:
    """A real uvicorn server on 127.0.0.1 in a background thread."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """(directory, retriever): the first 100 sample passages, packaged models. Shared by the servers."""
    from hybridret.retriever import HybridRetriever

    root = tmp_path_factory.mktemp("serve") / "idx"
    retriever = HybridRetriever.from_models()
    retriever.index(sample_docs(0, N_INDEXED), workdir=root, show_progress=False)
    retriever.searcher.warm()
    return root, retriever


@pytest.fixture(scope="module")
def server(index):
    from hybridret.serve.app import ServeConfig, create_app

    with ThreadServer(create_app(index[1], ServeConfig(batch_window_ms=5, max_batch=32))) as s:
        yield s


@pytest.fixture(scope="module")
def auth_server(index):
    """Writes need the key, reads are open; no micro-batching (the baseline)."""
    from hybridret.serve.app import ServeConfig, create_app

    with ThreadServer(create_app(index[1], ServeConfig(api_key=KEY, batching=False))) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def error_of(resp) -> dict:
    body = resp.json()
    assert set(body) == {"error"}, body
    assert body["error"]["type"] and body["error"]["message"], body
    return body["error"]


# -- reads -------------------------------------------------------------------------------------------
def test_health_and_info(http):
    h = http.get("/health").json()
    assert h["status"] == "ok" and h["num_docs"] >= N_INDEXED and isinstance(h["commit"], int)
    info = http.get("/info").json()
    assert info["num_docs"] == h["num_docs"]
    assert info["encoder"]["type"] == "paired"
    assert info["encoder"]["dense"]["model"] == "all-MiniLM-L6-v2"
    assert info["available"] == {"dense": True, "sparse": True, "bm25": True, "sparse_approx": True}
    assert info["fusion"]["hybrid"]["method"] == "gqr"
    assert info["segments"] and all("live" in s for s in info["segments"])
    assert info["batching"]["enabled"] is True and info["batching"]["max_batch"] == 32
    assert info["auth"] == {"writes": False, "reads": False}
    assert "/search" in http.get("/openapi.json").json()["paths"]
    assert http.get("/docs").status_code == 200


def test_search_one_query_has_every_field(http):
    r = http.post("/search", json={"query": "what happens when a star like the Sun runs out of hydrogen", "k": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "hybrid" and body["resolved"] == "hybrid:gqr" and body["k"] == 5
    (res,) = body["results"]
    hits = res["hits"]
    assert len(hits) == 5 and [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    top = hits[0]
    assert top["id"] == "s0001" and top["title"] == "Red Giant Stars"
    assert {"dense", "sparse", "bm25"} <= set(top["scores"])
    assert top["metadata"] == {"part": "a", "n": 0}
    terms = top["matched_terms"]
    assert any(not m["expansion"] and m["term"] in top["text"].lower() for m in terms)
    assert any(m["expansion"] for m in terms)
    assert all(m["term"] not in top["text"].lower().split() for m in terms if m["expansion"])
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)


def test_search_batch_equals_single_queries(http):
    queries = ["why is it warmer in summer", "how do vaccines work", "red giant star"]
    batch = http.post("/search", json={"queries": queries, "k": 4, "method": "sparse"}).json()
    assert [r["query"] for r in batch["results"]] == queries
    for q, res in zip(queries, batch["results"]):
        one = http.post("/search", json={"query": q, "k": 4, "method": "sparse"}).json()["results"][0]
        assert [h["id"] for h in res["hits"]] == [h["id"] for h in one["hits"]]
        assert [h["score"] for h in res["hits"]] == pytest.approx([h["score"] for h in one["hits"]], rel=1e-5)


@pytest.mark.parametrize("method", ["hybrid", "dense", "sparse", "bm25", "linear", "rrf", "gqr"])
def test_every_method(http, method):
    r = http.post("/search", json={"query": "stars and planets", "k": 3, "method": method})
    assert r.status_code == 200, r.text
    hits = r.json()["results"][0]["hits"]
    assert len(hits) == 3
    if method in ("dense", "sparse", "bm25"):
        assert set(hits[0]["scores"]) == {method}


def test_filter_fusion_candidates_and_without_text(http):
    r = http.post("/search", json={"query": "the solar system", "k": 10, "filter": {"part": "b", "n": {"$lt": 50}},
                                   "with_text": False}).json()
    hits = r["results"][0]["hits"]
    assert hits and all(h["metadata"]["part"] == "b" and h["metadata"]["n"] < 50 for h in hits)
    assert all(h["text"] is None for h in hits)
    r = http.post("/search", json={"query": "the solar system", "k": 5, "method": "linear", "candidates": 20,
                                   "fusion": {"method": "linear", "retrievers": ["dense", "bm25"]}})
    assert r.status_code == 200, r.text
    assert set(r.json()["results"][0]["hits"][0]["scores"]) == {"dense", "bm25"}


def test_search_page_and_static_files(http):
    page = http.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert 'src="/static/app.js"' in page.text and "http" not in page.text.split("<body>")[0].replace(
        'name="viewport"', "")
    for name in ("app.js", "style.css"):
        r = http.get(f"/static/{name}")
        assert r.status_code == 200 and len(r.text) > 500
        assert "https://" not in r.text and "http://" not in r.text  # nothing external


# -- bad input -----------------------------------------------------------------------------------------
BAD = [
    ({"k": 5}, "query"),
    ({"query": ""}, "empty"),
    ({"query": "   "}, "empty"),
    ({"queries": []}, "queries"),
    ({"queries": ["ok", ""]}, "query #1 is empty"),
    ({"query": "x", "queries": ["y"]}, "either"),
    ({"query": "x", "k": 0}, "k"),
    ({"query": "x", "k": 1001}, "k"),
    ({"query": "x", "k": "10"}, "k"),
    ({"query": "x", "k": True}, "k"),
    ({"query": "x", "method": "vector"}, "method"),
    ({"query": "x", "filter": {"$gte": 3}}, "filter"),
    ({"query": "x", "filter": "{not json"}, "filter"),
    ({"query": "x", "filter": {"n": {"$in": 3}}}, "filter"),
    ({"query": "x", "fusion": {"method": "nope"}}, "fusion"),
    ({"query": "x", "fusion": {"depth": "deep"}}, "fusion"),
    ({"query": "x", "candidates": 0}, "candidates"),
    ({"query": "x" * 5000}, "4096"),
    ({"queries": ["q"] * 300}, "queries"),
    ({"query": "x", "limit": 3}, "limit"),
    ({"query": 7}, "query"),
]


@pytest.mark.parametrize("body,needle", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_search_input_is_4xx_naming_the_problem(http, body, needle):
    r = http.post("/search", json=body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert needle.lower() in error_of(r)["message"].lower(), r.text


def test_malformed_requests(http):
    r = http.post("/search", content=b"{bad json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not valid JSON" in error_of(r)["message"]
    r = http.post("/search", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON object" in error_of(r)["message"]
    r = http.post("/search")
    assert r.status_code == 422 and "JSON body" in error_of(r)["message"]
    r = http.get("/nowhere")
    assert r.status_code == 404 and error_of(r)["type"] == "not_found"
    r = http.get("/search")
    assert r.status_code == 405 and error_of(r)["type"] == "method_not_allowed"
    r = http.post("/documents", json={"documents": [{"text": "no id here"}]})
    assert r.status_code == 422 and "documents.0.id" in error_of(r)["message"]
    r = http.post("/documents", json={"documents": [{"id": "x1", "text": 5}]})
    assert r.status_code == 422 and "text" in error_of(r)["message"]
    r = http.post("/documents", json={"documents": []})
    assert r.status_code == 422
    r = http.request("DELETE", "/documents", json={"ids": []})
    assert r.status_code == 422


def test_oversize_body_is_413(http):
    big = b'{"documents": [{"id": "big", "text": "' + b"a" * (16 * 1024 * 1024) + b'"}]}'
    r = http.post("/documents", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "16 MiB" in error_of(r)["message"]

    def chunks():  # no Content-Length: counted while it streams
        yield b'{"documents": [{"id": "big", "text": "'
        for _ in range(17):
            yield b"a" * (1024 * 1024)
        yield b'"}]}'

    r = http.post("/documents", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert http.post("/search", json={"query": "ok"}).status_code == 200
    assert not http.post("/search", json={"query": "big", "k": 1, "method": "bm25",
                                          "filter": {"n": {"$exists": False}}}).json()["results"][0]["hits"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
maybe = st.none() | json_values
search_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={
        "query": st.text(max_size=30) | json_values, "queries": st.lists(st.text(max_size=10), max_size=4) | json_values,
        "k": st.integers(-5, 2000) | json_values, "method": st.sampled_from(["hybrid", "bm25", "x", ""]) | json_values,
        "filter": json_values | st.dictionaries(st.sampled_from(["part", "n", "$and", "$or", "$not", "$in"]),
                                                json_values, max_size=3),
        "fusion": json_values | st.dictionaries(st.sampled_from(["method", "depth", "weights", "retrievers", "gqr"]),
                                                json_values, max_size=3),
        "candidates": st.integers(-3, 20000) | json_values, "with_text": json_values,
        "extra": json_values}),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=search_bodies)
def test_fuzzed_search_bodies_never_5xx(http, body):
    r = http.post("/search", json=body)
    assert r.status_code < 500, (body, r.status_code, r.text)
    if r.status_code >= 400:
        error_of(r)
    else:
        assert "results" in r.json()


doc_like = st.fixed_dictionaries({}, optional={"id": json_values, "text": json_values, "title": json_values,
                                               "metadata": json_values, "other": json_values})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(json_values, st.fixed_dictionaries({"documents": st.lists(doc_like, max_size=3)},
                                                         optional={"upsert": json_values})),
       ids=json_values)
def test_fuzzed_write_bodies_never_5xx(http, body, ids):
    if isinstance(body, dict) and isinstance(body.get("documents"), list):
        for d in body["documents"]:  # keep fuzzed writes away from the documents the other tests use
            if isinstance(d.get("id"), str):
                d["id"] = "fz-" + d["id"]
    r = http.post("/documents", json=body)
    assert r.status_code < 500, (body, r.status_code, r.text)
    if r.status_code >= 400:
        error_of(r)
    r = http.request("DELETE", "/documents", json={"ids": ids} if not isinstance(ids, list) else
                     {"ids": [i for i in ids if not isinstance(i, str)] or [{"no": 1}]})
    assert 400 <= r.status_code < 500, r.text
    error_of(r)


# -- writes ----------------------------------------------------------------------------------------------
def test_add_then_search_upsert_delete_compact(http):
    before = http.get("/health").json()["num_docs"]
    doc = {"id": "w-1", "title": "Glass frogs", "text": "Glass frogs have translucent skin on their bellies, so "
                                                        "their hearts can be seen beating.", "metadata": {"kind": "new"}}
    r = http.post("/documents", json={"documents": [doc]})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["added"] == 1 and res["num_docs"] == before + 1 and isinstance(res["commit"], int)
    hit = http.post("/search", json={"query": "translucent frog skin", "k": 1}).json()["results"][0]["hits"][0]
    assert hit["id"] == "w-1" and hit["metadata"] == {"kind": "new"}

    r = http.post("/documents", json={"documents": [doc]})  # the id exists: add refuses
    assert r.status_code == 409 and "w-1" in error_of(r)["message"] and "upsert" in error_of(r)["message"]
    changed = dict(doc, text="Glass frogs are small tree frogs from Central and South America.")
    r = http.post("/documents", json={"documents": [changed], "upsert": True}).json()
    assert r["updated"] == 1 and r["num_docs"] == before + 1
    hit = http.post("/search", json={"query": "glass frogs", "k": 1}).json()["results"][0]["hits"][0]
    assert hit["id"] == "w-1" and "Central and South America" in hit["text"]

    r = http.request("DELETE", "/documents", json={"ids": ["w-1", "no-such-doc", "neither"]})
    assert r.status_code == 404
    err = error_of(r)
    assert err["ids"] == ["no-such-doc", "neither"] and "nothing was deleted" in err["message"]
    assert http.get("/health").json()["num_docs"] == before + 1
    r = http.request("DELETE", "/documents", json={"ids": ["w-1", "no-such-doc"], "ignore_missing": True}).json()
    assert r["deleted"] == 1 and r["missing"] == ["no-such-doc"] and r["num_docs"] == before
    hits = http.post("/search", json={"query": "glass frogs", "k": 5}).json()["results"][0]["hits"]
    assert "w-1" not in [h["id"] for h in hits]

    segments = len(http.get("/info").json()["segments"])
    assert segments > 1
    r = http.post("/compact")
    assert r.status_code == 200, r.text
    info = http.get("/info").json()
    assert len(info["segments"]) == 1 and info["num_deleted"] == 0 and info["num_docs"] == before


def test_searches_keep_succeeding_during_concurrent_writes(http, server):
    new = [{"id": f"cw-{i}", "text": f"Concurrent write number {i} mentions the okapi zebrafish {i}.",
            "metadata": {"batch": "cw", "i": i}} for i in range(5)]
    failures: list[str] = []
    acked: list[str] = []
    done = threading.Event()

    def writer() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            for d in new:
                r = c.post("/documents", json={"documents": [d]})
                (acked.append(d["id"]) if r.status_code == 200 else failures.append(r.text))
        done.set()

    def reader(n_seen: list[int]) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            while not done.is_set():
                r = c.post("/search", json={"query": "okapi zebrafish", "k": 10, "filter": {"batch": "cw"}})
                if r.status_code != 200:
                    failures.append(r.text)
                    return
                n_seen.append(len(r.json()["results"][0]["hits"]))

    seen: list[list[int]] = [[] for _ in range(3)]
    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(s,)) for s in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures
    assert acked == [d["id"] for d in new]
    assert sum(len(s) for s in seen) >= 6  # searches were answered while the writes went on
    for s in seen:
        assert s == sorted(s)  # each reader saw the index grow, never shrink
    hits = http.post("/search", json={"query": "okapi zebrafish", "k": 10, "filter": {"batch": "cw"}}).json()
    assert sorted(h["id"] for h in hits["results"][0]["hits"]) == sorted(acked)


# -- micro-batching ----------------------------------------------------------------------------------------
async def _concurrent(url: str, queries: list[str]) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        rs = await asyncio.gather(*[c.post("/search", json={"query": q, "k": 5, "method": "sparse"}) for q in queries])
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    return [r.json() for r in rs]


def test_micro_batching_on_vs_off(server, auth_server):
    queries = [f"question {i} about stars, bread and summer" for i in range(32)]
    counts = {}
    results = {}
    for name, srv in (("on", server), ("off", auth_server)):
        before = httpx.get(f"{srv.url}/info").json()["batching"]
        results[name] = asyncio.run(_concurrent(srv.url, queries))
        after = httpx.get(f"{srv.url}/info").json()["batching"]
        counts[name] = (after["search_calls"] - before["search_calls"], after["queries"] - before["queries"])
    assert counts["off"] == (32, 32)
    calls_on, queries_on = counts["on"]
    assert queries_on == 32
    assert calls_on <= 8, counts  # 32 concurrent clients -> a handful of encoder calls
    for a, b in zip(results["on"], results["off"]):  # batching changes nothing in the answers
        assert [h["id"] for h in a["results"][0]["hits"]] == [h["id"] for h in b["results"][0]["hits"]]


# -- auth --------------------------------------------------------------------------------------------------
def test_api_key_guards_writes_but_not_reads(auth_server, caplog):
    caplog.set_level(logging.DEBUG)
    url = auth_server.url
    doc = {"documents": [{"id": "auth-1", "text": "A document written with the key."}]}
    r = httpx.post(f"{url}/documents", json=doc)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer KEY" in error_of(r)["message"]
    for bad in ("Bearer wrong-key-0123456789abc", f"Bearer {KEY[:-1]}", f"Basic {KEY}", KEY, f"Bearer {KEY}x"):
        assert httpx.post(f"{url}/documents", json=doc, headers={"Authorization": bad}).status_code == 401
    for method, path in (("DELETE", "/documents"), ("POST", "/compact")):
        assert httpx.request(method, f"{url}{path}", json={"ids": ["auth-1"]}).status_code == 401
    r = httpx.post(f"{url}/documents", json=doc, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200 and r.json()["added"] == 1
    r = httpx.post(f"{url}/search", json={"query": "written with the key", "k": 1})  # reads are open
    assert r.status_code == 200 and r.json()["results"][0]["hits"][0]["id"] == "auth-1"
    assert httpx.get(f"{url}/info").json()["auth"] == {"writes": True, "reads": False}
    assert KEY not in caplog.text  # the key is never logged


def test_protect_reads(index):
    from hybridret.serve.app import ServeConfig, create_app

    with ThreadServer(create_app(index[1], ServeConfig(api_key=KEY, protect_reads=True))) as srv:
        assert httpx.get(f"{srv.url}/health").status_code == 200  # always open
        assert httpx.post(f"{srv.url}/search", json={"query": "stars"}).status_code == 401
        assert httpx.get(f"{srv.url}/info").status_code == 401
        ok = httpx.post(f"{srv.url}/search", json={"query": "stars"}, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200
        assert httpx.get(f"{srv.url}/info", headers={"Authorization": f"Bearer {KEY}"}).json()["auth"]["reads"]


def test_key_comparison_is_constant_time_and_key_file_checked(tmp_path):
    from hybridret.errors import ConfigError
    from hybridret.serve import auth

    assert "hmac.compare_digest" in inspect.getsource(auth.key_matches)
    assert auth.key_matches(f"Bearer {KEY}", KEY) and auth.key_matches(f"bearer {KEY}", KEY)
    assert not auth.key_matches(None, KEY) and not auth.key_matches("Bearer ", KEY)
    assert not auth.key_matches("Bearer \udcff", KEY)  # undecodable bytes do not crash the comparison
    f = tmp_path / "key"
    f.write_text(f"  {KEY}\n")
    assert auth.read_api_key(f) == KEY
    for content, needle in (("", "empty"), ("short", "shorter"), ("two words here!!", "one line")):
        f.write_text(content)
        with pytest.raises(ConfigError, match=needle):
            auth.read_api_key(f)
    with pytest.raises(ConfigError, match="cannot read"):
        auth.read_api_key(tmp_path / "missing")


# -- graceful shutdown -------------------------------------------------------------------------------------
def test_sigterm_during_a_write_lets_it_commit(index, tmp_path, start_server):
    from hybridret.search.searcher import Searcher

    copy = tmp_path / "idx"
    shutil.copytree(index[0], copy, ignore=shutil.ignore_patterns("*.lock", "leases"))
    keyfile = tmp_path / "key"
    keyfile.write_text(KEY)
    proc, url = start_server(copy, "--api-key-file", str(keyfile), "--shutdown-timeout", "240")  # time to commit
    try:
        start = httpx.get(f"{url}/health").json()["num_docs"]
        docs = sample_docs(150, 300)
        box: dict = {}

        def write() -> None:
            box["r"] = httpx.post(f"{url}/documents", json={"documents": docs},
                                  headers={"Authorization": f"Bearer {KEY}"}, timeout=120)

        t = threading.Thread(target=write)
        t.start()
        time.sleep(1.0)  # the write is encoding now
        proc.send_signal(signal.SIGTERM)
        t.join(timeout=120)
        r = box["r"]
        assert r.status_code == 200, r.text
        assert r.json()["added"] == len(docs)
        assert proc.wait(timeout=60) == 0  # a graceful shutdown on SIGTERM exits 0
        out = proc.stdout.read()
        assert "Shutting down" in out and "Finished server process" in out and "Traceback" not in out
        assert KEY not in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert Searcher(copy).num_docs == start + len(docs)


# -- the search page in a real browser -----------------------------------------------------------------------


@pytest.mark.skipif(chromium() is None, reason=NO_CHROMIUM)
def test_search_page_in_headless_chromium(server, tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver = headless_chrome(webdriver, "--window-size=1200,1000", "--force-device-scale-factor=1")
    try:
        driver.get(server.url + "/")
        WebDriverWait(driver, 20).until(ec.text_to_be_present_in_element((By.ID, "status"), "documents"))
        Select(driver.find_element(By.ID, "method")).select_by_value("hybrid")
        k = driver.find_element(By.ID, "k")
        k.clear()
        k.send_keys("4")
        box = driver.find_element(By.ID, "q")
        box.send_keys("Why does a star like the Sun swell into a red giant?")
        driver.find_element(By.ID, "go").click()
        WebDriverWait(driver, 30).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#results .hit")) == 4)
        hits = driver.find_elements(By.CSS_SELECTOR, "#results .hit")
        assert hits[0].get_attribute("data-id") == "s0001"
        assert "Red Giant Stars" in hits[0].find_element(By.CSS_SELECTOR, ".title").text
        marks = [m.text.lower() for m in hits[0].find_elements(By.CSS_SELECTOR, ".snippet mark")]
        assert {"star", "red", "giant"} <= set(marks), marks
        expansion = [c.text for c in hits[0].find_elements(By.CSS_SELECTOR, ".exp .chip")]
        text = hits[0].find_element(By.CSS_SELECTOR, ".snippet").text.lower()
        assert expansion and all(e.lower() not in text.split() for e in expansion)
        shares = [int(re.search(r"\((\d+)% of the sparse score", c.get_attribute("title")).group(1))
                  for c in hits[0].find_elements(By.CSS_SELECTOR, ".exp .chip")]
        assert shares == sorted(shares, reverse=True) and min(shares) >= 5  # by contribution, over the floor
        bars = hits[0].find_elements(By.CSS_SELECTOR, ".bar-row .name")
        assert [b.text for b in bars][:4] == ["fused", "dense", "sparse", "bm25"]
        assert "part: a" in hits[0].find_element(By.CSS_SELECTOR, ".meta").text
        assert "hybrid:gqr" in driver.find_element(By.ID, "summary").text
        # the README's picture is refreshed only on request (HYBRIDRET_UPDATE_SCREENSHOT=1): a test run
        # must not change tracked files
        out = ROOT / "docs" / "img" / "search-page.png" if os.environ.get("HYBRIDRET_UPDATE_SCREENSHOT") \
            else tmp_path_factory.mktemp("screenshot") / "search-page.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(out))
        # the diversify control: the page shows the API's diversified hits for the same request
        question = "Why does a star like the Sun swell into a red giant?"
        want = [h["id"] for h in httpx.post(server.url + "/search", timeout=60, json={
            "query": question, "k": 4, "method": "hybrid", "diversify": 0.3}).json()["results"][0]["hits"]]
        lam = driver.find_element(By.ID, "diversify")
        lam.send_keys("0.3")
        driver.find_element(By.ID, "go").click()
        from selenium.common.exceptions import StaleElementReferenceException

        # the hits are re-rendered while the wait reads them: a hit replaced under it is read again
        WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: [h.get_attribute("data-id") for h in d.find_elements(By.CSS_SELECTOR, "#results .hit")] == want)
        lam.clear()
        # a bad filter is reported on the page, not as a broken page
        driver.find_element(By.ID, "filter").send_keys('{"n": {"$in": 3}}')
        driver.find_element(By.ID, "go").click()
        WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "error").is_displayed())
        assert "filter" in driver.find_element(By.ID, "error").text
    finally:
        driver.quit()


@pytest.mark.skipif(chromium() is None, reason=NO_CHROMIUM)
def test_api_docs_page_renders_in_headless_chromium(server):
    """``/docs`` renders FastAPI's OpenAPI 3.1 offline (Swagger UI 5 from local files): every
    operation is listed, and there is no "Unable to render this definition"."""
    from hybridret.serve.docs import swagger_ui_folder

    if swagger_ui_folder() is None:
        pytest.skip("swagger-ui-py is not installed (it comes with the serve and test extras)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = headless_chrome(webdriver, "--window-size=1200,1000")
    try:
        driver.get(server.url + "/docs")
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock")
                                        or "Unable to render" in d.find_element(By.TAG_NAME, "body").text)
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "Unable to render" not in body and "Errors" not in body.split("\n")[:5]
        ops = set()
        for block in driver.find_elements(By.CSS_SELECTOR, ".opblock"):
            method = block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text.strip().upper()
            path = block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path")
            ops.add((method, path))
        want = {("POST", "/search"), ("POST", "/documents"), ("GET", "/documents"), ("DELETE", "/documents"),
                ("POST", "/purge"), ("POST", "/documents/list"), ("POST", "/compact"), ("GET", "/health"),
                ("GET", "/info")}
        assert want <= ops, sorted(want - ops)
        assert "OAS 3.1" in body or "3.1" in driver.find_element(By.CSS_SELECTOR, ".info").text
    finally:
        driver.quit()
