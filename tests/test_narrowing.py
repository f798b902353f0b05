"""No silent narrowing: an argument that would quietly shrink (or widen) an answer is an error
naming the problem, or does what it says (issue #32)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _text_only import TextOnly, build

from hybridret import IndexWriter, Searcher
from hybridret.errors import ConfigError
from hybridret.filters import FilterError, parse_filter

DOCS = [
    {"id": "a", "title": "Bees", "text": "bees make honey in the hive", "lang": "en"},
    {"id": "b", "title": "Honey", "text": "honey is sweet and bees love it", "lang": "de"},
    {"id": "c", "title": "Tea", "text": "green tea and honey", "metadata": {"title": "meta title"}},
]


@pytest.fixture
def index(tmp_path: Path) -> Path:
    return build(tmp_path / "idx", DOCS)


@pytest.mark.parametrize("spec", [{"id": "a"}, {"_id": {"$in": ["a", "b"]}}, {"text": {"$exists": True}},
                                  {"$or": [{"lang": "en"}, {"_id": "b"}]}, {"id": {"$ne": "a"}}])
def test_filter_on_document_field_is_refused_in_search(index: Path, spec: dict) -> None:
    s = Searcher(index, encoder=TextOnly())
    with pytest.raises(FilterError, match="not a metadata field"):
        s.search("honey", method="bm25", filter=spec)
    with pytest.raises(FilterError, match="not a metadata field"):
        s.count(filter=spec)


def test_filter_on_title_uses_metadata_when_some_document_has_it(index: Path) -> None:
    s = Searcher(index, encoder=TextOnly())
    hits = s.search("honey", method="bm25", filter={"title": "meta title"})[0]
    assert [h.id for h in hits] == ["c"]
    assert [h.id for h in s.search("honey", method="bm25", filter={"lang": "en"})[0]] == ["a"]


def test_delete_by_filter_on_document_field_is_refused_and_deletes_nothing(index: Path) -> None:
    with IndexWriter(index, encoder=TextOnly()) as w:
        for dry in (True, False):
            with pytest.raises(FilterError, match="filter._id: '_id' is the document id"):
                w.delete(filter={"_id": "a"}, dry_run=dry)
    assert Searcher(index, encoder=TextOnly()).count() == 3


def test_filter_on_document_field_parses_alone() -> None:
    parse_filter({"id": "a"})  # the index decides (a metadata field may carry that name)


def test_group_by_unknown_field_is_refused(index: Path) -> None:
    s = Searcher(index, encoder=TextOnly())
    with pytest.raises(ConfigError, match="no document of the index has the metadata field 'lnag'"):
        s.search("honey", method="bm25", group_by="lnag")


def test_group_by_field_some_documents_lack_groups_them_alone(index: Path) -> None:
    hits = Searcher(index, encoder=TextOnly()).search("honey", k=5, method="bm25", group_by="lang")[0]
    assert sorted(h.id for h in hits) == ["a", "b", "c"]  # "c" lacks lang: a group of its own


def test_explicit_null_expiry_wins_over_ttl(tmp_path: Path) -> None:
    now = [1_000_000.0]
    docs = [{"id": "keep", "text": "honey forever", "expires_at": None},
            {"id": "go", "text": "honey for a while"}]
    with IndexWriter(tmp_path / "idx", encoder=TextOnly(), clock=lambda: now[0]) as w:
        w.write(docs, mode="build", ttl=10)
    now[0] += 3600
    s = Searcher(tmp_path / "idx", encoder=TextOnly(), clock=lambda: now[0])
    assert [h.id for h in s.search("honey", method="bm25")[0]] == ["keep"]
    assert s.get(["keep"])[0]["metadata"]["expires_at"] is None


def test_chunk_overlap_without_chunking_is_refused(tmp_path: Path) -> None:
    with IndexWriter(tmp_path / "idx", encoder=TextOnly()) as w:
        with pytest.raises(ConfigError, match="chunk_overlap=8 given with chunk_tokens=0"):
            w.write(DOCS, mode="build", chunk_tokens=0, chunk_overlap=8)
        with pytest.raises(ConfigError, match="chunk_overlap needs chunk_tokens"):
            w.write(DOCS, mode="build", chunk_overlap=8)
        w.write(DOCS, mode="build", chunk_tokens=0)  # nothing lost: the same call without it works
    assert Searcher(tmp_path / "idx", encoder=TextOnly()).count() == 3


@pytest.mark.parametrize("command", ["search", "get"])
def test_server_with_an_index_folder_is_refused_not_sent_as_a_word(index: Path, command: str,
                                                                   capsys: pytest.CaptureFixture) -> None:
    from hybridret.cli import main

    # the folder is refused before any request: no server needs to listen at the URL
    assert main([command, str(index), "honey", "--server", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "with --server there is no DIR" in err and "is an index folder" in err
