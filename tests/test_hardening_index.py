"""Hardening of the index and the library boundary: read-only indexes, damaged or missing parts,
one writer per directory, loads racing commits, and property-based search arguments."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridret import HybridRetriever, IndexWriter
from hybridret.errors import ConfigError, CorpusFormatError, HybridRetError, IndexFormatError

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def small_index(paired_encoder, small_corpus, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hard") / "idx"
    docs = [dict(d, metadata={"n": i, "kind": "odd" if i % 2 else "even"}) for i, d in enumerate(small_corpus)]
    HybridRetriever(paired_encoder).index(docs[:30], workdir=path)
    HybridRetriever.load(path, encoder=paired_encoder).add(docs[30:])
    return path


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("leases", "write.lock"))
    return dst


def run_cli(*args: str, preexec=None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridret", *args], capture_output=True, text=True, env=ENV,
                          cwd=REPO, timeout=timeout, preexec_fn=preexec)


def one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hybridret: error:")]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# -------------------------------------------------------------------------------- read-only


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux) to drop root's override")
def test_a_read_only_index_can_be_searched_and_described(small_index, tmp_path):
    """Read-only volumes and image layers: searching must never need write access. As root, file
    permissions are ignored, so the child drops CAP_DAC_OVERRIDE first."""
    ro = copy(small_index, tmp_path / "ro")
    subprocess.run(["chmod", "-R", "a-w", str(ro)], check=True)
    try:
        script = ("import sys, json; from hybridret import HybridRetriever; r = HybridRetriever.load(sys.argv[1]); "
                  "print(json.dumps({m: r.search('honey bees', k=3, method=m, filter={'kind': 'even'}).ids[0].tolist() "
                  "for m in ('dense', 'sparse', 'bm25', 'hybrid')}))")
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", sys.executable, "-c", script, str(ro)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout)
        assert all(ids[0] for ids in got.values())
        assert not (ro / "leases").exists()  # no lease could be (or needed to be) written
        write = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", sys.executable,
                                "-m", "hybridret", "delete", str(ro), "d01"], capture_output=True, text=True, env=ENV,
                               timeout=300)
        one_error_line(write, "cannot write to the index", str(ro))
        dry = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", sys.executable,
                              "-m", "hybridret", "delete", str(ro), "--filter", '{"kind": "even"}', "--dry-run",
                              "--json"], capture_output=True, text=True, env=ENV, timeout=300)
        assert dry.returncode == 0, dry.stderr[-2000:]  # a dry run writes nothing: read-only is fine (issue #32)
        assert json.loads(dry.stdout)["deleted"] == 20
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(ro)], check=True)


# -------------------------------------------------------------------------------- damaged parts


def _segment(path: Path) -> Path:
    return path / json.loads((path / "manifest.json").read_text())["segments"][0]["name"]


@pytest.mark.parametrize("damage,needle", [
    (lambda seg: shutil.rmtree(seg / "sparse"), "missing index file"),
    (lambda seg: (seg / "texts.bin").unlink(), "missing index file"),
    (lambda seg: (seg / "texts.bin").write_bytes((seg / "texts.bin").read_bytes()[:-7]), "texts.bin has"),
    (lambda seg: (seg / "dense" / "meta.json").write_text((seg / "dense" / "meta.json").read_text() + " "),
     "has"),
    (lambda seg: (seg / "docids.txt").write_text((seg / "docids.txt").read_text().replace("d01", "x01")),
     "checksum"),
])
def test_missing_or_damaged_parts_are_refused_at_load(small_index, tmp_path, damage, needle):
    path = copy(small_index, tmp_path / "idx")
    damage(_segment(path))
    with pytest.raises(IndexFormatError, match=needle):
        HybridRetriever.load(path)
    one_error_line(run_cli("search", str(path), "bees"), needle)


def test_info_check_finds_damage_inside_large_files(small_index, tmp_path, monkeypatch):
    """Loading checks sizes, and checksums of files up to 1 MiB; a same-size change inside a larger
    file is found by the full check (``info --check``)."""
    import hybridret.index.dense as dense
    import hybridret.index.segment as segment

    path = copy(small_index, tmp_path / "idx")
    assert run_cli("info", str(path), "--check").returncode == 0
    vec = _segment(path) / "dense" / "vectors.npy"
    arr = np.load(vec)
    arr[3, 5] = np.nan  # same size
    np.save(vec, arr)
    with pytest.raises(IndexFormatError, match="checksum"):  # small here: caught at load
        HybridRetriever.load(path)
    monkeypatch.setattr(segment, "_QUICK_HASH", 0)  # as if every file were large
    monkeypatch.setattr(dense, "SAMPLE_ROWS", 2)  # ... and the load's sample of vectors missed row 3
    r = HybridRetriever.load(path)
    assert r.search("bees", k=2, method="dense").ids.shape == (1, 2)
    problems = r.check()
    assert any("checksum" in p for p in problems) and any("NaN" in p for p in problems)
    proc = run_cli("info", str(path), "--check")
    one_error_line(proc, "checksum")  # the CLI loads normally: refused at load already


@pytest.mark.parametrize("name", ["../elsewhere", "/etc", "seg-x/../../y", ""])
def test_segment_names_must_stay_inside_the_index(small_index, tmp_path, name):
    path = copy(small_index, tmp_path / "idx")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["segments"][0]["name"] = name
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="invalid segment entry"):
        HybridRetriever.load(path)


def test_hits_never_carry_nan_into_json(small_index, capsys):
    from hybridret.cli import main

    assert main(["-q", "search", str(small_index), "bees", "--method", "dense", "--json"]) == 0
    text = capsys.readouterr().out
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text)


# -------------------------------------------------------------------------------- writers


def test_a_second_writer_gets_a_clear_error_and_the_index_stays(small_index, tmp_path, small_corpus):
    path = copy(small_index, tmp_path / "idx")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in small_corpus[:5]))
    with IndexWriter(path):  # another writer (this process) holds the directory
        one_error_line(run_cli("index", str(corpus), "-o", str(path), "--overwrite"),
                       "being written by another writer", f"process {os.getpid()}")
        one_error_line(run_cli("compact", str(path)), "being written by another writer")
    assert HybridRetriever.load(path).num_docs == 40


def test_disk_full_during_add_keeps_the_index(small_index, tmp_path, small_corpus):
    path = copy(small_index, tmp_path / "idx")
    corpus = tmp_path / "new.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"n{i}", "text": d["text"] * 40}) + "\n"
                              for i, d in enumerate(small_corpus)))
    before = sorted(p.name for p in path.iterdir())

    def small_files():  # every file the child writes may hold 64 KiB: the segment cannot be finished
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))

    one_error_line(run_cli("add", str(path), str(corpus), preexec=small_files), str(path))
    unchanged = {"leases", "write.lock"}  # the lock file appears with the first writer
    assert sorted(p.name for p in path.iterdir() if p.name not in unchanged) == [b for b in before if b not in unchanged]
    r = HybridRetriever.load(path)
    assert r.num_docs == 40 and r.search("bees", k=1).ids[0, 0]


LOOP = r"""
import sys
from hybridret import HybridRetriever
r = HybridRetriever.load(sys.argv[1])
print("ready", flush=True)
for i in range(10_000):
    r.set_fusion(None, {"round": i})                 # a cheap commit
    r.delete(["d0%d" % (1 + i % 9)], missing="ignore") if i % 7 == 0 else None
"""


def test_loads_racing_commits_always_open_a_whole_commit(small_index, tmp_path):
    path = copy(small_index, tmp_path / "idx")
    child = subprocess.Popen([sys.executable, "-c", LOOP, str(path)], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdout.readline().strip() == "ready"
        seen = set()
        for _ in range(150):
            r = HybridRetriever.load(path)
            seen.add(r.searcher.snapshot.commit)
            assert r.num_docs == len(r.searcher.snapshot.live_ids())
        assert len(seen) > 5, "the writer did not commit while we loaded"
    finally:
        child.kill()
        child.wait()


# -------------------------------------------------------------------------------- library boundary


@pytest.mark.parametrize("docs,needle", [
    ("hello world", "not a single str"),
    ({"id": "a", "text": "x"}, "not a single dict"),
    ([{"id": "a", "text": 42}], "field 'text' must be a string"),
    ([{"id": "a", "text": ["x"]}], "field 'text' must be a string"),
    ([{"id": None, "text": "x"}], "the id must be a string or an integer"),
    ([{"id": True, "text": "x"}], "the id must be a string or an integer"),
    ([{"id": "a\nb", "text": "x"}], "contains a newline"),
    ([{"id": "a", "text": "bad \ud800 surrogate"}], "not valid Unicode"),
    ([{"id": "a", "text": "x", "metadata": {"$bad": 1}}], "may not start with '$'"),
    ([{"id": "a", "text": "x", "metadata": "str"}], "must be an object"),
    ([object()], "cannot index a object"),
])
def test_bad_documents_get_clear_errors(paired_encoder, docs, needle):
    with pytest.raises(CorpusFormatError) as err:
        HybridRetriever(paired_encoder).index(docs)
    assert needle in str(err.value)


@pytest.mark.parametrize("kwargs,needle", [
    ({"queries": 123}, "queries must be a string or a list of strings"),
    ({"queries": ["ok", None]}, "query #1 is a NoneType"),
    ({"queries": b"bytes"}, "queries must be a string"),
    ({"queries": "x", "k": 2.5}, "k must be a positive integer"),
    ({"queries": "x", "k": 0}, "k must be positive"),
    ({"queries": "x", "k": True}, "k must be a positive integer"),
    ({"queries": "x", "method": "magic"}, "unknown method 'magic'"),
    ({"queries": "x", "filter": {"n": {"$gt": "a", "$foo": 1}}}, "unknown operator"),
    ({"queries": "\ud800"}, "not valid Unicode"),
    ({"queries": "x", "candidates": -1}, "candidates must be positive"),
])
def test_bad_search_arguments_get_clear_errors(small_index, paired_encoder, kwargs, needle):
    r = HybridRetriever.load(small_index, encoder=paired_encoder)
    with pytest.raises(ConfigError) as err:
        r.search(**kwargs)
    assert needle in str(err.value)


def test_blank_queries_get_no_hits(small_index, paired_encoder):
    r = HybridRetriever.load(small_index, encoder=paired_encoder)
    hits = r.search(["", "   ", "honey bees"], k=3)
    assert (hits.rows[:2] == -1).all() and hits[0] == [] and hits[2][0].id == "d05"


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10, 50), st.floats(allow_nan=True),
                         st.text(max_size=5))
FILTERS = st.recursive(
    st.dictionaries(st.sampled_from(["n", "kind", "$and", "$or", "$not", "$in", "x.y", "$gt"]),
                    JSON_SCALARS, max_size=2),
    lambda inner: st.dictionaries(st.sampled_from(["n", "kind", "$and", "$or", "$not", "$gte", "$in", "$exists"]),
                                  st.one_of(inner, st.lists(inner, max_size=2), JSON_SCALARS), max_size=2),
    max_leaves=6)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queries=st.one_of(st.text(max_size=30), st.lists(st.one_of(st.text(max_size=20), st.integers(), st.none()),
                                                       max_size=3), st.integers(), st.none()),
       k=st.one_of(st.integers(-2, 60), st.floats(allow_nan=True), st.booleans(), st.none()),
       method=st.sampled_from(["hybrid", "dense", "sparse", "bm25", "rrf", "linear", "gqr", "nope", ""]),
       filt=st.one_of(st.none(), FILTERS, st.text(max_size=10)))
def test_search_arguments_property(small_index, paired_encoder, queries, k, method, filt):
    """Any arguments: valid Hits, or a HybridRetError saying what is wrong -- never another exception."""
    r = _loaded(small_index, paired_encoder)
    try:
        hits = r.search(queries, k=k, method=method, filter=filt)
    except HybridRetError:
        return
    want = 10 if k is None else k  # k=None: the request's default (search(queries, k=None) as search(queries))
    assert hits.rows.shape == (len(hits.queries), min(want, r.num_docs))  # k beyond the index: its width
    for i in range(len(hits)):
        for h in hits[i]:
            json.dumps(h.to_dict(), allow_nan=False)


_CACHE: dict = {}


def _loaded(path, encoder):
    if path not in _CACHE:
        _CACHE[path] = HybridRetriever.load(path, encoder=encoder)
    return _CACHE[path]


# ------------------------------------------------- found in review: each failed before its fix


def test_saving_twice_into_one_directory_carries_new_tombstones(small_index, paired_encoder, tmp_path):
    r = HybridRetriever.load(copy(small_index, tmp_path / "a"), encoder=paired_encoder)
    r.delete(["d01"])
    r.save(tmp_path / "b")
    r.delete(["d02"])  # a newer tombstone file in a segment folder that b already has
    r.save(tmp_path / "b", overwrite=True)
    b = HybridRetriever.load(tmp_path / "b", encoder=paired_encoder)
    assert b.num_docs == 38 and not {"d01", "d02"} & set(b.searcher.snapshot.live_ids())


def test_a_failed_commit_never_touches_live_tombstones(small_index, paired_encoder, tmp_path, monkeypatch):
    import errno

    import hybridret.index.manifest as manifest

    r = HybridRetriever.load(copy(small_index, tmp_path / "a"), encoder=paired_encoder)
    r.delete(["d01"])
    r.save(tmp_path / "b")  # b's commit numbers restart: tombstone names must not collide
    b = HybridRetriever.load(tmp_path / "b", encoder=paired_encoder)
    b.delete(["d35"])
    live = set(b.searcher.snapshot.live_ids())

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(manifest, "atomic_write_json", full)
    with pytest.raises(OSError):
        b.upsert([{"id": "d06", "text": "A new text about glaciers and ice."}])
    monkeypatch.undo()
    again = HybridRetriever.load(tmp_path / "b", encoder=paired_encoder)
    assert set(again.searcher.snapshot.live_ids()) == live  # d06 is still there, nothing half-applied


def test_an_interrupt_while_tidying_up_keeps_the_commit(small_index, paired_encoder, tmp_path, monkeypatch):
    import hybridret.index.manifest as manifest

    r = HybridRetriever.load(copy(small_index, tmp_path / "a"), encoder=paired_encoder)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(manifest, "collect_garbage", interrupted)
    with pytest.raises(KeyboardInterrupt):
        r.add([{"id": "n1", "text": "Lighthouses guide ships."}])
    monkeypatch.undo()
    assert "n1" in HybridRetriever.load(tmp_path / "a", encoder=paired_encoder).searcher.snapshot


def test_merging_is_housekeeping_an_add_never_fails_on_it(paired_encoder, small_corpus):
    r = HybridRetriever(paired_encoder, store_text=False, max_segments=1).index(small_corpus[:10])
    res = r.add(small_corpus[10:15])  # no texts: BM25 segments cannot be merged, the add stands
    assert res.added == 5 and r.num_docs == 15


@pytest.mark.parametrize("call,needle", [
    (lambda r: r.add([{"id": "big", "text": "x", "n": 10**400}]), "beyond ±2**53"),
    (lambda r: r.search("x", filter={"n": 10**400}), "beyond ±2**53"),
    (lambda r: r.search("x", filter={"n": {"$gt": 10**30}}), "beyond ±2**53"),
    (lambda r: r.search("x", filter="{" + '"$not": {' * 40 + '"a": 1' + "}" * 41), "nested more than"),
    (lambda r: r.search("x", filter="[" * 100_000), "not valid JSON"),
    (lambda r: r.delete([None]), "strings or integers"),
    (lambda r: r.delete(None), "must be a list"),
    (lambda r: r.add(None), "must be an iterable"),
    (lambda r: r.add([{"id": "z", "text": "x"}], chunk_size="a"), "chunk_size must be a positive integer"),
])
def test_more_bad_input_gets_clear_errors(small_index, paired_encoder, tmp_path, call, needle):
    r = HybridRetriever.load(copy(small_index, tmp_path / "idx"), encoder=paired_encoder)
    with pytest.raises(HybridRetError) as err:
        call(r)
    assert needle in str(err.value)
    assert HybridRetriever.load(tmp_path / "idx", encoder=paired_encoder).num_docs == 40


def test_loading_with_another_encoder_is_refused(small_index):
    from hybridret.encoders import SpladeEncoder

    with pytest.raises(ConfigError, match="not the one that built"):
        HybridRetriever.load(small_index, encoder=SpladeEncoder("splade-tiny"))


def test_save_to_a_path_that_is_a_file(small_index, paired_encoder, tmp_path):
    target = tmp_path / "a-file"
    target.write_text("not an index")
    r = HybridRetriever.load(small_index, encoder=paired_encoder)
    with pytest.raises(HybridRetError, match="it is a file"):
        r.save(target)
    assert target.read_text() == "not an index"


def test_save_redoes_a_segment_folder_an_interrupted_save_left_half_linked(small_index, paired_encoder, tmp_path):
    r = HybridRetriever.load(small_index, encoder=paired_encoder)
    target = tmp_path / "target"
    target.mkdir()
    seg = r.searcher.snapshot.segments[0]
    shutil.copytree(seg.root, target / seg.name)
    (target / seg.name / "docids.txt").unlink()  # as a save killed mid-copy leaves it
    r.save(target)
    assert HybridRetriever.load(target, encoder=paired_encoder).num_docs == r.num_docs
