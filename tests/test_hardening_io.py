"""Fault injection through the real CLI (``python -m hybridret`` in a subprocess).

Pipes and streams as the corpus, truncated gzip, over-long lines, invalid UTF-8 and lone
surrogates, outputs that cannot be written (a file in the way, no permission, a full disk),
a closed stdout pipe, and ``demo`` over an existing index. Every failure must be one
``hybridret: error:`` line naming the file, a non-zero exit, no traceback, and no damage to an
index that was already there.

Model loading costs ~5-10 s per ``index`` run on a small machine, so only five runs here load
models (stdin, a FIFO, /dev/zero, a full disk, a lone surrogate); the rest fail before that.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from hybridret import HybridRetriever
from hybridret.errors import ConfigError
from hybridret.index.manifest import BUILDING, MANIFEST
from hybridret.runs import load_run, write_run

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "hybridret" / "resources" / "sample" / "corpus.jsonl"
N_DOCS = 20


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE", PYTHONDONTWRITEBYTECODE="1")
    return env


def run_cli(*args: str, timeout: float = 180, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    return subprocess.run([sys.executable, "-m", "hybridret", *args], env=cli_env(), timeout=timeout,
                          cwd=str(ROOT), **kwargs)


def text(data: bytes | str | None) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else (data or "")


def assert_clean_error(res: subprocess.CompletedProcess, *needles: str) -> str:
    """Non-zero exit, exactly one ``hybridret:`` line on stderr holding every needle, no traceback."""
    err = text(res.stderr)
    assert res.returncode not in (0, None), err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("hybridret:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("hybridret: error: "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def assert_no_partial_build(out: Path) -> None:
    for gen in [*out.glob("gen-*"), *out.glob("seg-*")]:
        assert not (gen / BUILDING).exists(), f"unfinished generation left behind: {gen}"


@pytest.fixture(scope="module")
def corpus_lines() -> list[str]:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()[:N_DOCS]
    assert len(lines) == N_DOCS
    return lines


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, corpus_lines) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "c20.jsonl"
    path.write_text("\n".join(corpus_lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def stdin_index(tmp_path_factory, corpus) -> Path:
    """`cat corpus.jsonl | hybridret index /dev/stdin -o X` (the issue's exact command). [loads models]"""
    out = tmp_path_factory.mktemp("stdin") / "idx"
    res = run_cli("-q", "index", "/dev/stdin", "-o", str(out), input=corpus.read_bytes())
    assert res.returncode == 0, text(res.stderr)
    return out


def doc_ids(lines: list[str]) -> list[str]:
    return [json.loads(line)["_id"] for line in lines]


# --------------------------------------------------------------------------- streams


def test_corpus_from_a_stdin_pipe(stdin_index, corpus_lines):
    r = HybridRetriever.load(stdin_index)
    assert r.num_docs == N_DOCS
    assert r.docs.ids.tolist() == doc_ids(corpus_lines)
    assert_no_partial_build(stdin_index)


def test_corpus_from_a_named_pipe(tmp_path, corpus_lines):
    """A FIFO without a suffix: read once (no counting pre-pass that would hang), format sniffed. [loads models]"""
    fifo = tmp_path / "corpus-pipe"
    os.mkfifo(fifo)
    tsv = "".join(f"{json.loads(ln)['_id']}\t{json.loads(ln)['title']}\t{json.loads(ln)['text']}\n" for ln in corpus_lines)

    def feed() -> None:
        with open(fifo, "w", encoding="utf-8") as fh:
            fh.write(tsv)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    out = tmp_path / "idx"
    try:
        res = run_cli("-q", "index", str(fifo), "-o", str(out), timeout=240)
    finally:
        if writer.is_alive():  # the CLI never opened the pipe: unblock the writer
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)
        writer.join(10)
    assert res.returncode == 0, text(res.stderr)
    r = HybridRetriever.load(out)
    assert r.docs.ids.tolist() == doc_ids(corpus_lines)
    assert r.docs.get(0)[0] == json.loads(corpus_lines[0])["title"]  # read as 3-column TSV
    assert_no_partial_build(out)


def test_dash_reads_stdin_gzip_by_magic_and_sniffs_tsv(corpus):
    """`-` is standard input; gzip is recognised without a suffix; a stream is read once."""
    code = (
        "import sys\n"
        "from hybridret.data import CorpusReader\n"
        "from hybridret.errors import ConfigError\n"
        "r = CorpusReader('-')\n"
        "docs = list(r)\n"
        "print(r.format, len(docs), docs[0].id, docs[-1].text)\n"
        "try:\n"
        "    list(r)\n"
        "except ConfigError as exc:\n"
        "    print('again:', exc)\n"
    )
    tsv = b"".join(f"d{i}\tbody {i}\n".encode() for i in range(30))
    res = subprocess.run([sys.executable, "-c", code], input=gzip.compress(tsv), capture_output=True,
                         env=cli_env(), timeout=60)
    assert res.returncode == 0, text(res.stderr)
    first, second = text(res.stdout).splitlines()
    assert first == "tsv 30 d0 body 29"
    assert "read only once" in second


def test_truncated_gzip_is_one_error_line_naming_file_and_line(tmp_path, corpus):
    bad = tmp_path / "corpus.jsonl.gz"
    packed = gzip.compress(corpus.read_bytes())
    bad.write_bytes(packed[: len(packed) // 2])
    out = tmp_path / "idx"
    res = run_cli("-q", "index", str(bad), "-o", str(out))
    line = assert_clean_error(res, "corpus.jsonl.gz:", "truncated gzip")
    assert "Loading" not in text(res.stderr), "the corrupt file should fail before models load"
    assert line.split("corpus.jsonl.gz:")[1].split(":")[0].isdigit()  # the line reached
    assert not (out / MANIFEST).exists()


def test_corrupt_gzip_and_not_gzip(tmp_path, corpus):
    packed = bytearray(gzip.compress(corpus.read_bytes()))
    packed[len(packed) // 2] ^= 0xFF
    for name, data in (("flipped.jsonl.gz", bytes(packed)), ("plain.jsonl.gz", corpus.read_bytes())):
        bad = tmp_path / name
        bad.write_bytes(data)
        assert_clean_error(run_cli("-q", "index", str(bad), "-o", str(tmp_path / "idx")), name, "gzip")


def test_over_long_line_in_a_file_fails_fast(tmp_path):
    bad = tmp_path / "long.jsonl"
    with open(bad, "wb") as fh:
        fh.write(b'{"_id": "ok", "text": "fine"}\n{"_id": "big", "text": "')
        chunk = b"a" * (1 << 20)
        for _ in range(65):
            fh.write(chunk)
        fh.write(b'"}\n')
    res = run_cli("-q", "index", str(bad), "-o", str(tmp_path / "idx"))
    assert_clean_error(res, "long.jsonl:2:", "longer than the maximum")


def test_dev_zero_is_bounded_not_a_memory_error(tmp_path):
    """No newline ever: memory stays at one bounded line, then a clear error. [loads models]"""
    out = tmp_path / "idx"
    res = run_cli("-q", "index", "/dev/zero", "--format", "jsonl", "-o", str(out), timeout=240)
    assert_clean_error(res, "/dev/zero:1:", "longer than the maximum")
    assert not (out / MANIFEST).exists()
    assert_no_partial_build(out)


def test_invalid_utf8_fails_before_models_load(tmp_path):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"_id": "a", "text": "ok"}\n{"_id": "b", "text": "caf\xe9"}\n')
    res = run_cli("-q", "index", str(bad), "-o", str(tmp_path / "idx"))
    assert_clean_error(res, "latin1.jsonl:2:", "UTF-8")
    assert "Loading" not in text(res.stderr)


def test_lone_surrogate_in_a_corpus_is_named(tmp_path):
    """`\\ud800` is valid JSON but not writable text: refused with file, line and field. [loads models]"""
    bad = tmp_path / "surrogate.jsonl"
    bad.write_text('{"_id": "a", "text": "fine"}\n{"_id": "b", "title": "x\\ud800y", "text": "t"}\n', encoding="utf-8")
    out = tmp_path / "idx"
    res = run_cli("-q", "index", str(bad), "-o", str(out), timeout=240)
    assert_clean_error(res, "surrogate.jsonl:2:", "surrogate", "'title'")
    assert not (out / MANIFEST).exists()
    assert_no_partial_build(out)


# --------------------------------------------------------------------------- outputs


def test_output_is_a_file(tmp_path, corpus):
    target = tmp_path / "taken"
    target.write_text("not an index")
    assert_clean_error(run_cli("-q", "index", str(corpus), "-o", str(target)), str(target), "not a directory")
    assert target.read_text() == "not an index"
    below = target / "idx"
    assert_clean_error(run_cli("-q", "index", str(corpus), "-o", str(below)), str(target), "not a directory")


def test_output_without_permission(tmp_path, corpus):
    if os.geteuid() != 0:
        pytest.skip("needs root, to drop privileges to 'nobody' for the child process")
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user on this machine")
    shared = Path(tempfile.mkdtemp(prefix="hr-perm-", dir="/tmp"))
    try:
        shared.chmod(0o755)  # readable by nobody, writable only by root
        readable = shared / "corpus.jsonl"
        shutil.copy(corpus, readable)
        readable.chmod(0o644)
        secret = shared / "secret.jsonl"
        shutil.copy(corpus, secret)
        secret.chmod(0o600)

        def drop() -> None:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)

        try:
            probe = subprocess.run([sys.executable, "-c", "import hybridret"], preexec_fn=drop, env=cli_env(),
                                   capture_output=True, timeout=60, cwd="/")
        except OSError as exc:
            pytest.skip(f"'nobody' cannot run this interpreter ({exc}), so privileges cannot be dropped")
        if probe.returncode != 0:
            pytest.skip(f"'nobody' cannot import hybridret from {ROOT}: {text(probe.stderr)[-200:]}")
        res = run_cli("-q", "index", str(readable), "-o", str(shared / "idx"), preexec_fn=drop)
        assert_clean_error(res, str(shared), "ermission")
        assert not (shared / "idx").exists()
        res = run_cli("-q", "index", str(secret), "-o", "/tmp/hr-perm-never", preexec_fn=drop)
        if res.returncode == 0 or "ermission" not in text(res.stderr):
            pytest.fail(f"expected a permission error reading {secret}: {text(res.stderr)}")
        assert_clean_error(res, "secret.jsonl", "ermission")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_full_disk_keeps_the_previous_index(stdin_index, corpus):
    """RLIMIT_FSIZE makes write() fail with EFBIG (SIGXFSZ ignored) while replacing an index. [loads models]"""
    before = (stdin_index / MANIFEST).read_bytes()
    gens_before = sorted(p.name for p in stdin_index.glob("seg-*"))

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    res = run_cli("-q", "index", str(corpus), "-o", str(stdin_index), "--overwrite", "--no-encode-cache",
                  preexec_fn=small_files, timeout=240)
    assert_clean_error(res, str(stdin_index), "File too large")
    assert (stdin_index / MANIFEST).read_bytes() == before
    assert sorted(p.name for p in stdin_index.glob("seg-*")) == gens_before  # nothing half-written left
    r = HybridRetriever.load(stdin_index)
    assert r.num_docs == N_DOCS
    assert r.search("black hole", k=1, method="bm25").ids.shape == (1, 1)


def test_demo_refuses_an_existing_index(stdin_index):
    before = (stdin_index / MANIFEST).read_bytes()
    res = run_cli("-q", "demo", "-o", str(stdin_index))
    assert_clean_error(res, "--overwrite", str(stdin_index))
    assert "Loading" not in text(res.stderr)
    assert (stdin_index / MANIFEST).read_bytes() == before
    assert "--overwrite" in text(run_cli("demo", "--help").stdout)
    makefile = (ROOT / "Makefile").read_text()
    assert "hybridret demo --overwrite" in makefile  # `make demo` re-makes indexes/sample every time


# --------------------------------------------------------------------------- stdout and text


def test_closed_stdout_pipe_exits_quietly(stdin_index):
    """The reader of stdout is gone before the first write: no traceback, no 'Exception ignored'."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        res = subprocess.run([sys.executable, "-m", "hybridret", "-q", "search", str(stdin_index), "black hole",
                              "--method", "bm25", "-k", "20"], stdout=write_end, stderr=subprocess.PIPE,
                             env=cli_env(), timeout=120, cwd=str(ROOT))
    finally:
        os.close(write_end)
    assert res.returncode == 141, text(res.stderr)
    assert text(res.stderr).strip() == ""


def test_pipe_into_head(stdin_index):
    cmd = (f"set -o pipefail; {sys.executable} -m hybridret -q search {stdin_index} 'black hole' --method bm25 "
           f"-k 20 --json | head -c 10")
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, env=cli_env(), timeout=120, cwd=str(ROOT))
    assert text(res.stdout) == '{\n  "query'
    assert res.returncode in (0, 141), text(res.stderr)
    assert text(res.stderr).strip() == ""


def test_non_utf8_query_argument(stdin_index):
    res = subprocess.run([sys.executable.encode(), b"-m", b"hybridret", b"-q", b"search", bytes(stdin_index),
                          b"caf\xe9", b"--method", b"bm25"], capture_output=True, env=cli_env(), timeout=120)
    assert_clean_error(res, "not valid UTF-8")


def test_lone_surrogate_in_queries_file(stdin_index, tmp_path):
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "bad \\udc80 query"}\n', encoding="utf-8")
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("q1\tx\t1\n")
    res = run_cli("-q", "eval", str(stdin_index), "--queries", str(queries), "--qrels", str(qrels),
                  "--method", "bm25")
    assert_clean_error(res, "queries.jsonl:1:", "surrogate")


def test_debug_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    res = run_cli("--debug", "-q", "index", str(bad), "-o", str(tmp_path / "idx"))
    assert res.returncode != 0
    assert "Traceback" in text(res.stderr) and "CorpusFormatError" in text(res.stderr)
    assert_clean_error(run_cli("-q", "index", str(bad), "-o", str(tmp_path / "idx")), "bad.jsonl.gz")


# --------------------------------------------------------------------------- run files with spaced ids


@pytest.fixture(scope="module")
def spaced_index(tmp_path_factory, paired_encoder) -> Path:
    """LIMIT-style ids with spaces, built in-process (the session's encoder, no extra model load)."""
    out = tmp_path_factory.mktemp("spaced") / "idx"
    docs = [{"id": "Jane Doe", "text": "Jane likes black holes and astronomy."},
            {"id": "John Q Public", "text": "John bakes sourdough bread."},
            {"id": "plain", "text": "Trains in Japan are fast."}]
    HybridRetriever(paired_encoder).index(docs).save(out)
    return out


def test_eval_save_run_with_spaced_ids_round_trips(spaced_index, tmp_path):
    queries = tmp_path / "queries.tsv"
    queries.write_text("q 1\tblack holes\nq2\tsourdough bread\n", encoding="utf-8")
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq 1\tJane Doe\t1\nq2\tJohn Q Public\t1\n", encoding="utf-8")
    run_file = tmp_path / "run.trec"
    res = run_cli("-q", "eval", str(spaced_index), "--queries", str(queries), "--qrels", str(qrels),
                  "--method", "bm25", "-k", "3", "--save-run", str(run_file), "--json")
    assert res.returncode == 0, text(res.stderr)
    assert json.loads(text(res.stdout))["metrics"]["ndcg@10"] == 1.0
    run = load_run(run_file)
    assert set(run) == {"q 1", "q2"}
    assert max(run["q 1"], key=run["q 1"].get) == "Jane Doe"
    assert max(run["q2"], key=run["q2"].get) == "John Q Public"
    for line in run_file.read_text(encoding="utf-8").splitlines():
        assert len(line.split("\t")) == 6


def test_save_run_to_a_directory_is_one_error_line(spaced_index, tmp_path):
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\tblack holes\n", encoding="utf-8")
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("q1\tplain\t1\n", encoding="utf-8")
    target = tmp_path / "a-directory"
    target.mkdir()
    res = run_cli("-q", "eval", str(spaced_index), "--queries", str(queries), "--qrels", str(qrels),
                  "--method", "bm25", "--save-run", str(target))
    assert_clean_error(res, str(target))
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("run, needle", [
    ({"q1": {"a\tb": 1.0}}, "'a\\tb'"),
    ({"q1": {"a\nb": 1.0}}, "'a\\nb'"),
    ({"q1": {" lead": 1.0}}, "' lead'"),
    ({"": {"d": 1.0}}, "''"),
    ({"q1": {"d\ud800": 1.0}}, "surrogate"),
    ({"q1": {"d": float("nan")}}, "NaN"),
])
def test_write_run_refuses_unwritable_ids_by_name(tmp_path, run, needle):
    with pytest.raises(ConfigError) as info:
        write_run(run, tmp_path / "run.trec")
    assert needle in str(info.value)
    assert not list(tmp_path.iterdir())


def test_write_run_plain_ids_keep_the_classic_format(tmp_path):
    path = write_run({"q1": {"d1": 0.5, "d2": 0.25}}, tmp_path / "run.trec", tag="t")
    assert path.read_text() == "q1 Q0 d1 1 0.500000 t\nq1 Q0 d2 2 0.250000 t\n"
    assert stat.S_ISREG(path.stat().st_mode)
