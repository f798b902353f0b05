"""Bounded resources: one argument (k, candidates, a fusion depth, a batch size, a filter's list, a
request body) never makes memory or work grow beyond what the index holds or a documented limit.

The searches run in a child process under an address-space limit (``RLIMIT_AS``), so an
allocation that follows the argument (``k=10**9`` -> gigabytes) fails there instead of taking the
machine down."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from _serving import serving

from hybridret import HybridRetriever
from hybridret.errors import ConfigError
from hybridret.filters import MAX_IN_VALUES, FilterError
from hybridret.fusion.config import MAX_CANDIDATES, FusionConfig

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
HUGE = 10**9
LIMIT = 6 << 30  # the child's address space: a search of 40 documents needs far less; k=10**9 rows need 8 GiB
METHODS = ("dense", "sparse", "bm25", "hybrid", "linear", "rrf", "gqr")


@pytest.fixture(scope="module")
def index(paired_encoder, small_corpus, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("limits") / "idx"
    docs = [dict(d, metadata={"kind": "odd" if i % 2 else "even"}) for i, d in enumerate(small_corpus)]
    HybridRetriever(paired_encoder).index(docs, workdir=path)
    return path


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def run_limited(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV, cwd=REPO,
                          timeout=300, preexec_fn=limited)


LIBRARY = """
import json, sys
from hybridret import HybridRetriever
r = HybridRetriever.load(sys.argv[1])
out = {}
for m in %r:
    fused = m not in ("dense", "sparse", "bm25")
    h = r.search(["honey bees", "a tower in Paris"], k=%d, method=m, candidates=%d if fused else None)
    f = r.search("honey bees", k=%d, method=m, filter={"kind": "odd"})
    out[m] = [list(h.ids.shape), int((h.rows >= 0).sum()), int((f.rows >= 0).sum())]
print(json.dumps(out))
""" % (METHODS, HUGE, HUGE, HUGE)


def test_k_far_beyond_the_index_in_every_method_stays_small(index):
    proc = run_limited(LIBRARY, str(index))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    for method, (shape, found, filtered) in got.items():
        assert shape == [2, 40], (method, shape)  # as many columns as the index has documents
        lexical = method in ("sparse", "bm25")  # these return only documents sharing a term
        assert found == 80 or lexical and found > 0, (method, found)  # every document
        assert filtered == 20 or lexical and filtered <= 20, (method, filtered)  # the filter's 20 documents


def test_a_huge_batch_size_and_chunk_size_index_in_bounded_memory(tmp_path, small_corpus):
    code = ("import sys, json; from hybridret import HybridRetriever; docs = json.loads(sys.argv[2]); "
            "r = HybridRetriever.from_models().index(docs, workdir=sys.argv[1], batch_size=10**9, chunk_size=10**9); "
            "r.add([{'id': 'new', 'text': 'a new one'}], batch_size=10**9, chunk_size=10**9); print(r.num_docs)")
    proc = run_limited(code, str(tmp_path / "idx"), json.dumps(small_corpus[:10]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "11"


# Through the CLI: the model-free BM25 path and the hybrid that loads both models (every method's huge k in
# the library: test_k_far_beyond_the_index_in_every_method_stays_small)
@pytest.mark.parametrize("method", ["bm25", "hybrid"])
def test_cli_search_with_a_huge_k(index, method):
    proc = subprocess.run([sys.executable, "-m", "hybridret", "search", str(index), "honey bees", "-k", str(HUGE),
                           "--method", method, "--json"], capture_output=True, text=True, env=ENV, cwd=REPO,
                          timeout=300, preexec_fn=limited)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "d05" in proc.stdout  # the honey-bee passage is among the hits


def test_cli_batch_search_with_huge_k_and_batch_size(index, tmp_path):
    queries = tmp_path / "q.tsv"
    queries.write_text("q1\thoney bees\nq2\tthe eiffel tower\n")
    proc = subprocess.run([sys.executable, "-m", "hybridret", "search", str(index), "--queries", str(queries),
                           "--batch-size", str(HUGE), "-k", str(HUGE), "--candidates", str(HUGE), "--trec",
                           str(tmp_path / "run.trec")], capture_output=True, text=True, env=ENV, cwd=REPO, timeout=300,
                          preexec_fn=limited)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (tmp_path / "run.trec").read_text().splitlines()
    assert len(lines) == 80  # every document for each query, nothing more


def test_fused_depths_are_bounded_by_a_documented_limit():
    with pytest.raises(ConfigError, match=f"between 1 and {MAX_CANDIDATES}"):
        FusionConfig(depth=HUGE)
    with pytest.raises(ConfigError, match="depth must be an integer"):
        FusionConfig.from_dict({"depth": "deep"})


def test_filter_lists_are_bounded(index):
    from hybridret import Searcher

    s = Searcher(index)
    ok = s.search("bees", k=3, method="bm25", filter={"kind": {"$in": ["odd"] * MAX_IN_VALUES}})
    assert ok.ids.shape == (1, 3)
    with pytest.raises(FilterError, match=f"at most {MAX_IN_VALUES}"):
        s.search("bees", k=3, method="bm25", filter={"kind": {"$in": list(range(MAX_IN_VALUES + 1))}})


@pytest.fixture(scope="module")
def served(index, paired_encoder):
    """A real uvicorn server on loopback over the module's index."""
    pytest.importorskip("fastapi")


    from hybridret.serve.app import ServeConfig, create_app

    retriever = HybridRetriever.load(index, encoder=paired_encoder)
    with serving(create_app(retriever, ServeConfig())) as url:
        yield url


def test_api_bounds_k_candidates_and_fusion_depth(served):
    import httpx

    with httpx.Client(base_url=served, timeout=60) as http:
        for method in METHODS:  # the largest k the API takes, far beyond the 40 documents
            fused = method not in ("dense", "sparse", "bm25")
            body = {"query": "honey bees", "k": 1000, "method": method, **({"candidates": 10_000} if fused else {})}
            resp = http.post("/search", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["results"][0]["hits"][0]["id"]
        for body in ({"query": "bees", "k": HUGE}, {"query": "bees", "candidates": HUGE},
                     {"query": "bees", "fusion": {"depth": HUGE}}):
            resp = http.post("/search", json=body)
            assert resp.status_code in (400, 422), resp.text
            assert "Traceback" not in resp.text
        big = http.post("/search", content=b'{"query": "' + b"a" * (17 << 20) + b'"}',
                        headers={"content-type": "application/json"})
        assert big.status_code == 413
