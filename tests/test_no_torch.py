"""hybridret without torch and transformers (``sys.modules[...] = None`` in a fresh interpreter, so every
import of them fails as for a missing package): the demo, index, search, serve and the library's build
and search run on the onnx backend (numpy where onnxruntime is absent); every torch-only path says which extra to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUNNER = Path(__file__).resolve().parent / "_no_torch.py"
SAMPLE = REPO / "hybridret" / "resources" / "sample"
EXTRA = "pip install 'hybridret[torch]'"


def no_torch(*args: str, timeout: float = 300) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
    res = subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=timeout)
    out = res.stdout + res.stderr
    line = [x for x in res.stdout.splitlines() if x.startswith("NO_TORCH ")]
    assert line and json.loads(line[-1][9:])["loaded"] == [], out
    return res.returncode, out


def test_demo_index_search_without_torch(tmp_path: Path) -> None:
    code, out = no_torch("-q", "demo", "-o", str(tmp_path / "demo"))
    assert code == 0, out
    assert "Try: hybridret search" in out and "ModuleNotFoundError" not in out
    code, out = no_torch("-q", "index", str(SAMPLE / "corpus.jsonl"), "-o", str(tmp_path / "idx"))
    assert code == 0, out
    code, out = no_torch("-q", "search", str(tmp_path / "idx"), "What did Jocelyn Bell Burnell discover in 1967?",
                         "-k", "3", "--json")
    assert code == 0, out
    hits = json.loads(out.split("\nNO_TORCH")[0])["hits"]
    assert len(hits) == 3 and all(h["score"] for h in hits)


def test_torch_only_paths_name_the_extra(tmp_path: Path) -> None:
    code, out = no_torch("-q", "index", str(SAMPLE / "corpus.jsonl"), "-o", str(tmp_path / "idx"),
                         "--encoder-backend", "torch-int8")
    assert code == 1 and EXTRA in out and "Traceback" not in out, out
    script = f"""
from hybridret.errors import MissingDependencyError
def says(fn):
    try:
        fn()
    except MissingDependencyError as exc:
        assert {EXTRA!r} in str(exc), exc
        assert isinstance(exc, ImportError)
        return
    raise AssertionError("no MissingDependencyError")
from hybridret.encoders import DenseEncoder, SpladeEncoder
says(lambda: DenseEncoder(backend="torch"))
says(lambda: SpladeEncoder(device="cuda"))
from hybridret import CrossEncoderReranker
import shutil, pathlib
from hybridret.models import resolve_model
ce = pathlib.Path({str(tmp_path)!r}) / "ce"
shutil.copytree(resolve_model("all-MiniLM-L6-v2"), ce)
says(lambda: CrossEncoderReranker(ce))
from hybridret.train import TrainConfig
says(lambda: __import__("hybridret.train.model"))
"""
    code, out = no_torch("--code", script)
    assert code == 0, out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_library_and_server_without_torch(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    script = f"""
import sys
sys.path.insert(0, {str(REPO / "tests")!r})
from _serving import serving
from hybridret import CorpusReader, HybridRetriever, load_queries
from hybridret.client import Client
from hybridret.serve.app import create_app
r = HybridRetriever.from_models().index(CorpusReader({str(SAMPLE / "corpus.jsonl")!r}), workdir={str(tmp_path / "lib")!r})
import importlib.util
want = "onnx" if importlib.util.find_spec("onnxruntime") else "numpy"  # auto: onnx where installed
assert r.encoder.dense.runner.backend == want and r.encoder.sparse.runner.backend == want
queries = list(load_queries({str(SAMPLE / "queries.jsonl")!r}).values())[:5]
want = r.search(queries, k=5).ids.tolist()
for method in ("dense", "sparse", "hybrid", "bm25"):
    assert len(r.search(queries[0], k=5, method=method).ids[0]) == 5
loaded = HybridRetriever.load({str(tmp_path / "lib")!r})
assert loaded.search(queries, k=5).ids.tolist() == want
with serving(create_app({str(tmp_path / "lib")!r})) as url, Client(url) as client:
    got = client.search(queries, k=5)
    assert got.ids.tolist() == want, (got.ids, want)
print("served", len(want))
"""
    code, out = no_torch("--code", script)
    assert code == 0 and "served 5" in out, out
