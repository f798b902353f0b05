"""Warnings that reach people: hybridret's warnings go through :mod:`warnings` (seen by a library
user who configured no logging), the CLI prints them as log lines, ``-q`` silences other libraries'
chatter, and small builds show progress."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

from hybridret import HybridRetriever, Searcher
from hybridret.errors import HybridRetWarning, PerformanceWarning, StaleSnapshotWarning, TruncationWarning

REPO = Path(__file__).resolve().parent.parent


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    full.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=REPO,
                          timeout=300)


def test_warning_classes_are_warnings():
    for cls in (PerformanceWarning, TruncationWarning, StaleSnapshotWarning):
        assert issubclass(cls, HybridRetWarning) and issubclass(cls, UserWarning)


def test_omp_trap_is_visible_without_logging_setup():
    """torch imported before hybridret: a plain script (no logging configured) sees the warning."""
    res = _python("import faiss\nfrom hybridret import HybridRetriever\nHybridRetriever()\n")
    assert res.returncode == 0, res.stderr
    assert "PerformanceWarning" in res.stderr and "OMP_WAIT_POLICY=PASSIVE" in res.stderr, res.stderr
    quiet = _python("import faiss\nfrom hybridret import HybridRetriever\nHybridRetriever()\n",
                    OMP_WAIT_POLICY="PASSIVE")  # the user chose a policy: nothing to say
    assert quiet.returncode == 0 and "PerformanceWarning" not in quiet.stderr, quiet.stderr


def test_library_index_warns_once_per_call_with_the_count(paired_encoder):
    from hybridret.encoders import PairedEncoder

    short = PairedEncoder.from_names(max_length=16)
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 10)
    docs = [{"id": "a", "text": long}, {"id": "b", "text": "short"}, {"id": "c", "text": long}]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        HybridRetriever(short).index(docs)
    cut = [w for w in got if issubclass(w.category, TruncationWarning)]
    # one per model of the pair (each counts its own cuts), each with the count of this call
    assert len(cut) == 2, [str(w.message) for w in got]
    assert all("2 of 3 documents" in str(w.message) for w in cut)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        HybridRetriever(paired_encoder).index(docs)  # 256 tokens: nothing is cut
    assert not [w for w in got if issubclass(w.category, TruncationWarning)]


def test_refresh_failure_is_a_warning(tmp_path, paired_encoder, small_corpus):
    root = tmp_path / "idx"
    HybridRetriever(paired_encoder).index(small_corpus[:5], workdir=root)
    searcher = Searcher(root, encoder=paired_encoder)
    try:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            (root / "manifest.json").write_text("{not json", encoding="utf-8")
            searcher.refresh_every(0.05)
            deadline = time.monotonic() + 20
            while not [w for w in got if issubclass(w.category, StaleSnapshotWarning)] and time.monotonic() < deadline:
                time.sleep(0.05)
            searcher.close()  # no more refreshes once the warnings are no longer recorded
        stale = [w for w in got if issubclass(w.category, StaleSnapshotWarning)]
        assert stale and "still serving commit" in str(stale[0].message)
        assert searcher.search("photosynthesis", k=1, method="bm25").ids[0][0] == "d01"  # old snapshot serves
    finally:
        searcher.close()


def test_cli_prints_hybridret_warnings_as_log_lines(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "%s"}\n{"_id": "b", "text": "short"}\n'
                      % " ".join(["the quick brown fox"] * 20), encoding="utf-8")
    res = _python(f"import sys\nfrom hybridret.cli import main\nsys.exit(main(['-q', 'index', {str(corpus)!r}, "
                  f"'-o', {str(tmp_path / 'idx')!r}, '--max-length', '16']))", OMP_WAIT_POLICY="PASSIVE")
    assert res.returncode == 0, res.stderr
    lines = [x for x in res.stderr.splitlines() if "truncated" in x]
    assert lines and all(x.startswith("warning: ") for x in lines), res.stderr
    assert "TruncationWarning" not in res.stderr  # a log line, not Python's warning format


def test_quiet_search_prints_no_transformers_chatter(tmp_path, paired_encoder):
    """A hit longer than the model's 512 positions: finding its expansion terms tokenises it whole,
    which transformers' tokenizer wrapper reported as 'Token indices sequence length ...'."""
    root = tmp_path / "idx"
    long = " ".join(f"ferry harbour crossing number {i} leaves the quay at dawn" for i in range(80))
    HybridRetriever(paired_encoder).index([{"id": "long", "text": long}, {"id": "x", "text": "bread"}],
                                          workdir=root)
    res = _python(f"import sys\nfrom hybridret.cli import main\nsys.exit(main(['-q', 'search', {str(root)!r}, "
                  "'ferry harbour', '-k', '1']))", OMP_WAIT_POLICY="PASSIVE")
    assert res.returncode == 0 and "1. long" in res.stdout, res.stderr
    assert "Token indices" not in res.stderr and "transformers" not in res.stderr, res.stderr


def test_small_build_shows_progress_when_logging_is_at_info(paired_encoder, small_corpus, capsys):
    log = logging.getLogger("hybridret")
    level = log.level
    log.setLevel(logging.INFO)
    try:
        HybridRetriever(paired_encoder).index(small_corpus, batch_size=8)  # 40 documents, one chunk
    finally:
        log.setLevel(level)
    err = capsys.readouterr().err
    assert "dense docs" in err and "sparse docs" in err and "40/40" in err, err
    HybridRetriever(paired_encoder).index(small_corpus, batch_size=8)  # logging not at INFO: silent
    assert "docs" not in capsys.readouterr().err


def test_show_progress_false_stays_silent(paired_encoder, small_corpus, capsys):
    log = logging.getLogger("hybridret")
    level = log.level
    log.setLevel(logging.INFO)
    try:
        HybridRetriever(paired_encoder).index(small_corpus, batch_size=8, show_progress=False)
    finally:
        log.setLevel(level)
    assert "docs" not in capsys.readouterr().err
