"""CI smoke of benchmarks/rag.py: ``--smoke`` as a user runs it (300 chunks of the shared MS MARCO
pool, 4 queries), and the JSON it writes. Skips when the shared pool is absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "rag.py"
POOL = ROOT.parent / "shared" / "data" / "msmarco-dl19-pool"


@pytest.mark.slow
@pytest.mark.skipif(not (POOL / "corpus.jsonl").is_file(), reason=f"the shared MS MARCO pool is not at {POOL}")
def test_rag_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "rag.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--workdir", str(tmp_path), "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"rag.py --smoke failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["smoke"] and doc["documents"]["chunks"] >= 300 and doc["documents"]["queries"] == 4
    for method in ("dense", "sparse", "bm25", "hybrid"):
        res = doc["methods"][method]
        flat, grouped = res["chunks@10"], res["group max"]
        assert flat["distinct_docs_top10"] <= 10 and grouped["distinct_docs_top10"] == 10
        assert grouped["distinct_docs_top10"] >= flat["distinct_docs_top10"]
        if res["chunks@30->10"]["distinct_docs_top10"] == 10:  # 30 chunks held 10 documents for every query:
            # grouping by max = the first 10 distinct documents of a deep enough chunk list
            assert grouped["doc_ndcg@10"] == res["chunks@30->10"]["doc_ndcg@10"]
        assert 0 <= grouped["doc_ndcg@10"] <= 1
        assert res["ms_per_query"]["group@10"] > 0
        assert ("group decayed" in res) == (method != "hybrid")
    assert doc["rerank"]["ms_per_query"] > 0 and doc["rerank"]["depth"] == 10
    assert "| method" in proc.stdout
