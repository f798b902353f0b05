"""Evaluation that cannot see part of its judgments says so, with counts; a data line of a qrels
file is never dropped as a header."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridret import HybridRetriever
from hybridret.data import load_qrels
from hybridret.errors import CorpusFormatError
from hybridret.eval import judgment_coverage, warn_coverage

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def index(paired_encoder, small_corpus, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("evalwarn") / "idx"
    HybridRetriever(paired_encoder).index(small_corpus[:10], workdir=path)
    return path


@pytest.mark.parametrize("text", ["q1\t0\td01\t1\n", "q1 d01 1\n", "q1\td01\t2"])
def test_a_one_line_qrels_file_is_data(tmp_path, text):
    p = tmp_path / "qrels.tsv"
    p.write_text(text)
    assert load_qrels(p) == {"q1": {"d01": int(text.split()[-1])}}


@pytest.mark.parametrize("header", ["query-id\tcorpus-id\tscore", "qid 0 docid relevance", "topic\titer\tdoc\tgrade"])
def test_a_real_header_is_still_skipped(tmp_path, header):
    p = tmp_path / "qrels.tsv"
    sep = "\t" if "\t" in header else " "
    cols = ["q1", "d01", "1"] if len(header.split()) == 3 else ["q1", "0", "d01", "1"]
    p.write_text(header + "\n" + sep.join(cols) + "\n")
    assert load_qrels(p) == {"q1": {"d01": 1}}


def test_a_first_line_with_a_fractional_grade_is_an_error_not_a_header(tmp_path):
    p = tmp_path / "qrels.tsv"
    p.write_text("q1\t0\td01\t1.0\nq1\t0\td02\t1\n")
    with pytest.raises(CorpusFormatError, match=r"qrels.tsv:1: relevance grade must be an integer"):
        load_qrels(p)


def test_coverage_counts_what_the_index_and_the_judgments_miss(caplog):
    qrels = {"q1": {"d01": 1, "x1": 1, "x2": 0}, "q2": {"x3": 2}, "q3": {}}
    cov = judgment_coverage(qrels, ["q1", "q2", "q3", "q4"], {"d01"}.__contains__)
    assert (cov.queries, cov.unjudged, cov.judged, cov.judged_missing) == (4, ["q3", "q4"], 4, 3)
    assert (cov.relevant, cov.relevant_missing, cov.queries_without_relevant) == (3, 2, ["q2"])
    with caplog.at_level(logging.WARNING, logger="hybridret.eval"):
        lines = warn_coverage(cov, queries="Q", qrels="R", index="I")
    assert lines[0].startswith("2 of 4 queries in Q have no judgments in R")
    assert lines[1].startswith("2 of 3 relevant judgments in R name documents that are not in I")
    assert "1 queries have no relevant document" in lines[1]
    assert [r.getMessage() for r in caplog.records] == lines


def test_cli_eval_warns_with_counts(index, tmp_path):
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\thoney bees\nq2\tthe eiffel tower\nq3\tunjudged question\n")
    qrels = tmp_path / "qrels.tsv"  # 20 of 30 relevant documents are not in the index
    qrels.write_text("".join([f"q1\t0\td0{i}\t1\n" for i in range(1, 10)] + ["q1\t0\td10\t1\n"] +
                             [f"q2\t0\tgone{i}\t1\n" for i in range(20)]))
    proc = subprocess.run([sys.executable, "-m", "hybridret", "eval", str(index), "--queries", str(queries),
                           "--qrels", str(qrels), "--method", "bm25"], capture_output=True, text=True, env=ENV,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"1 of 3 queries in {queries} have no judgments" in proc.stderr
    assert f"20 of 30 relevant judgments in {qrels} name documents that are not in the index at {index}" \
        in proc.stderr
    assert "1 queries have no relevant document in the index at all" in proc.stderr
