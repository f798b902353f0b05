"""The LIMIT-style generator (benchmarks/limit.py) builds what the paper describes, reproducibly."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from hybridret import CorpusReader, load_qrels, load_queries

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "limit.py"


def _module():
    spec = importlib.util.spec_from_file_location("limit_gen", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_structure_and_determinism(tmp_path):
    gen = _module()
    stats = gen.generate(tmp_path / "a", docs=300, queries=1000, core=46, per_doc=44, seed=7)
    assert stats["queries"] == 1000
    docs = {d.id: d.text for d in CorpusReader(tmp_path / "a")}
    queries = load_queries(tmp_path / "a" / "queries.jsonl")
    qrels = load_qrels(tmp_path / "a" / "qrels" / "test.tsv")
    assert len(docs) == 300 and len(queries) == 1000
    liked = {name: set(text.split(" likes ", 1)[1].rstrip(".").replace(" and ", ", ").split(", "))
             for name, text in docs.items()}
    assert all(len(v) == 44 for v in liked.values())
    core = set()
    pairs = set()
    for qid, text in queries.items():
        attr = text.removeprefix("Who likes ").removesuffix("?")
        relevant = set(qrels[qid])
        assert len(relevant) == 2
        assert {n for n, a in liked.items() if attr in a} == relevant  # exactly the two relevant people
        core |= relevant
        pairs.add(frozenset(relevant))
    assert len(core) <= 46 and len(pairs) == 1000  # one distinct core pair per query
    gen.generate(tmp_path / "b", docs=300, queries=1000, core=46, per_doc=44, seed=7)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    gen.generate(tmp_path / "c", docs=300, queries=1000, core=46, per_doc=44, seed=8)
    assert (tmp_path / "c" / "corpus.jsonl").read_bytes() != (tmp_path / "a" / "corpus.jsonl").read_bytes()
    first = json.loads((tmp_path / "a" / "corpus.jsonl").read_text().splitlines()[0])
    assert first["text"].startswith(first["_id"] + " likes ")
