"""Smoke run of the benchmark scripts on a tiny slice of the bundled sample (CI keeps them working).

The scripts run as a user would run them (subprocesses), with --quick timing, into temporary
folders; peers that are not installed (CI installs only the test extra) are skipped by the
scripts themselves, which this also checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "hybridret" / "resources" / "sample"
BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 60-passage BEIR folder and the same data as MS MARCO-style TSV files."""
    root = tmp_path_factory.mktemp("tiny")
    docs = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").read_text().splitlines()[:60]]
    ids = {d["_id"] for d in docs}
    qrels = [line.split("\t") for line in (SAMPLE / "qrels.tsv").read_text().splitlines()[1:]]
    qrels = [q for q in qrels if q[1] in ids]
    queries = {json.loads(line)["_id"]: json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").read_text().splitlines()}
    queries = {q: t for q, t in queries.items() if any(r[0] == q for r in qrels)}
    assert len(queries) >= 3, "the slice must keep some judged queries"
    beir = root / "tiny-beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join("\t".join(r) + "\n" for r in qrels))
    tsv = root / "tsv"
    tsv.mkdir()
    (tsv / "collection.tsv").write_text("".join(f"{d['_id']}\t{d['text']}\n" for d in docs))
    (tsv / "queries.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in queries.items()))
    (tsv / "qrels.txt").write_text("".join(f"{r[0]} 0 {r[1]} {r[2].strip()}\n" for r in qrels))
    return root


def _run(*args: str | Path, cwd: Path) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_beir_msmarco_and_report_scripts(tiny, tmp_path):
    res, idx = tmp_path / "results", tmp_path / "indexes"
    out = _run(BENCH / "beir.py", tiny / "tiny-beir", "--quick", "--depth", "100", "--index-root", idx, "--results", res,
               cwd=tmp_path)
    assert "hybrid (GQR, default)" in out and "FAISS IndexFlatIP" in out
    beir = json.loads((res / "peers-tiny-beir.json").read_text())
    rows = beir["topics"]["test"]["rows"]
    ours = {r["method"]: r for r in rows if r["system"] == "hybridret"}
    assert set(ours) >= {"dense (MiniLM)", "BM25", "hybrid (GQR, default)"}
    assert all(0 < r["ndcg@10"] <= 1 for r in ours.values())
    faiss_row = next(r for r in rows if r["system"].startswith("FAISS"))
    assert faiss_row["ndcg@10"] == pytest.approx(ours["dense (MiniLM)"]["ndcg@10"], abs=1e-3)  # same vectors
    assert beir["build"]["hybridret"]["docs"] == 60
    # each peer either ran or says why it was skipped (CI installs none of bm25s, sentence-transformers, pyserini)
    for peer in ("bm25s", "sentence-transformers", "pyserini"):
        ran = any(r["system"].startswith(peer) for r in rows)
        assert ran or "skipped" in beir["build"].get(peer, {}), peer

    tsv = tiny / "tsv"
    out = _run(BENCH / "msmarco.py", "--collection", tsv / "collection.tsv", "--queries", tsv / "queries.tsv",
               "--qrels", tsv / "qrels.txt", "--name", "tiny-msmarco", "--quick", "--no-peers", "--depth", "100",
               "--index-root", idx, "--results", res, cwd=tmp_path)
    assert "projected for 8,841,823 passages" in out
    ms = json.loads((res / "peers-tiny-msmarco.json").read_text())
    dev = {r["method"]: r for r in ms["topics"]["dev-small"]["rows"]}
    assert dev["dense (MiniLM)"]["mrr@10"] == pytest.approx(ours["dense (MiniLM)"]["mrr@10"], abs=1e-3)

    _run(BENCH / "report.py", "--results", res, "--out", tmp_path / "docs" / "benchmarks.md", cwd=tmp_path)
    md = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "tiny-beir" in md and "tiny-msmarco" in md and "hybridret ÷ peer" in md


def test_scale_script_quick(tmp_path):
    out = _run(BENCH / "scale.py", "--quick", "--out", tmp_path / "scale.json", cwd=tmp_path)
    assert "SYNTHETIC" in out
    data = json.loads((tmp_path / "scale.json").read_text())
    assert data["synthetic"] is True and [d["size"] for d in data["sizes_done"]] == [2000, 5000]
    assert {r["index"].split()[0] for r in data["results"]} >= {"dense", "sparse"}


def test_serve_load_writes_smoke(tmp_path):
    """serve_load.py --smoke: 4 clients mixing searches and writes for 4 s on a 30-passage index, with
    group commit; every acknowledged write checked afterwards, the server stopped by SIGTERM."""
    out_json = tmp_path / "serve-load-writes.json"
    out = _run(BENCH / "serve_load.py", "--smoke", "--output", out_json, cwd=tmp_path)
    assert "lost: 0, deleted but back: 0" in out
    data = json.loads(out_json.read_text())
    res = data["modes"]["group"]
    (run,) = res["runs"]
    (level,) = run["levels"]
    assert level["clients"] == 4 and level["errors"] == 0 and level["requests"] > 0
    assert level["write_ms"]["n"] > 0 and level["search_ms"]["n"] > 0 and level["write_calls"] >= 1
    assert run["acknowledged_ids"] > 0 and run["lost"] == [] and run["deleted_came_back"] == []
    assert res["server_exits"] == [0] and data["index_docs"] == 30


def test_living_script_quick(tmp_path):
    """living.py --quick on the bundled sample (its first 120 passages): every section is written."""
    beir = tmp_path / "sample-beir"
    (beir / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        (beir / name).write_text((SAMPLE / name).read_text())
    (beir / "qrels" / "test.tsv").write_text((SAMPLE / "qrels.tsv").read_text())
    res = tmp_path / "results"
    out = _run(BENCH / "living.py", "--quick", "--data", beir, "--index-root", tmp_path / "indexes",
               "--out", res / "living.json", cwd=tmp_path)
    assert "retriever.add(docs)" in out and "ratio segmented ÷ compacted" in out
    data = json.loads((res / "living.json").read_text())
    assert {"build", "add", "segments", "filters"} <= set(data)
    add = data["add"]
    assert add["write_result"]["added"] == add["docs_added"] > 0 and add["segments_after"] == 2
    assert add["add_seconds"] > 0 and add["encode_alone_seconds"] > 0 and "overhead_seconds" in add
    seg = data["segments"]
    assert seg["made"]["segments"] == 20 and seg["compact"]["segments_after"] == 1
    labels = ("20 segments", "compacted", "ratio segmented ÷ compacted")
    assert {(r["index"], r["method"]) for r in seg["latency"]} >= {
        (i, m) for i in labels for m in ("dense", "sparse", "bm25", "hybrid")}
    fresh = {r["method"]: r for r in seg["quality_compacted_vs_fresh"]}
    assert fresh["dense"]["queries with a different top-10 (ids, in order)"] == 0
    assert all(r["queries with different top-10 scores"] == 0 for r in fresh.values() if r["method"] != "hybrid")
    filt = data["filters"]
    assert filt["metadata_upsert"]["write_result"]["encoded"] == 0
    assert {r["filter"] for r in filt["latency"]} == {"none", "~50%", "~5%", "~0.1%"}
    assert all(r["hits outside the filter"] == 0 for r in filt["latency"])
    for check in filt["brute_force"].values():
        assert check["dense"]["queries_top10_differ"] == check["dense"]["of_which_ties_at_equal_scores"]
        assert check["sparse"]["queries_top10_differ"] == check["sparse"]["of_which_ties_at_equal_scores"]
    _run(BENCH / "report.py", "--results", res, "--out", tmp_path / "docs" / "benchmarks.md", cwd=tmp_path)
    assert "## Living index" in (tmp_path / "docs" / "benchmarks.md").read_text()


def test_llamaindex_store_script(tiny, tmp_path):
    pytest.importorskip("llama_index.core", reason="LlamaIndex adapter: pip install 'hybridret[llamaindex]'")
    out = _run(BENCH / "llamaindex_store.py", "--dataset", tiny / "tiny-beir", "--out", tmp_path / "li.json",
               cwd=tmp_path)
    assert "llamaindex store" in out
    rows = {r["way"]: r for r in json.loads((tmp_path / "li.json").read_text())["rows"]}
    assert set(rows) == {"hybridret docs", "hybridret chunks", "llamaindex store"}
    assert rows["llamaindex store"]["nodes"] >= rows["hybridret docs"]["nodes"] == 60
    assert all(0 < r["nDCG@10"] <= 1 for r in rows.values())


def test_text_filter_script_smoke(tmp_path):
    """text_filter.py --smoke: every $text engine (the shipped one, the fallback for segments without
    the phrases part, tantivy for words too) is exact against the brute-force scan on every filter kind."""
    out_json = tmp_path / "text_filter.json"
    _run(BENCH / "text_filter.py", "--smoke", "--out", out_json, cwd=tmp_path)
    data = json.loads(out_json.read_text())
    assert data["passages"] > 100 and set(data["kinds"]) >= {"word rare", "phrase 2", "phrase 3", "none 1 word"}
    assert all(all(k["exact"].values()) for k in data["kinds"].values())  # every engine, every filter
    assert data["build"]["phrases_part_bytes"] > 0 and data["build"]["phrases_part_build_s_median"] > 0


def test_rag_diversity_script(tiny, tmp_path):
    out = tmp_path / "results" / "rag-diversity.json"
    text = _run(BENCH / "rag_diversity.py", "--collections", "--beir", tiny / "tiny-beir", "--smoke", "--index-root",
                tmp_path / "indexes", "--out", out, cwd=tmp_path)
    assert "mean_cos" in text and "distinct_docs" in text
    rows = json.loads(out.read_text())["collections"]["tiny-beir"]["rows"]
    assert {(r["mode"], r["lambda"]) for r in rows} == {(m, lam) for m in ("chunks", "documents")
                                                         for lam in (1.0, 0.9, 0.7, 0.5)}
