"""Per-request work limits and graceful shutdown of ``hybridret serve``, on real servers on loopback.

A write whose documents would make too many chunks or tokens is refused with 413 before anything is
encoded, naming the limit and how to raise it; the body limit is a setting too. SIGTERM stops a real
``hybridret serve`` process within its shutdown timeout, exit status 0, a write still encoding
stopped before its commit (503) or committed (200) - never half - and the index checks clean."""

from __future__ import annotations

import shutil
import signal
import threading
import time

import pytest

from hybridret import HybridRetriever

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

WORDS = "the river carves a valley through granite while falcons circle above the quiet meadow".split()


def long_text(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


@pytest.fixture(scope="module")
def chunked(paired_encoder, small_corpus, tmp_path_factory):
    """An index of chunks (64 tokens), its retriever shared by the in-thread servers."""
    root = tmp_path_factory.mktemp("limits") / "idx"
    r = HybridRetriever(paired_encoder).index(small_corpus[:10], workdir=root, chunk_tokens=64, show_progress=False)
    return root, r


def test_too_many_tokens_or_chunks_is_refused_before_encoding(chunked):
    from _serving import serving

    from hybridret.serve.app import ServeConfig, create_app

    root, retriever = chunked
    config = ServeConfig(max_request_tokens=5000, max_request_chunks=20)
    with serving(create_app(retriever, config)) as url:
        before = httpx.get(f"{url}/health").json()
        info = httpx.get(f"{url}/info").json()["limits"]
        assert (info["request_tokens"], info["request_chunks"]) == (5000, 20)
        # ~2 MB of text: counted a slice at a time, refused long before a full tokenization or any encoding
        t0 = time.perf_counter()
        r = httpx.post(f"{url}/documents", json={"documents": [{"id": "huge", "text": long_text(300_000)}]},
                       timeout=60)
        took = time.perf_counter() - t0
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["type"] == "WorkLimitError"
        assert "5,000 tokens per request" in err["message"] and "--max-request-tokens" in err["message"]
        assert "'huge'" in err["message"] and "nothing was written" in err["message"]
        assert took < 10, took
        # under the token limit, over the chunk limit: ~1,500 tokens in 64-token chunks is ~25 chunks
        r = httpx.post(f"{url}/documents", json={"documents": [{"id": "long", "text": long_text(1500)}]})
        assert r.status_code == 413, r.text
        msg = r.json()["error"]["message"]
        assert "20 chunks per request" in msg and "--max-request-chunks" in msg
        # several documents count together
        docs = [{"id": f"p{i}", "text": long_text(400)} for i in range(4)]
        assert httpx.post(f"{url}/documents", json={"documents": docs}).status_code == 413
        after = httpx.get(f"{url}/health").json()
        assert after["num_docs"] == before["num_docs"] and after["commit"] == before["commit"]
        # within both limits: written
        r = httpx.post(f"{url}/documents", json={"documents": [{"id": "ok", "text": long_text(300)}]})
        assert r.status_code == 200, r.text
        assert r.json()["documents"]["added"] == 1 and r.json()["added"] >= 2


def test_limits_are_server_settings_checked_at_start():
    from hybridret.errors import ConfigError
    from hybridret.serve.app import ServeConfig

    for bad in ({"max_request_tokens": 0}, {"max_request_chunks": -1}, {"max_body_bytes": True},
                {"shutdown_timeout": 0}, {"shutdown_timeout": float("nan")}):
        with pytest.raises(ConfigError, match="server setting"):
            ServeConfig(**bad)


def test_limits_from_the_command_line_and_sigterm_within_the_timeout(chunked, tmp_path, start_server):
    from hybridret.search.searcher import Searcher

    copy = tmp_path / "idx"
    shutil.copytree(chunked[0], copy, ignore=shutil.ignore_patterns("*.lock", "leases"))
    proc, url = start_server(copy, "--shutdown-timeout", "4", "--max-body-mb", "0.5", "--max-request-tokens", "100000")
    start = httpx.get(f"{url}/health").json()
    info = httpx.get(f"{url}/info").json()["limits"]  # the limits from the command line
    assert info["body_bytes"] == 2**19 and info["request_tokens"] == 100000
    r = httpx.post(f"{url}/documents", json={"documents": [{"id": "b", "text": long_text(100_000)}]})
    assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]
    # a write that encodes for far longer than the 2 s writes get after SIGTERM (~600 chunks)
    big = [{"id": f"big{i}", "text": long_text(2000)} for i in range(20)]
    box: dict = {}

    def write(name: str, docs: list) -> None:
        try:
            box[name] = httpx.post(f"{url}/documents", json={"documents": docs}, timeout=120)
        except httpx.HTTPError as exc:
            box[name] = exc

    threads = [threading.Thread(target=write, args=("big", big)),
               threading.Thread(target=write, args=("small", [{"id": "small", "text": "a small note"}]))]
    threads[0].start()
    time.sleep(1.5)  # the big write is encoding; the small one queues behind it
    threads[1].start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    took = time.perf_counter() - t0
    for t in threads:
        t.join(timeout=30)
    out = proc.stdout.read()
    assert rc == 0, out[-3000:]
    assert took < 12, took  # 4 s timeout; a stopped write ends at its next encoder slice
    assert "Traceback" not in out, out[-3000:]
    big_r = box["big"]
    assert isinstance(big_r, httpx.Response) and big_r.status_code in (200, 503), big_r
    if big_r.status_code == 503:
        assert big_r.json()["error"]["type"] == "WriteCancelledError"
        assert "nothing of it was committed" in big_r.json()["error"]["message"]
    small_r = box["small"]
    assert not isinstance(small_r, httpx.Response) or small_r.status_code in (200, 503), small_r.text
    searcher = Searcher(copy)  # the index opens: the last commit is whole
    docs, _ = searcher.document_counts()
    committed = big_r.status_code == 200
    assert docs == start["num_documents"] + (len(big) if committed else 0) + \
        (1 if isinstance(small_r, httpx.Response) and small_r.status_code == 200 else 0)
    assert HybridRetriever.load(copy).check() == []
