"""The README's curl examples (section "Serve") are true: each runs, in README order, against a real
``hybridret serve`` on loopback over an index of chunked documents, and answers what its comment says.
With curl installed the commands run as written (the README's address swapped for the test server's);
without it, the same requests parsed from them are sent with httpx."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

README = Path(__file__).resolve().parents[1] / "README.md"
ADDRESS = "http://127.0.0.1:8000"


def readme_curls() -> list[list[str]]:
    """Every ``curl`` command of the README's Serve section, as argv lists (continuations joined,
    comments dropped)."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Serve")
    section = text[start:text.index("\n## ", start + 5)]
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", section, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "curl":
                out.append(words)
    return out


def as_request(argv: list[str]) -> tuple[str, str, dict[str, str], str | None]:
    """(method, url, headers, body) of a curl command line (the options the README uses)."""
    method, url, headers, body = None, None, {}, None
    it = iter(argv[1:])
    for word in it:
        if word == "-X":
            method = next(it)
        elif word == "-H":
            name, _, value = next(it).partition(":")
            headers[name.strip()] = value.strip()
        elif word in ("-d", "--data"):
            body = next(it)
        elif word == "-s":
            continue
        elif word.startswith("-"):
            raise AssertionError(f"the README's curl uses {word}, which this test does not read")
        else:
            url = word
    assert url is not None, argv
    return method or ("POST" if body is not None else "GET"), url, headers, body


@pytest.fixture(scope="module")
def index(tmp_path_factory, paired_encoder, small_corpus):
    """The small corpus as chunked documents: ``parent_id`` (two chunks a document) and ``source``."""
    from hybridret import HybridRetriever

    docs = [{"id": d["id"], "title": d["title"], "text": d["text"],
             "metadata": {"parent_id": f"p{i // 2}", "source": ("wiki", "news")[i % 2]}}
            for i, d in enumerate(small_corpus)]
    path = tmp_path_factory.mktemp("curl") / "kb"
    HybridRetriever(paired_encoder).index(docs, workdir=path, show_progress=False)
    return path


def test_readme_has_curl_for_search_add_delete_and_purge():
    seen = {(m, u.removeprefix(ADDRESS), "diversify" in (b or "")) for m, u, _, b in map(as_request, readme_curls())}
    assert {("POST", "/search", True), ("POST", "/documents", False), ("DELETE", "/documents", False),
            ("POST", "/purge", False)} <= seen, seen


def test_readme_curl_examples_run_against_a_real_server(index, start_server):
    _, url = start_server(index)
    curl = shutil.which("curl")
    answers = []
    for argv in readme_curls():
        assert any(w.startswith(ADDRESS) for w in argv), argv
        argv = [w.replace(ADDRESS, url) for w in argv]
        if curl:
            got = subprocess.run([*argv, "-w", "\n%{http_code}"], capture_output=True, text=True, timeout=120)
            assert got.returncode == 0, got.stderr
            text, _, status = got.stdout.rpartition("\n")
        else:
            method, where, headers, body = as_request(argv)
            resp = httpx.request(method, where, headers=headers, content=body, timeout=120)
            text, status = resp.text, str(resp.status_code)
        assert status == "200", f"{shlex.join(argv)} -> {status}: {text}"
        answers.append((as_request(argv), json.loads(text)))
    searches = [a for (m, u, _, _), a in answers if u.endswith("/search")]
    assert len(searches) == 2
    one, grouped = searches
    assert one["results"][0]["hits"] and all(h["metadata"]["source"] == "wiki" for h in one["results"][0]["hits"])
    assert [len(r["groups"]) for r in grouped["results"]] == [3, 3]  # the second page of 3 documents each
    writes = {(m, u.rsplit("/", 1)[1], json.dumps(json.loads(b or "{}"), sort_keys=True)): a
              for (m, u, _, b), a in answers if not u.endswith("/search")}
    add = next(a for (m, p, _), a in writes.items() if m == "POST" and p == "documents")
    assert add["added"] + add["updated"] == 1
    by_id = next(a for (m, p, b), a in writes.items() if m == "DELETE" and '"ids"' in b)
    assert by_id["deleted"] == 1
    dry = next(a for (m, p, b), a in writes.items() if m == "DELETE" and "dry_run" in b)
    assert dry["deleted"] == 20 and len(dry["matched"]) == 20  # the news half, nothing deleted
    assert "num_docs" in next(a for (m, p, _), a in writes.items() if p == "purge")
