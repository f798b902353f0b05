"""The write side of RAG knowledge bases on the real packaged models: chunking (offsets, token
limits of both models, boundaries), chunk-level upsert (only changed chunks encoded, vanished
chunks deleted, equal to a fresh build), delete by document id and by filter (equal to deleting
the listed ids), and expiry with an injected clock (never returned by any method, BM25 statistics
of the live documents, gone after compact) -- in the library, the CLI, the HTTP API and the Client."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import pytest
from _serving import serving

from hybridret import HybridRetriever
from hybridret.chunking import Chunker
from hybridret.cli import main
from hybridret.data import Document
from hybridret.encoders import PairedEncoder
from hybridret.errors import ConfigError, CorpusFormatError, DocumentNotFoundError, IndexExistsError
from hybridret.methods import method_names
from hybridret.retrievers import REGISTRY

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "hybridret" / "resources" / "sample" / "corpus.jsonl"
QUERIES = ["What happens when a star exhausts its hydrogen?", "icy bodies beyond Neptune", "how do tides work",
           "volcanic eruptions", "the immune system"]
KEY = "rag-write-test-key-0123456789"


class CountingEncoder(PairedEncoder):
    """The packaged pair, counting the document texts it encodes (the encodings are the real ones)."""

    def __init__(self, base: PairedEncoder) -> None:
        super().__init__(base.dense, base.sparse)
        self.encoded = 0

    def encode_documents(self, texts, **kw):
        self.encoded += len(texts)
        return super().encode_documents(texts, **kw)


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def passages() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.open(encoding="utf-8")]


def long_docs(passages: list[dict], n: int, per: int = 4, start: int = 0) -> list[dict]:
    """``n`` documents of ``per`` sample passages each, one paragraph per passage."""
    out = []
    for i in range(n):
        group = passages[start + i * per:start + (i + 1) * per]
        out.append({"id": f"doc{i}", "title": group[0]["title"], "text": "\n\n".join(p["text"] for p in group),
                     "metadata": {"source": ("wiki", "news", "blog")[i % 3], "year": 2015 + i % 7}})
    return out


def live_ids(r: HybridRetriever) -> set[str]:
    return set(r.searcher.current().live_ids())


def assert_same_results(r: HybridRetriever, ref: HybridRetriever, methods, k: int = 8, **kw) -> None:
    for method in methods:
        got, want = r.search(QUERIES, k=k, method=method, **kw), ref.search(QUERIES, k=k, method=method, **kw)
        for i in range(len(QUERIES)):
            g = [(d, s) for d, s in zip(got.ids[i], got.scores[i]) if d]
            w = [(d, s) for d, s in zip(want.ids[i], want.scores[i]) if d]
            assert len(g) == len(w), f"{method} query {i}"
            np.testing.assert_allclose([s for _, s in g], [s for _, s in w], rtol=2e-4, atol=2e-5,
                                       err_msg=f"{method} query {i}")
            for (dg, sg), (dw, sw) in zip(g, w):  # same ids up to ties
                assert dg == dw or abs(sg - sw) <= 2e-4 * max(1.0, abs(sw)), f"{method} query {i}: {dg} vs {dw}"


SINGLE = ("dense", "sparse", "bm25")
ALL = method_names(REGISTRY)


# ------------------------------------------------------------------------------------------ chunking
def test_chunks_are_exact_slices_within_every_models_limit(paired_encoder, passages):
    docs = long_docs(passages, 6, per=5)
    chunker = Chunker(64, 16, encoder=paired_encoder)
    tokenizers = paired_encoder.document_tokenizers()
    assert len(tokenizers) == 2  # the dense and the learned-sparse model
    for d in docs:
        doc = Document(d["id"], d["text"], d["title"], d["metadata"])
        chunks = chunker.chunk(doc)
        assert len(chunks) > 2
        assert [c.id for c in chunks] == [f"{doc.id}#{i}" for i in range(len(chunks))]
        covered = np.zeros(len(doc.text), dtype=bool)
        prev_end = 0
        for i, c in enumerate(chunks):
            m = c.metadata
            assert m["parent_id"] == doc.id and m["chunk"] == i and m["source"] == d["metadata"]["source"]
            assert c.text == doc.text[m["start"]:m["end"]] and c.title == doc.title
            covered[m["start"]:m["end"]] = True
            assert m["start"] >= (0 if i == 0 else chunks[i - 1].metadata["start"]) and m["end"] > prev_end
            prev_end = m["end"]
            dense_tok = tokenizers[0][0]
            assert len(dense_tok(c.text, add_special_tokens=False)["input_ids"]) <= 64
            for tok, max_length, prefix in tokenizers:  # nothing is truncated by either encoder
                assert len(tok(prefix + c.full_text, add_special_tokens=True)["input_ids"]) <= max_length
            if i:  # the overlap: at most 16 tokens of the previous chunk, starting at a word
                shared = chunks[i - 1].metadata["end"] - m["start"]
                if shared > 0:
                    assert len(dense_tok(doc.text[m["start"]:chunks[i - 1].metadata["end"]],
                                         add_special_tokens=False)["input_ids"]) <= 16
                    assert m["start"] == 0 or not doc.text[m["start"] - 1].isalnum()
        assert all(covered[j] or doc.text[j].isspace() for j in range(len(doc.text)))  # nothing left out


def test_chunks_end_at_paragraphs_then_sentences(paired_encoder, passages):
    paras = [p["text"] for p in passages[:6]]
    text = "\n\n".join(paras)
    chunker = Chunker(200, encoder=paired_encoder)  # every passage fits, two rarely do
    chunks = chunker.chunk(Document("d", text))
    for c in chunks:
        end = c.metadata["end"]
        assert end == len(text) or text[end:end + 2] == "\n\n", repr(c.text[-40:])
    small = Chunker(24, encoder=paired_encoder).chunk(Document("d", paras[0]))  # sentences are cut points now
    assert len(small) > 2
    assert sum(c.text.rstrip()[-1] in ".!?" for c in small) >= len(small) - 1


def test_short_documents_are_one_chunk_and_bad_settings_are_refused(paired_encoder):
    chunker = Chunker(128, 32, encoder=paired_encoder)
    one = chunker.chunk(Document("a", "A short text.", "Title", {"k": 1}))
    assert [(c.id, c.text, c.metadata) for c in one] == [
        ("a#0", "A short text.", {"k": 1, "parent_id": "a", "chunk": 0, "start": 0, "end": 13})]
    with pytest.raises(ConfigError, match="more than the encoder reads"):
        Chunker(400, encoder=paired_encoder)  # both models read 256 tokens
    with pytest.raises(ConfigError, match="chunk_overlap"):
        Chunker(64, 40, encoder=paired_encoder)
    with pytest.raises(CorpusFormatError, match="parent_id"):
        chunker.chunk(Document("a", "text", metadata={"parent_id": "x"}))


# --------------------------------------------------------------------------------- chunked writes
def test_upsert_reencodes_only_changed_chunks_and_equals_a_fresh_build(paired_encoder, passages, tmp_path):
    enc = CountingEncoder(paired_encoder)
    docs = long_docs(passages, 8)
    r = HybridRetriever(enc).index(docs, chunk_tokens=64, chunk_overlap=0, workdir=tmp_path / "idx")
    assert r.manifest["chunking"] == {"tokens": 64, "overlap": 0}
    chunker = Chunker(64, encoder=paired_encoder)

    def texts_of(d):
        return [c.full_text for c in chunker.chunk(Document(d["id"], d["text"], d["title"], d["metadata"]))]

    n_chunks = {d["id"]: len(texts_of(d)) for d in docs}
    assert r.num_docs == sum(n_chunks.values()) and enc.encoded == r.num_docs

    # one paragraph changed in doc1, doc2 cut to its first paragraph, doc3 unchanged, doc4 re-tagged
    paras = docs[1]["text"].split("\n\n")
    paras[2] = "Tidal forces stretch moons; this paragraph was rewritten for the test."
    changed = dict(docs[1], text="\n\n".join(paras))
    cut = dict(docs[2], text=docs[2]["text"].split("\n\n")[0])
    tagged = dict(docs[4], metadata={**docs[4]["metadata"], "source": "archive"})
    want_encoded = len(set(texts_of(changed)) - set(texts_of(docs[1]))) + len(set(texts_of(cut)) - set(texts_of(docs[2])))
    assert want_encoded >= 1
    before = enc.encoded
    res = r.upsert([changed, cut, docs[3], tagged])
    assert res.encoded == want_encoded == enc.encoded - before  # only chunks with new text went through the models
    vanished = n_chunks["doc1"] - len(texts_of(changed)) + n_chunks["doc2"] - len(texts_of(cut))
    assert vanished >= 5 and res.deleted == vanished  # chunks past the new ends
    assert res.unchanged >= n_chunks["doc3"]
    ids = live_ids(r)
    assert {f"doc2#{i}" for i in range(len(texts_of(cut)), n_chunks["doc2"])}.isdisjoint(ids)
    assert r.get(["doc4#0"])[0]["metadata"]["source"] == "archive"
    assert r.upsert([changed, cut, docs[3], tagged]).commit is None  # all unchanged: nothing written

    final = [d for d in docs if d["id"] not in ("doc1", "doc2", "doc4")] + [changed, cut, tagged]
    fresh = HybridRetriever(paired_encoder).index(final, chunk_tokens=64)
    assert ids == live_ids(fresh)
    for doc_id in ("doc1#2", "doc2#0", "doc4#1"):
        assert r.get([doc_id]) == fresh.get([doc_id])
    assert_same_results(r, fresh, SINGLE)

    # add with the recorded chunking; an id already there is refused; delete by document id
    r.add([dict(docs[0], id="new")])
    assert {f"new#{i}" for i in range(n_chunks["doc0"])} <= live_ids(r)
    with pytest.raises(IndexExistsError):
        r.add([docs[5]])
    out = r.delete(["doc5", "new"])
    assert out.deleted == n_chunks["doc5"] + n_chunks["doc0"]
    assert not any(i.startswith(("doc5#", "new#")) for i in live_ids(r))
    with pytest.raises(DocumentNotFoundError):
        r.delete(["doc5"])
    hits = r.search(QUERIES, k=20, method="bm25").ids
    assert not any(str(h).startswith("doc5#") for h in hits.ravel())


def test_a_parent_id_field_of_the_users_own_is_not_a_chunk(paired_encoder):
    r = HybridRetriever(paired_encoder).index([
        {"id": "q1", "text": "Questions about comets.", "parent_id": "p"},   # the user's own field
        {"id": "p", "text": "A page about comets and their tails."}])
    assert r.delete("p").deleted == 1 and r.get(["q1"])[0] is not None
    with pytest.raises(DocumentNotFoundError):
        r.delete("nothing")
    r.upsert([{"id": "p", "text": "A longer page about comets. " * 30}], chunk_tokens=32)
    assert live_ids(r) == {"q1"} | {f"p#{i}" for i in range(len(live_ids(r)) - 1)}
    n_chunks = len(live_ids(r)) - 1
    assert n_chunks > 3
    assert r.upsert([{"id": "p", "text": "Back to one short page."}], chunk_tokens=0).deleted == n_chunks
    assert live_ids(r) == {"q1", "p"}  # unchunked again: its chunks went with the upsert


# ------------------------------------------------------------------------------- delete by filter
FILTERS = [{"source": "news"}, {"year": {"$gte": 2019}}, {"$or": [{"source": "blog"}, {"year": 2015}]},
           {"source": "none-such"}]


def _matches(meta: dict, spec: dict) -> bool:
    """A plain reading of the filters above."""
    if "$or" in spec:
        return any(_matches(meta, s) for s in spec["$or"])
    (key, want), = spec.items()
    if isinstance(want, dict):
        return meta.get(key, -1) >= want["$gte"]
    return meta.get(key) == want


@pytest.mark.parametrize("spec", FILTERS)
def test_delete_by_filter_equals_deleting_the_listed_ids(paired_encoder, passages, tmp_path, spec):
    rng = random.Random(7)
    docs = [{"id": p["_id"], "title": p["title"], "text": p["text"],
             "metadata": {"source": rng.choice(["wiki", "news", "blog"]), "year": rng.randrange(2015, 2023)}}
            for p in passages[:50]]
    cache = tmp_path / "cache"
    a = HybridRetriever(paired_encoder).index(docs[:40], encode_cache=cache)
    a.add(docs[40:], encode_cache=cache)  # two segments
    a.delete([docs[3]["id"]])  # and a tombstone
    b = HybridRetriever(paired_encoder).index(docs[:40], encode_cache=cache)
    b.add(docs[40:], encode_cache=cache)
    b.delete([docs[3]["id"]])
    listed = sorted(d["id"] for d in docs if d["id"] != docs[3]["id"] and _matches(d["metadata"], spec))
    dry = a.delete(filter=spec, dry_run=True)
    assert dry.commit is None and dry.deleted == len(listed) and sorted(dry.matched) == listed
    commit = a.searcher.snapshot.commit
    got = a.delete(filter=spec)
    assert got.deleted == len(listed)
    assert (got.commit is None) == (not listed) and a.searcher.snapshot.commit == commit + bool(listed)
    if listed:
        b.delete(listed)
    assert live_ids(a) == live_ids(b) == {d["id"] for d in docs} - set(listed) - {docs[3]["id"]}
    assert_same_results(a, b, ALL)
    with pytest.raises(ConfigError):
        a.delete(["x"], filter=spec)
    with pytest.raises(ConfigError, match="filter"):
        a.delete(filter={"year": {"$bogus": 1}})


# ---------------------------------------------------------------------------------------- expiry
def test_expired_documents_are_never_returned_and_gone_after_compact(paired_encoder, passages, tmp_path):
    clock = Clock()
    t0 = clock.now
    docs = [{"id": p["_id"], "title": p["title"], "text": p["text"], "metadata": {"n": i}}
            for i, p in enumerate(passages[:40])]
    for i, d in enumerate(docs):  # a quarter expire at t0+100 (epoch), a quarter at t0+200 (ISO), the rest never
        if i % 4 == 0:
            d["metadata"]["expires_at"] = t0 + 100
        elif i % 4 == 1:
            iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0 + 200))
            d["metadata"]["expires_at"] = iso
    cache = tmp_path / "cache"
    r = HybridRetriever(paired_encoder, clock=clock).index(docs[:30], workdir=tmp_path / "idx", encode_cache=cache)
    r.add(docs[30:], encode_cache=cache, ttl=150)  # expires_at = t0 + 150 for those without one
    assert r.get(["s0040"])[0]["metadata"]["expires_at"] == pytest.approx(t0 + 150)

    def alive(t):
        out = []
        for i, d in enumerate(docs):
            exp = {0: t0 + 100, 1: t0 + 200}.get(i % 4, t0 + 150 if i >= 30 else None)
            if exp is None or exp > t:
                out.append(d)
        return out

    for t in (t0, t0 + 100, t0 + 160, t0 + 250):
        clock.now = t
        keep = alive(t)
        expect = {d["id"] for d in keep}
        ref = HybridRetriever(paired_encoder).index(
            [{**d, "metadata": {k: v for k, v in d["metadata"].items() if k != "expires_at"}} for d in keep],
            encode_cache=cache)
        assert r.num_docs == len(keep) and live_ids(r) == expect
        for method in ALL:  # every method, with and without a filter: never an expired document
            for filt in (None, {"n": {"$lt": 20}}):
                hits = r.search(QUERIES, k=40, method=method, filter=filt)
                returned = {str(x) for x in hits.ids.ravel() if x}
                assert returned <= expect, f"{method} at t0+{t - t0:.0f}: {returned - expect}"
        # BM25 statistics etc. are those of the live documents (sparse_approx, approximate, aside)
        assert_same_results(r, ref, [m for m in ALL if m != "sparse_approx"], k=10)
        assert [g is not None for g in r.get([d["id"] for d in docs])] == [d["id"] in expect for d in docs]

    # re-adding an expired id is allowed (its old row is replaced); purge tombstones the rest
    r.add([dict(docs[0], metadata={"n": 0})])
    assert "s0001" in live_ids(r)
    expired = 40 - len(alive(clock.now)) - 1
    assert r.info()["num_expired"] == expired
    purged = r.purge()
    assert purged.deleted == expired and r.info()["num_expired"] == 0 and r.num_docs == len(alive(clock.now)) + 1
    clock.now = t0 + 10_000
    r.upsert([docs[5]])  # expires at t0+200: already expired when written
    res = r.compact()
    assert res.deleted >= 1
    snap = r.searcher.snapshot
    assert len(snap.segments) == 1 and snap.num_rows == r.num_docs == len(alive(clock.now)) + 1
    assert docs[5]["id"] not in set(snap.ids.tolist())  # physically gone


def test_expiry_values_are_validated(paired_encoder):
    r = HybridRetriever(paired_encoder)
    with pytest.raises(CorpusFormatError, match="expires_at"):
        r.index([{"id": "a", "text": "x", "expires_at": "next tuesday"}])
    with pytest.raises(CorpusFormatError, match="expires_at"):
        r.index([{"id": "a", "text": "x", "expires_at": True}])
    with pytest.raises(ConfigError, match="ttl"):
        r.index([{"id": "a", "text": "x"}], ttl=-5)


# -------------------------------------------------------------------------------------------- CLI
def test_cli_chunk_add_delete_by_filter_dry_run_and_purge(passages, tmp_path, capsys):
    docs = long_docs(passages, 4)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d["id"], "title": d["title"], "text": d["text"],
                                          **d["metadata"]}) + "\n" for d in docs))
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"_id": "gone", "text": "An expired note about comets.", "source": "blog",
                                "expires_at": "2001-01-01T00:00:00Z"}) + "\n" +
                    json.dumps({"_id": "later", "text": passages[30]["text"], "source": "blog"}) + "\n")
    idx = tmp_path / "idx"
    assert main(["-q", "index", str(corpus), "-o", str(idx), "--chunk-tokens", "80", "--chunk-overlap", "16"]) == 0
    r = HybridRetriever.load(idx)
    n = r.num_docs
    assert n > len(docs) and all("#" in i for i in live_ids(r))
    assert main(["-q", "add", str(idx), str(more), "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["added"] == 2  # one chunk each (the recorded chunking)
    assert main(["-q", "search", str(idx), "comets", "--method", "bm25", "--json"]) == 0
    assert "gone#0" not in capsys.readouterr().out  # expired in 2001
    assert main(["-q", "delete", str(idx), "--filter", '{"source": "blog"}', "--dry-run"]) == 0
    out = capsys.readouterr().out
    snap = HybridRetriever.load(idx).searcher.snapshot  # the commit itself: expired documents are still in it
    blog = sorted(i for i in snap.live_ids() if snap.get(snap.row_of(i))[2]["source"] == "blog")
    assert "gone#0" in blog and "later#0" in blog  # a filter deletes expired documents too
    parents = {i.split("#")[0] for i in blog}  # counted in documents, with their chunks
    assert f"would delete {len(parents)} documents ({len(blog)} chunks)" in out and all(i in out for i in blog)
    assert snap.commit == 2  # nothing deleted
    assert main(["-q", "purge", str(idx), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"] == 1  # "gone"
    assert main(["-q", "delete", str(idx), "--filter", '{"source": "blog"}', "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"] == len(blog) - 1
    assert main(["-q", "delete", str(idx), "doc0", "--json"]) == 0  # a document id: all its chunks
    r = HybridRetriever.load(idx)
    assert not any(i.startswith("doc0#") for i in live_ids(r))
    assert main(["-q", "delete", str(idx), "doc1", "--filter", '{"source": "x"}']) == 1
    assert "not both" in capsys.readouterr().err
    assert main(["-q", "delete", str(idx), "--filter", '{"source": ']) == 1
    assert "not valid JSON" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- API and Client
@pytest.fixture
def served(paired_encoder, passages, tmp_path):

    from hybridret.serve.app import ServeConfig, create_app

    clock = Clock()
    r = HybridRetriever(paired_encoder, clock=clock)
    r.index(long_docs(passages, 4), chunk_tokens=96, workdir=tmp_path / "idx", show_progress=False)
    with serving(create_app(r, ServeConfig(api_key=KEY, batching=False))) as url:
        yield url, r, clock


def test_api_and_client_chunk_expire_and_delete_by_filter(served, passages):
    import httpx

    from hybridret.client import Client

    url, r, clock = served
    with Client(url, api_key=KEY, timeout=60) as c:
        res = c.add([{"id": "note", "text": passages[40]["text"], "metadata": {"source": "blog"}}], ttl=60)
        assert res["added"] == 1 and "note#0" in live_ids(r)  # chunked as the index records
        assert "note#0" in {h.id for h in c.search(passages[40]["title"], k=5, method="bm25")[0]}
        clock.now += 61  # the note expired: no method returns it, get does not find it
        for method in ALL:
            assert "note#0" not in {h.id for h in c.search(passages[40]["title"], k=20, method=method)[0]}
        assert c.get(["note#0"]) == [None]
        assert c.purge()["deleted"] == 1
        news = sorted(i for i in live_ids(r) if r.get([i])[0]["metadata"]["source"] == "news")
        dry = c.delete(filter={"source": "news"}, dry_run=True)
        assert dry["deleted"] == len(news) and sorted(dry["matched"]) == news and dry.get("commit") is None
        done = c.delete(filter={"source": "news"})
        assert done["deleted"] == len(news) and done["num_docs"] == r.num_docs
        assert not set(news) & live_ids(r)
        n0 = sum(i.startswith("doc0#") for i in live_ids(r))
        assert n0 > 1 and c.delete("doc0")["deleted"] == n0  # a document id: all its chunks
        assert not any(i.startswith("doc0#") for i in live_ids(r))
        with pytest.raises(ConfigError):
            c.delete(["a"], filter={"source": "x"})
    # writes need the key; a request with both ids and filter is malformed
    body = {"filter": {"source": "wiki"}}
    assert httpx.request("DELETE", f"{url}/documents", json=body).status_code == 401
    assert httpx.post(f"{url}/purge").status_code == 401
    bad = httpx.request("DELETE", f"{url}/documents", json={"ids": ["a"], **body},
                        headers={"Authorization": f"Bearer {KEY}"})
    assert bad.status_code == 422
    bad = httpx.request("DELETE", f"{url}/documents", json={"filter": {"year": {"$bogus": 1}}},
                        headers={"Authorization": f"Bearer {KEY}"})
    assert bad.status_code == 400 and "$bogus" in bad.json()["error"]["message"]
