"""Tests for hybridret.data: corpus, queries and qrels readers."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

from hybridret.data import (
    CorpusReader,
    Document,
    detect_corpus_format,
    iter_batches,
    iter_corpus,
    load_beir,
    load_qrels,
    load_queries,
)
from hybridret.errors import ConfigError, CorpusFormatError, HybridRetError

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(text.encode("utf-8"))
    else:
        path.write_bytes(text.encode("utf-8"))
    return path


def jsonl(*objs: object) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def expect_error(fn, *args, line: int | None, path: Path, **kwargs) -> CorpusFormatError:
    with pytest.raises(CorpusFormatError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert isinstance(err, HybridRetError) and isinstance(err, ValueError)
    assert err.line == line
    assert path.name in str(err)
    assert err.path is not None and Path(err.path).name == path.name
    if line is not None:
        assert f":{line}:" in str(err)
    return err


def read_all(path: Path, **kwargs) -> list[Document]:
    return list(iter_corpus(path, **kwargs))


# --------------------------------------------------------------------------- Document


def test_full_text_with_and_without_title():
    assert Document("1", "body", "Title").full_text == "Title body"
    assert Document("1", "  body  ").full_text == "body"
    assert Document("1", "body", "   ").full_text == "body"
    assert Document("1", "", "Only title").full_text == "Only title"
    with pytest.raises(AttributeError):
        Document("1", "x").text = "y"  # type: ignore[misc]


# --------------------------------------------------------------------------- format detection


def test_detect_corpus_format(tmp_path):
    beir = tmp_path / "beir"
    write(beir / "corpus.jsonl", jsonl({"_id": "1", "text": "a"}))
    beir_gz = tmp_path / "beirgz"
    write(beir_gz / "corpus.jsonl.gz", jsonl({"_id": "1", "text": "a"}))
    cases = {
        beir: "beir",
        beir_gz: "beir",
        write(tmp_path / "c.jsonl", ""): "jsonl",
        write(tmp_path / "c.JSONL.gz", ""): "jsonl",
        write(tmp_path / "c.json", ""): "jsonl",
        write(tmp_path / "collection.tsv", ""): "tsv",
        write(tmp_path / "collection.tsv.gz", ""): "tsv",
    }
    for path, fmt in cases.items():
        assert detect_corpus_format(path) == fmt, path
        assert detect_corpus_format(str(path)) == fmt


def test_detect_corpus_format_errors(tmp_path):
    odd = write(tmp_path / "corpus.txt", "x\n")
    expect_error(detect_corpus_format, odd, line=None, path=odd)
    empty_dir = tmp_path / "notbeir"
    empty_dir.mkdir()
    expect_error(detect_corpus_format, empty_dir, line=None, path=empty_dir)
    with pytest.raises(FileNotFoundError, match="corpus not found: .*missing.jsonl"):
        detect_corpus_format(tmp_path / "missing.jsonl")


def test_missing_corpus_raises_file_not_found(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError) as info:
        iter_corpus(missing)
    assert str(info.value) == f"corpus not found: {missing}"
    with pytest.raises(FileNotFoundError):
        CorpusReader(missing)


def test_bad_arguments(tmp_path):
    p = write(tmp_path / "c.jsonl", jsonl({"_id": "1", "text": "a"}))
    with pytest.raises(ConfigError):
        CorpusReader(p, format="csv")
    with pytest.raises(ConfigError):
        CorpusReader(p, on_empty="ignore")
    with pytest.raises(CorpusFormatError):
        CorpusReader(p, format="beir")
    with pytest.raises(CorpusFormatError):
        CorpusReader(tmp_path, format="jsonl")


# --------------------------------------------------------------------------- JSONL corpora


def test_jsonl_ids_titles_and_contents(tmp_path):
    p = write(
        tmp_path / "corpus.jsonl",
        jsonl(
            {"_id": "d1", "title": "T1", "text": "one"},
            {"id": "d2", "text": "two"},
            {"_id": 3, "title": None, "text": "three"},
            {"id": 4, "contents": "four", "extra": [1, 2]},
            {"_id": "d5", "id": "ignored", "title": "", "text": "five"},
        ),
    )
    docs = read_all(p)
    assert docs == [
        Document("d1", "one", "T1"),
        Document("d2", "two"),
        Document("3", "three"),
        Document("4", "four", metadata={"extra": [1, 2]}),  # other fields are metadata
        Document("d5", "five"),
    ]
    assert [d.full_text for d in docs] == ["T1 one", "two", "three", "four", "five"]


def test_jsonl_blank_lines_crlf_and_bom(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(
        b'\xef\xbb\xbf{"_id": "1", "text": "a"}\r\n\r\n   \n{"_id": "2", "text": "b\\u00e9"}\n\n'
    )
    assert read_all(p) == [Document("1", "a"), Document("2", "b\u00e9")]


def test_jsonl_gzip(tmp_path):
    p = write(tmp_path / "c.jsonl.gz", jsonl({"_id": "1", "text": "zipped"}, {"_id": "2", "text": "x"}))
    assert [d.text for d in read_all(p)] == ["zipped", "x"]


def test_jsonl_format_override(tmp_path):
    p = write(tmp_path / "corpus.data", jsonl({"_id": "1", "text": "a"}))
    assert read_all(p, format="jsonl") == [Document("1", "a")]


@pytest.mark.parametrize(
    ("bad_line", "field", "fragment"),
    [
        ("{not json", None, "invalid JSON"),
        ("[1, 2]", None, "JSON object"),
        ('"a string"', None, "JSON object"),
        ('{"text": "no id"}', "_id", "missing id"),
        ('{"_id": null, "text": "null id"}', "_id", "missing id"),
        ('{"_id": "x"}', "text", "missing field"),
        ('{"_id": "x", "text": 5}', "text", "must be a string"),
        ('{"_id": "x", "text": null}', "text", "must be a string"),
        ('{"_id": "x", "contents": ["a"]}', "contents", "must be a string"),
        ('{"_id": "x", "title": 7, "text": "a"}', "title", "must be a string"),
        ('{"_id": 1.5, "text": "a"}', "_id", "string or integer"),
        ('{"_id": true, "text": "a"}', "_id", "string or integer"),
        ('{"id": ["x"], "text": "a"}', "id", "string or integer"),
        ('{"_id": "  ", "text": "a"}', "_id", "empty"),
    ],
)
def test_jsonl_bad_lines(tmp_path, bad_line, field, fragment):
    # Line 1 good, line 2 blank, bad input on line 3.
    p = write(tmp_path / "bad.jsonl", '{"_id": "ok", "text": "fine"}\n\n' + bad_line + "\n")
    reader = CorpusReader(p)
    it = iter(reader)
    assert next(it) == Document("ok", "fine")
    err = expect_error(next, it, line=3, path=p)
    assert err.field == field
    assert fragment in str(err)


def test_jsonl_bad_line_in_gzip_reports_line(tmp_path):
    p = write(tmp_path / "bad.jsonl.gz", jsonl({"_id": "1", "text": "a"}) + "{oops\n")
    expect_error(read_all, p, line=2, path=p)


def test_invalid_utf8_names_line(tmp_path):
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(b'{"_id": "1", "text": "ok"}\n{"_id": "2", "text": "caf\xe9"}\n')
    err = expect_error(read_all, p, line=2, path=p)
    assert "UTF-8" in str(err)


def test_corrupt_gzip(tmp_path):
    p = tmp_path / "c.jsonl.gz"
    p.write_bytes(b"this is not gzip data\n")
    with pytest.raises(CorpusFormatError) as info:
        read_all(p)
    assert "c.jsonl.gz" in str(info.value) and "gzip" in str(info.value)


def test_duplicate_ids_name_both_lines(tmp_path):
    p = write(
        tmp_path / "dup.jsonl",
        jsonl({"_id": "a", "text": "1"}, {"_id": "b", "text": "2"}) + "\n" + jsonl({"id": "a", "text": "3"}),
    )
    err = expect_error(read_all, p, line=4, path=p)
    assert "lines 1 and 4" in str(err)
    assert "'a'" in str(err)


def test_duplicate_int_and_str_id(tmp_path):
    p = write(tmp_path / "dup.jsonl", jsonl({"_id": 7, "text": "1"}, {"_id": "7", "text": "2"}))
    err = expect_error(read_all, p, line=2, path=p)
    assert "lines 1 and 2" in str(err)


# --------------------------------------------------------------------------- empty documents


EMPTY_CORPUS = jsonl(
    {"_id": "1", "text": "a"},
    {"_id": "2", "title": "", "text": "   "},
    {"_id": "3", "title": "title only", "text": ""},
    {"_id": "4", "title": None, "text": ""},
    {"_id": "5", "title": " ", "text": "\t"},
    {"_id": "6", "text": "b"},
)


def test_empty_documents_skipped_counted_and_logged_once(tmp_path, caplog):
    p = write(tmp_path / "empty.jsonl", EMPTY_CORPUS)
    reader = CorpusReader(p)
    assert reader.path == p and reader.format == "jsonl"
    with caplog.at_level(logging.WARNING, logger="hybridret.data"):
        docs = list(reader)
    assert [d.id for d in docs] == ["1", "3", "6"]
    assert reader.skipped_empty == 3
    assert reader.n_read == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "skipped 3 empty documents" in msg and "empty.jsonl" in msg and "first at line 2" in msg
    # A second pass starts counting afresh.
    assert len(list(reader)) == 3 and reader.skipped_empty == 3 and reader.n_read == 3


def test_no_warning_without_empty_documents(tmp_path, caplog):
    p = write(tmp_path / "c.jsonl", jsonl({"_id": "1", "text": "a"}))
    with caplog.at_level(logging.WARNING, logger="hybridret.data"):
        reader = CorpusReader(p)
        assert len(list(reader)) == 1
    assert reader.skipped_empty == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_empty_documents_error_mode(tmp_path):
    p = write(tmp_path / "empty.jsonl", EMPTY_CORPUS)
    err = expect_error(read_all, p, on_empty="error", line=2, path=p)
    assert "'2'" in str(err)


def test_iter_corpus_is_a_lazy_generator(tmp_path):
    p = write(tmp_path / "c.jsonl", jsonl({"_id": "1", "text": "a"}) + "{broken\n")
    gen = iter_corpus(p)
    assert iter(gen) is gen
    assert next(gen) == Document("1", "a")
    expect_error(next, gen, line=2, path=p)


# --------------------------------------------------------------------------- BEIR folder and TSV


def test_beir_folder_corpus(tmp_path):
    write(tmp_path / "corpus.jsonl", jsonl({"_id": "1", "title": "t", "text": "a"}))
    reader = CorpusReader(tmp_path)
    assert reader.format == "beir"
    assert reader.file == tmp_path / "corpus.jsonl"
    assert list(reader) == [Document("1", "a", "t")]


def test_beir_folder_gzip_corpus_errors_name_inner_file(tmp_path):
    write(tmp_path / "corpus.jsonl.gz", jsonl({"_id": "1", "text": "a"}) + '{"_id": "2"}\n')
    err = expect_error(read_all, tmp_path, line=2, path=tmp_path / "corpus.jsonl.gz")
    assert err.field == "text"


def test_tsv_two_and_three_columns(tmp_path):
    p2 = write(tmp_path / "collection.tsv", "0\tfirst passage\r\n1\tsecond passage\n\n2\t\n")
    reader = CorpusReader(p2)
    assert list(reader) == [Document("0", "first passage"), Document("1", "second passage")]
    assert reader.skipped_empty == 1
    p3 = write(tmp_path / "titled.tsv.gz", "a\tTitle A\tbody a\nb\t\tbody b\n")
    docs = read_all(p3)
    assert docs == [Document("a", "body a", "Title A"), Document("b", "body b")]
    assert docs[0].full_text == "Title A body a"


def test_tsv_header_line_is_skipped(tmp_path):
    p = write(tmp_path / "c.tsv", "id\ttitle\ttext\n1\tt\tbody\n")
    assert read_all(p) == [Document("1", "body", "t")]


@pytest.mark.parametrize(
    ("content", "line"),
    [
        ("1\ta\n2\n", 2),
        ("1\ta\n\n2\ta\tb\tc\n", 3),
        ("1\ta\n\ta text without id\n", 2),
        ("1\ta\n2\tb\n1\tc\n", 3),
    ],
)
def test_tsv_bad_lines(tmp_path, content, line):
    p = write(tmp_path / "collection.tsv", content)
    expect_error(read_all, p, line=line, path=p)


def test_tsv_duplicate_mentions_both_lines(tmp_path):
    p = write(tmp_path / "collection.tsv", "1\ta\n2\tb\n1\tc\n")
    assert "lines 1 and 3" in str(expect_error(read_all, p, line=3, path=p))


# --------------------------------------------------------------------------- queries


def test_queries_jsonl(tmp_path):
    p = write(
        tmp_path / "queries.jsonl",
        jsonl({"_id": "q1", "text": "first", "metadata": {}}, {"id": 2, "text": "second"}) + "\n",
    )
    assert load_queries(p) == {"q1": "first", "2": "second"}


def test_queries_tsv_and_gzip(tmp_path):
    p = write(tmp_path / "queries.dev.tsv", "1048585\twhat is paula deen's brother\r\n\n2\tsecond\n")
    assert load_queries(p) == {"1048585": "what is paula deen's brother", "2": "second"}
    g = write(tmp_path / "topics.tsv.gz", "qid\tquery\n19335\tanthropological definition\n")
    assert load_queries(g) == {"19335": "anthropological definition"}


@pytest.mark.parametrize(
    ("name", "content", "line", "fragment"),
    [
        ("q.jsonl", '{"_id": "1", "text": "a"}\n{"_id": "2", "text": ""}\n', 2, "empty text"),
        ("q.jsonl", '{"_id": "1", "text": "a"}\n\n{"_id": "1", "text": "b"}\n', 3, "lines 1 and 3"),
        ("q.jsonl", '{"_id": "1", "text": "a"}\n{"_id": "2"}\n', 2, "missing field"),
        ("q.jsonl", '{"_id": "1", "text": "a"}\nnope\n', 2, "invalid JSON"),
        ("q.jsonl", '{"text": "a"}\n', 1, "missing id"),
        ("q.tsv", "1\ta\n2\n", 2, "2 tab-separated columns"),
        ("q.tsv", "1\ta\n2\tb\tc\n", 2, "2 tab-separated columns"),
        ("q.tsv", "1\ta\n2\t  \n", 2, "empty text"),
        ("q.tsv", "1\ta\n2\tb\n1\tc\n", 3, "lines 1 and 3"),
        ("q.tsv", "1\ta\n\tb\n", 2, "empty query id"),
    ],
)
def test_queries_bad_lines(tmp_path, name, content, line, fragment):
    p = write(tmp_path / name, content)
    err = expect_error(load_queries, p, line=line, path=p)
    assert fragment in str(err)


def test_queries_invalid_utf8(tmp_path):
    p = tmp_path / "q.tsv"
    p.write_bytes(b"1\tok\n2\t\xff\xfe\n")
    expect_error(load_queries, p, line=2, path=p)


def test_queries_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="queries not found"):
        load_queries(tmp_path / "queries.jsonl")


# --------------------------------------------------------------------------- qrels


def test_qrels_beir_with_header(tmp_path):
    p = write(tmp_path / "test.tsv", "query-id\tcorpus-id\tscore\n1\td1\t2\n1\td2\t0\n2\td1\t-1\n\n")
    assert load_qrels(p) == {"1": {"d1": 2, "d2": 0}, "2": {"d1": -1}}


def test_qrels_beir_without_header(tmp_path):
    p = write(tmp_path / "test.tsv", "1\td1\t1\n2\td3\t3\n")
    assert load_qrels(p) == {"1": {"d1": 1}, "2": {"d3": 3}}


def test_qrels_trec_spaces_and_tabs(tmp_path):
    trec = write(tmp_path / "qrels.txt", "101 0 docA 1\n101 0 docB 0\n102 Q0 docA 3\n")
    assert load_qrels(trec) == {"101": {"docA": 1, "docB": 0}, "102": {"docA": 3}}
    marco = write(tmp_path / "qrels.dev.tsv.gz", "1102432\t0\t2026790\t1\n1102431\t0\t7066866\t1\n")
    assert load_qrels(marco) == {"1102432": {"2026790": 1}, "1102431": {"7066866": 1}}


def test_qrels_exact_repeat_is_ignored(tmp_path, caplog):
    p = write(tmp_path / "q.tsv", "1\td\t1\n1\td\t1\n")
    with caplog.at_level(logging.WARNING, logger="hybridret.data"):
        assert load_qrels(p) == {"1": {"d": 1}}
    assert any("repeated" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        ("query-id\tcorpus-id\tscore\n1\td1\t1\n1\td2\thigh\n", 3, "integer"),
        ("1\td1\t1\n1\td2\n", 2, "got 2"),
        ("1 0 d1 1\n1 0 d2 1 extra\n", 2, "got 5"),
        ("1 0 d1 1\n1 d2 1\n", 2, "expected 4 columns"),
        ("1\td1\t1\n1\td2\t1.5\n", 2, "integer"),
        ("1\td1\t1\n\n1\td1\t2\n", 3, "conflicting grades"),
    ],
)
def test_qrels_bad_lines(tmp_path, content, line, fragment):
    p = write(tmp_path / "qrels.tsv", content)
    err = expect_error(load_qrels, p, line=line, path=p)
    assert fragment in str(err)


def test_qrels_conflict_mentions_both_lines(tmp_path):
    p = write(tmp_path / "qrels.tsv", "1\td1\t1\n\n1\td1\t2\n")
    err = expect_error(load_qrels, p, line=3, path=p)
    assert "on line 1" in str(err) and "on line 3" in str(err)


def test_qrels_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="qrels not found"):
        load_qrels(tmp_path / "qrels.tsv")


# --------------------------------------------------------------------------- load_beir


def make_beir(root: Path) -> Path:
    write(root / "corpus.jsonl", jsonl({"_id": "d1", "title": "T", "text": "a"}, {"_id": "d2", "text": "b"}))
    write(root / "queries.jsonl", jsonl({"_id": "q1", "text": "x"}, {"_id": "q2", "text": "y"}))
    write(root / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td2\t1\n")
    write(root / "qrels" / "dev.tsv.gz", "query-id\tcorpus-id\tscore\nq2\td1\t2\n")
    return root


def test_load_beir(tmp_path):
    root = make_beir(tmp_path / "mini")
    corpus, queries, qrels = load_beir(root)
    assert isinstance(corpus, CorpusReader) and corpus.format == "beir"
    assert [d.id for d in corpus] == ["d1", "d2"]
    assert queries == {"q1": "x", "q2": "y"}  # all queries, not only judged ones
    assert qrels == {"q1": {"d2": 1}}
    assert load_beir(root, split="dev")[2] == {"q2": {"d1": 2}}


def test_load_beir_missing_parts(tmp_path):
    with pytest.raises(FileNotFoundError, match="BEIR folder not found"):
        load_beir(tmp_path / "absent")
    root = make_beir(tmp_path / "mini")
    with pytest.raises(FileNotFoundError, match=r"qrels not found.*available splits: \['dev', 'test'\]"):
        load_beir(root, split="train")
    (root / "queries.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="queries not found"):
        load_beir(root)


# --------------------------------------------------------------------------- iter_batches


def test_iter_batches():
    assert list(iter_batches(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(iter_batches([], 4)) == []
    assert list(iter_batches(iter("ab"), 5)) == [["a", "b"]]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError):
            iter_batches([1], bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- real data


def test_cranfield_shared_data():
    folder = SHARED_DATA / "cranfield"
    if not (folder / "corpus.jsonl").is_file():
        pytest.skip(f"../shared/data not available: {folder}")
    corpus, queries, qrels = load_beir(folder)
    docs = list(corpus)
    assert len(docs) == 1398 and corpus.n_read == 1398 and corpus.skipped_empty == 0
    assert len(queries) == 225
    assert len(qrels) == 225
    assert sum(len(v) for v in qrels.values()) == 1611
    ids = {d.id for d in docs}
    assert all(doc in ids for judged in qrels.values() for doc in judged)
    assert set(qrels) <= set(queries)
    assert all(d.title and d.full_text.startswith(d.title.strip()) for d in docs)


def test_qrels_tab_separated_ids_may_contain_spaces(tmp_path):
    path = tmp_path / "qrels.tsv"
    path.write_text("query-id\tcorpus-id\tscore\nquery_0\tGeneva Durben\t1\nquery_0\tArmand Schweda\t1\n")
    assert load_qrels(path) == {"query_0": {"Geneva Durben": 1, "Armand Schweda": 1}}
