"""Damage that used to pass the checks (issue #32): a seg-* segment without segment.json, a
hand-edited manifest (a component's width, a tombstone file dropped at the same commit), damage a
compaction would stamp as valid, and the temporary file of a killed manifest write. Each is found
at load or by `info --check` (and compaction refuses), naming the file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _text_only import TextOnly, build

from hybridret import IndexWriter, Searcher
from hybridret.cli import main
from hybridret.errors import IndexFormatError

LEGACY = Path(__file__).parent / "data" / "legacy"


def _format2(tmp_path: Path) -> Path:
    return Path(shutil.copytree(LEGACY / "format2", tmp_path / "format2"))


def _edit(root: Path, change) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def _check_fails(root: Path, capsys: pytest.CaptureFixture, *needles: str) -> str:
    assert main(["info", str(root), "--check"]) == 1
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("hybridret: error:")]
    assert len(lines) == 1, lines
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# -- a segment that lost its segment.json ----------------------------------------------------------------
def test_a_format2_segment_without_segment_json_is_damaged_not_format1(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    root = _format2(tmp_path)
    seg = json.loads((root / "manifest.json").read_text())["segments"][0]["name"]
    (root / seg / "segment.json").unlink()
    with pytest.raises(IndexFormatError, match=f"{seg}/segment.json: missing; every seg-\\* segment"):
        Searcher(root, encoder=TextOnly())
    _check_fails(root, capsys, "segment.json: missing")
    before = sorted(p.name for p in root.iterdir())
    assert main(["compact", str(root), "--migrate"]) == 1  # the fix `info` suggests for old layouts
    assert "segment.json: missing" in capsys.readouterr().err
    assert sorted(p.name for p in root.iterdir()) == before  # nothing re-stamped


# -- hand-edited manifests ----------------------------------------------------------------------------
@pytest.mark.parametrize("component, key, value", [("dense", "dim", 385), ("sparse", "vocab_size", 30000)])
def test_a_hand_edited_component_width_fails_the_load(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      component: str, key: str, value: int) -> None:
    root = _format2(tmp_path)
    _edit(root, lambda m: m["components"][component].update({key: value}))
    _check_fails(root, capsys, f"components.{component}.{key} is {value}", "manifest.json")


def test_a_component_width_matching_the_parts_loads(tmp_path: Path) -> None:
    root = _format2(tmp_path)
    assert Searcher(root, encoder=TextOnly()).count() == 47  # the untouched copy: the check passes


def test_a_tombstone_file_dropped_from_the_manifest_fails_the_load(tmp_path: Path) -> None:
    root = build(tmp_path / "idx", [{"id": f"d{i}", "text": f"honey {i}"} for i in range(6)], delete=["d1", "d2"])
    assert Searcher(root, encoder=TextOnly()).count() == 4

    def forget(m: dict) -> None:
        for seg in m["segments"]:
            seg["deleted"], seg["num_deleted"] = None, 0
    _edit(root, forget)  # the same commit number: deleted documents would come back (info --check loads first)
    with pytest.raises(IndexFormatError, match="tombstones of commit 2, which .*manifest.json \\(commit 2\\) does "
                                               "not name \\(it names none\\)"):
        Searcher(root, encoder=TextOnly())


def test_older_tombstone_files_a_reader_keeps_still_load(tmp_path: Path) -> None:
    root = build(tmp_path / "idx", [{"id": f"d{i}", "text": f"honey {i}"} for i in range(6)], delete=["d1"])
    reader = Searcher(root, encoder=TextOnly())  # leases the tombstone file of commit 2
    with IndexWriter(root, encoder=TextOnly()) as w:
        w.delete(["d2"])  # commit 3 names a newer file; the old one stays for the reader
    seg = next(p for p in root.iterdir() if p.name.startswith("seg-"))
    assert len([f for f in os.listdir(seg) if f.startswith("deleted-")]) == 2
    assert Searcher(root, encoder=TextOnly()).count() == 4
    reader.close()


# -- a compaction verifies before it stamps ---------------------------------------------------------------
def test_compact_refuses_damage_a_load_does_not_read(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(4000)]
    docs = [{"id": f"d{i}", "text": " ".join(words[(i * 7) % 3000:(i * 7) % 3000 + 900]) * 12} for i in range(90)]
    root = build(tmp_path / "idx", docs, parts=2)
    seg = sorted(p for p in root.iterdir() if p.name.startswith("seg-"))[0]
    texts = seg / "texts.bin"
    size = texts.stat().st_size
    assert size > 2 * (1 << 20)  # larger than what a load checksums (first and last MiB)
    with open(texts, "r+b") as fh:  # one byte in the middle
        fh.seek(size // 2)
        b = fh.read(1)
        fh.seek(size // 2)
        fh.write(bytes([b[0] ^ 0x20]))
    assert Searcher(root, encoder=TextOnly()).count() == 90  # the load's quick check does not see it
    before = (root / "manifest.json").read_text()
    with IndexWriter(root, encoder=TextOnly()) as w:
        with pytest.raises(IndexFormatError, match="texts.bin does not match the checksum .*nothing was compacted"):
            w.compact()
    assert (root / "manifest.json").read_text() == before


# -- a killed manifest write ------------------------------------------------------------------------------
def test_the_temporary_file_of_a_killed_manifest_write_is_removed_by_the_next_write(tmp_path: Path) -> None:
    root = build(tmp_path / "idx", [{"id": f"d{i}", "text": f"honey {i}"} for i in range(4)])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process that has exited
    stale = root / f".manifest.json.tmp-{pid}"
    stale.write_text('{"half": ')
    seg = next(p for p in root.iterdir() if p.name.startswith("seg-"))
    stale_tomb = seg / f".deleted-00000009-abcdef12.npy.tmp-{pid}"
    stale_tomb.write_bytes(b"\x93NUMPY")
    live = root / f".manifest.json.tmp-{os.getppid()}"  # a live process's: left alone
    live.write_text("{}")
    with IndexWriter(root, encoder=TextOnly()) as w:
        w.delete(["d0"])
    assert not stale.exists() and not stale_tomb.exists()
    assert live.exists()
    assert Searcher(root, encoder=TextOnly()).count() == 3
