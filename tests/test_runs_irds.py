"""TREC / MS MARCO run files, and the optional ir_datasets reader."""

from __future__ import annotations

import pytest

from hybridret.errors import ConfigError, CorpusFormatError
from hybridret.runs import load_run, write_run


def test_trec_run_round_trip_is_best_first(tmp_path):
    run = {"q1": {"d1": 0.5, "d2": 2.0, "d3": 1.0}, "q2": {"d9": -1.0}}
    path = write_run(run, tmp_path / "run.trec", tag="mine")
    lines = path.read_text().splitlines()
    assert lines[0] == "q1 Q0 d2 1 2.000000 mine"
    assert [ln.split()[2] for ln in lines[:3]] == ["d2", "d3", "d1"]
    assert load_run(path) == run


def test_msmarco_run_scores_by_rank(tmp_path):
    path = write_run({"7": {"a": 3.0, "b": 9.0}}, tmp_path / "run.tsv", format="msmarco")
    assert path.read_text() == "7\tb\t1\n7\ta\t2\n"
    loaded = load_run(path)
    assert sorted(loaded["7"], key=loaded["7"].get, reverse=True) == ["b", "a"]


@pytest.mark.parametrize("body, match", [
    ("q1 Q0 d1 1 0.5 t\nq1 Q0 d2 2\n", "bad.trec:2: expected 6 columns like the first"),
    ("q1 Q0 d1 1 high t\n", "score must be a number"),
    ("q1 Q0 d1 1 0.5 t\nq1 Q0 d1 2 0.4 t\n", "listed twice"),
    ("q1 d1\n", "expected 6 columns"),
])
def test_bad_run_lines_are_named(tmp_path, body, match):
    path = tmp_path / "bad.trec"
    path.write_text(body)
    with pytest.raises(CorpusFormatError, match=match) as err:
        load_run(path)
    assert "bad.trec" in str(err.value)


def test_ir_datasets_local_dataset(tmp_path):
    ir_datasets = pytest.importorskip("ir_datasets")
    from ir_datasets.datasets.base import Dataset
    from ir_datasets.formats import TrecQrels, TsvDocs, TsvQueries
    from ir_datasets.util import LocalDownload

    from hybridret.irds import load_ir_dataset

    (tmp_path / "docs.tsv").write_text("d1\tthe tide is high\nd2\tpython code\n")
    (tmp_path / "queries.tsv").write_text("q1\twhat causes tides\n")
    (tmp_path / "qrels.txt").write_text("q1 0 d1 1\n")
    name = f"hybridret-test/{tmp_path.name}"
    ir_datasets.registry.register(name, Dataset(
        TsvDocs(LocalDownload(tmp_path / "docs.tsv")), TsvQueries(LocalDownload(tmp_path / "queries.tsv")),
        TrecQrels(LocalDownload(tmp_path / "qrels.txt"), {1: "relevant"})))
    docs, queries, qrels = load_ir_dataset(name)
    assert [(d.id, d.text) for d in docs] == [("d1", "the tide is high"), ("d2", "python code")]
    assert queries == {"q1": "what causes tides"} and qrels == {"q1": {"d1": 1}}
    with pytest.raises(ConfigError, match="unknown ir_datasets id"):
        load_ir_dataset("no-such/dataset")
    (tmp_path / "docs.tsv").unlink()
    with pytest.raises(ConfigError, match="not on this machine"):
        load_ir_dataset(name)
