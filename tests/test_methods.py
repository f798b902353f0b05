"""One method list (hybridret/methods.py): the CLI's --method choices, POST /search and Searcher.search
accept the same methods, and a retriever registered at run time with one call
(``hybridret.retrievers.register``) is a method in all three, searched through each."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hybridret.errors import ConfigError
from hybridret.methods import FUSION_METHODS, HYBRID, check_method, check_retriever_name, method_names
from hybridret.retrievers import REGISTRY, RETRIEVERS, BUILTIN as BUILTIN_RETRIEVERS, Retriever, register, unregister

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = ("hybrid", "dense", "sparse", "bm25", "sparse_approx", "linear", "rrf", "gqr")


class TitleWords(Retriever):
    """A retriever that reuses stored data only: a document scores the number of distinct query
    words in its title (0: no match, never returned)."""

    name = "title_words"
    needs = "text"  # the query text: nothing to encode

    def available(self, snap) -> bool:
        return True

    @staticmethod
    def _words(text: str) -> set[str]:
        return set(re.findall(r"\w+", text.lower()))

    def score_segment(self, snap, i, q, rows, ctx) -> np.ndarray:
        base = int(snap.offsets[i])
        out = np.zeros(rows.shape, dtype=np.float32)
        for a, text in enumerate(q.texts):
            words = self._words(text)
            for b, row in enumerate(rows[a]):
                if row >= 0:
                    out[a, b] = len(words & self._words(snap.get(base + int(row))[0]))
        return out

    def search_segment(self, snap, i, q, k, allowed, ctx) -> tuple[np.ndarray, np.ndarray]:
        n = snap.segments[i].num_docs
        cand = np.arange(n) if allowed is None else np.flatnonzero(allowed)
        rows = np.broadcast_to(cand, (len(q), len(cand)))
        scores = self.score_segment(snap, i, q, rows, ctx)
        scores = np.where(scores > 0, scores, -np.inf)
        order = np.lexsort((rows, -scores), axis=1)[:, :k]
        top_rows, top = np.take_along_axis(rows, order, axis=1), np.take_along_axis(scores, order, axis=1)
        top_rows = np.where(np.isfinite(top), top_rows, -1)
        pad = k - top_rows.shape[1]
        if pad > 0:
            top_rows = np.pad(top_rows, ((0, 0), (0, pad)), constant_values=-1)
            top = np.pad(top, ((0, 0), (0, pad)), constant_values=-np.inf)
        return top_rows, top


@pytest.fixture
def title_words():
    """TitleWords registered for one test (one registry call), unregistered afterwards."""
    retriever = register(TitleWords())
    try:
        yield retriever
    finally:
        unregister(TitleWords.name)
    assert TitleWords.name not in REGISTRY


@pytest.fixture(scope="module")
def retriever(tmp_path_factory, paired_encoder, small_corpus):
    from hybridret.retriever import HybridRetriever

    r = HybridRetriever(paired_encoder)
    r.index(small_corpus, workdir=tmp_path_factory.mktemp("methods") / "idx", show_progress=False)
    return r


def calibration_methods() -> tuple[str, ...]:
    from hybridret.search.calibrate import calibration_methods as methods

    return methods()


def cli_choices() -> dict[str, tuple[str, ...]]:
    """The --method choices of every subcommand that has one, from a parser built now."""
    from hybridret.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    out = {}
    for name, p in sub.choices.items():
        for action in p._actions:
            if "--method" in action.option_strings:
                out[name] = tuple(action.choices)
    return out


def api_methods(app) -> tuple[list[str], list[str]]:
    """(the methods /info lists, the enum of SearchRequest.method in the OpenAPI schema)."""
    from fastapi.testclient import TestClient

    with TestClient(app) as http:
        info = http.get("/info").json()["methods"]
        schema = http.get("/openapi.json").json()["components"]["schemas"]["SearchRequest"]
    return info, schema["properties"]["method"]["enum"]


# -- one list ------------------------------------------------------------------------------------------
def test_the_list_is_hybrid_the_registry_and_the_fusion_methods():
    assert method_names(BUILTIN_RETRIEVERS) == BUILTIN
    assert RETRIEVERS == ("dense", "sparse", "bm25")  # fused by default; sparse_approx is opt-in
    assert method_names(REGISTRY) == (HYBRID, *REGISTRY, *FUSION_METHODS)
    from hybridret.methods import FUSION_METHODS as fusion_of_hybrid
    from hybridret.search.searcher import METHODS

    assert fusion_of_hybrid is FUSION_METHODS
    assert METHODS == BUILTIN == __import__("hybridret").METHODS


ALL_AVAILABLE = {name: True for name in REGISTRY}


def test_cli_api_and_searcher_accept_the_same_methods(retriever):
    from hybridret.search.plan import plan_search
    from hybridret.search.request import SearchRequest as Request
    from hybridret.serve.app import SearchRequest, create_app

    names = method_names(REGISTRY)
    choices = cli_choices()
    assert set(choices) == {"search", "eval", "mine-negatives", "calibrate"}
    assert all(c == names for cmd, c in choices.items() if cmd != "calibrate")
    assert choices["calibrate"] == calibration_methods()  # the methods with relevance features: a subset
    assert set(calibration_methods()) < set(names)
    info, enum = api_methods(create_app(retriever))
    assert tuple(info) == tuple(enum) == names
    for m in names:
        assert SearchRequest(query="x", method=m).method == m
        assert plan_search(Request("x", 1, method=m), available=ALL_AVAILABLE).method == m
    for bad in ("vector", "", "Hybrid", "title_words"):
        with pytest.raises(ValueError, match="method"):
            SearchRequest(query="x", method=bad)
        with pytest.raises(ConfigError, match="unknown method"):
            plan_search(Request("x", 1, method=bad), available=ALL_AVAILABLE)


# -- a retriever registered at run time ----------------------------------------------------------------
def test_a_registered_retriever_is_a_method_everywhere(title_words, retriever):
    from hybridret.serve.app import create_app

    names = method_names(REGISTRY)
    assert names == (*BUILTIN[:5], "title_words", *FUSION_METHODS)
    assert all(c == names for cmd, c in cli_choices().items()  # a parser built after the registration
               if cmd != "calibrate")  # calibrate offers only methods with relevance features
    info, enum = api_methods(create_app(retriever))
    assert tuple(info) == tuple(enum) == names
    assert check_method("title_words", REGISTRY) == "title_words"


def test_a_registered_retriever_searches_through_searcher_api_and_cli(title_words, retriever, capsys):
    from fastapi.testclient import TestClient

    from hybridret.cli import main
    from hybridret.serve.app import create_app

    query = "the great wall and the tower"
    hits = retriever.searcher.search([query, "nothing matches zzz"], k=3, method="title_words")
    assert hits.method == "title_words"
    assert [(h.id, h.score) for h in hits[0][:2]] == [("d13", 3.0), ("d02", 2.0)]  # {the, great, wall}, {the, tower}
    assert set(hits.components) == {"title_words"}
    assert hits[1] == []  # a positive-only retriever returns no zero scores

    with TestClient(create_app(retriever)) as http:
        r = http.post("/search", json={"query": query, "k": 3, "method": "title_words"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["method"] == body["resolved"] == "title_words"
        got = [(h["id"], h["score"], set(h["scores"])) for h in body["results"][0]["hits"]]
        assert got == [(h.id, h.score, {"title_words"}) for h in hits[0]]

    path = str(retriever.path)
    assert main(["-q", "search", path, *query.split(), "--method", "title_words", "-k", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [h["id"] for h in out["hits"]] == [h.id for h in hits[0]]
    assert main(["-q", "search", path, "wall", "--method", "title_words", "--candidates", "5"]) == 1
    assert "single retriever" in capsys.readouterr().err


def test_after_unregister_the_method_is_gone(retriever):
    from fastapi.testclient import TestClient

    from hybridret.serve.app import create_app

    register(TitleWords())
    unregister("title_words")
    assert "title_words" not in method_names(REGISTRY)
    assert all("title_words" not in c for c in cli_choices().values())
    with pytest.raises(ConfigError, match="unknown method 'title_words'"):
        retriever.search("wall", method="title_words")
    with TestClient(create_app(retriever)) as http:
        r = http.post("/search", json={"query": "wall", "method": "title_words"})
        assert r.status_code == 422 and "unknown method" in r.json()["error"]["message"]


# -- register / unregister validate ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["", "hybrid", "rrf", "linear", "gqr", "1st", "a-b", "with space", "café", None, 3])
def test_register_refuses_a_bad_or_reserved_name(name):
    bad = type("Bad", (TitleWords,), {"name": name})
    with pytest.raises(ConfigError):
        register(bad())
    assert name not in REGISTRY or name in RETRIEVERS
    with pytest.raises(ConfigError):
        check_retriever_name(name)


def test_register_refuses_a_taken_name_unless_replace_and_non_retrievers(title_words):
    with pytest.raises(ConfigError, match="registered already"):
        register(TitleWords())
    again = TitleWords()
    assert register(again, replace=True) is again and REGISTRY["title_words"] is again
    with pytest.raises(ConfigError, match="registered already"):
        register(type("Dense2", (TitleWords,), {"name": "dense"})())
    with pytest.raises(ConfigError, match="Retriever instance"):
        register(TitleWords)  # the class, not an instance
    with pytest.raises(ConfigError, match="Retriever instance"):
        register(object())  # type: ignore[arg-type]


def test_unregister_refuses_builtins_and_unknown_names():
    for name in BUILTIN_RETRIEVERS:
        with pytest.raises(ConfigError, match="built-in"):
            unregister(name)
    with pytest.raises(ConfigError, match="no retriever named"):
        unregister("never_registered")
    assert tuple(REGISTRY) == BUILTIN_RETRIEVERS


# -- import-light ---------------------------------------------------------------------------------------
def test_methods_module_imports_only_the_standard_library_and_errors():
    tree = ast.parse((ROOT / "hybridret" / "methods.py").read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
    assert imported <= {"__future__", "collections.abc", ".errors"}, imported


def test_building_the_cli_parser_loads_no_engine():
    code = ("import sys; from hybridret.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'faiss', 'tantivy', 'transformers', 'fastapi', 'ray') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
