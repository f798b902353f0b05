"""Parquet and Arrow input: the corpus reader (files, folders, column mapping, bad input), the
library's index / add / upsert of pyarrow Tables and RecordBatches, and the CLI's index and add."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from hybridret import HybridRetriever  # noqa: E402
from hybridret.cli import main  # noqa: E402
from hybridret.data import CorpusReader, detect_corpus_format  # noqa: E402
from hybridret.errors import ConfigError, CorpusFormatError, MissingDependencyError  # noqa: E402

ROWS = [
    {"doc_id": "astro", "title": "Black holes", "body": "A black hole forms when a massive star collapses.",
     "source": "wiki", "year": 2020},
    {"doc_id": "bread", "title": None, "body": "Sourdough bread rises thanks to wild yeast in the starter.",
     "source": "blog", "year": None},
    {"doc_id": "rail", "title": "Shinkansen", "body": "Japan's high-speed trains reach 320 km/h on dedicated tracks.",
     "source": "wiki", "year": 2021},
]


def _table(rows: list[dict]) -> pa.Table:
    return pa.table({k: [r.get(k) for r in rows] for k in rows[0]})


def _write(path: Path, rows: list[dict], **kw) -> Path:
    pq.write_table(_table(rows), path, **kw)
    return path


MAPPING = {"id": "doc_id", "text": "body"}


# -- the reader ---------------------------------------------------------------------------------------
def test_reader_defaults_mapping_and_metadata(tmp_path):
    rows = [{"_id": "a", "title": "T", "text": "hello", "source": "wiki", "n": 1,
             "metadata": {"lang": "en", "tags": ["x"]}},
            {"_id": "b", "title": None, "text": "world", "source": None, "n": 2, "metadata": None}]
    f = _write(tmp_path / "c.parquet", rows)
    assert detect_corpus_format(f) == "parquet"
    reader = CorpusReader(f)
    assert reader.format == "parquet" and reader.num_rows == 2
    docs = list(reader)
    assert [(d.id, d.title, d.text) for d in docs] == [("a", "T", "hello"), ("b", "", "world")]
    # other columns and the metadata struct become metadata; nulls are absent values, not stored
    assert docs[0].metadata == {"source": "wiki", "n": 1, "lang": "en", "tags": ["x"]}
    assert docs[1].metadata == {"n": 2}
    only = list(CorpusReader(f, columns={"metadata": ["n"]}))
    assert [d.metadata for d in only] == [{"n": 1}, {"n": 2}]
    assert [d.metadata for d in CorpusReader(f, columns={"metadata": []})] == [{}, {}]


def test_reader_json_metadata_column_dates_and_integer_ids(tmp_path):
    import datetime

    t = pa.table({"id": pa.array([7, 8], pa.int64()), "text": ["x", "y"],
                  "metadata": ['{"a": {"b": 1}}', None],
                  "when": [datetime.date(2024, 1, 2), None]})
    pq.write_table(t, tmp_path / "c.parquet")
    docs = list(CorpusReader(tmp_path / "c.parquet"))
    assert [d.id for d in docs] == ["7", "8"]
    assert docs[0].metadata == {"a": {"b": 1}, "when": "2024-01-02"} and docs[1].metadata == {}


def test_reader_folder_of_files_in_name_order(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "part=2").mkdir(parents=True)
    _write(folder / "a.parquet", ROWS[:2])
    _write(folder / "part=2" / "b.parquet", ROWS[2:])
    (folder / "_SUCCESS").write_text("")
    assert detect_corpus_format(folder) == "parquet"
    reader = CorpusReader(folder, columns=MAPPING)
    assert reader.num_rows == 3
    assert [d.id for d in reader] == ["astro", "bread", "rail"]


def test_reader_streams_row_group_by_row_group(tmp_path):
    """Documents come out before a later row group is read: the bad row in group 2 fails only when reached."""
    rows = [{"id": f"d{i}", "text": f"text {i}"} for i in range(6)]
    rows[5]["id"] = None
    f = _write(tmp_path / "c.parquet", rows, row_group_size=2)
    it = iter(CorpusReader(f))
    assert [next(it).id for _ in range(5)] == ["d0", "d1", "d2", "d3", "d4"]
    with pytest.raises(CorpusFormatError) as exc:
        next(it)
    assert str(exc.value) == f"{f}: row group 2, row 1 (row 5 of the file, counting from 0): the id ('id') is null"


@pytest.mark.parametrize("table, columns, message", [
    ({"doc_id": ["a"], "text": ["x"]}, None, "no id column (expected '_id' or 'id'; the columns are: doc_id, text); "
                                             "name it with --id-column"),
    ({"id": ["a"], "body": ["x"]}, {"text": "nope"}, "no text column 'nope' (the columns are: id, body)"),
    ({"id": [1.5], "text": ["x"]}, None, "the id column 'id' has type double; ids must be strings or integers"),
    ({"id": ["a"], "text": [3]}, None, "the column 'text' has type int64; it must hold strings"),
    ({"id": ["a"], "text": ["x"]}, {"metadata": ["tags"]}, "no metadata column 'tags'"),
    ({"id": ["a"], "text": ["x"], "metadata": [1]}, None, "the column 'metadata' has type int64"),
])
def test_reader_refuses_bad_columns_before_reading(tmp_path, table, columns, message):
    f = tmp_path / "c.parquet"
    pq.write_table(pa.table(table), f)
    with pytest.raises(CorpusFormatError) as exc:
        CorpusReader(f, columns=columns)  # at construction: before any model would load
    assert str(exc.value).startswith(f"{f}: ") and message in str(exc.value)


def test_reader_bad_rows_name_file_row_group_and_row(tmp_path):
    a = _write(tmp_path / "a.parquet", [{"id": "x", "text": "one"}])
    b = _write(tmp_path / "b.parquet", [{"id": "y", "text": "two"}, {"id": "x", "text": "three"}])
    with pytest.raises(CorpusFormatError, match=rf"duplicate document id 'x': at {a}: row group 0, row 0 .* and at "
                                                rf"{b}: row group 0, row 1"):
        list(CorpusReader(tmp_path))
    bad = tmp_path / "m.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"], "metadata": ['{"k": 1}', "[1, 2]"]}), bad)
    with pytest.raises(CorpusFormatError, match=r"m.parquet: row group 0, row 1 .*\(id 'b'\): column 'metadata' must "
                                                "hold a JSON object"):
        list(CorpusReader(bad))
    blob = tmp_path / "blob.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["x"], "raw": [b"\x00"]}), blob)
    with pytest.raises(CorpusFormatError, match="column 'raw' holds binary data.*--metadata-columns"):
        list(CorpusReader(blob))
    assert [d.metadata for d in CorpusReader(blob, columns={"metadata": []})] == [{}]


def test_reader_blank_rows_are_counted_and_other_inputs_refused(tmp_path):
    f = _write(tmp_path / "c.parquet", [{"id": "a", "title": None, "text": None}, {"id": "b", "title": "", "text": "y"}])
    reader = CorpusReader(f)
    assert [d.id for d in reader] == ["b"] and reader.skipped_empty == 1
    with pytest.raises(CorpusFormatError, match=r"row group 0, row 0 .*document 'a' has empty title and text"):
        list(CorpusReader(f, on_empty="error"))
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(CorpusFormatError, match="junk.parquet: not a readable Parquet file"):
        CorpusReader(junk)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusFormatError, match="neither a BEIR folder"):
        CorpusReader(tmp_path / "empty")
    (tmp_path / "c.jsonl").write_text('{"id": "a", "text": "x"}\n')
    with pytest.raises(ConfigError, match="applies to Parquet input only"):
        CorpusReader(tmp_path / "c.jsonl", columns={"id": "a"})
    with pytest.raises(CorpusFormatError, match="Parquet is not read from a stream"):
        CorpusReader("-", format="parquet")


def test_without_pyarrow_the_error_names_the_extra(tmp_path, monkeypatch):
    f = _write(tmp_path / "c.parquet", [{"id": "a", "text": "x"}])
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'hybridret\[parquet\]'"):
        CorpusReader(f)


# -- the library --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def arrow_index(paired_encoder, tmp_path_factory):
    root = tmp_path_factory.mktemp("arrow") / "idx"
    r = HybridRetriever(paired_encoder)
    r.index(_table(ROWS[:2]), columns=MAPPING, workdir=root)
    return root


def test_library_table_batches_and_upsert(arrow_index, paired_encoder):
    r = HybridRetriever.load(arrow_index, encoder=paired_encoder)
    assert r.num_docs == 2
    assert r.get("astro")[0]["metadata"] == {"source": "wiki", "year": 2020}
    batch = _table(ROWS[2:]).to_batches()[0]
    result = r.add([batch], columns=MAPPING)  # an iterable of record batches
    assert result.added == 1 and r.search("high-speed trains", k=1, method="bm25").ids[0][0] == "rail"
    changed = pa.table({"id": ["bread"], "text": [ROWS[1]["body"]], "source": ["book"]})
    result = r.upsert(changed)  # default columns: id, text; the text is unchanged, nothing re-encoded
    assert result.updated == 1 and result.encoded == 0
    assert r.get("bread")[0]["metadata"] == {"source": "book"}
    with pytest.raises(CorpusFormatError, match=r"table: batch 0, row 0 .*the id \('id'\) is null"):
        r.add(pa.table({"id": pa.array([None], pa.string()), "text": ["x"]}))
    assert r.num_docs == 3  # nothing was written by the refused add


# -- the CLI ------------------------------------------------------------------------------------------
def test_cli_index_and_add_parquet(tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    _write(folder / "part-0.parquet", ROWS[:2])
    out = tmp_path / "idx"
    assert main(["-q", "index", str(folder), "-o", str(out), "--id-column", "doc_id", "--text-column", "body",
                 "--metadata-columns", "source"]) == 0
    more = _write(tmp_path / "more.parquet", ROWS[2:])
    assert main(["-q", "add", str(out), str(more), "--id-column", "doc_id", "--text-column", "body", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["added"] == 1
    assert main(["-q", "get", str(out), "rail", "bread"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["id"], d["metadata"]) for d in got] == [("rail", {"source": "wiki", "year": 2021}),
                                                       ("bread", {"source": "blog"})]
    # bad input: one error line naming the file and the column, and the index is as it was
    assert main(["-q", "add", str(out), str(more)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"hybridret: error: {more}: no id column") and "Traceback" not in err
    assert HybridRetriever.load(out).num_docs == 3
