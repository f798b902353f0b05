"""Errors name the cause the user can act on: the input given, where it is, what is allowed;
never a guess at another cause or the library's internal wording."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridret import HybridRetriever
from hybridret.cli._common import NamingPath
from hybridret.errors import ConfigError, CorpusFormatError

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def index(paired_encoder, small_corpus, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("errors") / "idx"
    HybridRetriever(paired_encoder).index(small_corpus[:10], workdir=path)
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridret", *args], capture_output=True, text=True, env=ENV,
                          cwd=REPO, timeout=300)


def error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hybridret: error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- OSError tails: a full disk only when the disk is full -----------------------------------------------
def test_a_duplicate_id_is_not_reported_as_a_full_disk(index, tmp_path):
    corpus = tmp_path / "dup.jsonl"
    corpus.write_text(json.dumps({"_id": "d01", "text": "again"}) + "\n")
    line = error_line(cli("add", str(index), str(corpus)))
    assert "'d01' is already in the index" in line
    assert "disk" not in line and "while writing" not in line


@pytest.mark.parametrize("code,want,unwanted", [
    (errno.EACCES, "(while writing the index)", "disk"),
    (errno.EROFS, "(while writing the index)", "disk"),
    (errno.ENOSPC, "the disk is full", "size limit"),
    (errno.EFBIG, "a file size limit", "disk is full"),
])
def test_oserror_tails_name_only_their_own_cause(tmp_path, code, want, unwanted):
    with pytest.raises(OSError) as err:
        with NamingPath(tmp_path):
            raise OSError(code, os.strerror(code))
    text = str(err.value)
    assert want in text and unwanted not in text and str(tmp_path) in text


def test_an_error_naming_its_file_keeps_its_own_words(tmp_path):
    with pytest.raises(PermissionError) as err:
        with NamingPath(tmp_path):
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "x.npy"))
    assert err.value.filename == str(tmp_path / "x.npy") and "disk" not in str(err.value)


# -- document positions and ids ---------------------------------------------------------------------------
def test_an_id_with_a_line_break_in_a_corpus_names_file_and_line(index, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"_id": "ok1", "text": "fine"}) + "\n" + json.dumps({"_id": "a\nb", "text": "x"}) + "\n")
    line = error_line(cli("add", str(index), str(corpus)))
    assert f"{corpus}:2: field '_id' holds a line break" in line
    assert "document #" not in line


def test_a_bad_document_given_to_the_library_names_its_position_unambiguously(paired_encoder):
    with pytest.raises(CorpusFormatError, match=r"documents\[1\] \(counting from 0\): invalid document id"):
        HybridRetriever(paired_encoder).index([{"id": "a", "text": "x"}, {"id": "a\nb", "text": "y"}])


# -- fusion settings --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fusion,needle", [
    ({"method": "linear", "weights": [0.5, 0.5]}, "fusion weights must map retriever names to numbers"),
    ({"method": "linear", "weights": {"dense": "high"}}, "fusion weights['dense'] must be a finite number"),
    ({"method": "linear", "weights": {"dense": -1}}, "fusion weights['dense'] must be a finite number >= 0"),
    ({"method": "linear", "weights": {"colbert": 1}}, "unknown retriever 'colbert'"),
    ({"method": "linear", "retrievers": ["dense"], "weights": {"bm25": 1}}, "not among the fused retrievers"),
    ({"method": "linear", "retrievers": "dense"}, "must be a list of retriever names"),
    ({"method": "gqr", "guide": {"sparse": "x"}}, "fusion guide['sparse'] must be a finite number"),
    ({"method": "linear", "retrievers": []}, "fusion retrievers is empty"),
])
def test_malformed_fusion_settings_name_the_setting(index, fusion, needle):
    from hybridret import Searcher

    with pytest.raises(ConfigError) as err:
        Searcher(index).search("bees", k=3, method="linear", fusion=fusion)
    assert needle in str(err.value)
    assert "candidate_union" not in str(err.value) and "row set" not in str(err.value)


# -- index settings ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings,needle", [
    ({"sparse_bits": 1}, "sparse_bits=1 applies only to the format-1 sparse schemes"),
    ({"sparse_bits": 1, "sparse_scheme": "planes"}, "sparse_bits=1: sparse_scheme 'planes' takes 2 to 16"),
    ({"sparse_bits": 99, "sparse_scheme": "buckets"}, "sparse_bits=99: sparse_scheme 'buckets' takes 2 to 64"),
    ({"sparse_scheme": "nope"}, "sparse_scheme 'nope' is unknown"),
])
def test_index_settings_errors_name_the_setting_given(paired_encoder, settings, needle):
    with pytest.raises(ConfigError) as err:
        HybridRetriever(paired_encoder, **settings).index([{"id": "a", "text": "hello"}])
    assert needle in str(err.value)
    assert "buckets must be" not in str(err.value)


def test_cli_sparse_bits_under_the_default_scheme(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "hello"}) + "\n")
    line = error_line(cli("index", str(corpus), "-o", str(tmp_path / "idx"), "--sparse-bits", "1"))
    assert "sparse_bits=1 applies only to the format-1 sparse schemes" in line
