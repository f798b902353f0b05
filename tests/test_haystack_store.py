"""HybridRetDocumentStore against the real haystack-ai: Haystack's own DocumentStore test mixins
(count, write with every DuplicatePolicy, delete, filters, delete_all / delete_by_filter /
update_by_filter / count_documents_by_filter) in-process and through a real loopback server; what
hybridret refuses, clearly; indexing and query Pipelines offline; serialisation."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import inspect

import pytest

pytest.importorskip("haystack", reason="Haystack adapter: pip install 'hybridret[haystack]'")

from haystack import Document, Pipeline  # noqa: E402
from haystack.document_stores.errors import DuplicateDocumentError  # noqa: E402
from haystack.document_stores.types import DuplicatePolicy  # noqa: E402
from haystack.errors import FilterError as HaystackFilterError  # noqa: E402
from haystack.testing.document_store import (  # noqa: E402
    CountDocumentsByFilterTest,
    CountDocumentsTest,
    DeleteAllTest,
    DeleteByFilterTest,
    DeleteDocumentsTest,
    FilterDocumentsTest,
    UpdateByFilterTest,
    WriteDocumentsTest,
)

from hybridret import HybridRetriever, Searcher  # noqa: E402
from hybridret.errors import ConfigError, CorpusFormatError, IndexExistsError  # noqa: E402
from hybridret.integrations import HybridRetDocumentStore, HybridRetHaystackRetriever  # noqa: E402

KEY = "haystack-store-key-0123456789"
TRUST = ({"allowed_modules": ["hybridret.integrations"]}  # haystack-ai >= 3: an allowlist of modules
         if "allowed_modules" in inspect.signature(Pipeline.loads).parameters else {})


class HaystackContract(CountDocumentsTest, WriteDocumentsTest, DeleteDocumentsTest, FilterDocumentsTest, DeleteAllTest,
                       DeleteByFilterTest, UpdateByFilterTest, CountDocumentsByFilterTest):
    """Haystack's standard DocumentStore tests. The stores under test are made with
    ``embeddings="ignore"`` (Haystack's fixture documents carry random embeddings, which hybridret
    does not store: it encodes with its own models), so documents compare without them."""

    @staticmethod
    def assert_documents_are_equal(received, expected):
        assert received == [dataclasses.replace(d, embedding=None, sparse_embedding=None) for d in expected]

    def test_write_documents(self, document_store):
        """The default policy (NONE) is FAIL: an id already stored is an error, nothing is written."""
        doc = Document(content="test doc")
        assert document_store.write_documents([doc]) == 1
        with pytest.raises(DuplicateDocumentError, match=doc.id):
            document_store.write_documents([doc, Document(content="another doc")])
        self.assert_documents_are_equal(document_store.filter_documents(), [doc])


class TestInProcess(HaystackContract):
    @pytest.fixture
    def document_store(self, paired_encoder):
        return HybridRetDocumentStore(encoder=paired_encoder, embeddings="ignore")  # a new temporary index


@pytest.fixture(scope="module")
def server(paired_encoder, tmp_path_factory):
    """A real uvicorn server (an API key on writes) over an index that holds nothing at first."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from _serving import serving

    from hybridret.serve.app import ServeConfig, create_app

    retriever = HybridRetriever(paired_encoder)
    retriever.index([{"id": "seed", "text": "a seed document"}], workdir=tmp_path_factory.mktemp("served") / "idx",
                    show_progress=False)
    retriever.delete(["seed"])
    with serving(create_app(retriever, ServeConfig(api_key=KEY))) as url:
        yield url, retriever


class ServerContract(CountDocumentsTest, WriteDocumentsTest, DeleteDocumentsTest, DeleteAllTest, DeleteByFilterTest,
                     CountDocumentsByFilterTest):
    """Through a server: Haystack's write/count/delete contract. The filter cases (some 70 of them) run
    in-process only: a Client sends the same translated filter that the server applies with the same
    code (POST /documents/list; tests/test_listing.py checks that path through a real server)."""

    assert_documents_are_equal = staticmethod(HaystackContract.assert_documents_are_equal)
    test_write_documents = HaystackContract.test_write_documents


class TestThroughServer(ServerContract):
    @pytest.fixture
    def document_store(self, server, monkeypatch):
        from haystack.utils import Secret

        monkeypatch.setenv("HYBRIDRET_TEST_KEY", KEY)
        store = HybridRetDocumentStore(server[0], api_key=Secret.from_env_var("HYBRIDRET_TEST_KEY"), embeddings="ignore")
        store.delete_all_documents()  # every test starts from an empty store
        yield store
        store.close()


# -- what hybridret does not store ------------------------------------------------------------------
def test_what_cannot_be_stored_is_refused_naming_the_document(paired_encoder):
    from haystack.dataclasses import ByteStream

    store = HybridRetDocumentStore(encoder=paired_encoder)
    with pytest.raises(ConfigError, match=r"documents\[1\] \(id 'e'\) carries an embedding.*embeddings='ignore'"):
        store.write_documents([Document(id="ok", content="fine"), Document(id="e", content="x", embedding=[0.1, 0.2])])
    with pytest.raises(CorpusFormatError, match="'b'.*blob.*text only"):
        store.write_documents([Document(id="b", content="x", blob=ByteStream(b"%PDF"))])
    for empty in (None, "   "):
        with pytest.raises(CorpusFormatError, match=r"\(id 'c'\) has no content"):
            store.write_documents([Document(id="c", content=empty)])
    with pytest.raises(CorpusFormatError, match="'d'.*may not start with '\\$' or contain '.'"):
        store.write_documents([Document(id="d", content="x", meta={"a.b": 1})])
    with pytest.raises(CorpusFormatError, match="'t'.*datetime"):
        store.write_documents([Document(id="t", content="x", meta={"when": datetime.datetime(2024, 1, 1)})])
    with pytest.raises(CorpusFormatError, match="reserved"):
        store.write_documents([Document(id="r", content="x", meta={"_haystack_json": {}})])
    with pytest.raises(ConfigError, match="DuplicatePolicy"):
        store.write_documents([Document(content="x")], policy="replace")
    assert store.count_documents() == 0  # a refused write writes nothing
    with pytest.raises(ConfigError, match="embeddings must be"):
        HybridRetDocumentStore(encoder=paired_encoder, embeddings="drop")
    # embeddings="ignore": written without them, and what is stored says so
    ignoring = HybridRetDocumentStore(encoder=paired_encoder, embeddings="ignore")
    assert ignoring.write_documents([Document(id="e", content="octopus", embedding=[0.1, 0.2])]) == 1
    assert ignoring.filter_documents()[0].embedding is None


def test_filters_hybridret_cannot_run_raise_haystack_filter_errors(paired_encoder):
    store = HybridRetDocumentStore(encoder=paired_encoder)
    store.write_documents([Document(id="x", content="x", meta={"n": 1})])
    for bad, msg in (({"field": "content", "operator": "==", "value": "x"}, "metadata only"),
                     ({"field": "id", "operator": "in", "value": ["x"]}, "metadata only"),
                     ({"field": "meta.n", "operator": "like", "value": "x"}, "unsupported comparison"),
                     ({"field": "meta.n", "operator": ">", "value": "tomorrow"}, "ISO dates"),
                     ({"field": "meta.n", "operator": "in", "value": (1, 2)}, "list value"),
                     ({"operator": "AND"}, "conditions"),
                     ({"operator": "==", "value": 1}, "'field' key missing")):
        with pytest.raises(HaystackFilterError, match=msg):
            store.filter_documents(bad)
        with pytest.raises(ConfigError):  # and a hybridret error too
            store.count_documents_by_filter(bad)
    # hybridret's own filter syntax works as well
    assert [d.id for d in store.filter_documents({"n": {"$gte": 1}})] == ["x"]
    with pytest.raises(ConfigError, match="needs a filter.*delete_all_documents"):
        store.delete_by_filter({})
    with pytest.raises(ConfigError, match="meta must be"):
        store.update_by_filter({"field": "meta.n", "operator": "==", "value": 1}, {})


# -- policies and documents -------------------------------------------------------------------------
def test_policies_within_one_write_and_meta_round_trip(paired_encoder):
    store = HybridRetDocumentStore(encoder=paired_encoder)
    a1, a2 = Document(id="a", content="first a"), Document(id="a", content="second a")
    with pytest.raises(DuplicateDocumentError, match="more than once") as err:
        store.write_documents([a1, a2])
    assert isinstance(err.value, IndexExistsError) and err.value.ids == ["a"] and store.count_documents() == 0
    assert store.write_documents([a1, Document(id="b", content="b"), a2], policy=DuplicatePolicy.SKIP) == 2
    assert [d.content for d in store.filter_documents()] == ["first a", "b"]
    assert store.write_documents([a2, a1, a2], policy=DuplicatePolicy.OVERWRITE) == 3  # as Haystack counts it
    assert [(d.id, d.content) for d in store.filter_documents()] == [("b", "b"), ("a", "second a")]
    # meta as written: nested objects, lists, None, numbers of both kinds, and Haystack's list-of-objects values
    meta = {"title": "A title", "author": {"name": "Ada", "born": 1815}, "tags": ["x", "y"], "none": None, "f": 0.5,
            "_split_overlap": [{"doc_id": "p", "range": [0, 12]}], "pages": [[1, 2], [3]]}
    doc = Document(id="m", content="A document with rich meta.", meta=meta)
    store.write_documents([doc])
    assert store.filter_documents({"field": "meta.author.name", "operator": "==", "value": "Ada"}) == [doc]
    stored = store.backend.get(["m"])[0]
    assert stored["title"] == "A title"  # meta["title"] is indexed as the title too
    assert asyncio.run(store.count_documents_async()) == 3
    assert asyncio.run(store.write_documents_async([Document(id="z", content="async")])) == 1
    assert [d.id for d in asyncio.run(store.filter_documents_async({"field": "meta.f", "operator": "<", "value": 1}))] \
        == ["m"]


def test_update_by_filter_does_not_encode_again(paired_encoder, caplog):
    store = HybridRetDocumentStore(encoder=paired_encoder)
    store.write_documents([Document(id=f"u{i}", content=f"text {i}", meta={"k": i % 2}) for i in range(6)])
    with caplog.at_level("INFO", logger="hybridret.integrations.haystack_store"):
        assert store.update_by_filter({"field": "meta.k", "operator": "==", "value": 1}, {"flag": True}) == 3
    assert "3 document(s) updated, 0 encoded again" in caplog.text
    assert store.count_documents_by_filter({"field": "meta.flag", "operator": "==", "value": True}) == 3
    assert store.backend.get(["u1"])[0]["metadata"] == {"k": 1, "flag": True}
    assert store.write_documents([Document(id="u0", content="text 0 changed")], policy="overwrite") == 1  # by name
    assert store.filter_documents({"field": "meta.k", "operator": "==", "value": 0}) == [
        Document(id="u2", content="text 2", meta={"k": 0}), Document(id="u4", content="text 4", meta={"k": 0})]


def test_a_served_index_that_chunks_documents_is_refused(paired_encoder, tmp_path):
    pytest.importorskip("fastapi")
    from _serving import serving

    from hybridret.serve.app import create_app

    chunked = HybridRetriever(paired_encoder).index([{"id": "a", "text": "one two three four five six seven"}],
                                                    workdir=tmp_path / "chunked", chunk_tokens=8, show_progress=False)
    with serving(create_app(chunked)) as url:
        store = HybridRetDocumentStore(url)
        with pytest.raises(ConfigError, match="cuts documents into chunks.*without chunk_tokens"):
            store.write_documents([Document(id="b", content="a document Haystack split already")])
        assert chunked.get(["b"]) == [None]
        store.close()


# -- pipelines --------------------------------------------------------------------------------------
def test_indexing_and_query_pipelines_offline_and_serialised(paired_encoder, tmp_path, monkeypatch):
    from haystack.components.preprocessors import DocumentSplitter
    from haystack.components.writers import DocumentWriter

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = tmp_path / "kb"
    store = HybridRetDocumentStore(root, encoder=paired_encoder)  # built there on the first write
    assert not root.exists() and store.count_documents() == 0
    index = Pipeline()
    index.add_component("split", DocumentSplitter(split_by="word", split_length=12, split_overlap=3))
    index.add_component("write", DocumentWriter(document_store=store, policy=DuplicatePolicy.OVERWRITE))
    index.connect("split", "write")
    texts = {"octopus": "The octopus has three hearts and blue blood. Two hearts pump blood through the gills, "
                        "and the third pumps it to the rest of the body. Octopuses can also change colour.",
             "bees": "Honey bees collect nectar from flowers and turn it into honey inside the hive. A colony "
                     "has one queen, thousands of workers and a few hundred drones in summer."}
    sources = [Document(id=k, content=v, meta={"topic": k}) for k, v in texts.items()]
    written = index.run({"split": {"documents": sources}})["write"]["documents_written"]
    assert written == store.count_documents() > 2 and (root / "manifest.json").is_file()
    chunks = store.filter_documents({"field": "meta.source_id", "operator": "==", "value": "octopus"})
    assert chunks and all(d.meta["topic"] == "octopus" for d in chunks)
    assert any(d.meta["_split_overlap"] for d in chunks)  # Haystack's overlap records come back as written

    query = Pipeline()
    query.add_component("retrieve", HybridRetHaystackRetriever(document_store=store, top_k=3))
    docs = query.run({"retrieve": {"query": "how many hearts does an octopus have"}})["retrieve"]["documents"]
    assert docs[0].meta["source_id"] == "octopus" and docs[0].score is not None and "scores" in docs[0].meta
    assert {d.id for d in docs} <= {d.id for d in store.filter_documents()}
    assert "_haystack_json" not in docs[0].meta and docs[0].meta["_split_overlap"] == \
        next(d for d in store.filter_documents() if d.id == docs[0].id).meta["_split_overlap"]
    only_bees = {"field": "meta.topic", "operator": "==", "value": "bees"}
    assert all(d.meta["topic"] == "bees" for d in query.run({"retrieve": {"query": "hearts", "filters": only_bees}})
               ["retrieve"]["documents"])
    grouped = HybridRetHaystackRetriever(document_store=store, top_k=2, group_by="source_id", group_size=1)
    assert [d.meta["source_id"] for d in grouped.run(query="honey")["documents"]][0] == "bees"

    # serialised: both pipelines reopen the index from its directory
    data = store.to_dict()
    assert data["type"] == "hybridret.integrations.haystack_store.HybridRetDocumentStore"
    assert data["init_parameters"]["index"] == str(root) and data["init_parameters"]["embeddings"] == "refuse"
    again = Pipeline.loads(query.dumps(), **TRUST)
    reopened = again.get_component("retrieve").document_store
    assert isinstance(reopened, HybridRetDocumentStore) and reopened.count_documents() == written
    got = again.run({"retrieve": {"query": "how many hearts does an octopus have"}})["retrieve"]["documents"]
    assert [(d.id, d.score) for d in got] == [(d.id, pytest.approx(d.score, rel=1e-5)) for d in docs]
    writer = Pipeline.loads(index.dumps(), **TRUST).get_component("write")
    assert writer.document_store.filter_documents() == store.filter_documents()
    # an empty store's retriever finds nothing (rather than failing)
    empty = HybridRetDocumentStore(encoder=paired_encoder)
    assert HybridRetHaystackRetriever(empty).run(query="anything")["documents"] == []
    with pytest.raises(ConfigError, match="temporary directory"):
        empty.to_dict()
    with pytest.raises(ConfigError, match="read-only"):
        HybridRetDocumentStore(Searcher(root))  # a Searcher cannot write
    with pytest.raises(ConfigError, match="one of them"):
        HybridRetHaystackRetriever(Searcher(root), document_store=store)
    with pytest.raises(ConfigError, match="neither an index"):
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "notes.txt").write_text("not an index")
        HybridRetDocumentStore(tmp_path / "other", encoder=paired_encoder)


def test_server_store_serialises_its_url_and_the_key_s_variable(server, monkeypatch):
    from haystack.utils import Secret

    url, retriever = server
    monkeypatch.setenv("HYBRIDRET_API_KEY", KEY)
    store = HybridRetDocumentStore(url)  # the key from HYBRIDRET_API_KEY by default
    store.delete_all_documents()  # the server is shared with the contract tests
    store.write_documents([Document(id="srv", content="Axolotls regrow their limbs.", meta={"kind": "amphibian"})])
    data = store.to_dict()
    assert data["init_parameters"]["index"] == url and KEY not in repr(data)
    assert data["init_parameters"]["api_key"] == {"type": "env_var", "env_vars": ["HYBRIDRET_API_KEY"], "strict": False}
    again = HybridRetDocumentStore.from_dict(data)
    assert [d.id for d in again.filter_documents({"field": "meta.kind", "operator": "==", "value": "amphibian"})] \
        == ["srv"]
    hits = HybridRetHaystackRetriever(document_store=again, top_k=1).run(query="which animal regrows limbs")
    assert hits["documents"][0].id == "srv"
    assert retriever.get(["srv"])[0]["metadata"] == {"kind": "amphibian"}  # the server's own index holds it
    again.delete_documents(["srv", "not-there"])
    assert store.count_documents() == 0
    with pytest.raises(ValueError, match="token"):  # Haystack never serialises a key given as a token
        HybridRetDocumentStore(url, api_key=Secret.from_token(KEY)).to_dict()
    store.close()
    again.close()


def test_two_first_writes_at_once_keep_both(paired_encoder):
    """Both writers see an unbuilt store; one builds the index, the other writes into it (before the
    lock, each built its own and one batch was lost while its ids were reported written)."""
    from concurrent.futures import ThreadPoolExecutor

    store = HybridRetDocumentStore(encoder=paired_encoder)
    batches = [[Document(id=f"{w}{i}", content=f"document {i} of writer {w}") for i in range(3)] for w in "ab"]
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(store.write_documents, batches)) == [3, 3]
    assert store.count_documents() == 6
