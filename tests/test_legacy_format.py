"""Indexes written by older releases open as named parts, search exactly as they did, accept writes,
and ``compact --migrate`` rewrites them in format 3.

The indexes under ``tests/data/legacy/`` were written by hybridret at commit 853a81f (index format 2) with
``tests/data/make_legacy_indexes.py``, which also recorded each method's top-10 (``expected.json``):
``format2/`` (two segments, tombstones, metadata) and ``format1-planes/`` (sparse format 1: bit planes,
BM25 through tantivy's text field as before the posting store existed). Each test works on a copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hybridret import HybridRetriever
from hybridret.cli import main
from hybridret.index.bm25 import BM25Store
from hybridret.index.learned import LearnedIndex
from hybridret.index.legacy.sparse import SparseIndex
from hybridret.index.legacy.tantivy_bm25 import TantivyBM25

DATA = Path(__file__).parent / "data" / "legacy"
EXPECTED = json.loads((DATA / "expected.json").read_text())
QUERIES: list[str] = EXPECTED["queries"]
METHODS = ("dense", "sparse", "bm25", "hybrid", "rrf", "linear")


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(DATA / name, dst)
    return dst


def _assert_expected(r: HybridRetriever, name: str, methods=METHODS) -> None:
    for m in methods:
        want = EXPECTED["results"][name][m]
        got = r.search(QUERIES, k=10, method=m)
        assert got.ids.tolist() == want["ids"], m
        np.testing.assert_allclose(got.scores, np.array(want["scores"], dtype=np.float32), rtol=1e-5, atol=1e-6,
                                   err_msg=m)


def _formats(r: HybridRetriever) -> list[dict[str, str]]:
    return [{n: p.meta["format"] for n, p in s.parts.items()} for s in r.searcher.snapshot.segments]


def test_format_2_index_opens_as_named_parts_and_searches_as_before(paired_encoder, tmp_path):
    r = HybridRetriever.load(_copy("format2", tmp_path), encoder=paired_encoder)
    segs = r.searcher.snapshot.segments
    assert [s.layout for s in segs] == ["legacy", "legacy"]
    assert all(isinstance(s.part("sparse"), LearnedIndex) and isinstance(s.part("bm25"), BM25Store) for s in segs)
    assert r.manifest["format_version"] == 2 and set(r.manifest["parts"]) == {"dense", "sparse", "bm25"}
    _assert_expected(r, "format2")


def test_format_2_index_accepts_writes_and_migrates(paired_encoder, sample_docs, tmp_path):
    path = _copy("format2", tmp_path)
    r = HybridRetriever.load(path, encoder=paired_encoder)
    r.add([dict(sample_docs[60], id="new-1")])
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format_version"] == 3 and "shape" not in manifest
    assert [s.layout for s in r.searcher.snapshot.segments] == ["legacy", "legacy", "parts"]
    assert r.search(sample_docs[60]["text"], k=1, method="sparse").ids[0, 0] == "new-1"
    r.delete(["new-1"])
    _assert_expected(r, "format2", ("dense", "sparse", "bm25"))  # the old documents score as before
    del r
    assert main(["compact", str(path), "--migrate"]) == 0
    r = HybridRetriever.load(path, encoder=paired_encoder)
    assert [s.layout for s in r.searcher.snapshot.segments] == ["parts"]
    assert _formats(r) == [{"dense": "hybridret-dense-v1", "sparse": "hybridret-impact-v2",
                            "bm25": "hybridret-bm25-v3", "phrases": "hybridret-phrases-v1"}]  # compact adds the phrases part
    assert sorted(p.name for p in r.searcher.snapshot.segments[0].root.iterdir() if p.is_dir()) == \
        ["bm25", "dense", "phrases", "sparse"]
    _assert_expected(r, "format2")  # tombstones were already subtracted from BM25: identical after migration


def test_format_1_sparse_part_and_tantivy_bm25_migrate(paired_encoder, tmp_path):
    path = _copy("format1-planes", tmp_path)
    r = HybridRetriever.load(path, encoder=paired_encoder)
    segs = r.searcher.snapshot.segments
    assert all(isinstance(s.part("sparse"), SparseIndex) and isinstance(s.part("bm25"), TantivyBM25) for s in segs)
    _assert_expected(r, "format1-planes")
    before = {m: r.search(QUERIES, k=10, method=m) for m in ("dense", "sparse")}
    live = [d for d in r.get(r.searcher.snapshot.live_ids())]
    del r
    assert main(["-q", "compact", str(path), "--migrate"]) == 0
    r = HybridRetriever.load(path, encoder=paired_encoder)
    assert _formats(r) == [{"dense": "hybridret-dense-v1", "sparse": "hybridret-impact-v2",
                            "bm25": "hybridret-bm25-v3", "phrases": "hybridret-phrases-v1"}]
    assert r.manifest["settings"]["sparse_scheme"] == "impact"
    for m, want in before.items():  # independent of segmentation and format: the same exact scores
        got = r.search(QUERIES, k=10, method=m)
        assert got.ids.tolist() == want.ids.tolist()
        np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-6)
    fresh = HybridRetriever(paired_encoder).index(live, workdir=tmp_path / "fresh")
    np.testing.assert_allclose(r.search(QUERIES, k=10, method="bm25").scores,
                               fresh.search(QUERIES, k=10, method="bm25").scores, rtol=1e-5)
    assert main(["-q", "compact", str(path), "--migrate"]) == 0  # nothing is left to do


def test_format_1_manifest_reads_and_upgrades_on_first_write(paired_encoder, sample_docs, tmp_path):
    """A format-1 manifest (one ``gen-`` folder, no text hashes, no file list) over a format-2 folder."""
    path = _copy("format2", tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    first = manifest["segments"][0]
    assert first["num_deleted"] == 2
    for seg in manifest["segments"][1:]:
        shutil.rmtree(path / seg["name"])
    old = path / first["name"]
    v1 = old.with_name("gen-20250101T000000-abcdef12")
    old.rename(v1)
    for name in ("keys.npy", "segment.json", first["deleted"]):
        (v1 / name).unlink()
    for key in ("segments", "commit", "shape"):
        manifest.pop(key)
    manifest.update(format_version=1, generation=v1.name, num_docs=first["num_docs"])
    (path / "manifest.json").write_text(json.dumps(manifest))
    r = HybridRetriever.load(path, encoder=paired_encoder)
    assert r.num_docs == first["num_docs"] and set(r.manifest["representations"]) == {"dense", "sparse"}
    assert r.search(QUERIES[:2], k=3, method="hybrid").ids.shape == (2, 3)
    r.add([dict(sample_docs[70], id="added")])
    after = json.loads((path / "manifest.json").read_text())
    assert after["format_version"] == 3 and after["segments"][0]["name"] == v1.name
    assert r.num_docs == first["num_docs"] + 1
    doc = r.get([r.searcher.snapshot.live_ids()[0]])[0]
    r.upsert([dict(doc, metadata={"new": 1})])  # no stored text hash: compared by text
    assert r.search(doc["text"], k=1, method="bm25")[0][0].metadata == {"new": 1}


@pytest.fixture(scope="module")
def sample_docs() -> list[dict]:
    import hybridret

    sample = Path(hybridret.__file__).parent / "resources" / "sample" / "corpus.jsonl"
    return [{"id": d["_id"], "title": d.get("title", ""), "text": d["text"]}
            for d in map(json.loads, sample.open())]
