"""The reranker's offline route: a cross-encoder folder on disk (a tiny one written here with
transformers from a config, random weights, ``save_pretrained``) reranks through the library, the
CLI and a server with no Hub access at all (``HF_HUB_OFFLINE=1`` and an empty Hugging Face cache);
without torch, the CLI and ``serve --rerank`` stop with one line naming the extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _tiny_models import tiny_cross_encoder

from hybridret import HybridRetriever
from hybridret.search.rerank import CrossEncoderReranker

REPO = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).resolve().parent / "_no_torch.py"
QUERY = "What happens when a star exhausts its hydrogen?"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, paired_encoder, small_corpus):
    root = tmp_path_factory.mktemp("offline")
    folder = tiny_cross_encoder(root / "models" / "ce")
    HybridRetriever(paired_encoder).index(small_corpus, workdir=root / "idx", show_progress=False)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HOME=str(root / "empty-hf-home"), OMP_WAIT_POLICY="PASSIVE")
    return root, folder, env


def _run(args: list[str], env: dict[str, str], *, no_torch: bool = False) -> tuple[int, str, str]:
    cmd = [sys.executable, str(RUNNER), *args] if no_torch else [sys.executable, "-m", "hybridret", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    return res.returncode, res.stdout, res.stderr


def test_a_folder_on_disk_reranks_with_no_hub_access(setup):
    root, folder, env = setup
    assert sorted(p.name for p in folder.iterdir()) >= ["config.json", "model.safetensors"]
    code, out, err = _run(["-q", "search", str(root / "idx"), QUERY, "-k", "4", "--rerank", str(folder),
                           "--rerank-depth", "10", "--json"], env)
    assert code == 0, err
    hits = json.loads(out)["hits"]
    scores = [h["scores"]["rerank"] for h in hits]
    assert len(hits) == 4 and scores == sorted(scores, reverse=True)
    # the library's answer with the same folder (loaded here, in this process) is the CLI's
    local = HybridRetriever.load(root / "idx").search(QUERY, k=4, rerank=str(folder), rerank_depth=10)
    assert [h["id"] for h in hits] == local.ids[0].tolist()
    np.testing.assert_allclose(scores, local.components["rerank"][0], rtol=1e-4, atol=1e-5)
    assert not (root / "empty-hf-home").exists() or not any((root / "empty-hf-home").rglob("*.safetensors"))


def test_a_server_reranks_with_the_folder(setup, start_server):
    httpx = pytest.importorskip("httpx")
    root, folder, _ = setup
    _, url = start_server(root / "idx", "--rerank", str(folder))
    body = {"query": QUERY, "k": 3, "rerank": True, "rerank_depth": 8}
    hits = httpx.post(f"{url}/search", json=body, timeout=120).json()["results"][0]["hits"]
    want = CrossEncoderReranker(folder)
    texts = [f"{h['title']}\n{h['text']}" if h["title"] else h["text"] for h in hits]
    np.testing.assert_allclose([h["scores"]["rerank"] for h in hits], want.scores(QUERY, texts), rtol=1e-4,
                               atol=1e-5)


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_without_torch_the_reranker_says_so_in_one_line(setup):
    root, folder, env = setup
    code, _, err = _run(["-q", "search", str(root / "idx"), QUERY, "--rerank", str(folder)], env, no_torch=True)
    line = _one_line(err)
    assert code == 1 and "the cross-encoder reranker needs torch" in line and "pip install 'hybridret[torch]'" in line
    code, _, err = _run(["-q", "serve", str(root / "idx"), "--rerank", str(folder), "--port", "9"], env,
                        no_torch=True)
    line = _one_line(err)  # before the server starts, not at the first request
    assert code == 1 and f"--rerank {folder}" in line and "pip install 'hybridret[torch]'" in line
    assert "without --rerank" in line
