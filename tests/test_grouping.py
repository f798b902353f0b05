"""Document-level grouping, pages, snippets and the reranking stage on a living index (real
encoders, FAISS, tantivy), checked against brute force computed outside the search path."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from _tiny_models import tiny_cross_encoder

from hybridret import HybridRetriever
from hybridret.errors import ConfigError
from hybridret.retrievers import REGISTRY, score_rows, vectors_of
from hybridret.search.rerank import CrossEncoderReranker, Reranker
from hybridret.search.snippets import WordMatcher, literal_terms, make_snippets

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "hybridret" / "resources" / "sample"
K, G = 6, 2


def _meta(i: int, rng: random.Random) -> dict:
    out: dict = {"lang": ("en", "de", "fr")[i % 3]}
    if i % 9 == 0:
        return out  # no parent: a group of its own, keyed by its id
    if i % 17 == 0:
        out["parent_id"] = 7 if i % 2 else "7"  # a number and a string: two groups
    else:
        out["parent_id"] = f"doc{rng.randrange(45)}"
    return out


@pytest.fixture(scope="module")
def chunks() -> list[dict]:
    rng = random.Random(22)
    docs = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").open()][:180]
    return [{"id": d["_id"], "title": d.get("title", ""), "text": d["text"], "metadata": _meta(i, rng)}
            for i, d in enumerate(docs)]


@pytest.fixture(scope="module")
def queries() -> list[str]:
    return [json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").open()][:6]


@pytest.fixture(scope="module")
def kb(paired_encoder, chunks, tmp_path_factory) -> HybridRetriever:
    """Three segments and some deletes."""
    r = HybridRetriever(paired_encoder).index(chunks[:100], workdir=tmp_path_factory.mktemp("kb") / "idx")
    r.add(chunks[100:140])
    r.add(chunks[140:])
    r.delete([c["id"] for c in chunks[::13]])
    assert len(r.searcher.snapshot.segments) == 3
    return r


def _key(meta: dict, doc_id: str):
    v = meta.get("parent_id")
    if v is None:
        return ("s", doc_id)
    return ("n", float(v)) if isinstance(v, (int, float)) else ("s", v)


def _reference(r: HybridRetriever, name: str, texts: list[str]) -> np.ndarray:
    snap = r.searcher.snapshot
    q = r.searcher.encode_queries(texts, {REGISTRY[name].needs})
    if name == "dense":
        return q.dense @ vectors_of(snap, np.arange(snap.num_rows)).T
    if name == "sparse":
        fwd = sp.vstack([s.sparse.forward for s in snap.segments]).tocsr()
        return np.asarray((q.sparse @ fwd.T).todense())
    return score_rows(REGISTRY["bm25"], snap, q, np.broadcast_to(np.arange(snap.num_rows), (len(q), snap.num_rows)))


def _brute_groups(r: HybridRetriever, name: str, texts: list[str], lang: str | None, k: int, g: int):
    """Brute force: every live (filter-matching) chunk's exact score, grouped, max per group."""
    snap = r.searcher.snapshot
    ref = _reference(r, name, texts).astype(np.float64)
    out = []
    for i in range(len(texts)):
        groups: dict = {}
        for row in range(snap.num_rows):
            doc_id = str(snap.ids[row])
            if snap.row_of(doc_id) != row:
                continue  # deleted
            meta = snap.get(row)[2]
            if lang is not None and meta.get("lang") != lang:
                continue
            s = ref[i, row]
            if name != "dense" and s <= 0:
                continue
            groups.setdefault(_key(meta, doc_id), []).append(s)
        ranked = sorted(((max(v), key, sorted(v, reverse=True)[:g]) for key, v in groups.items()),
                        key=lambda t: -t[0])[:k]
        out.append(ranked)
    return out


@pytest.mark.parametrize("name", ["dense", "sparse", "bm25"])
@pytest.mark.parametrize("lang", [None, "de"])
def test_grouping_equals_brute_force_for_single_retrievers(kb, queries, name, lang):
    filt = {"lang": lang} if lang else None
    hits = kb.search(queries, k=K, method=name, group_by="parent_id", group_size=G, filter=filt)
    want = _brute_groups(kb, name, queries, lang, K, G)
    assert hits.ids.shape == (len(queries), K * G) and hits.group_keys.shape == (len(queries), K)
    for i, ranked in enumerate(want):
        groups = hits.groups(i)
        assert len(groups) == len(ranked)
        np.testing.assert_allclose([gr.score for gr in groups], [t[0] for t in ranked], rtol=1e-4, atol=1e-5)
        for j, (gr, (score, key, best)) in enumerate(zip(groups, ranked)):
            tied = any(abs(score - t[0]) < 1e-4 for n, t in enumerate(ranked) if n != j)
            if not tied:
                assert gr.key == (int(key[1]) if key[0] == "n" else key[1]), (name, i, j)
                np.testing.assert_allclose([h.scores[name] for h in gr.hits], best, rtol=1e-4, atol=1e-5)
            assert gr.rank == j + 1 and all(h.rank == j + 1 and h.group == gr.key for h in gr.hits)
            for h in gr.hits:
                assert lang is None or h.metadata["lang"] == lang
                assert kb.searcher.snapshot.row_of(h.id) is not None  # never a deleted chunk


def test_group_keys_keep_json_types_and_default_to_the_id(kb, queries):
    hits = kb.search(queries, k=40, method="dense", group_by="parent_id", group_size=5)
    keys = [gr.key for i in range(len(queries)) for gr in hits.groups(i)]
    assert 7 in keys and "7" in keys  # a number and a string are different groups
    for i in range(len(queries)):
        for gr in hits.groups(i):
            for h in gr.hits:
                assert h.metadata.get("parent_id", h.id) == gr.key
                assert type(h.metadata.get("parent_id", h.id)) is type(gr.key)


@pytest.mark.parametrize("method", ["rrf", "linear", "hybrid"])
def test_grouping_of_fused_methods_is_sane(kb, queries, method):
    hits = kb.search(queries, k=K, method=method, group_by="parent_id", group_size=G)
    flat = kb.search(queries, k=1, method=method)
    refs = {n: _reference(kb, n, queries) for n in ("dense", "sparse", "bm25")}
    snap = kb.searcher.snapshot
    for i in range(len(queries)):
        groups = hits.groups(i)
        assert len(groups) == K and len({gr.key for gr in groups}) == K
        scores = [gr.score for gr in groups]
        assert scores == sorted(scores, reverse=True)
        assert groups[0].hits[0].id == flat[i][0].id  # the best group holds the best chunk
        for gr in groups:
            assert gr.score == gr.hits[0].score and [h.score for h in gr.hits] == sorted(
                (h.score for h in gr.hits), reverse=True)
            for h in gr.hits:
                row = snap.row_of(h.id)
                for leg, v in h.scores.items():  # every leg's exact score of every chunk
                    if leg in refs:
                        np.testing.assert_allclose(v, refs[leg][i, row], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["dense", "bm25", "rrf", "hybrid"])
def test_pages_concatenate_to_the_unpaginated_list(kb, queries, method):
    full = kb.search(queries, k=15, method=method)
    pages = [kb.search(queries, k=5, method=method, offset=o) for o in (0, 5, 10)]
    np.testing.assert_array_equal(np.concatenate([p.ids for p in pages], axis=1), full.ids)
    np.testing.assert_allclose(np.concatenate([p.scores for p in pages], axis=1), full.scores, rtol=1e-6)
    assert [h.rank for h in pages[2][0]] == list(range(11, 11 + len(pages[2][0])))
    gfull = kb.search(queries, k=9, method=method, group_by="parent_id", group_size=2)
    gpages = [kb.search(queries, k=3, method=method, offset=o, group_by="parent_id", group_size=2)
              for o in (0, 3, 6)]
    np.testing.assert_array_equal(np.concatenate([p.group_keys for p in gpages], axis=1), gfull.group_keys)
    np.testing.assert_array_equal(np.concatenate([p.ids for p in gpages], axis=1), gfull.ids)
    ranks = [gr.rank for gr in gpages[1].groups(1)]
    assert ranks == list(range(4, 4 + len(ranks))) and (method == "bm25" or len(ranks) == 3)


def test_snippets_highlight_the_matched_words(kb, queries):
    matcher = WordMatcher()
    hits = kb.search(queries, k=5, method="bm25")
    for i, q in enumerate(queries):
        want = matcher.stems(q)
        for h in hits[i]:
            assert h.snippets, h.id
            s = h.snippets[0]
            assert h.text[s.start:s.end] == s.text
            if want & matcher.stems(h.text):  # (a BM25 hit may match its title only)
                assert s.words, f"a BM25 hit shows no matched word: {h.id}"
            for w in s.words:
                assert want & set(matcher.tokens(w)), (w, q)
            assert all(a == 0 or not s.text[a - 1].isalnum() for a, _ in s.highlights)  # whole words
            assert "snippets" in h.to_dict()


def test_snippet_windows_and_word_level_literal_terms():
    m = WordMatcher()
    text = "Intro words here. " * 20 + "The Stars shine brightly over the starry sea. " + "filler " * 40
    (s,) = make_snippets(text, m.stems("star shine"), m, words=8)
    assert "Stars" in s.words and "shine" in s.words and "**Stars**" in s.marked()
    assert m.tokens("the") == ()  # a stop word matches nothing
    # "star" is literal in a text holding only "Stars"; "##s" is decided by the text's own pieces
    assert literal_terms(["star", "galaxy", "##s"], "Stars", m, lambda: {11}, [5, 6, 11]) == [True, False, True]
    assert make_snippets("", m.stems("x"), m) == []


def test_matched_terms_are_decided_at_word_level(paired_encoder, tmp_path):
    r = HybridRetriever(paired_encoder).index(
        [{"id": "a", "text": "Stars and planets."}, {"id": "b", "text": "A quiet village."}], workdir=tmp_path / "i")
    hit = r.search("star", k=1, method="sparse")[0][0]
    terms = {t.term: t for t in hit.matched_terms}
    assert "star" in terms and terms["star"].expansion is False
    assert hit.snippets[0].words == ["Stars"]


def test_bad_grouping_and_page_arguments(kb):
    for kw in ({"group_size": 2}, {"group_by": ""}, {"group_by": "parent_id", "group_size": 0},
               {"offset": -1}, {"offset": True}, {"rerank_depth": 5}):
        with pytest.raises(ConfigError):
            kb.search("a question", k=3, **kw)


# -- the reranking stage ------------------------------------------------------------------------
class ByLength(Reranker):
    def scores(self, query, passages):
        return np.array([float(len(p)) for p in passages])


def test_a_cross_encoder_reorders_the_first_stage_as_its_scores_say(kb, queries, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tiny_cross_encoder(tmp_path / "ce")
    first = kb.search(queries, k=20, method="hybrid")
    hits = kb.search(queries, k=10, method="hybrid", rerank=str(folder), rerank_depth=20)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    changed = False
    for i, q in enumerate(queries):
        pool = {h.id: h for h in first[i]}
        got = hits[i]
        assert len(got) == 10 and {h.id for h in got} <= set(pool)
        texts = [f"{pool[h.id].title}\n{pool[h.id].text}" if pool[h.id].title else pool[h.id].text for h in pool.values()]
        with torch.inference_mode():
            enc = tok([q] * len(texts), texts, padding=True, truncation="only_second", max_length=512,
                      return_tensors="pt")
            ref = dict(zip(pool, model(**enc).logits[:, 0].numpy().tolist()))
        want = sorted(pool, key=lambda d: -ref[d])[:10]
        assert [h.id for h in got] == want  # the order follows the cross-encoder's scores
        for h in got:
            assert h.score == pytest.approx(ref[h.id], abs=1e-4) and h.scores["rerank"] == h.score
            assert {"dense", "sparse", "bm25"} <= set(h.scores)  # the first stage's legs stay
        changed |= [h.id for h in got] != [h.id for h in first[i][:10]]
    assert changed
    grouped = kb.search(queries, k=4, method="hybrid", rerank=ByLength(), rerank_depth=20, group_by="parent_id",
                        group_size=2)
    for i in range(len(queries)):
        lens = [gr.hits[0].score for gr in grouped.groups(i)]
        assert lens == sorted(lens, reverse=True)
        assert all(h.score == len(f"{h.title}\n{h.text}" if h.title else h.text) for h in grouped[i])


class Wrong(Reranker):
    def scores(self, query, passages):
        return [1.0]


def test_a_reranker_must_score_every_passage(kb):
    with pytest.raises(ConfigError, match="one score per passage"):
        kb.search("a question", k=3, rerank=Wrong(), rerank_depth=5)


def test_a_pickled_checkpoint_is_refused(tmp_path):
    (tmp_path / "ce").mkdir()
    (tmp_path / "ce" / "config.json").write_text("{}")
    (tmp_path / "ce" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="safetensors"):
        CrossEncoderReranker(tmp_path / "ce")


def test_grouping_digs_deeper_when_one_document_fills_the_top(paired_encoder, tmp_path):
    """40 chunks of one document outrank everything: the top list is deepened until k groups are
    certain, and the groups equal brute force."""
    big = [{"id": f"tower#{i}", "text": f"The Eiffel tower in Paris, part {i}, an iron lattice tower.",
            "metadata": {"parent_id": "tower"}} for i in range(40)]
    rest = [{"id": f"d{i}", "text": f"A note {i} about towers of stone and iron in old cities.",
             "metadata": {"parent_id": f"p{i % 6}"}} for i in range(30)]
    r = HybridRetriever(paired_encoder).index(big + rest, workdir=tmp_path / "i")
    for name in ("dense", "bm25"):
        flat = r.search("eiffel tower paris iron lattice", k=16, method=name)
        assert {h.metadata["parent_id"] for h in flat[0]} == {"tower"}  # the first round holds one group
        hits = r.search("eiffel tower paris iron lattice", k=4, method=name, group_by="parent_id", group_size=3)
        want = _brute_groups(r, name, ["eiffel tower paris iron lattice"], None, 4, 3)[0]
        got = hits.groups(0)
        assert [g.key for g in got][0] == "tower" and len(got) == len(want) == 4
        np.testing.assert_allclose([g.score for g in got], [t[0] for t in want], rtol=1e-4, atol=1e-5)
        for g, (_, _, best) in zip(got, want):
            np.testing.assert_allclose([h.score for h in g.hits], best, rtol=1e-4, atol=1e-5)
