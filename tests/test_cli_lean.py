"""A CLI that loads only what a command needs: no torch or transformers for BM25 search, info, get,
delete, compact or the evaluation of a stored run (checked in sys.modules of a fresh process, not by
timing); ``hybridret get``; ``hybridret search/get --server URL`` through a running server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybridret import HybridRetriever

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers")
NUMPY_BERT = "hybridret.encoders._tokenizer"  # loaded when a model runs on the numpy backend
ALL = (*HEAVY, "numba")  # numba too: loading its kernels costs ~1 s, and a small BM25 search needs none

# Runs one CLI command in a fresh interpreter and reports which heavy modules it imported.
PROBE = """
import json, sys
from hybridret.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
print("\\nPROBE " + json.dumps({"code": code, "loaded": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY + (NUMPY_BERT,),)


def probe(*argv: str, **extra_env: str) -> tuple[int, list[str], str]:
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDRET_ENCODER_BACKEND"}  # the CLI's own choice
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE", **extra_env)
    res = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=300)
    line = [x for x in res.stdout.splitlines() if x.startswith("PROBE ")]
    assert line, f"the command did not finish: {res.stdout}\n{res.stderr}"
    data = json.loads(line[-1][6:])
    return data["code"], data["loaded"], res.stdout + res.stderr


@pytest.fixture(scope="module")
def index(tmp_path_factory, paired_encoder, small_corpus) -> Path:
    root = tmp_path_factory.mktemp("lean") / "idx"
    HybridRetriever(paired_encoder).index(small_corpus, workdir=root)
    return root


@pytest.fixture
def copy(index, tmp_path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(index, out)
    return out


def test_info_loads_no_torch(index):
    code, loaded, out = probe("-q", "info", str(index))
    assert code == 0 and "documents:  40" in out
    assert loaded == [], f"hybridret info imported {loaded}"


def test_bm25_search_loads_no_torch(index):
    code, loaded, out = probe("-q", "search", str(index), "tectonic plates fault", "--method", "bm25", "-k", "1",
                              "--json")
    assert code == 0 and json.loads(out.split("\nPROBE")[0])["hits"][0]["id"] == "d23"
    assert loaded == [], f"a BM25 search imported {loaded}"  # numba neither: a small store searches in numpy


def test_hybrid_search_runs_the_models_on_numpy_and_torch_when_asked(index):
    """A query-side command runs the models on numpy even where torch is installed (its import costs
    more than the command's encoding); HYBRIDRET_ENCODER_BACKEND=torch brings torch back, and the probe
    sees it (the other side of the checks above)."""
    code, loaded, out = probe("-q", "search", str(index), "tectonic plates", "-k", "1", "--json")
    assert code == 0 and loaded == [NUMPY_BERT]
    first = json.loads(out.split("\nPROBE")[0])["hits"][0]
    code, loaded, out = probe("-q", "search", str(index), "tectonic plates", "-k", "1", "--json",
                              HYBRIDRET_ENCODER_BACKEND="torch")
    assert code == 0 and set(HEAVY) <= set(loaded) and NUMPY_BERT not in loaded
    again = json.loads(out.split("\nPROBE")[0])["hits"][0]
    assert again["id"] == first["id"] and again["score"] == pytest.approx(first["score"], rel=1e-4)


def test_the_query_side_preference_ends_with_the_command(index, capsys):
    from hybridret.cli import main
    from hybridret.encoders.backends import auto_override

    assert main(["-q", "search", str(index), "tectonic plates", "-k", "1"]) == 0
    assert auto_override() is None  # an in-process caller's encoders are not changed by a CLI call


def test_get_delete_compact_load_no_torch(copy):
    code, loaded, out = probe("get", str(copy), "d02", "d40")
    assert code == 0 and loaded == []
    docs = [json.loads(x) for x in out.split("\nPROBE")[0].splitlines() if x.startswith("{")]
    assert [d["id"] for d in docs] == ["d02", "d40"] and docs[0]["title"] == "The Eiffel Tower"
    code, loaded, _ = probe("-q", "delete", str(copy), "d02")
    assert code == 0 and not set(loaded) & set(HEAVY)
    code, loaded, _ = probe("-q", "compact", str(copy))  # rewrites the learned-sparse part: numba's kernels
    assert code == 0 and not set(loaded) & set(HEAVY)
    assert HybridRetriever.load(copy).get(["d02", "d03"])[0] is None


def test_eval_of_a_stored_run_loads_no_torch(tmp_path):
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 a 1 3.0 t\nq1 Q0 b 2 2.0 t\nq2 Q0 c 1 1.0 t\n", encoding="utf-8")
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\tb\t1\nq2\tc\t1\n", encoding="utf-8")
    code, loaded, out = probe("-q", "eval", "--run", str(run), "--qrels", str(qrels), "--metrics", "mrr@10", "--json")
    assert code == 0 and loaded == []
    result = json.loads(out.split("\nPROBE")[0])
    assert result["queries"] == 2 and result["metrics"]["mrr@10"] == pytest.approx((0.5 + 1.0) / 2)


def test_get_unknown_ids(index, capsys):
    from hybridret.cli import main

    assert main(["get", str(index), "d01", "nope"]) == 1
    cap = capsys.readouterr()
    assert json.loads(cap.out)["id"] == "d01"  # the known one is still printed
    assert "1 of 2 ids are not in the index: nope" in cap.err
    assert main(["-q", "get", str(index), "nope", "--ignore-missing"]) == 0
    assert main(["get", str(index)]) == 1 and "no ids" in capsys.readouterr().err


def test_search_and_get_through_a_server(copy, start_server, capsys):
    from hybridret.cli import main

    _, url = start_server(copy)
    assert main(["-q", "search", "--server", url, "tectonic", "plates", "-k", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["query"] == "tectonic plates" and out["hits"][0]["id"] == "d23"
    assert main(["-q", "search", "--server", url, "chocolate", "--method", "bm25", "-k", "1"]) == 0
    assert "1. d39" in capsys.readouterr().out
    assert main(["get", "--server", url, "d40", "d01"]) == 0
    assert [json.loads(x)["id"] for x in capsys.readouterr().out.splitlines()] == ["d40", "d01"]
    queries = copy.parent / "q.txt"
    queries.write_text("penguins seabirds\nroman empire\n", encoding="utf-8")
    assert main(["-q", "search", "--server", url, "--queries", str(queries), "-k", "1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["hits"][0]["id"] for x in lines] == ["d25", "d28"]


@pytest.mark.parametrize("command", ["search", "get"])
def test_no_dir_and_no_server_is_a_usage_error(capsys, command):
    from hybridret.cli import main

    with pytest.raises(SystemExit) as exc:
        main([command])
    assert exc.value.code == 2
    assert "required: DIR (or --server URL)" in capsys.readouterr().err


def test_duplicate_id_add_error_is_about_the_id(copy, tmp_path, capsys):
    from hybridret.cli import main

    doc = tmp_path / "dup.jsonl"
    doc.write_text('{"_id": "d01", "text": "again"}\n', encoding="utf-8")
    assert main(["-q", "add", str(copy), str(doc)]) == 1
    err = capsys.readouterr().err.strip()
    assert "'d01' is already in the index" in err and "--upsert" in err
    assert "disk full" not in err and "while writing" not in err
