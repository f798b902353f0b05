"""LangChain, LlamaIndex and Haystack adapters against the real frameworks, on one small index: each
adapter returns what the Searcher returns, filters (hybridret's and the translated Haystack/LlamaIndex
ones, checked by hand and against Haystack's own filter evaluator), batch == single calls, async,
serialisation inside a Haystack Pipeline, and LangChain's VectorStore over a living index."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridret import HybridRetriever, Searcher
from hybridret.errors import ConfigError, DocumentNotFoundError
from hybridret.filters import FilterError

SAMPLE = Path(__file__).resolve().parents[1] / "hybridret" / "resources" / "sample"
N = 60
QUERIES = [json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").open()][:4]


def _meta(i: int) -> dict:
    out = {"year": 2000 + i, "src": {"kind": "news" if i % 4 == 0 else "wiki"}, "tags": ["odd" if i % 2 else "even"]}
    if i % 10 != 9:  # every tenth document has no "lang": Haystack's "== None" must match it
        out["lang"] = ("en", "de", "fr")[i % 3]
    return out


DOCS = [{"id": d["_id"], "title": d.get("title", ""), "text": d["text"], "metadata": _meta(i)}
        for i, d in enumerate(json.loads(line) for line in (SAMPLE / "corpus.jsonl").open()) if i < N]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("integrations") / "index"
    HybridRetriever.from_models().index(DOCS, workdir=root)
    return root


@pytest.fixture(scope="module")
def searcher(index_dir) -> Searcher:
    return Searcher(index_dir, warm=True)


class CountingSearcher:
    """Any object with hybridret's search signature works; this one counts the calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def search(self, queries, k=10, *, method="hybrid", filter=None):
        self.calls.append(queries)
        return self.inner.search(queries, k, method=method, filter=filter)


def expected(searcher, query, k=10, method="hybrid", filter=None):
    return [(h.id, h.score) for h in searcher.search(query, k, method=method, filter=filter)[0]]


def finite(scores):
    return {k: v for k, v in scores.items() if v == v}


# -- packaging -----------------------------------------------------------------------------------
def test_import_hybridret_imports_no_framework_and_missing_framework_names_the_extra(monkeypatch):
    code = ("import sys, hybridret, hybridret.integrations as i; assert 'HybridRetVectorStore' in dir(i); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('langchain_core', 'llama_index', 'haystack')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    from hybridret.integrations._common import require

    for module, extra in (("langchain_core", "langchain"), ("llama_index.core", "llamaindex"), ("haystack", "haystack")):
        monkeypatch.setitem(sys.modules, module, None)  # what an uninstalled package looks like to import
        with pytest.raises(ImportError, match=rf"pip install 'hybridret\[{extra}\]'"):
            require(module, extra, extra)
    with pytest.raises(AttributeError):
        import hybridret.integrations as integrations

        integrations.NoSuchAdapter  # noqa: B018


# -- LangChain -----------------------------------------------------------------------------------
def test_langchain_retriever_matches_searcher_and_overrides(searcher, index_dir):
    pytest.importorskip("langchain_core", reason="LangChain adapter: pip install 'hybridret[langchain]'")
    from hybridret.integrations import HybridRetLangChainRetriever

    r = HybridRetLangChainRetriever(searcher=searcher, k=5)
    for q in QUERIES[:2]:
        docs = r.invoke(q)
        hits = searcher.search(q, 5)[0]
        assert [(d.id, d.metadata["score"]) for d in docs] == [(h.id, h.score) for h in hits]
        for d, h in zip(docs, hits):
            assert d.page_content == h.text and d.metadata["title"] == h.title and d.metadata["id"] == h.id
            assert d.metadata["scores"] == finite(h.scores)
            assert {k: d.metadata[k] for k in h.metadata} == h.metadata
    # per-call k, filter and method; a filter given replaces the default one
    flt = {"lang": "de"}
    docs = r.invoke(QUERIES[0], k=3, filter=flt, method="bm25")
    assert [(d.id, d.metadata["score"]) for d in docs] == expected(searcher, QUERIES[0], 3, "bm25", flt)
    assert all(d.metadata["lang"] == "de" for d in docs)
    old = {"year": {"$lt": 2010}}
    r2 = HybridRetLangChainRetriever(searcher=str(index_dir), k=4, filter=old)
    assert [d.id for d in r2.invoke(QUERIES[1])] == [i for i, _ in expected(searcher, QUERIES[1], 4, filter=old)]
    assert [d.id for d in r2.invoke(QUERIES[1], filter={})] == [i for i, _ in expected(searcher, QUERIES[1], 4)]
    # runtime config through LangChain's own configurable fields
    from langchain_core.runnables import ConfigurableField

    conf = r.configurable_fields(k=ConfigurableField(id="k"))
    assert len(conf.invoke(QUERIES[0], config={"configurable": {"k": 2}})) == 2
    with pytest.raises(ValueError, match="expected a hybridret Searcher"):  # pydantic's ValidationError
        HybridRetLangChainRetriever(searcher=object())


def test_langchain_batch_is_one_search_and_async(searcher):
    pytest.importorskip("langchain_core", reason="LangChain adapter: pip install 'hybridret[langchain]'")
    from langchain_core.callbacks import BaseCallbackHandler

    from hybridret.integrations import HybridRetLangChainRetriever

    class Count(BaseCallbackHandler):
        def __init__(self):
            self.starts = self.ends = 0

        def on_retriever_start(self, *a, **kw):
            self.starts += 1

        def on_retriever_end(self, *a, **kw):
            self.ends += 1

    spy = CountingSearcher(searcher)
    r = HybridRetLangChainRetriever(searcher=spy, k=4)
    single = [[(d.id, d.metadata["score"]) for d in r.invoke(q)] for q in QUERIES]
    spy.calls.clear()
    handler = Count()
    batched = r.batch(QUERIES, config={"callbacks": [handler]})
    assert len(spy.calls) == 1 and spy.calls[0] == QUERIES
    got = [[(d.id, d.metadata["score"]) for d in docs] for docs in batched]
    hits = searcher.search(QUERIES, 4)
    assert got == [[(h.id, h.score) for h in hits[i]] for i in range(len(QUERIES))]  # exactly the batched search
    # and the single calls, up to float noise: a batch encodes padded queries (~1e-7 apart)
    assert [[i for i, _ in q] for q in got] == [[i for i, _ in q] for q in single]
    assert [[s for _, s in q] for q in got] == [[pytest.approx(s, rel=1e-5) for _, s in q] for q in single]
    assert handler.starts == handler.ends == len(QUERIES)
    assert r.batch([]) == []
    assert [d.id for d in r.batch(QUERIES[:2], k=2)[1]] == [i for i, _ in expected(searcher, QUERIES[1], 2)]

    async def go():
        one = await r.ainvoke(QUERIES[0], k=3)
        many = await r.abatch(QUERIES)
        return one, many

    one, many = asyncio.run(go())
    assert [(d.id, d.metadata["score"]) for d in one] == expected(searcher, QUERIES[0], 3)
    assert [[(d.id, d.metadata["score"]) for d in docs] for docs in many] == got
    errors = r.batch(QUERIES[:2], return_exceptions=True, method="nope")
    assert all(isinstance(e, ConfigError) for e in errors)


def test_langchain_vectorstore_living_index(searcher):
    pytest.importorskip("langchain_core", reason="LangChain adapter: pip install 'hybridret[langchain]'")
    from langchain_core.documents import Document

    from hybridret.integrations import HybridRetVectorStore

    encoder = searcher.encoder
    store = HybridRetVectorStore.from_texts([d["text"] for d in DOCS[:5]], metadatas=[{"n": i} for i in range(5)],
                                            ids=[d["id"] for d in DOCS[:5]], encoder=encoder)
    living = store.index
    assert living.num_docs == 5 and store.embeddings is None
    ids = store.add_documents([
        Document(id="lc-1", page_content="Honey bees dance to tell the hive where the flowers are.",
                 metadata={"title": "Bees", "kind": "insect"}),
        Document(page_content="Wolves hunt in packs across the tundra.", metadata={"id": "lc-2", "kind": "mammal"}),
        Document(page_content="Penguins cannot fly but swim very fast.", metadata={"kind": "bird"}),
    ])
    assert ids[:2] == ["lc-1", "lc-2"] and len(ids[2]) == 36  # the third got a UUID4
    assert store.add_texts(["Octopuses have three hearts."], [{"kind": "mollusc"}], ids=["lc-4"]) == ["lc-4"]
    assert living.num_docs == 9
    top = store.similarity_search("how do bees tell each other where flowers are", k=2)
    assert top[0].id == "lc-1" and top[0].metadata["title"] == "Bees" and top[0].metadata["kind"] == "insect"
    with_score = store.similarity_search_with_score("wolf packs", k=3, filter={"kind": {"$in": ["mammal", "bird"]}})
    assert [d.id for d, _ in with_score][0] == "lc-2" and {d.metadata["kind"] for d, _ in with_score} <= {"mammal", "bird"}
    assert [(d.id, s) for d, s in with_score] == expected(living, "wolf packs", 3, filter={"kind": {"$in": ["mammal", "bird"]}})
    # an upsert replaces: same id, new text
    store.add_documents([Document(id="lc-2", page_content="Grey wolves howl at night.", metadata={"kind": "mammal"})])
    assert living.num_docs == 9
    assert store.get_by_ids(["lc-2", "missing"])[0].page_content == "Grey wolves howl at night."
    assert store.delete(["lc-1", ids[2]]) is True
    assert living.num_docs == 7
    assert "lc-1" not in [d.id for d in store.similarity_search("honey bees dance", k=7)]
    assert store.get_by_ids(["lc-1"]) == []
    with pytest.raises(DocumentNotFoundError):
        store.delete(["lc-1"])
    store.delete(["lc-1"], missing="ignore")
    with pytest.raises(ValueError, match="needs the ids"):
        store.delete()
    retriever = store.as_retriever(search_kwargs={"k": 1})
    assert retriever.invoke("octopus hearts")[0].id == "lc-4"
    assert asyncio.run(store.asimilarity_search("octopus hearts", k=1))[0].id == "lc-4"
    # what it cannot honour says so
    with pytest.raises(ValueError, match="embedding=None"):
        HybridRetVectorStore.from_texts(["x"], embedding=object())
    with pytest.raises(NotImplementedError, match="by text"):
        store.similarity_search_by_vector([0.1, 0.2])
    pairs = store.similarity_search_with_relevance_scores("octopus hearts", k=2)  # calibrated: tests/test_relevance.py
    assert pairs[0][0].id == "lc-4" and 0 <= pairs[1][1] <= pairs[0][1] <= 1
    with pytest.raises(NotImplementedError, match="document vectors"):
        store.max_marginal_relevance_search("x")
    read_only = HybridRetVectorStore(searcher)
    assert [d.id for d in read_only.similarity_search(QUERIES[0], k=3)] == [i for i, _ in expected(searcher, QUERIES[0], 3)]
    with pytest.raises(ConfigError, match="read-only"):
        read_only.add_texts(["x"])


# -- LlamaIndex ----------------------------------------------------------------------------------
def test_llamaindex_retriever_filters_and_async(searcher):
    pytest.importorskip("llama_index.core", reason="LlamaIndex adapter: pip install 'hybridret[llamaindex]'")
    from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

    from hybridret.integrations import HybridRetLlamaIndexRetriever, llamaindex_filters_to_hybridret

    r = HybridRetLlamaIndexRetriever(searcher, similarity_top_k=5)
    for q in QUERIES[:2]:
        nodes = r.retrieve(q)
        hits = searcher.search(q, 5)[0]
        assert [(n.node.node_id, n.score) for n in nodes] == [(h.id, h.score) for h in hits]
        assert [n.node.get_content() for n in nodes] == [h.text for h in hits]
        assert nodes[0].node.metadata["title"] == hits[0].title and nodes[0].node.metadata["scores"] == finite(hits[0].scores)
        assert "scores" not in nodes[0].node.get_metadata_str(mode="llm")
    # translation, by hand
    f = MetadataFilters(filters=[MetadataFilter(key="lang", value="en"),
                                 MetadataFilter(key="year", value=2030, operator=FilterOperator.LT),
                                 MetadataFilters(filters=[MetadataFilter(key="src.kind", value="news"),
                                                          MetadataFilter(key="tags", value=["odd"], operator=FilterOperator.ANY)],
                                                 condition=FilterCondition.OR)])
    want = {"$and": [{"lang": "en"}, {"year": {"$lt": 2030}}, {"$or": [{"src.kind": "news"}, {"tags": {"$in": ["odd"]}}]}]}
    assert llamaindex_filters_to_hybridret(f) == want
    assert llamaindex_filters_to_hybridret(MetadataFilters(
        filters=[MetadataFilter(key="lang", value=["de", "fr"], operator=FilterOperator.NIN),
                 MetadataFilter(key="tags", value="even", operator=FilterOperator.CONTAINS)],
        condition=FilterCondition.NOT)) == {"$not": {"$or": [{"lang": {"$nin": ["de", "fr"]}}, {"tags": "even"}]}}
    assert llamaindex_filters_to_hybridret({"lang": "en"}) == {"lang": "en"}
    with pytest.raises(FilterError, match="text_match"):
        HybridRetLlamaIndexRetriever(searcher, filters=MetadataFilters(
            filters=[MetadataFilter(key="lang", value="e", operator=FilterOperator.TEXT_MATCH)]))
    fr = HybridRetLlamaIndexRetriever(searcher, similarity_top_k=4, filters=f, method="sparse")
    nodes = fr.retrieve(QUERIES[2])
    assert [(n.node.node_id, n.score) for n in nodes] == expected(searcher, QUERIES[2], 4, "sparse", want)
    assert all(n.node.metadata["lang"] == "en" for n in nodes)
    nodes = asyncio.run(r.aretrieve(QUERIES[3]))
    assert [(n.node.node_id, n.score) for n in nodes] == expected(searcher, QUERIES[3], 5)


# -- Haystack ------------------------------------------------------------------------------------
def test_haystack_filter_translation_by_hand():
    pytest.importorskip("haystack", reason="Haystack adapter: pip install 'hybridret[haystack]'")
    from haystack.errors import FilterError as HaystackFilterError

    from hybridret.integrations import haystack_filter_to_hybridret as tr

    assert tr({"field": "meta.lang", "operator": "==", "value": "en"}) == {"lang": "en"}
    assert tr({"field": "meta.lang", "operator": "!=", "value": "en"}) == {"lang": {"$ne": "en"}}
    assert tr({"field": "meta.src.kind", "operator": "in", "value": ["news"]}) == {"src.kind": {"$in": ["news"]}}
    assert tr({"field": "lang", "operator": "not in", "value": ["de", "fr"]}) == {"lang": {"$nin": ["de", "fr"]}}
    assert tr({"operator": "AND", "conditions": [
        {"field": "meta.year", "operator": ">=", "value": 2010}, {"field": "meta.year", "operator": "<", "value": 2020},
        {"operator": "OR", "conditions": [{"field": "meta.lang", "operator": "==", "value": "de"},
                                          {"field": "meta.year", "operator": ">", "value": 2018}]}]}) == \
        {"$and": [{"year": {"$gte": 2010}}, {"year": {"$lt": 2020}},
                  {"$or": [{"lang": "de"}, {"year": {"$gt": 2018}}]}]}
    assert tr({"operator": "NOT", "conditions": [{"field": "meta.lang", "operator": "==", "value": "en"},
                                                  {"field": "meta.year", "operator": "<=", "value": 2030}]}) == \
        {"$not": {"$and": [{"lang": "en"}, {"year": {"$lte": 2030}}]}}
    assert tr({"field": "meta.lang", "operator": "==", "value": None}) == {"$or": [{"lang": None}, {"lang": {"$exists": False}}]}
    assert tr({"field": "meta.lang", "operator": "!=", "value": None}) == \
        {"$and": [{"lang": {"$exists": True}}, {"lang": {"$ne": None}}]}
    import datetime

    assert tr({"field": "meta.date", "operator": ">", "value": datetime.date(2020, 1, 2)}) == {"date": {"$gt": "2020-01-02"}}
    assert tr({"lang": "en", "year": {"$gte": 2010}}) == {"lang": "en", "year": {"$gte": 2010}}  # hybridret's own
    assert tr(None) is None and tr({}) is None
    for bad, msg in (({"field": "meta.lang", "operator": "~=", "value": "x"}, "unsupported comparison operator"),
                     ({"operator": "XOR", "conditions": [{"field": "meta.a", "operator": "==", "value": 1}]}, "XOR"),
                     ({"field": "content", "operator": "==", "value": "x"}, "metadata only"),
                     ({"field": "meta.lang", "operator": "in", "value": "en"}, "list value"),
                     ({"field": "meta.lang", "operator": "=="}, "'value' key missing"),
                     ({"operator": "AND", "conditions": []}, "non-empty")):
        with pytest.raises(FilterError, match=msg) as info:
            tr(bad)
        assert isinstance(info.value, HaystackFilterError)


def test_haystack_retriever_matches_searcher_and_haystack_semantics(searcher):
    pytest.importorskip("haystack", reason="Haystack adapter: pip install 'hybridret[haystack]'")
    from haystack import Document
    from haystack.utils.filters import document_matches_filter

    from hybridret.integrations import HybridRetHaystackRetriever, haystack_filter_to_hybridret

    r = HybridRetHaystackRetriever(searcher, top_k=5)
    for q in QUERIES[:2]:
        docs = r.run(query=q)["documents"]
        hits = searcher.search(q, 5)[0]
        assert [(d.id, d.score) for d in docs] == [(h.id, h.score) for h in hits]
        assert [d.content for d in docs] == [h.text for h in hits]
        assert docs[0].meta["title"] == hits[0].title and docs[0].meta["scores"] == finite(hits[0].scores)
    assert len(r.run(query=QUERIES[0], top_k=2)["documents"]) == 2
    # exact dense search with k >= N returns every matching document: compare with Haystack's evaluator
    mine = [Document(id=d["id"], content=d["text"], meta=d["metadata"]) for d in DOCS]
    exact = HybridRetHaystackRetriever(searcher, top_k=N, method="dense")
    for hf in ({"field": "meta.lang", "operator": "==", "value": "de"},
               {"field": "meta.lang", "operator": "==", "value": None},
               {"field": "meta.lang", "operator": "!=", "value": "en"},
               {"field": "meta.src.kind", "operator": "in", "value": ["news"]},
               {"operator": "AND", "conditions": [{"field": "meta.year", "operator": ">=", "value": 2010},
                                                  {"field": "meta.year", "operator": "<", "value": 2040},
                                                  {"field": "meta.lang", "operator": "not in", "value": ["fr"]}]},
               {"operator": "OR", "conditions": [{"field": "meta.year", "operator": "<=", "value": 2003},
                                                 {"field": "meta.src.kind", "operator": "==", "value": "news"}]},
               {"operator": "NOT", "conditions": [{"field": "meta.lang", "operator": "==", "value": "en"},
                                                  {"field": "meta.year", "operator": ">", "value": 2030}]}):
        got = exact.run(query=QUERIES[0], filters=hf)["documents"]
        want = {d.id for d in mine if document_matches_filter(hf, d)}
        assert want and {d.id for d in got} == want, hf
        assert [(d.id, d.score) for d in got] == expected(searcher, QUERIES[0], N, "dense", haystack_filter_to_hybridret(hf))
    # hybridret-style filters directly; init filters with REPLACE and MERGE policies
    assert {d.id for d in exact.run(query=QUERIES[0], filters={"lang": "de"})["documents"]} == \
        {d.id for d in mine if d.meta.get("lang") == "de"}
    en = {"field": "meta.lang", "operator": "==", "value": "en"}
    late = {"field": "meta.year", "operator": ">=", "value": 2030}
    replace = HybridRetHaystackRetriever(searcher, top_k=N, method="dense", filters=en)
    assert {d.meta.get("lang") for d in replace.run(query="x")["documents"]} == {"en"}
    assert {d.id for d in replace.run(query="x", filters=late)["documents"]} == {d.id for d in mine if d.meta["year"] >= 2030}
    merge = HybridRetHaystackRetriever(searcher, top_k=N, method="dense", filters=en, filter_policy="merge")
    assert {d.id for d in merge.run(query="x", filters=late)["documents"]} == \
        {d.id for d in mine if d.meta["year"] >= 2030 and d.meta.get("lang") == "en"}
    with pytest.raises(FilterError):
        HybridRetHaystackRetriever(searcher, filters={"field": "meta.x", "operator": "like", "value": 1})
    out = asyncio.run(r.run_async(query=QUERIES[2], top_k=3))["documents"]
    assert [(d.id, d.score) for d in out] == expected(searcher, QUERIES[2], 3)


def test_haystack_pipeline_and_serialisation(searcher, index_dir):
    pytest.importorskip("haystack", reason="Haystack adapter: pip install 'hybridret[haystack]'")
    from haystack import Pipeline

    from hybridret.integrations import HybridRetHaystackRetriever

    pipe = Pipeline()
    pipe.add_component("retriever", HybridRetHaystackRetriever(searcher, top_k=3, method="rrf",
                                                               filters={"field": "meta.src.kind", "operator": "==",
                                                                        "value": "wiki"}))
    result = pipe.run({"retriever": {"query": QUERIES[1]}})
    want = expected(searcher, QUERIES[1], 3, "rrf", {"src.kind": "wiki"})
    assert [(d.id, d.score) for d in result["retriever"]["documents"]] == want
    data = pipe.to_dict()
    params = data["components"]["retriever"]["init_parameters"]
    assert params["searcher"] == {"index": str(index_dir)} and params["top_k"] == 3 and params["method"] == "rrf"
    import inspect

    trust = ({"allowed_modules": ["hybridret.integrations.haystack"]}  # haystack-ai >= 3: an allowlist
             if "allowed_modules" in inspect.signature(Pipeline.loads).parameters else {})
    again = Pipeline.loads(pipe.dumps(), **trust)  # YAML round trip: reopens the index from its path
    result = again.run({"retriever": {"query": QUERIES[1], "top_k": 2}})
    docs = result["retriever"]["documents"]
    assert [(d.id, d.score) for d in docs] == expected(searcher, QUERIES[1], 2, "rrf", {"src.kind": "wiki"})
    assert isinstance(again.get_component("retriever").searcher, Searcher)
    with pytest.raises(ConfigError, match="cannot serialise"):
        HybridRetHaystackRetriever(CountingSearcher(searcher)).to_dict()


# -- through a running `hybridret serve` -----------------------------------------------------------
def test_adapters_through_a_real_server(searcher, index_dir, tmp_path, start_server):
    pytest.importorskip("fastapi", reason="the server test needs the serve extra: pip install 'hybridret[serve]'")
    pytest.importorskip("uvicorn", reason="the server test needs the serve extra: pip install 'hybridret[serve]'")
    pytest.importorskip("httpx", reason="the server test needs the serve extra: pip install 'hybridret[serve]'")
    pytest.importorskip("langchain_core", reason="LangChain adapter: pip install 'hybridret[langchain]'")
    pytest.importorskip("llama_index.core", reason="LlamaIndex adapter: pip install 'hybridret[llamaindex]'")
    pytest.importorskip("haystack", reason="Haystack adapter: pip install 'hybridret[haystack]'")
    import shutil

    from langchain_core.documents import Document

    from hybridret.client import Client
    from hybridret.integrations import (
        HybridRetHaystackRetriever,
        HybridRetLangChainRetriever,
        HybridRetLlamaIndexRetriever,
        HybridRetVectorStore,
    )

    copy = tmp_path / "served"  # the server writes: never into the shared index
    shutil.copytree(index_dir, copy, ignore=shutil.ignore_patterns("*.lock", "leases"))
    proc, url = start_server(copy, "--no-batching")
    try:
        with Client(url) as client:
            q, flt = QUERIES[0], {"lang": {"$in": ["en", "de"]}}
            want = expected(searcher, q, 4, filter=flt)

            def same(got):
                assert [i for i, _ in got] == [i for i, _ in want]
                assert [s for _, s in got] == [pytest.approx(s, rel=1e-6) for _, s in want]

            lc = HybridRetLangChainRetriever(searcher=client, k=4, filter=flt)
            same([(d.id, d.metadata["score"]) for d in lc.invoke(q)])
            same([(d.id, d.metadata["score"]) for d in lc.batch([q, QUERIES[1]])[0]])
            same([(n.node.node_id, n.score) for n in HybridRetLlamaIndexRetriever(client, similarity_top_k=4,
                                                                                  filters=flt).retrieve(q)])
            hs = HybridRetHaystackRetriever(client, top_k=4)
            hay = {"field": "meta.lang", "operator": "in", "value": ["en", "de"]}
            same([(d.id, d.score) for d in hs.run(query=q, filters=hay)["documents"]])
            data = hs.to_dict()
            assert data["init_parameters"]["searcher"] == {"url": url}
            reopened = HybridRetHaystackRetriever.from_dict(data)
            assert isinstance(reopened.searcher, Client)
            same([(d.id, d.score) for d in reopened.run(query=q, filters=hay)["documents"]])
            reopened.searcher.close()
            # the VectorStore writes through the server
            store = HybridRetVectorStore(client)
            store.add_documents([Document(id="srv-1", page_content="Octopuses have three hearts and blue blood.",
                                          metadata={"kind": "mollusc"})])
            assert store.similarity_search("how many hearts does an octopus have", k=1)[0].id == "srv-1"
            assert store.similarity_search("octopus hearts", k=3, filter={"kind": "mollusc"})[0].id == "srv-1"
            store.delete(["srv-1"])
            assert "srv-1" not in [d.id for d in store.similarity_search("octopus hearts", k=5)]
            got = store.get_by_ids(["s0001", "missing", "s0001"])  # through GET /documents
            assert [d.id for d in got] == ["s0001"] and got[0].page_content and got[0].metadata["title"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def test_adapters_group_chunks_by_their_document(searcher):
    """group_by: every framework gets the chunks of the top documents, in group order, each naming
    its document the framework's way (LangChain metadata, LlamaIndex ref_doc_id, Haystack source_id)."""
    from hybridret.integrations.haystack import HybridRetHaystackRetriever
    from hybridret.integrations.langchain import HybridRetLangChainRetriever
    from hybridret.integrations.llamaindex import HybridRetLlamaIndexRetriever

    q = QUERIES[0]
    hits = searcher.search(q, k=3, method="sparse", group_by="lang", group_size=2)
    want = [(h.id, h.group) for h in hits[0]]
    best = {g.key: g.score for g in hits.groups(0)}
    assert len({key for _, key in want}) == 3

    docs = HybridRetLangChainRetriever(searcher=searcher, k=3, method="sparse", group_by="lang",
                                       group_size=2).invoke(q)
    assert [(d.id, d.metadata["group"]) for d in docs] == want
    assert all(d.metadata["group_score"] == pytest.approx(best[d.metadata["group"]]) for d in docs)
    assert [d.metadata["group_rank"] for d in docs] == [h.rank for h in hits[0]]

    nodes = HybridRetLlamaIndexRetriever(searcher, similarity_top_k=3, method="sparse", group_by="lang",
                                         group_size=2).retrieve(q)
    assert [(n.node.node_id, n.node.ref_doc_id) for n in nodes] == [(i, str(key)) for i, key in want]
    assert all("group_rank" not in n.node.get_content(metadata_mode="llm") for n in nodes)

    hay = HybridRetHaystackRetriever(searcher, top_k=3, method="sparse", group_by="lang", group_size=2)
    out = hay.run(q)["documents"]
    assert [(d.id, d.meta["source_id"]) for d in out] == want
    again = HybridRetHaystackRetriever.from_dict(hay.to_dict())
    assert [d.id for d in again.run(q)["documents"]] == [i for i, _ in want]
    with pytest.raises(ConfigError):
        HybridRetHaystackRetriever(searcher, group_size=2)
    with pytest.raises(ValueError, match="group_by"):  # pydantic wraps the ConfigError
        HybridRetLangChainRetriever(searcher=searcher, group_by="")


def test_adapters_diversify(searcher, index_dir):
    """diversify=λ (MMR): each framework gets the library's diversified hits, grouped or not; a bad λ
    fails at construction; Haystack keeps it through to_dict / from_dict."""
    from hybridret.integrations.haystack import HybridRetHaystackRetriever
    from hybridret.integrations.langchain import HybridRetLangChainRetriever
    from hybridret.integrations.llamaindex import HybridRetLlamaIndexRetriever

    q = QUERIES[0]
    want = searcher.search(q, k=5, diversify=0.5).ids[0].tolist()
    assert want != searcher.search(q, k=5).ids[0].tolist()
    assert [d.id for d in HybridRetLangChainRetriever(searcher=searcher, k=5, diversify=0.5).invoke(q)] == want
    nodes = HybridRetLlamaIndexRetriever(searcher, similarity_top_k=5, diversify=0.5).retrieve(q)
    assert [n.node.node_id for n in nodes] == want
    hay = HybridRetHaystackRetriever(searcher, top_k=5, diversify=0.5)
    assert [d.id for d in hay.run(q)["documents"]] == want
    assert [d.id for d in HybridRetHaystackRetriever.from_dict(hay.to_dict()).run(q)["documents"]] == want
    grouped = searcher.search(q, k=3, method="sparse", group_by="lang", group_size=2, diversify=0.5)
    docs = HybridRetLangChainRetriever(searcher=searcher, k=3, method="sparse", group_by="lang", group_size=2,
                                       diversify=0.5).invoke(q)
    assert [d.id for d in docs] == [h.id for h in grouped[0]]
    for bad in (1.5, "x"):
        with pytest.raises(ConfigError, match="diversify must be"):
            HybridRetLlamaIndexRetriever(searcher, diversify=bad)
        with pytest.raises(ConfigError, match="diversify must be"):
            HybridRetHaystackRetriever(searcher, diversify=bad)
        with pytest.raises(ValueError, match="diversify must be"):
            HybridRetLangChainRetriever(searcher=searcher, diversify=bad)
