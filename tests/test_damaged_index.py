"""A damaged index is refused with one line naming the file, never served as a smaller answer:
every part the manifest or a segment promises is verified at load (cheaply), and in full by
``hybridret info --check``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hybridret import HybridRetriever
from hybridret.errors import IndexFormatError

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def built(paired_encoder, small_corpus, tmp_path_factory) -> Path:
    """Two segments, metadata on every document, one deletion (commit 3)."""
    path = tmp_path_factory.mktemp("damage") / "idx"
    docs = [dict(d, metadata={"kind": "odd" if i % 2 else "even"}) for i, d in enumerate(small_corpus)]
    r = HybridRetriever(paired_encoder).index(docs[:30], workdir=path)
    r.add(docs[30:])
    r.delete(["d05"])
    return path


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("leases", "write.lock"))
    return dst


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def segment(path: Path, i: int = 0) -> Path:
    return path / manifest(path)["segments"][i]["name"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridret", *args], capture_output=True, text=True, env=ENV,
                          cwd=REPO, timeout=300)


def one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hybridret: error:")]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def edit_manifest(path: Path, change) -> None:
    data = manifest(path)
    change(data)
    (path / "manifest.json").write_text(json.dumps(data))


def _drop_segment_json_and_sparse(path: Path) -> None:
    seg = segment(path)
    (seg / "segment.json").unlink()
    shutil.rmtree(seg / "sparse")


def _drop_segment_json_and_metadata(path: Path) -> None:
    seg = segment(path)
    (seg / "segment.json").unlink()
    (seg / "metadata.jsonl").unlink()


def _symlink_segment(path: Path) -> None:
    seg = segment(path, 1)
    other = copy(path, path.parent / f"{path.name}-other")
    shutil.rmtree(seg)
    os.symlink(segment(other, 1), seg)


def _symlink_part(path: Path) -> None:
    seg = segment(path, 1)
    other = copy(path, path.parent / f"{path.name}-other")
    shutil.rmtree(seg / "dense")
    os.symlink(segment(other, 1) / "dense", seg / "dense")


def _restore_older_manifest(path: Path) -> None:
    """Put back the manifest of commit 2 (before the deletion): its segments carry no tombstones."""
    def older(m):
        m["commit"] = 2
        m["num_docs"] = 40
        m["segments"][0].update(deleted=None, num_deleted=0)
    edit_manifest(path, older)


def _nan_everywhere(path: Path) -> None:
    vec = segment(path) / "dense" / "vectors.npy"
    arr = np.load(vec)
    arr[:] = np.nan
    np.save(vec, arr)
    info = json.loads((segment(path) / "segment.json").read_text())  # as if written so: checksums agree
    from hybridret.index.segment import file_list

    info["files"] = file_list(segment(path))
    (segment(path) / "segment.json").write_text(json.dumps(info))


def _format_zero(path: Path) -> None:
    edit_manifest(path, lambda m: m.update(format_version=0))


def _dims_disagree(path: Path) -> None:
    def dims(m):
        m["representations"]["dense"]["dim"] = 128
        m["components"]["dense"]["dim"] = 128
    edit_manifest(path, dims)


DAMAGE = [
    (_drop_segment_json_and_sparse, "segment.json"),
    (_drop_segment_json_and_metadata, "segment.json"),
    (_symlink_segment, "symbolic link"),
    (_symlink_part, "symbolic link"),
    (_restore_older_manifest, "deleted-00000003"),
    (_nan_everywhere, "vectors.npy"),
    (_format_zero, "format_version 0"),
    (_dims_disagree, "width 384"),
]


@pytest.mark.parametrize("damage,needle", DAMAGE, ids=[d.__name__.strip("_") for d, _ in DAMAGE])
def test_damage_is_refused_at_load_with_one_line_naming_the_file(built, tmp_path, damage, needle):
    path = copy(built, tmp_path / "idx")
    damage(path)
    with pytest.raises(IndexFormatError, match=needle) as err:
        HybridRetriever.load(path)
    assert "\n" not in str(err.value)
    assert str(path) in str(err.value)  # names the file or folder
    line = one_error_line(cli("search", str(path), "honey bees", "--filter", '{"kind": "odd"}'), needle)
    assert str(path) in line
    one_error_line(cli("info", str(path), "--check"), needle)


def test_a_restored_manifest_never_brings_deleted_documents_back(built, tmp_path):
    path = copy(built, tmp_path / "idx")
    r = HybridRetriever.load(path)
    assert r.get("d05") == [None]
    before = (path / "manifest.json").read_text()
    r.delete(["d07"])  # commit 4 writes new tombstones
    (path / "manifest.json").write_text(before)  # an older copy put back (a backup, a sync tool)
    with pytest.raises(IndexFormatError, match="newer than the commit 3"):
        HybridRetriever.load(path)
    with pytest.raises(IndexFormatError, match="older than commit 4"):  # the writer that loaded commit 4 refuses
        r.add([{"id": "n1", "text": "a new passage"}])


def test_a_large_files_damaged_head_is_caught_at_load(paired_encoder, small_corpus, tmp_path, monkeypatch):
    """Files over the quick-hash size are checked at load by the checksum of their first and last
    MiB (here the size is made 4 KiB, so a 45 KiB vector file counts as large)."""
    import hybridret.index.segment as segment_module

    monkeypatch.setattr(segment_module, "_QUICK_HASH", 4096)
    path = tmp_path / "idx"
    HybridRetriever(paired_encoder).index(small_corpus[:30], workdir=path)
    vec = segment(path) / "dense" / "vectors.npy"
    data = bytearray(vec.read_bytes())
    assert len(data) > 4096
    data[200:204] = b"\xff\xff\xff\x7f"  # a NaN inside the first KiB of vectors, same size
    vec.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="vectors.npy does not match the checksum"):
        HybridRetriever.load(path)


def test_an_intact_index_and_a_killed_writers_tombstones_still_load(built, tmp_path):
    """The lineage check must not refuse what a crash legitimately leaves: tombstones a writer
    wrote for a commit it never finished (kill -9 between the tombstone and the manifest)."""
    path = copy(built, tmp_path / "idx")
    assert cli("info", str(path), "--check").returncode == 0
    seg = segment(path)
    name = "deleted-00000004-0badc0de.npy"
    np.save(seg / name, np.array([1, 2], dtype=np.int64))
    (seg / (name + ".pending")).write_text("999999")  # the dead writer's marker
    r = HybridRetriever.load(path)
    assert r.num_docs == 39
    r.delete(["d01"])  # the next commit clears the leftovers
    assert not (seg / name).exists() and not (seg / (name + ".pending")).exists()
    assert HybridRetriever.load(path).num_docs == 38
