"""CLI options are accepted anywhere among a command's positionals, as Unix tools take them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybridret import HybridRetriever

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def built(paired_encoder, small_corpus, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("order") / "idx"
    HybridRetriever(paired_encoder).index(small_corpus[:12], workdir=path)
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridret", *args], capture_output=True, text=True, env=ENV,
                          cwd=REPO, timeout=300)


@pytest.mark.parametrize("args", [
    ("--ignore-missing", "d01", "nope"),
    ("d01", "--ignore-missing", "nope"),
    ("d01", "nope", "--ignore-missing", "--json"),
])
def test_delete_takes_options_between_and_after_ids(built, tmp_path, args):
    path = shutil.copytree(built, tmp_path / "idx")
    proc = cli("delete", str(path), *args)
    assert proc.returncode == 0, proc.stderr
    assert HybridRetriever.load(path).get("d01") == [None]
    assert "nope" in proc.stdout + proc.stderr  # reported as not in the index


def test_search_options_anywhere_give_the_same_hits(built):
    ref = cli("search", str(built), "honey", "bees", "-k", "3", "--method", "bm25", "--json")
    assert ref.returncode == 0, ref.stderr
    for args in (("-k", "3", str(built), "--method", "bm25", "honey", "bees", "--json"),
                 (str(built), "honey", "-k", "3", "bees", "--json", "--method", "bm25")):
        proc = cli("search", *args)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == json.loads(ref.stdout)


def test_add_and_index_take_options_first_or_last(built, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"_id": "d01", "text": "a changed passage"}) + "\n")
    path = shutil.copytree(built, tmp_path / "idx")
    proc = cli("add", "--upsert", str(path), "--json", str(corpus))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["updated"] == 1
    out = tmp_path / "new"
    proc = cli("index", "-o", str(out), str(corpus), "--no-bm25")
    assert proc.returncode == 0, proc.stderr
    assert HybridRetriever.load(out).num_docs == 1
