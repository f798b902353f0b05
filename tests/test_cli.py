"""The CLI contract: index / search / info / demo, and clear errors with non-zero exits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridret import HybridRetriever
from hybridret.cli import main

DOCS = [
    {"_id": "astro", "title": "Black holes", "text": "A black hole forms when a massive star collapses under its own gravity."},
    {"_id": "bread", "title": "Sourdough",
     "text": "Sourdough bread rises thanks to wild yeast and lactic acid bacteria in the starter."},
    {"_id": "heart", "title": "Hypertension",
     "text": "High blood pressure is treated with diet, exercise and drugs such as ACE inhibitors."},
    {"_id": "rail", "title": "Shinkansen", "text": "Japan's high-speed Shinkansen trains reach 320 km/h on dedicated tracks."},
    {"_id": "blank", "title": "", "text": "   "},
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cli")
    corpus = _write_jsonl(tmp / "corpus.jsonl", DOCS)
    out = tmp / "idx"
    assert main(["-q", "index", str(corpus), "-o", str(out)]) == 0
    return out


def test_index_writes_a_loadable_index_and_counts_skipped(built):
    r = HybridRetriever.load(built)
    assert r.num_docs == 4
    assert r.manifest["skipped_empty"] == 1


def test_search_json_contract(built, capsys):
    assert main(["-q", "search", str(built), "how", "do", "black", "holes", "form", "-k", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["query"] == "how do black holes form"
    assert len(out["hits"]) == 2
    top = out["hits"][0]
    assert top["id"] == "astro"
    assert {"id", "score", "scores", "text", "matched_terms"} <= set(top)
    assert {"dense", "sparse", "bm25"} <= set(top["scores"])  # default hybrid = GQR, sparse + BM25 guide


@pytest.mark.parametrize("method", ["dense", "sparse", "bm25", "hybrid"])
def test_search_each_method_text_output(built, capsys, method):
    assert main(["-q", "search", str(built), "sourdough starter yeast", "--method", method, "-k", "3"]) == 0
    out = capsys.readouterr().out
    assert f"[{method}" in out  # hybrid shows the fusion it resolved to, e.g. [hybrid:linear]
    assert "1. bread" in out


def test_candidates_only_for_fused_methods(built, capsys):
    assert main(["-q", "search", str(built), "yeast", "--method", "dense", "--candidates", "50"]) == 1
    assert "--candidates" in capsys.readouterr().err
    assert main(["-q", "search", str(built), "yeast", "--method", "rrf", "--candidates", "2", "-k", "2"]) == 0


def test_default_encode_cache_is_removed_after_a_build(built):
    assert not (built / "encode-cache").exists()


def test_info_json_and_text(built, capsys):
    assert main(["-q", "info", str(built), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_docs"] == 4 and info["format_version"] == 3
    assert info["components"]["dense"]["factory"] == "Flat"
    assert main(["-q", "info", str(built)]) == 0
    out = capsys.readouterr().out
    assert "documents:  4" in out
    assert "None" not in out  # no field of another part format printed as missing ("None bit planes")
    lines = out.splitlines()
    for name, meta in info["components"].items():  # each part: its name, its format and its own fields
        line = next(li for li in lines if li.startswith(f"{name}:"))
        assert f"format {meta['format']}" in line
        assert all(f"{k} " in line for k in meta if k != "format")


def test_info_component_lines_are_generic():
    from hybridret.cli.info import component_line

    line = component_line("bm25", {"format": "bm25-v1", "k1": 0.9, "fields": ["title", "text"]})
    assert line == 'bm25:       format bm25-v1; k1 0.9, fields ["title", "text"]'
    assert component_line("multivec", {"dim": 8}) == "multivec:   format ?; dim 8"
    assert component_line("x", {"format": 3}) == "x:          format 3"
    assert len(component_line("big", {"format": 1, "ids": list(range(1000))})) < 100


def test_existing_index_needs_overwrite_and_stays_usable(built, tmp_path, capsys):
    corpus = _write_jsonl(tmp_path / "other.jsonl", [{"id": "x1", "text": "Volcanoes erupt molten rock called lava."}])
    assert main(["-q", "index", str(corpus), "-o", str(built)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert HybridRetriever.load(built).num_docs == 4  # untouched


def test_overwrite_replaces(tmp_path):
    first = _write_jsonl(tmp_path / "a.jsonl", DOCS[:2])
    second = _write_jsonl(tmp_path / "b.jsonl", [{"id": "v", "text": "Volcanoes erupt molten rock called lava."}])
    out = tmp_path / "idx"
    assert main(["-q", "index", str(first), "-o", str(out)]) == 0
    assert main(["-q", "index", str(second), "-o", str(out), "--overwrite", "--faiss", "HNSW8,Flat"]) == 0
    r = HybridRetriever.load(out)
    assert r.num_docs == 1 and r.docs.ids.tolist() == ["v"]
    assert len(list(out.glob("seg-*"))) == 1  # the old generation was removed


def test_beir_folder_and_msmarco_tsv(tmp_path):
    beir = tmp_path / "beir"
    beir.mkdir()
    _write_jsonl(beir / "corpus.jsonl", DOCS[:3])
    assert main(["-q", "index", str(beir), "-o", str(tmp_path / "i1")]) == 0
    tsv = tmp_path / "collection.tsv"
    tsv.write_text("0\tThe Eiffel Tower is in Paris.\n1\tMount Fuji is the highest mountain in Japan.\n", encoding="utf-8")
    assert main(["-q", "index", str(tsv), "-o", str(tmp_path / "i2")]) == 0
    r = HybridRetriever.load(tmp_path / "i2")
    assert r.search("tallest peak in japan", k=1, method="dense").ids[0, 0] == "1"


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"_id": "a", "text": "fine"}\n{"_id": "b", "text": oops}\n', ":2"),  # malformed JSON, line 2
        ('{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}\n', "duplicate"),
        ('{"text": "no id here"}\n', ":1"),
    ],
)
def test_bad_corpus_lines_name_file_and_line(tmp_path, capsys, content, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content, encoding="utf-8")
    out = tmp_path / "idx"
    assert main(["-q", "index", str(bad), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and needle in err
    assert not (out / "manifest.json").exists()
    assert not list(out.glob("seg-*"))  # the failed build left nothing behind


def test_missing_inputs(tmp_path, capsys):
    assert main(["-q", "index", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "i")]) == 1
    assert "nope.jsonl" in capsys.readouterr().err
    assert main(["-q", "search", str(tmp_path / "noindex"), "query"]) == 1
    assert "no index" in capsys.readouterr().err
    assert main(["-q", "info", str(tmp_path)]) == 1
    assert "manifest.json" in capsys.readouterr().err


def test_corrupt_index_is_reported(built, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    gen = next(copy.glob("seg-*"))
    (gen / "sparse" / "forward.data.npy").write_bytes(b"garbage")
    assert main(["-q", "search", str(copy), "query"]) == 1
    assert "forward.data.npy" in capsys.readouterr().err


def test_module_entry_point_runs():
    res = subprocess.run([sys.executable, "-m", "hybridret", "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for cmd in ("index", "search", "info", "demo"):
        assert cmd in res.stdout
    res = subprocess.run([sys.executable, "-m", "hybridret", "search"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "usage" in res.stderr
