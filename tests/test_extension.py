"""Two retrievers added from this module alone, with one registry call each, work everywhere.

* ``sparse_binary`` reuses stored data: the learned-sparse part, scored with every query weight set
  to 1 (a plain count of the document weights of the query's terms).
* ``trigram`` brings its own representation (hashed character trigrams, 64 floats per text, made
  without a model) and its own segment part format (``toy-vectors-v1``: a ``.npy`` of the vectors,
  searched exhaustively).

Both are checked against brute force in build, add, upsert, delete, compact and filters, in fused
methods, on a 2-shard :class:`ShardedSearcher` (equal to one index), in the CLI's ``--method``
choices and through ``POST /search`` on a real server. Nothing outside this module is edited to
add them (docs/architecture.md counts the places).
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from test_ray import ray_cluster  # noqa: F401 - a local Ray cluster for the 2-shard test

from hybridret import HybridRetriever
from hybridret.encoders.reps import Representation
from hybridret.index.parts import PartType
from hybridret.index.storage import atomic_write_json, read_json
from hybridret.retrievers import QueryBatch, Retriever, register, unregister
from hybridret.retrievers.sparse import SparseRetriever

TOY_FORMAT = "toy-vectors-v1"
DIM = 64
QUERIES = ["tower in paris", "honey bees and flowers", "black hole gravity", "bread yeast", "the moon landing 1969"]


# ----------------------------------------------------------------------------- the two extensions

class Trigrams(Representation):
    """L2-normalised counts of hashed character trigrams: a deterministic toy representation."""

    name = "trigram"
    kind = "dense"
    dim = DIM

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            t = f"  {text.lower()}  "
            for j in range(len(t) - 2):
                out[i, zlib.crc32(t[j:j + 3].encode()) % DIM] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)


class ToyVectors:
    """The ``toy-vectors-v1`` part: ``vectors.npy`` plus ``meta.json``, searched exhaustively."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.meta = read_json(root / "meta.json")
        self.vectors = np.load(root / "vectors.npy", allow_pickle=False)

    @property
    def num_docs(self) -> int:
        return int(self.vectors.shape[0])

    def score(self, q: np.ndarray, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        got = np.einsum("qd,qmd->qm", q, self.vectors[np.maximum(rows, 0)]) if rows.size else np.zeros(rows.shape)
        return np.where(rows >= 0, got, 0.0).astype(np.float32)

    def search(self, q: np.ndarray, k: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        scores = (q @ self.vectors.T).astype(np.float32)
        if allowed is not None:
            scores = np.where(allowed[None, :], scores, -np.inf)
        order = np.lexsort((np.broadcast_to(np.arange(self.num_docs), scores.shape), -scores), axis=1)[:, :k]
        top = np.take_along_axis(scores, order, axis=1)
        rows = np.where(np.isfinite(top), order, -1)
        pad = k - rows.shape[1]
        return (np.pad(rows, ((0, 0), (0, pad)), constant_values=-1),
                np.pad(top, ((0, 0), (0, pad)), constant_values=-np.inf))


class ToyVectorsBuilder:
    def __init__(self, root: Path, dim: int) -> None:
        self.root, self.dim, self.blocks = root, dim, []
        root.mkdir(parents=True)

    def add(self, values: Any) -> None:
        self.blocks.append(np.asarray(values, dtype=np.float32).reshape(-1, self.dim))

    def close(self) -> None:
        vectors = np.concatenate(self.blocks) if self.blocks else np.zeros((0, self.dim), np.float32)
        np.save(self.root / "vectors.npy", vectors)
        atomic_write_json(self.root / "meta.json", {"format": TOY_FORMAT, "num_docs": len(vectors), "dim": self.dim})

    def abort(self) -> None:
        pass


TOY_PART = PartType(TOY_FORMAT, "dense", create=lambda root, dim, options: ToyVectorsBuilder(root, int(dim)),
                    open=lambda root, device: ToyVectors(root), stored=lambda part, rows: part.vectors[rows])


class TrigramRetriever(Retriever):
    name = "trigram"
    needs = "trigram"
    part = "trigram"
    part_type = TOY_PART
    representation = Trigrams()
    positive_only = False

    def search_segment(self, snap, i, q, k, allowed, ctx):
        return snap.segments[i].part(self.part).search(q.get(self.needs), k, allowed)

    def score_segment(self, snap, i, q, rows, ctx):
        return snap.segments[i].part(self.part).score(q.get(self.needs), rows)


class SparseBinary(SparseRetriever):
    name = "sparse_binary"

    @staticmethod
    def _binary(q: QueryBatch) -> QueryBatch:
        s = sp.csr_matrix(q.get("sparse"), copy=True)
        s.data[:] = 1.0
        return q.with_(sparse=s)

    def search_segment(self, snap, i, q, k, allowed, ctx):
        return super().search_segment(snap, i, self._binary(q), k, allowed, ctx)

    def score_segment(self, snap, i, q, rows, ctx):
        return super().score_segment(snap, i, self._binary(q), rows, ctx)


@pytest.fixture(scope="module", autouse=True)
def registered():
    register(TrigramRetriever())
    register(SparseBinary())
    yield
    unregister("trigram")
    unregister("sparse_binary")


# ----------------------------------------------------------------------------- brute force

def brute(docs: list[dict], paired_encoder, queries: list[str], method: str, k: int, keep=None):
    """Top-k ids and scores over ``docs`` (filtered by ``keep``) computed from scratch."""
    texts = [(d.get("title", "") + " " + d["text"]).strip() for d in docs]
    if method == "trigram":
        scores = Trigrams().encode_queries(queries) @ Trigrams().encode_documents(texts).T
        positive = False
    else:
        qs = paired_encoder.encode_queries(queries).sparse.copy()
        qs.data[:] = 1.0
        scores = (qs @ paired_encoder.encode_documents(texts).sparse.T).toarray()
        positive = True
    ids = np.array([d["id"] for d in docs], dtype=object)
    mask = np.ones(len(docs), bool) if keep is None else np.array([bool(keep(d)) for d in docs])
    out_ids, out_scores = [], []
    for row in scores:
        s = np.where(mask & ((row > 0) if positive else True), row, -np.inf)
        order = np.lexsort((np.arange(len(docs)), -s))[:k]
        order = order[np.isfinite(s[order])]
        out_ids.append(list(ids[order]))
        out_scores.append(s[order])
    return out_ids, out_scores


def assert_brute(r, docs, paired_encoder, k=5, filt=None, keep=None):
    for method in ("trigram", "sparse_binary"):
        hits = r.search(QUERIES, k=k, method=method, filter=filt)
        want_ids, want_scores = brute(docs, paired_encoder, QUERIES, method, k, keep)
        for i in range(len(QUERIES)):
            got = [x for x in hits.ids[i] if x]
            assert got == want_ids[i], (method, QUERIES[i])
            np.testing.assert_allclose(hits.scores[i][: len(got)], want_scores[i], rtol=1e-5, atol=1e-6)


def docs_of(r: HybridRetriever) -> list[dict]:
    snap = r.searcher.snapshot
    ids = sorted(snap.live_ids(), key=lambda i: snap.row_of(i))  # row order: ties break as the index does
    return [d for d in r.get(ids)]


@pytest.fixture(scope="module")
def index(paired_encoder, small_corpus, tmp_path_factory) -> HybridRetriever:
    docs = [dict(d, metadata={"n": i, "half": "a" if i < 20 else "b"}) for i, d in enumerate(small_corpus)]
    r = HybridRetriever(paired_encoder).index(docs[:30], workdir=tmp_path_factory.mktemp("ext") / "idx")
    r.add(docs[30:])
    return r


# ----------------------------------------------------------------------------- the tests

def test_every_segment_has_the_new_part_and_searches_equal_brute_force(index, paired_encoder):
    segs = index.searcher.snapshot.segments
    assert len(segs) == 2 and all(s.part("trigram").meta["format"] == TOY_FORMAT for s in segs)
    assert index.manifest["parts"]["trigram"] == {"format": TOY_FORMAT, "source": "trigram", "options": {}}
    assert index.manifest["representations"]["trigram"] == {"kind": "dense", "dim": DIM}
    assert_brute(index, docs_of(index), paired_encoder)


def test_filters_apply_before_top_k(index, paired_encoder):
    assert_brute(index, docs_of(index), paired_encoder, k=4, filt={"half": "b"},
                 keep=lambda d: d["metadata"]["half"] == "b")


def test_upsert_delete_compact(paired_encoder, small_corpus, tmp_path):
    r = HybridRetriever(paired_encoder).index(small_corpus[:20], workdir=tmp_path / "w")
    changed = dict(small_corpus[3], text="Moon rocks brought back by Apollo astronauts are basalt.")
    res = r.upsert([changed, small_corpus[4]])
    assert res.updated == 1 and res.unchanged == 1 and res.encoded == 1
    r.delete([small_corpus[7]["id"]])
    assert_brute(r, docs_of(r), paired_encoder)
    r.compact()
    assert len(r.searcher.snapshot.segments) == 1
    assert_brute(r, docs_of(r), paired_encoder)


def test_fused_methods_carry_the_new_retrievers_exact_scores(index, paired_encoder):
    for method in ("linear", "rrf"):
        hits = index.search(QUERIES, k=5, method=method, fusion={"retrievers": ["dense", "trigram", "sparse_binary"]})
        assert {"dense", "trigram", "sparse_binary"} <= set(hits.components)
        docs = {d["id"]: d for d in docs_of(index)}
        for i, q in enumerate(QUERIES):
            for j, doc_id in enumerate(hits.ids[i]):
                text = (docs[doc_id].get("title", "") + " " + docs[doc_id]["text"]).strip()
                want = float(Trigrams().encode_queries([q])[0] @ Trigrams().encode_documents([text])[0])
                assert hits.components["trigram"][i, j] == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_cli_method_choices(index, capsys):
    from hybridret.cli import main

    assert main(["-q", "search", str(index.searcher.root), "tower in paris", "--method", "trigram", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = index.search("tower in paris", k=len(out["hits"]), method="trigram")
    assert out["method"] == "trigram" and [h["id"] for h in out["hits"]] == list(want.ids[0])
    assert [h["scores"]["trigram"] for h in out["hits"]] == pytest.approx(want.scores[0].tolist(), rel=1e-6)


def test_post_search_accepts_them(index, tmp_path):
    httpx = pytest.importorskip("httpx")
    from test_serve import ThreadServer

    from hybridret.serve.app import create_app

    with ThreadServer(create_app(index.searcher.root)) as srv:
        for method in ("trigram", "sparse_binary"):
            resp = httpx.post(f"{srv.url}/search", json={"queries": QUERIES[:2], "k": 3, "method": method}, timeout=60)
            assert resp.status_code == 200, resp.text
            got = index.search(QUERIES[:2], k=3, method=method)
            assert [[h["id"] for h in row["hits"]] for row in resp.json()["results"]] == \
                [[x for x in row if x] for row in got.ids.tolist()]


def test_two_shards_equal_one_index(index, tmp_path, ray_cluster):  # noqa: F811 - the fixture imported above
    from hybridret.distributed.reshard import reshard
    from hybridret.distributed.searcher import ShardedSearcher

    reshard(index.searcher.root, tmp_path / "sharded", 2)
    # the shard actors get this process's registered retrievers, pickled; this module is not importable
    # in Ray's worker processes, so its classes travel by value
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    searcher = ShardedSearcher.open(tmp_path / "sharded", encoder=index.encoder)
    try:
        for method, fusion in (("trigram", None), ("sparse_binary", None),
                               ("linear", {"retrievers": ["dense", "trigram", "sparse_binary"]})):
            got = searcher.search(QUERIES, k=5, method=method, fusion=fusion)
            want = index.search(QUERIES, k=5, method=method, fusion=fusion)
            assert got.ids.tolist() == want.ids.tolist(), method
            np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-6)
    finally:
        searcher.close()
