"""``hybridret search DIR --queries FILE|-``: many queries, models loaded once; JSONL or TREC out."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridret.cli import main
from hybridret.runs import load_run

SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample"
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")


def cli(*args: str, stdin: str | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridret", *args], input=stdin, capture_output=True, text=True,
                          env=ENV, timeout=180, **kw)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("batchcli")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join((SAMPLE / "corpus.jsonl").read_text(encoding="utf-8").splitlines(True)[:80]))
    assert main(["-q", "index", str(corpus), "-o", str(root / "idx")]) == 0
    return root / "idx"


def test_jsonl_queries_file_to_jsonl_hits(index_dir, tmp_path):
    from hybridret.retriever import HybridRetriever

    lines = (SAMPLE / "queries.jsonl").read_text(encoding="utf-8").splitlines()[:6]
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("\n".join(lines) + "\n\n")  # a blank line is skipped
    out = tmp_path / "hits.jsonl"
    assert main(["-q", "search", str(index_dir), "--queries", str(qfile), "-o", str(out), "-k", "3",
                 "--method", "sparse", "--batch-size", "4"]) == 0
    rows = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    expected = [json.loads(x) for x in lines]
    assert [r["query_id"] for r in rows] == [q["_id"] for q in expected]
    assert [r["query"] for r in rows] == [q["text"] for q in expected]
    local = HybridRetriever.load(index_dir).search([q["text"] for q in expected], k=3, method="sparse")
    for i, r in enumerate(rows):
        assert r["method"] == "sparse" and r["resolved"] == "sparse"
        assert [h["id"] for h in r["hits"]] == [h.id for h in local[i]]
        assert all({"id", "rank", "score", "scores", "text", "matched_terms"} <= set(h) for h in r["hits"])


def test_plain_lines_from_stdin_to_trec_run(index_dir, tmp_path):
    run_file = tmp_path / "run.trec"
    stdin = "what is a red giant\n\nhow does sourdough rise\n{\"id\": 7, \"text\": \"Kuiper belt objects\"}\n"
    r = cli("-q", "search", str(index_dir), "--queries", "-", "--trec", str(run_file), "-k", "5", stdin=stdin)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    run = load_run(run_file)
    assert list(run) == ["1", "2", "7"] and all(len(docs) == 5 for docs in run.values())
    assert max(run["1"], key=run["1"].get) == "s0001"
    first = run_file.read_text().splitlines()[0].split()
    assert first[1] == "Q0" and first[3] == "1" and first[5] == "hybridret-hybrid:gqr"


def test_jsonl_to_stdout(index_dir):
    r = cli("-q", "search", str(index_dir), "--queries", "-", "-k", "2", "--method", "bm25",
            stdin="red giant\nthe orbit of neptune\n")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [row["query_id"] for row in rows] == ["1", "2"] and all(len(row["hits"]) == 2 for row in rows)


def test_no_query_without_a_terminal_is_a_clear_error(index_dir):
    start = time.monotonic()
    r = cli("search", str(index_dir), stdin="")
    assert r.returncode == 1
    assert "no query given" in r.stderr and "--queries" in r.stderr
    assert time.monotonic() - start < 60  # fails before loading any model


@pytest.mark.parametrize("content,needle", [
    ('{"id": "a"}\n', ":1: query 'a' needs a non-empty \"text\""),
    ('ok\n{"text": "x"}\n', ':2: a JSON query needs an "_id" or "id"'),
    ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', "duplicate query id 'a'"),
    ("{nope\n", ":1: not valid JSON"),
    ("\n\n", "no queries in"),
])
def test_bad_queries_files(index_dir, tmp_path, capsys, content, needle):
    qfile = tmp_path / "q.txt"
    qfile.write_text(content)
    assert main(["search", str(index_dir), "--queries", str(qfile)]) == 1
    assert needle in capsys.readouterr().err


def test_conflicting_options(index_dir, capsys):
    assert main(["search", str(index_dir), "a query", "--queries", "-"]) == 1
    assert "not both" in capsys.readouterr().err
    assert main(["search", str(index_dir), "a query", "--trec", "run.txt"]) == 1
    assert "--queries" in capsys.readouterr().err


def test_interactive_prompt_on_a_terminal(index_dir):
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hybridret", "-q", "search", str(index_dir), "-k", "2"],
                            stdin=slave, stdout=slave, stderr=subprocess.PIPE, env=ENV, close_fds=True)
    os.close(slave)
    out = b""

    def read_until(marker: bytes, timeout: float = 120) -> None:
        nonlocal out
        deadline = time.monotonic() + timeout
        while marker not in out:
            assert time.monotonic() < deadline, out
            ready, _, _ = select.select([master], [], [], 1)
            if ready:
                out += os.read(master, 65536)

    try:
        read_until(b"query> ")
        os.write(master, b"what is a red giant star\n")
        read_until(b"Red Giant Stars")
        read_until(b"query> ")
        os.write(master, b"\n")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert b"s0001" in out
