"""The LlamaIndex vector store against the real llama-index-core: ingestion (IngestionPipeline,
VectorStoreIndex, StorageContext) offline with NoEmbedding, nodes read back as written (ref_doc_id
included), delete by ref_doc_id / node ids / filters, clear, queries (modes, alpha, filters,
doc_ids) equal to hybridret's own search, what is refused, and all of it through a real server."""

from __future__ import annotations

import asyncio
import socket

import pytest

pytest.importorskip("llama_index.core", reason="LlamaIndex adapter: pip install 'hybridret[llamaindex]'")

from llama_index.core import Document, StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.core.ingestion import DocstoreStrategy, IngestionPipeline  # noqa: E402
from llama_index.core.node_parser import SentenceSplitter  # noqa: E402
from llama_index.core.schema import IndexNode, NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.storage.docstore import SimpleDocumentStore  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

from hybridret import HybridRetriever, Searcher  # noqa: E402
from hybridret.errors import ConfigError, CorpusFormatError, HybridRetWarning  # noqa: E402
from hybridret.integrations.llamaindex import (  # noqa: E402
    HybridRetLlamaIndexRetriever,
    HybridRetLlamaIndexVectorStore,
    NoEmbedding,
)

TEXTS = {
    "bees": ("Honey bees dance to tell the hive where the flowers are. The waggle dance encodes direction and "
             "distance. A colony can hold tens of thousands of workers. The queen lays up to two thousand eggs a day."),
    "wolves": ("Wolves hunt in packs across the tundra. Grey wolves howl at night to call the pack together. A pack "
               "is a family: a breeding pair and their offspring."),
    "octopus": ("Octopuses have three hearts and blue blood. They can change colour in a fraction of a second. "
                "Each arm holds a cluster of neurons."),
    "volcano": ("Volcanoes form where magma reaches the surface. Lava cools into basalt. Some eruptions throw ash "
                "high into the stratosphere."),
}
META = {"bees": {"kind": "insect", "year": 2001}, "wolves": {"kind": "mammal", "year": 2010},
        "octopus": {"kind": "mollusc", "year": 2020}, "volcano": {"kind": "geology", "year": 2024}}


def documents(*names: str) -> list[Document]:
    return [Document(id_=n, text=TEXTS[n], metadata=dict(META[n])) for n in names or TEXTS]


def splitter() -> SentenceSplitter:
    return SentenceSplitter(chunk_size=24, chunk_overlap=0)  # several nodes per document


def dump(node) -> dict:
    """A node's fields without its embedding (hybridret does not keep LlamaIndex embeddings)."""
    data = node.model_dump()
    data.pop("embedding")
    return data


@pytest.fixture
def offline(monkeypatch):
    """Any connection or name lookup beyond loopback fails the test."""
    loopback = ("127.0.0.1", "::1", "localhost")
    real_connect, real_lookup = socket.socket.connect, socket.getaddrinfo

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in loopback:
            raise AssertionError(f"network access to {address}")
        return real_connect(sock, address)

    def lookup(host, *args, **kwargs):
        if host not in loopback:
            raise AssertionError(f"name lookup of {host!r}")
        return real_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", lookup)


@pytest.fixture
def store(paired_encoder) -> HybridRetLlamaIndexVectorStore:
    """A store over a fresh retriever holding the split TEXTS (written by an IngestionPipeline)."""
    s = HybridRetLlamaIndexVectorStore(HybridRetriever(paired_encoder))
    IngestionPipeline(transformations=[splitter(), NoEmbedding()], vector_store=s).run(documents=documents())
    return s


def search(store, query, k, method="hybrid", filter=None, **kw):
    return [(h.id, h.score) for h in store.client.search(query, k, method=method, filter=filter, **kw)[0]]


# -- ingestion --------------------------------------------------------------------------------------
def test_ingestion_offline_and_nodes_come_back_as_written(paired_encoder, offline):
    retriever = HybridRetriever(paired_encoder)  # fresh: the first add builds the index
    store = HybridRetLlamaIndexVectorStore(retriever)
    assert store.query(VectorStoreQuery(query_str="bees", similarity_top_k=3)).ids == []  # nothing yet
    assert store.get_nodes() == []
    # an IngestionPipeline writes only nodes that carry an embedding: NoEmbedding gives them one, offline
    assert IngestionPipeline(transformations=[splitter()], vector_store=store).run(documents=documents()) and \
        retriever.path is None  # (LlamaIndex's rule: without an embedding step nothing reaches the store)
    nodes = IngestionPipeline(transformations=[splitter(), NoEmbedding()], vector_store=store).run(
        documents=documents("bees", "wolves", "octopus"))
    assert len(nodes) > 3 and retriever.num_docs == len(nodes)
    assert {n.ref_doc_id for n in nodes} == {"bees", "wolves", "octopus"}
    back = store.get_nodes([n.node_id for n in nodes])
    assert [dump(b) for b in back] == [dump(n) for n in nodes]  # class, text, metadata, relationships, offsets
    assert all(b.ref_doc_id == n.ref_doc_id and b.metadata == n.metadata for b, n in zip(back, nodes))

    # VectorStoreIndex over the store: its retriever queries hybridret with the query text
    index = VectorStoreIndex.from_vector_store(store, embed_model=NoEmbedding())
    got = index.as_retriever(similarity_top_k=4).retrieve("how do bees tell the hive where flowers are")
    assert [(n.node.node_id, n.score) for n in got] == search(store, "how do bees tell the hive where flowers are", 4)
    assert got[0].node.ref_doc_id == "bees" and got[0].node.metadata == META["bees"]
    by_id = {n.node_id: n for n in nodes}
    assert all(dump(n.node) == dump(by_id[n.node.node_id]) for n in got)
    # ... and VectorStoreIndex(nodes, storage_context=...) inserts through it
    more = splitter().get_nodes_from_documents(documents("volcano"))
    VectorStoreIndex(more, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=NoEmbedding())
    index.insert(Document(id_="extra", text="Penguins cannot fly but they swim very fast.", metadata={"kind": "bird"}))
    assert retriever.num_docs == len(nodes) + len(more) + 1
    top = index.as_retriever(similarity_top_k=1).retrieve("penguins swimming")[0].node
    assert top.ref_doc_id == "extra" and top.get_content() == "Penguins cannot fly but they swim very fast."
    assert index.as_retriever(similarity_top_k=1).retrieve("lava and basalt")[0].node.ref_doc_id == "volcano"


def test_nodes_of_every_kind_round_trip_and_metadata_is_encoded_as_llamaindex_embeds_it(paired_encoder):
    store = HybridRetLlamaIndexVectorStore(HybridRetriever(paired_encoder))
    text = TextNode(id_="t1", text="Basalt is a dark volcanic rock.", metadata={"topic": "rocks", "pages": [3, 4],
                                                                             "source": {"shelf": "B2"}, "secret": "x"},
                    excluded_embed_metadata_keys=["secret", "pages", "source"], excluded_llm_metadata_keys=["secret"],
                    start_char_idx=10, end_char_idx=41, metadata_template="{key}={value}",
                    relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="geo-book", metadata={"p": 1}),
                                   NodeRelationship.NEXT: RelatedNodeInfo(node_id="t2")})
    index_node = IndexNode(id_="i1", text="A summary of the rock chapter.", index_id="rock-chapter")
    doc = Document(id_="whole", text="A whole document stored as one node.", metadata={"topic": "misc"})
    assert store.add([text, index_node, doc]) == ["t1", "i1", "whole"]
    back = {n.node_id: n for n in store.get_nodes(["whole", "t1", "missing", "i1"])}
    assert list(back) == ["whole", "t1", "i1"]  # unknown ids left out, order kept
    assert type(back["i1"]) is IndexNode and back["i1"].index_id == "rock-chapter"
    assert type(back["whole"]) is Document and dump(back["whole"]) == dump(doc)
    assert dump(back["t1"]) == dump(text) and dump(back["i1"]) == dump(index_node)
    # what hybridret encodes: the text, titled by the metadata LlamaIndex would embed with it
    stored = {d["id"]: d for d in store.client.get(["t1", "i1"])}
    assert stored["t1"]["text"] == text.text and stored["t1"]["title"] == "topic=rocks"
    assert stored["t1"]["metadata"]["parent_id"] == "geo-book" and stored["t1"]["metadata"]["source"] == {"shelf": "B2"}
    assert stored["i1"]["title"] == ""  # no metadata
    assert store.query(VectorStoreQuery(query_str="dark volcanic rock", similarity_top_k=5,
                                        filters=MetadataFilters(filters=[MetadataFilter(key="source.shelf", value="B2")]))
                       ).ids == ["t1"]
    # a Document is its own source: delete(its id) removes it
    store.delete("whole")
    assert store.get_nodes(["whole"]) == []
    plain = HybridRetLlamaIndexVectorStore(HybridRetriever(paired_encoder), embed_metadata=False)
    plain.add([text])
    assert plain.client.get(["t1"])[0]["title"] == ""
    with pytest.raises(CorpusFormatError, match="'empty' has no text"):
        plain.add([TextNode(id_="empty", text="  ")])
    with pytest.raises(ConfigError, match="'parent_id' is 'other'"):
        store.add([TextNode(id_="c", text="x", metadata={"parent_id": "other"},
                            relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="geo-book")})])
    with pytest.raises(ConfigError, match="reserved"):
        store.add([TextNode(id_="c", text="x", metadata={"_llamaindex": 1})])
    with pytest.raises(CorpusFormatError, match="'c'.*may not start with"):  # hybridret's metadata rules apply
        store.add([TextNode(id_="c", text="x", metadata={"a.b": 1})])
    with pytest.warns(HybridRetWarning, match="ignores LlamaIndex node embeddings"):
        store.add([TextNode(id_="e", text="Embedded already.", embedding=[0.1, 0.2, 0.3])])
    assert store.get_nodes(["e"])[0].embedding is None


# -- deletes ----------------------------------------------------------------------------------------
def test_delete_by_ref_doc_id_nodes_filters_and_clear(store):
    retriever = store.client
    every = store.get_nodes()
    per_doc = {name: [n.node_id for n in every if n.ref_doc_id == name] for name in TEXTS}
    assert retriever.num_docs == len(every) and all(len(ids) >= 1 for ids in per_doc.values())
    assert len(per_doc["bees"]) > 1
    index = VectorStoreIndex.from_vector_store(store, embed_model=NoEmbedding())
    index.delete_ref_doc("bees")
    assert retriever.num_docs == len(every) - len(per_doc["bees"])
    assert "bees" not in {n.node.ref_doc_id for n in index.as_retriever(similarity_top_k=20).retrieve("honey bees")}
    store.delete("bees")  # already gone: nothing happens
    store.delete("never-there")
    # by node id (unknown ids skipped), by filter, by both (the ids that match)
    wolves = per_doc["wolves"]
    store.delete_nodes(node_ids=[wolves[0], "never-there"])
    assert store.get_nodes(wolves) == store.get_nodes(wolves[1:]) and len(store.get_nodes(wolves[1:])) == len(wolves) - 1
    octopus_and_volcano = per_doc["octopus"] + per_doc["volcano"]
    store.delete_nodes(node_ids=octopus_and_volcano, filters=MetadataFilters(filters=[
        MetadataFilter(key="year", value=2024, operator=FilterOperator.GTE)]))
    assert [n.node_id for n in store.get_nodes(octopus_and_volcano)] == per_doc["octopus"]
    store.delete_nodes(filters=MetadataFilters(filters=[MetadataFilter(key="kind", value="mollusc")]))
    assert store.get_nodes(per_doc["octopus"]) == []
    store.delete_nodes(node_ids=[])  # nothing
    assert {n.ref_doc_id for n in store.get_nodes()} == {"wolves"}
    with pytest.raises(ConfigError, match="node_ids or filters"):
        store.delete_nodes()
    asyncio.run(store.adelete("wolves"))
    assert retriever.num_docs == 0
    store.add(splitter().get_nodes_from_documents(documents("octopus")))
    store.clear()
    assert retriever.num_docs == 0 and store.query(VectorStoreQuery(query_str="octopus", similarity_top_k=3)).ids == []
    store.add(splitter().get_nodes_from_documents(documents("volcano")))  # still writable after clear
    assert {n.ref_doc_id for n in store.get_nodes()} == {"volcano"}


def test_ingestion_pipeline_upserts_changed_documents(paired_encoder):
    """IngestionPipeline with a docstore: a changed document's old nodes are deleted by ref_doc_id."""
    store = HybridRetLlamaIndexVectorStore(HybridRetriever(paired_encoder))
    pipe = IngestionPipeline(transformations=[splitter(), NoEmbedding()], vector_store=store,
                             docstore=SimpleDocumentStore(), docstore_strategy=DocstoreStrategy.UPSERTS)
    pipe.run(documents=documents("bees", "wolves"))
    before = {n.node_id for n in store.get_nodes() if n.ref_doc_id == "wolves"}
    changed = Document(id_="wolves", text="Wolves were reintroduced to Yellowstone in 1995.", metadata=META["wolves"])
    pipe.run(documents=[changed, *documents("bees")])
    now = [n for n in store.get_nodes() if n.ref_doc_id == "wolves"]
    assert [n.get_content() for n in now] == ["Wolves were reintroduced to Yellowstone in 1995."]
    assert not before & {n.node_id for n in now}
    assert {n.ref_doc_id for n in store.get_nodes()} == {"bees", "wolves"}


# -- queries ----------------------------------------------------------------------------------------
def test_query_modes_filters_and_refusals(store):
    q = "pack hunting animals that howl"

    def ask(**kw):
        res = store.query(VectorStoreQuery(query_str=q, **{"similarity_top_k": 3, **kw}))
        assert len(res.nodes) == len(res.ids) == len(res.similarities)
        assert [n.node_id for n in res.nodes] == res.ids
        return list(zip(res.ids, res.similarities))

    assert ask() == search(store, q, 3)
    assert ask(mode=VectorStoreQueryMode.TEXT_SEARCH) == search(store, q, 3, "bm25")
    assert ask(mode=VectorStoreQueryMode.SPARSE) == search(store, q, 3, "sparse")
    assert ask(mode=VectorStoreQueryMode.HYBRID, hybrid_top_k=2) == search(store, q, 2)
    assert store.query(VectorStoreQuery(query_str=q, similarity_top_k=2), method="rrf").ids == \
        [i for i, _ in search(store, q, 2, "rrf")]
    for alpha in (0.0, 0.3, 1.0):
        fusion = {"method": "linear", "retrievers": ["dense", "sparse"], "weights": {"dense": alpha, "sparse": 1 - alpha}}
        assert ask(mode=VectorStoreQueryMode.HYBRID, alpha=alpha) == search(store, q, 3, "linear", fusion=fusion)
    filters = MetadataFilters(filters=[MetadataFilter(key="year", value=2010, operator=FilterOperator.GTE),
                                       MetadataFilter(key="kind", value=["mammal", "mollusc"], operator=FilterOperator.IN)])
    want = {"$and": [{"year": {"$gte": 2010}}, {"kind": {"$in": ["mammal", "mollusc"]}}]}
    assert ask(filters=filters, similarity_top_k=20) == search(store, q, 20, filter=want)
    assert {store.client.get([i])[0]["metadata"]["kind"] for i, _ in ask(filters=filters, similarity_top_k=20)} == \
        {"mammal", "mollusc"}
    got = ask(doc_ids=["octopus", "volcano"], similarity_top_k=20)
    assert got == search(store, q, 20, filter={"parent_id": {"$in": ["octopus", "volcano"]}})
    assert {n.ref_doc_id for n in store.get_nodes([i for i, _ in got])} == {"octopus", "volcano"}
    assert ask(doc_ids=["wolves"], filters=filters, similarity_top_k=20) == \
        search(store, q, 20, filter={"$and": [want, {"parent_id": {"$in": ["wolves"]}}]})
    assert ask(node_ids=[]) == search(store, q, 3)  # what VectorStoreIndex.as_retriever passes for a text store
    assert ask(query_embedding=[0.5] * 8) == search(store, q, 3)  # ignored: hybridret encodes the text
    # through LlamaIndex's own retriever arguments
    index = VectorStoreIndex.from_vector_store(store, embed_model=NoEmbedding())
    r = index.as_retriever(similarity_top_k=2, vector_store_query_mode="text_search", filters=filters)
    assert [(n.node.node_id, n.score) for n in r.retrieve(q)] == search(store, q, 2, "bm25", want)
    r = index.as_retriever(similarity_top_k=2, vector_store_kwargs={"method": "dense"})
    assert [(n.node.node_id, n.score) for n in asyncio.run(r.aretrieve(q))] == search(store, q, 2, "dense")
    # refused, saying why
    for kw, err, msg in (({"query_str": None, "query_embedding": [0.1]}, ConfigError, "searches by text"),
                         ({"node_ids": ["x"]}, NotImplementedError, "not by node id"),
                         ({"mode": VectorStoreQueryMode.MMR}, NotImplementedError, "document vectors"),
                         ({"mode": VectorStoreQueryMode.SVM}, NotImplementedError, "document vectors"),
                         ({"sparse_top_k": 5}, NotImplementedError, "sparse_top_k"),
                         ({"alpha": 0.5}, ConfigError, "vector_store_query_mode='hybrid'"),
                         ({"alpha": 1.5, "mode": VectorStoreQueryMode.HYBRID}, ConfigError, "between 0"),
                         ({"filters": MetadataFilters(filters=[MetadataFilter(key="kind", value="m",
                                                                              operator=FilterOperator.TEXT_MATCH)])},
                          ConfigError, "text_match")):
        with pytest.raises(err, match=msg):
            store.query(VectorStoreQuery(**{"query_str": q, **kw}))
    with pytest.raises(TypeError, match="unexpected arguments"):
        store.query(VectorStoreQuery(query_str=q), nope=1)
    assert asyncio.run(store.aquery(VectorStoreQuery(query_str=q, similarity_top_k=3))).ids == [i for i, _ in ask()]


def test_get_nodes_by_filter_and_read_only_searcher(store, tmp_path):
    insects = store.get_nodes(filters=MetadataFilters(filters=[MetadataFilter(key="kind", value="insect")]))
    assert insects and {n.ref_doc_id for n in insects} == {"bees"}
    ids = [n.node_id for n in insects]
    assert [n.node_id for n in store.get_nodes(["missing", *reversed(ids)], filters=MetadataFilters(
        filters=[MetadataFilter(key="year", value=2001)]))] == list(reversed(ids))
    assert len(asyncio.run(store.aget_nodes())) == store.client.num_docs
    store.client.save(tmp_path / "kb")
    read_only = HybridRetLlamaIndexVectorStore(str(tmp_path / "kb"))
    assert isinstance(read_only.client, Searcher)
    q = VectorStoreQuery(query_str="octopus hearts", similarity_top_k=3)
    assert read_only.query(q).ids == store.query(q).ids
    assert [n.node_id for n in read_only.get_nodes(ids)] == ids
    for write in (lambda: read_only.add(insects), lambda: read_only.delete("bees"), read_only.clear,
                  lambda: read_only.delete_nodes(ids)):
        with pytest.raises(ConfigError, match="read-only"):
            write()
    insect = MetadataFilters(filters=[MetadataFilter(key="kind", value="insect")])
    assert [dump(n) for n in read_only.get_nodes(filters=insect)] == [dump(n) for n in insects]  # a listing: no writes
    assert len(read_only.get_nodes()) == store.client.num_docs
    with pytest.raises(ConfigError, match="ref_doc_id_key"):
        HybridRetLlamaIndexVectorStore(store.client, ref_doc_id_key="a.b")
    with pytest.raises(ConfigError, match="unknown method 'vector'"):
        HybridRetLlamaIndexVectorStore(store.client, method="vector")
    with pytest.raises(ConfigError, match="store_text=False"):
        HybridRetLlamaIndexVectorStore(HybridRetriever(store.client.encoder, store_text=False, bm25=False))


def test_custom_ref_doc_id_key_and_the_retriever_reads_store_nodes(paired_encoder):
    store = HybridRetLlamaIndexVectorStore(HybridRetriever(paired_encoder), ref_doc_id_key="source_doc")
    nodes = splitter().get_nodes_from_documents(documents("bees", "wolves"))
    store.add(nodes)
    assert store.client.get([nodes[0].node_id])[0]["metadata"]["source_doc"] == nodes[0].ref_doc_id
    store.delete("wolves")
    assert {n.ref_doc_id for n in store.get_nodes()} == {"bees"}
    # HybridRetLlamaIndexRetriever over the same index returns the stored nodes, scores added (hidden)
    got = HybridRetLlamaIndexRetriever(store.client, similarity_top_k=2).retrieve("waggle dance")
    by_id = {n.node_id: n for n in nodes}
    assert [n.node.node_id for n in got] == [i for i, _ in search(store, "waggle dance", 2)]
    for n in got:
        assert n.node.ref_doc_id == "bees" and n.node.get_content() == by_id[n.node_id].get_content()
        assert set(n.node.metadata) == {*META["bees"], "scores"} and "scores" not in n.node.get_metadata_str("llm")


def test_retriever_names_the_document_of_hybridret_chunks(paired_encoder):
    """Chunks hybridret cut itself (parent_id) carry ref_doc_id, grouped or not, in both adapters."""
    retriever = HybridRetriever(paired_encoder)
    retriever.index([{"id": n, "text": TEXTS[n], "metadata": META[n]} for n in TEXTS], chunk_tokens=16)
    got = HybridRetLlamaIndexRetriever(retriever, similarity_top_k=3).retrieve("octopus hearts")
    assert got[0].node.node_id.startswith("octopus#") and got[0].node.ref_doc_id == "octopus"
    assert all(n.node.ref_doc_id == n.node.node_id.split("#")[0] for n in got)
    store = HybridRetLlamaIndexVectorStore(retriever)
    res = store.query(VectorStoreQuery(query_str="octopus hearts", similarity_top_k=3))
    assert res.ids == [n.node.node_id for n in got] and res.nodes[0].ref_doc_id == "octopus"
    assert res.nodes[0].metadata["parent_id"] == "octopus"  # a document hybridret wrote keeps its metadata
    store.delete("octopus")  # every chunk of it
    assert not any(i.startswith("octopus#") for i in store.query(VectorStoreQuery(query_str="octopus hearts",
                                                                                  similarity_top_k=50)).ids)
    # new nodes are not cut again: they keep their ids
    node = TextNode(id_="n1", text=TEXTS["octopus"] + " " + TEXTS["volcano"])
    store.add([node])
    assert store.get_nodes(["n1"])[0].get_content() == node.text


# -- through a running server ---------------------------------------------------------------------
def test_store_through_a_real_server(paired_encoder, tmp_path):
    pytest.importorskip("fastapi", reason="the server test needs the serve extra: pip install 'hybridret[serve]'")
    pytest.importorskip("uvicorn", reason="the server test needs the serve extra: pip install 'hybridret[serve]'")
    from _serving import serving

    from hybridret.client import Client
    from hybridret.serve.app import ServeConfig, create_app

    served = HybridRetriever(paired_encoder)
    served.index([{"id": "seed", "text": "A seed document the server starts with."}], workdir=tmp_path / "idx")
    # a small body limit: the store splits its upserts into several requests
    with serving(create_app(served, ServeConfig(batching=False, max_body_bytes=8192))) as url, Client(url) as client:
        store = HybridRetLlamaIndexVectorStore(client)
        nodes = IngestionPipeline(transformations=[splitter(), NoEmbedding()], vector_store=store).run(
            documents=documents())
        assert client.info()["num_docs"] == len(nodes) + 1
        local = HybridRetLlamaIndexVectorStore(served)
        q = VectorStoreQuery(query_str="blue blood and three hearts", similarity_top_k=4,
                             filters=MetadataFilters(filters=[MetadataFilter(key="year", value=2030,
                                                                             operator=FilterOperator.LT)]))
        remote, here = store.query(q), local.query(q)
        assert remote.ids == here.ids and remote.similarities == pytest.approx(here.similarities, rel=1e-5)
        assert [dump(n) for n in remote.nodes] == [dump(n) for n in here.nodes] and remote.nodes[0].ref_doc_id == "octopus"
        by_id = {n.node_id: n for n in nodes}
        assert all(dump(n) == dump(by_id[n.node_id]) for n in remote.nodes)
        index = VectorStoreIndex.from_vector_store(store, embed_model=NoEmbedding())
        assert index.as_retriever(similarity_top_k=1).retrieve("lava cools into basalt")[0].node.ref_doc_id == "volcano"
        index.delete_ref_doc("volcano")
        assert "volcano" not in {n.ref_doc_id for n in store.get_nodes()}  # get_nodes(): every node, via the server
        mammals = store.get_nodes(filters=MetadataFilters(filters=[MetadataFilter(key="kind", value="mammal")]))
        assert mammals and {n.ref_doc_id for n in mammals} == {"wolves"}
        store.delete_nodes([mammals[0].node_id])
        assert len(store.get_nodes([n.node_id for n in mammals])) == len(mammals) - 1
        asyncio.run(store.async_add([TextNode(id_="srv-1", text="Penguins swim very fast.")]))
        assert store.query(VectorStoreQuery(query_str="fast swimming penguins", similarity_top_k=1)).ids == ["srv-1"]
        store.clear()
        assert client.info()["num_docs"] == 0

    chunked = HybridRetriever(paired_encoder)
    chunked.index([{"id": "seed", "text": "A seed document."}], workdir=tmp_path / "chunked", chunk_tokens=32)
    with serving(create_app(chunked, ServeConfig(batching=False))) as url, Client(url) as client:
        with pytest.raises(ConfigError, match="cuts documents into chunks"):
            HybridRetLlamaIndexVectorStore(client).add([TextNode(id_="x", text="Some text.")])


def test_plain_hit_views_are_the_views_without_matched_terms_and_snippets(store):
    """What the LlamaIndex adapters read: Hits.plain(i) == hits[i] but for the two costly fields."""
    from dataclasses import replace

    hits = store.client.search(["bees dance", "wolves howl"], 5, group_by="parent_id", group_size=2)
    for i in range(2):
        full, plain = hits[i], hits.plain(i)
        assert any(h.matched_terms for h in full) and any(h.snippets for h in full)
        assert plain == [replace(h, matched_terms=[], snippets=[]) for h in full]
    with pytest.raises(IndexError):
        hits.plain(2)
