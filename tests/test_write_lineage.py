"""Writes against an index that vanished or was replaced are refused (commit lineage): a writer
remembers the commit it loaded, and never silently starts a new index where its index was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hybridret import HybridRetriever, IndexWriter
from hybridret.errors import HybridRetError, IndexFormatError, IndexNotFoundError

NEW = [{"id": "n1", "text": "A new passage about honey bees."}]


@pytest.fixture()
def loaded(paired_encoder, small_corpus, tmp_path) -> tuple[Path, HybridRetriever]:
    path = tmp_path / "idx"
    HybridRetriever(paired_encoder).index(small_corpus[:20], workdir=path)
    return path, HybridRetriever.load(path, encoder=paired_encoder)


@pytest.mark.parametrize("write", [
    lambda r: r.add(NEW), lambda r: r.upsert(NEW), lambda r: r.delete(["d01"]), lambda r: r.compact(),
    lambda r: r.set_fusion(None),
])
def test_every_write_after_the_folder_is_removed_is_refused(loaded, write):
    path, r = loaded
    shutil.rmtree(path)
    with pytest.raises(IndexNotFoundError, match="is gone") as err:
        write(r)
    assert str(path) in str(err.value)
    assert not path.exists()  # no new index holding only the new document


def test_a_write_after_the_folder_is_replaced_by_another_index_is_refused(loaded, paired_encoder):
    path, r = loaded
    shutil.rmtree(path)
    HybridRetriever(paired_encoder).index([{"id": "x1", "text": "another index altogether"}], workdir=path)
    with pytest.raises(IndexFormatError, match="replaced by another index"):
        r.add(NEW)
    assert HybridRetriever.load(path).num_docs == 1  # the other index is untouched


def test_a_write_after_an_older_manifest_was_put_back_is_refused(loaded):
    path, r = loaded
    before = (path / "manifest.json").read_text()
    r.add(NEW)
    (path / "manifest.json").write_text(before)
    with pytest.raises(HybridRetError, match="older than commit 2"):
        r.add([{"id": "n2", "text": "one more"}])


def test_a_forked_history_is_refused(loaded, paired_encoder):
    """Same index id, a newer commit number, but not descending from what was loaded."""
    path, r = loaded
    m = json.loads((path / "manifest.json").read_text())
    m.update(commit=m["commit"] + 3, commit_id="f" * 16, history=["e" * 16])
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="does not descend"):
        r.add(NEW)


def test_writes_by_another_writer_meanwhile_are_fine(loaded, paired_encoder):
    path, r = loaded
    other = HybridRetriever.load(path, encoder=paired_encoder)
    other.add([{"id": "o1", "text": "written by another retriever"}])
    other.delete(["d02"])
    r.add(NEW)  # descends from what r loaded: allowed
    fresh = HybridRetriever.load(path)
    assert fresh.num_docs == 21 and fresh.get("o1")[0] and fresh.get("n1")[0]


def test_index_writer_takes_the_expected_manifest(loaded):
    path, r = loaded
    seen = r.manifest
    assert seen["index_id"] and seen["commit_id"]
    shutil.rmtree(path)
    with pytest.raises(IndexNotFoundError):
        IndexWriter(path, expect=seen)
    assert not path.exists()
