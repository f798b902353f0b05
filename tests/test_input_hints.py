"""Small input traps get a word instead of silence: a pretty-printed JSON file, a quoted TSV field
holding a tab, a named pipe nobody writes to."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest

from hybridret.data import iter_corpus, load_queries
from hybridret.errors import CorpusFormatError


def test_a_json_array_file_gets_a_json_lines_hint(tmp_path):
    p = tmp_path / "corpus.json"
    p.write_text(json.dumps([{"_id": "a", "text": "x"}, {"_id": "b", "text": "y"}], indent=2))
    with pytest.raises(CorpusFormatError, match=r"corpus.json:1: .*looks like a JSON array: the input must be "
                                                r"JSON Lines, one object per line"):
        list(iter_corpus(p))


def test_a_one_line_json_array_gets_the_hint_too(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps([{"_id": "a", "text": "x"}]) + "\n")
    with pytest.raises(CorpusFormatError, match="looks like a JSON array"):
        load_queries(p)


def test_a_pretty_printed_object_gets_the_hint(tmp_path):
    p = tmp_path / "corpus.jsonl"
    p.write_text(json.dumps({"_id": "a", "text": "x"}, indent=2))
    with pytest.raises(CorpusFormatError, match="a JSON object spread over several lines"):
        list(iter_corpus(p))


def test_a_quoted_tsv_field_holding_a_tab_is_warned_about(tmp_path, caplog):
    p = tmp_path / "collection.tsv"
    p.write_text('1\t"Title\twith a tab"\tthe text\n2\tplain\ttext\n')
    with caplog.at_level(logging.WARNING, logger="hybridret.data"):
        with pytest.raises(CorpusFormatError, match='collection.tsv:1: .*got 4; a "quoted" field holds a tab'):
            list(iter_corpus(p))
    q = tmp_path / "two.tsv"  # 3 columns after the split: read, but never silently
    q.write_text('1\t"a\tb"\n')
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hybridret.data"):
        docs = list(iter_corpus(q))
    assert docs[0].title == '"a' and any("quoted" in r.getMessage() for r in caplog.records)


def test_ordinary_quotes_in_tsv_are_not_warned_about(tmp_path, caplog):
    p = tmp_path / "collection.tsv"
    p.write_text('1\t"Hello," she said\tand "left"\n')
    with caplog.at_level(logging.WARNING, logger="hybridret.data"):
        docs = list(iter_corpus(p))
    assert docs[0].text == 'and "left"' and not caplog.records


def test_a_named_pipe_without_a_writer_says_it_is_waiting(tmp_path, caplog, monkeypatch):
    import hybridret.data as data

    monkeypatch.setattr(data, "WAIT_NOTICE_S", 0.2)
    fifo = tmp_path / "queries.tsv"
    os.mkfifo(fifo)
    got: dict = {}

    def read() -> None:
        got["queries"] = load_queries(fifo)

    with caplog.at_level(logging.WARNING, logger="hybridret.data"):
        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 30
        while not any("waiting for input on" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no waiting message"
            time.sleep(0.05)
        with open(fifo, "w") as w:
            w.write("q1\thello\n")
        reader.join(timeout=30)
    assert got["queries"] == {"q1": "hello"}
    assert sum("waiting for input on" in r.getMessage() for r in caplog.records) == 1
    assert str(fifo) in next(r.getMessage() for r in caplog.records if "waiting" in r.getMessage())
