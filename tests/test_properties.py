"""Property-based tests (hypothesis) for the input readers and run files.

Two kinds of property, for every reader (JSONL corpus, BEIR folder, TSV corpus, queries as JSONL
and TSV, qrels as BEIR and TREC, TREC / MS MARCO runs):

* valid generated inputs round-trip exactly: ids, titles, texts and grades are preserved, with
  unicode, tabs inside JSON strings, CRLF line endings, a byte-order mark, blank lines and gzip;
* arbitrary bytes (binary, invalid UTF-8, truncated lines and gzip members, huge numbers, NaN,
  deep nesting, lone surrogates, empty files) either parse or raise ``HybridRetError`` whose
  message names the file. Any other exception type is a bug, and fails the test.
"""

from __future__ import annotations

import gzip
import json
import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hybridret.data import _DOC_HEADER_IDS, _QUERY_HEADER_IDS, CorpusReader, Document, load_beir, load_qrels, load_queries  # noqa: E402
from hybridret.errors import CorpusFormatError, HybridRetError  # noqa: E402
from hybridret.runs import load_run, write_run  # noqa: E402

PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GARBAGE = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hr-prop-") as d:
        yield Path(d)


def encode_file(path: Path, lines: list[str], *, crlf: bool, bom: bool, gz: bool, blank_every: int = 0) -> Path:
    """Write ``lines`` as UTF-8 with the chosen line ending, BOM, blank lines and compression."""
    eol = "\r\n" if crlf else "\n"
    out: list[str] = []
    for i, line in enumerate(lines):
        if blank_every and i % blank_every == 0:
            out.append("")
        out.append(line)
    data = ("\ufeff" if bom else "") + "".join(x + eol for x in out)
    raw = data.encode("utf-8")
    if gz:
        path = path.with_name(path.name + ".gz")
        raw = gzip.compress(raw)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    return path


layout = st.fixed_dictionaries({"crlf": st.booleans(), "bom": st.booleans(), "gz": st.booleans(),
                                "blank_every": st.integers(0, 3)})

# Unicode text without surrogates (hypothesis's default); includes tabs, newlines and whitespace.
any_text = st.text(max_size=40)
# An id the JSON readers keep: any string that is not blank and is one line (an index stores ids one
# per line, run files and qrels are line-based; see test_ids_with_line_breaks_name_their_line).
json_id = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != "" and "\n" not in s and "\r" not in s)
# A field of a tab-separated line: no tab, line feed or carriage return.
tsv_field = st.text(st.characters(blacklist_characters="\t\n\r", blacklist_categories=("Cs",)), max_size=30)
# A TSV id: as above, non-empty, and no surrounding whitespace (the readers strip it).
tsv_id = tsv_field.filter(lambda s: s != "" and s == s.strip() and not s.startswith("\ufeff"))
# A TREC id: no whitespace at all (columns are whitespace-separated).
word_id = st.text(st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1, max_size=15) \
    .filter(lambda s: not any(c.isspace() for c in s) and not s.startswith("\ufeff"))
grade = st.integers(-(2**31), 2**31 - 1)


def unique_by_first(items: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    seen: set[Any] = set()
    out = []
    for item in items:
        if item[0] not in seen:
            seen.add(item[0])
            out.append(item)
    return out


def expected_docs(rows: list[tuple[str, str, str]]) -> list[Document]:
    return [Document(id=i, text=t, title=ti) for i, ti, t in rows if ti.strip() or t.strip()]


# --------------------------------------------------------------------------- round trips

@PROPS
@given(rows=st.lists(st.tuples(json_id, any_text, any_text), max_size=12).map(unique_by_first),
       shape=layout, id_key=st.sampled_from(["_id", "id"]), text_key=st.sampled_from(["text", "contents"]),
       ascii_json=st.booleans())
def test_jsonl_corpus_round_trip(rows, shape, id_key, text_key, ascii_json):
    lines = [json.dumps({id_key: i, "title": ti, text_key: t}, ensure_ascii=ascii_json) for i, ti, t in rows]
    with scratch() as d:
        path = encode_file(d / "corpus.jsonl", lines, **shape)
        reader = CorpusReader(path)
        assert list(reader) == expected_docs(rows)
        assert reader.skipped_empty == len(rows) - len(expected_docs(rows))


@PROPS
@given(good=json_id, bad=st.text(max_size=8).map(lambda s: s + "\n") | st.text(max_size=8).map(lambda s: "\r" + s),
       where=st.sampled_from(["corpus", "queries"]))
def test_ids_with_line_breaks_name_their_line(good, bad, where):
    lines = [json.dumps({"_id": good, "text": "fine"}), json.dumps({"_id": good + "x" + bad, "text": "t"})]
    with scratch() as d:
        path = encode_file(d / f"{where}.jsonl", lines, crlf=False, bom=False, gz=False)
        with pytest.raises(CorpusFormatError, match=r"\.jsonl:2: field '_id' (holds a line break|is empty)"):
            list(CorpusReader(path)) if where == "corpus" else load_queries(path)


@PROPS
@given(ids=st.lists(st.integers(-(10**30), 10**30), max_size=8, unique=True), text=st.text(min_size=1).filter(str.strip))
def test_jsonl_integer_ids_become_strings(ids, text):
    with scratch() as d:
        path = encode_file(d / "c.jsonl", [json.dumps({"_id": i, "text": text}) for i in ids],
                           crlf=False, bom=False, gz=False)
        assert [doc.id for doc in CorpusReader(path)] == [str(i) for i in ids]


@PROPS
@given(rows=st.lists(st.tuples(json_id, any_text, any_text), min_size=1, max_size=8).map(unique_by_first),
       queries=st.dictionaries(json_id, any_text.filter(str.strip), max_size=6),
       qrels=st.dictionaries(tsv_id, st.dictionaries(tsv_id, grade, min_size=1, max_size=4), max_size=5),
       shape=layout)
def test_beir_folder_round_trip(rows, queries, qrels, shape):
    with scratch() as d:
        encode_file(d / "corpus.jsonl", [json.dumps({"_id": i, "title": ti, "text": t}) for i, ti, t in rows], **shape)
        encode_file(d / "queries.jsonl", [json.dumps({"_id": q, "text": t}) for q, t in queries.items()], **shape)
        qlines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{doc}\t{g}" for q, docs in qrels.items() for doc, g in docs.items()]
        encode_file(d / "qrels" / "test.tsv", qlines, **shape)
        corpus, got_queries, got_qrels = load_beir(d)
        assert list(corpus) == expected_docs(rows)
        assert got_queries == queries
        assert got_qrels == qrels


@PROPS
@given(rows=st.lists(st.tuples(tsv_id, tsv_field, tsv_field), max_size=12).map(unique_by_first),
       with_title=st.booleans(), header=st.booleans(), shape=layout)
def test_tsv_corpus_round_trip(rows, with_title, header, shape):
    if rows and not header and rows[0][0].lower() in _DOC_HEADER_IDS:
        rows = rows[1:]  # a first-line id such as "docid" is read as a header, by design
    if not with_title:
        rows = [(i, "", t) for i, _, t in rows]
    lines = (["id\ttitle\ttext" if with_title else "id\ttext"] if header else []) + [
        f"{i}\t{ti}\t{t}" if with_title else f"{i}\t{t}" for i, ti, t in rows]
    with scratch() as d:
        path = encode_file(d / "collection.tsv", lines, **shape)
        assert list(CorpusReader(path)) == expected_docs(rows)


@PROPS
@given(queries=st.dictionaries(json_id, any_text.filter(str.strip), max_size=10), shape=layout,
       ascii_json=st.booleans())
def test_jsonl_queries_round_trip(queries, shape, ascii_json):
    lines = [json.dumps({"_id": q, "text": t}, ensure_ascii=ascii_json) for q, t in queries.items()]
    with scratch() as d:
        assert load_queries(encode_file(d / "queries.jsonl", lines, **shape)) == queries


@PROPS
@given(queries=st.dictionaries(tsv_id, tsv_field.filter(str.strip), max_size=10), header=st.booleans(), shape=layout)
def test_tsv_queries_round_trip(queries, header, shape):
    items = list(queries.items())
    if items and not header and items[0][0].lower() in _QUERY_HEADER_IDS:
        items = items[1:]
    lines = (["qid\ttext"] if header else []) + [f"{q}\t{t}" for q, t in items]
    with scratch() as d:
        assert load_queries(encode_file(d / "queries.tsv", lines, **shape)) == dict(items)


@PROPS
@given(qrels=st.dictionaries(tsv_id, st.dictionaries(tsv_id, grade, min_size=1, max_size=5), max_size=6),
       header=st.booleans(), repeat=st.booleans(), shape=layout)
def test_beir_qrels_round_trip(qrels, header, repeat, shape):
    lines = [f"{q}\t{doc}\t{g}" for q, docs in qrels.items() for doc, g in docs.items()]
    if repeat and lines:
        lines.append(lines[0])  # an exact repeat is ignored
    if header:
        lines.insert(0, "query-id\tcorpus-id\tscore")
    with scratch() as d:
        assert load_qrels(encode_file(d / "test.tsv", lines, **shape)) == qrels


@PROPS
@given(qrels=st.dictionaries(word_id, st.dictionaries(word_id, grade, min_size=1, max_size=5), max_size=6),
       sep=st.sampled_from([" ", "  ", " \t "]), shape=layout)
def test_trec_qrels_round_trip(qrels, sep, shape):
    lines = [sep.join([q, "0", doc, str(g)]) for q, docs in qrels.items() for doc, g in docs.items()]
    with scratch() as d:
        assert load_qrels(encode_file(d / "qrels.txt", lines, **shape)) == qrels


# Ids a run file can hold: non-empty, no tab / newline / carriage return, no surrounding whitespace
# (inner spaces are fine: the file is then tab-separated).
run_id = st.text(st.characters(blacklist_characters="\t\n\r", blacklist_categories=("Cs",)), min_size=1, max_size=15) \
    .filter(lambda s: s == s.strip() and not s.startswith("\ufeff"))
score = st.floats(allow_nan=False, width=64)


@PROPS
@given(run=st.dictionaries(run_id, st.dictionaries(run_id, score, min_size=1, max_size=6), max_size=5),
       tag=st.sampled_from(["hybridret", "bm25-run", "x"]))
def test_trec_run_round_trip(run, tag):
    with scratch() as d:
        path = write_run(run, d / "run.trec", tag=tag)
        assert load_run(path) == run
        for line in path.read_text(encoding="utf-8").split("\n")[:-1]:
            assert line.endswith(tag)


@PROPS
@given(run=st.dictionaries(run_id, st.dictionaries(run_id, score, min_size=1, max_size=6), max_size=5))
def test_msmarco_run_keeps_the_order(run):
    with scratch() as d:
        loaded = load_run(write_run(run, d / "run.tsv", format="msmarco"))
    assert set(loaded) == set(run)
    for qid, docs in run.items():
        best_first = [doc for doc, _ in sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))]
        assert sorted(loaded[qid], key=lambda doc: -loaded[qid][doc]) == best_first


# --------------------------------------------------------------------------- garbage

TRICKY = [
    b"", b"\xef\xbb\xbf", b"\xff\xfe", b"\x00", b"\r", b"\t", b"\t\t", b" ", b"\x1f\x8b", b"\x1f\x8b\x08\x00",
    b"{", b"}", b"[" * 5000, b"{\"_id\": " + b"9" * 5000 + b", \"text\": \"x\"}",
    b"{\"_id\": 1e999, \"text\": \"x\"}", b"{\"_id\": NaN, \"text\": \"x\"}", b"{\"_id\": \"a\", \"text\": NaN}",
    b"{\"_id\": \"\\ud800\", \"text\": \"x\"}", b"{\"_id\": \"a\", \"text\": \"\\udfff\"}",
    b"{\"_id\": \"a\", \"title\": \"\\ud83d\", \"text\": \"b\"}", b"{\"_id\": true, \"text\": \"x\"}",
    b"{\"_id\": \"a\", \"text\": \"x\"}", b"{\"id\": \"a\", \"contents\": \"x\"}", b"{\"_id\": \"a\", \"text\": \"\"}",
    b"{\"_id\": \"a\"}", b"{\"_id\": [], \"text\": \"x\"}", b"[1, 2]", b"\"str\"", b"null",
    b"q1\tdoc\t1", b"q1 0 d1 1", b"q1 0 d1 NaN", b"q1 0 d1 nan", b"q1\td1\tinf", b"q1\td1\t" + b"9" * 40,
    b"q1\td1\t1_0", b"q1\td1\t\xd9\xa3", b"q1\td1\t-0", b"\td1\t1", b"q1\t\t1", b"q1 0 d1 1 extra",
    b"q1 Q0 d1 1 0.5 tag", b"q1 Q0 d1 1 nan tag", b"q1 Q0 d1 1 1e999 tag", b"q1 Q0 d1 x 0.5 tag",
    b"q1\tQ0\td 1\t1\t0.5\ttag", b"q1\td1\t" + b"9" * 5000, b"q1 d1 " + b"9" * 5000,
    b"id\ttext", b"qid\ttext", b"query-id\tcorpus-id\tscore", b"1\t", b"\t\t\t",
    b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", "héllo\u2028wörld".encode(),
]
line = st.one_of(st.binary(max_size=40), st.sampled_from(TRICKY))


@st.composite
def garbage_bytes(draw: Callable[..., Any]) -> bytes:
    kind = draw(st.sampled_from(["binary", "lines", "gzip", "truncated-gzip"]))
    if kind == "binary":
        return draw(st.binary(max_size=300))
    body = draw(st.sampled_from([b"\n", b"\r\n"])).join(draw(st.lists(line, max_size=12)))
    if draw(st.booleans()):
        body += b"\n"
    if kind == "lines":
        return body
    packed = gzip.compress(body)
    if kind == "gzip":
        return packed
    return packed[: draw(st.integers(0, max(0, len(packed) - 1)))]


def assert_writable(value: Any) -> None:
    """Whatever a reader returns can be written as UTF-8 (no lone surrogates slip through)."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, Document):
        for part in (value.id, value.title, value.text):
            part.encode("utf-8")
    elif isinstance(value, dict):
        for k, v in value.items():
            assert_writable(k)
            assert_writable(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            assert_writable(v)
    else:
        assert isinstance(value, (int, float)), type(value)
        if isinstance(value, float):
            assert not math.isnan(value), "a NaN score or grade was accepted"


def check_parses_or_names_file(fn: Callable[[Path], Any], path: Path) -> None:
    try:
        assert_writable(fn(path))
    except HybridRetError as exc:
        assert path.name in str(exc), f"error does not name the file: {exc}"
        if isinstance(exc, CorpusFormatError):
            assert exc.path is not None and Path(exc.path).name == path.name


def corpus_pass(**kwargs: Any) -> Callable[[Path], Any]:
    return lambda p: list(CorpusReader(p, **kwargs))


READERS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "jsonl-corpus": ("corpus.jsonl", corpus_pass()),
    "jsonl-corpus-gz-name": ("corpus.jsonl.gz", corpus_pass()),
    "tsv-corpus": ("collection.tsv", corpus_pass()),
    "tsv-corpus-on-empty-error": ("collection.tsv", corpus_pass(on_empty="error")),
    "jsonl-corpus-short-lines": ("corpus.jsonl", corpus_pass(max_line_bytes=24)),
    "jsonl-queries": ("queries.jsonl", load_queries),
    "tsv-queries": ("queries.tsv", load_queries),
    "qrels": ("test.tsv", load_qrels),
    "qrels-gz-name": ("qrels.txt.gz", load_qrels),
    "qrels-short-lines": ("test.tsv", lambda p: load_qrels(p, max_line_bytes=16)),
    "run": ("run.trec", load_run),
}


@pytest.mark.parametrize("reader", sorted(READERS))
@GARBAGE
@given(data=garbage_bytes())
def test_garbage_parses_or_raises_a_named_format_error(reader, data):
    name, fn = READERS[reader]
    with scratch() as d:
        path = d / name
        path.write_bytes(data)
        check_parses_or_names_file(fn, path)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_each_tricky_line_parses_or_raises_a_named_format_error(reader):
    """Every hand-picked hostile line, alone, after a valid line, and gzip-compressed."""
    name, fn = READERS[reader]
    valid = b'{"_id": "v", "text": "valid"}' if ".jsonl" in name else b"v\tQ0\td\t1\t0.5\tt" if "run" in name \
        else b"v\t0\td\t1" if "qrels" in name else b"v\tvalid"
    with scratch() as d:
        for i, tricky in enumerate(TRICKY):
            for body in (tricky, valid + b"\n" + tricky + b"\n", gzip.compress(valid + b"\n" + tricky)):
                path = d / f"{i}" / name
                path.parent.mkdir(exist_ok=True)
                path.write_bytes(body)
                check_parses_or_names_file(fn, path)


@GARBAGE
@given(corpus=garbage_bytes(), queries=garbage_bytes(), qrels=garbage_bytes())
def test_garbage_beir_folder(corpus, queries, qrels):
    with scratch() as d:
        (d / "qrels").mkdir()
        (d / "corpus.jsonl").write_bytes(corpus)
        (d / "queries.jsonl").write_bytes(queries)
        (d / "qrels" / "test.tsv").write_bytes(qrels)
        try:
            reader, queries, qrels = load_beir(d)
            assert_writable([list(reader), queries, qrels])
        except HybridRetError as exc:
            assert any(n in str(exc) for n in ("corpus.jsonl", "queries.jsonl", "test.tsv")), str(exc)


@PROPS
@given(run=st.dictionaries(st.text(max_size=6), st.dictionaries(st.text(max_size=6), st.floats(), max_size=3),
                           max_size=3))
def test_write_run_refuses_what_it_cannot_write_back(run):
    """Any ids and scores: either the file reads back identically, or a HybridRetError says why."""
    with scratch() as d:
        try:
            path = write_run(run, d / "run.trec")
        except HybridRetError as exc:
            assert "id" in str(exc) or "NaN" in str(exc) or "nan" in str(exc)
            bad_ids = [i for i in list(run) + [doc for docs in run.values() for doc in docs]
                       if not i or i != i.strip() or i.startswith("\ufeff") or any(c in i for c in "\t\n\r")]
            assert bad_ids or any(math.isnan(s) for docs in run.values() for s in docs.values())
            assert not (d / "run.trec").exists() and not (d / "run.trec.tmp").exists()
        else:
            assert load_run(path) == {q: docs for q, docs in run.items() if docs}


# -- fusion options: any settings mapping is a valid config or a ConfigError, never another exception --------
_fusion_value = st.one_of(st.none(), st.booleans(), st.integers(-3, 20_000), st.floats(allow_nan=True),
                          st.text(max_size=6), st.lists(st.sampled_from(["dense", "sparse", "bm25", "x"]), max_size=3),
                          st.dictionaries(st.sampled_from(["dense", "sparse", "bm25", "x", ""]),
                                          st.one_of(st.floats(allow_nan=True), st.integers(-2, 3), st.text(max_size=2)),
                                          max_size=3))
_fusion_key = st.sampled_from(["method", "retrievers", "weights", "normalisation", "rrf_k", "depth", "guide",
                               "guide_weighting", "gqr", "bogus"])


@PROPS
@given(data=st.dictionaries(_fusion_key, st.one_of(_fusion_value, st.sampled_from(
    ["linear", "rrf", "gqr", "minmax", "zscore", "fixed", "agreement"])), max_size=6))
@example(data={"weights": {}})  # found by hypothesis: {} came back from to_dict as None
def test_fusion_settings_are_a_config_or_a_config_error(data):
    from hybridret.errors import ConfigError
    from hybridret.fusion.config import MAX_CANDIDATES, FusionConfig

    try:
        cfg = FusionConfig.from_dict(data)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert 1 <= cfg.depth <= MAX_CANDIDATES
    assert all(isinstance(w, (int, float)) and w >= 0 for w in (cfg.weights or {}).values())
    assert FusionConfig.from_dict(cfg.to_dict()) == cfg
