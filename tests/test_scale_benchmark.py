"""CI smoke of benchmarks/scale_sparse.py: ``--smoke`` as a user runs it, from a fresh clone (it
encodes its own 200-passage source index into a temporary folder), and the JSON it writes.

The smoke is one 10k corpus resampled from the source, 40 queries, every step in-process; it must
stay well under a minute. Every search path is in the JSON, run or with the reason it was not
(bm25s is a bench extra that CI does not install), and the exact paths that ran agree with brute
force (learned sparse, dense) or with today's exhaustive BM25 on every query.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "scale_sparse.py"

GROUP_PATHS = {
    "learned": ("impact-exact", "impact-approx", "tantivy-exact", "numpy-inverted", "scipy-brute"),
    "bm25": ("bm25-store", "bm25-store-pruned", "bm25s-numba", "bm25s-numba-pretokenised"),
    "dense": ("dense-hybridret", "dense-faiss", "dense-numpy", "dense-hybridret-b256", "dense-hybridret-single",
              "dense-faiss-single", "dense-numpy-single"),
    "hybrid": ("hybrid-default", "hybrid-default-today", "retriever-dense", "retriever-sparse", "retriever-bm25"),
}
MUST_RUN = ("impact-exact", "impact-approx", "tantivy-exact", "numpy-inverted", "scipy-brute", "bm25-store",
            "dense-hybridret", "dense-faiss", "dense-numpy", "hybrid-default", "hybrid-default-today")


@pytest.mark.slow
def test_scale_sparse_smoke(tmp_path: Path) -> None:
    out, plot = tmp_path / "scale-sparse.json", tmp_path / "scale-sparse.png"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--index", str(tmp_path / "source"),
                           "--workdir", str(tmp_path), "--out", str(out), "--plot", str(plot)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t0
    assert proc.returncode == 0, f"scale_sparse.py --smoke failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(f"scale_sparse.py --smoke took {took:.0f} s")
    doc = json.loads(out.read_text())
    assert list(doc["sizes"]) == ["10000"], doc.get("skipped")
    res = doc["sizes"]["10000"]
    assert res["resampled"] and res["build"]["docs"] == 10000
    assert {"dense", "sparse", "bm25"} <= set(res["build"]["parts"])
    assert "resampled" in doc["method"] and doc["queries"]["count"] > 0
    for group, names in GROUP_PATHS.items():
        got = res[group]["paths"]
        for name in names:
            assert name in got, f"{group}: {name} missing from the JSON"
            p = got[name]
            if not p.get("available"):
                assert name not in MUST_RUN, f"{name} did not run: {p.get('reason')}"
                assert p.get("reason"), f"{name} did not run and says no reason"
                continue
            assert p["ms_per_query"] > 0, name
            if name in doc["exact_paths"] or name == "bm25-store":
                assert p["top10_exact"] == 1.0, f"{name}: top-10 differs from the reference on some queries"
    approx = res["learned"]["paths"]["impact-approx"]
    assert 0.0 < approx["recall_at_10"] <= 1.0
    assert 0.0 <= res["hybrid"]["paths"]["hybrid-default-today"]["same_top10_as_default"] <= 1.0
    assert plot.is_file() or "no plot" in doc["plot"]
    assert res["ratios"]["impact exact vs numpy inverted (x faster)"] > 0
    # benchmarks/dense_ann.py on the same source index: the compressed dense part at 3,000 resampled
    # vectors (the size rule's threshold set to 0), its recall against exact and its memory
    dense_out = tmp_path / "dense-ann.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dense_ann.py"), "--smoke", "--index",
                           str(tmp_path / "source"), "--workdir", str(tmp_path), "--out", str(dense_out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"dense_ann.py --smoke failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (dense,) = json.loads(dense_out.read_text())["results"]
    assert dense["size"] == 3000 and dense["factory"].endswith("RaBitQfs") and dense["nprobe"] >= 1
    assert 0.5 <= dense["recall_real"] <= 1.0 and dense["x_flat"] > 0
    assert dense["index_bytes_per_vector"] < dense["float32_bytes_per_vector"] / 4  # the memory target
    assert {(g["nprobe"], g["candidates"]) for g in dense["grid"]} == {(4, 40), (4, 100), (8, 40), (8, 100)}
