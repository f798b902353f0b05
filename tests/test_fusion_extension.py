"""A fusion method added from this module alone, with one registry call, is a search method everywhere.

``combmax`` ranks the candidate union by each candidate's best min-max normalised exact score over the
fused retrievers (CombMAX). It declares that it reads the candidates' dense vectors (``vectors = True``),
so gathering must hand them over. It is checked against brute force through ``HybridRetriever.search``
(the library end to end: request, plan, gathering, fusion, hits), with a filter, and in the CLI's
``--method`` choices; nothing outside this module is edited to add it.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from hybridret import ConfigError, HybridRetriever
from hybridret.fusion import FUSERS, FusionConfig, FusionMethod, register_fusion, unregister_fusion
from hybridret.fusion.scores import normalise, select
from hybridret.methods import method_names
from hybridret.retrievers import REGISTRY

QUERIES = ["tower in paris", "honey bees and flowers", "black hole gravity", "bread yeast"]


class CombMax(FusionMethod):
    """The best min-max normalised exact score of any fused retriever."""

    name = "combmax"
    vectors = True  # declared: gathering hands over the candidates' dense vectors
    seen_vectors: list[tuple[int, ...]] = []

    def fuse(self, config, cands, k, snap, q, *, filt=None, threads=None):
        assert cands.vectors is not None, "a method that declares vectors gets them"
        self.seen_vectors.append(cands.vectors.shape[:2])
        best = np.max([normalise(cands.exact[r], cands.valid, "minmax") for r in config.retrievers], axis=0)
        return select(cands.rows, np.where(cands.valid, best, -np.inf), cands.exact, k)


@pytest.fixture(scope="module")
def combmax():
    method = register_fusion(CombMax())
    yield method
    unregister_fusion("combmax")


@pytest.fixture(scope="module")
def index(paired_encoder, small_corpus, tmp_path_factory) -> HybridRetriever:
    docs = [dict(d, metadata={"half": "a" if i < 20 else "b"}) for i, d in enumerate(small_corpus)]
    return HybridRetriever(paired_encoder).index(docs, workdir=tmp_path_factory.mktemp("fusion-ext") / "idx")


def brute(r: HybridRetriever, query: str, keep=None) -> dict[str, float]:
    """CombMAX of dense and BM25 over every document (``keep``: those alone), by id (BM25 scores 0
    where no query term matches)."""
    n = r.num_docs
    scores = {}
    for name in ("dense", "bm25"):
        hits = r.search(query, k=n, method=name)
        scores[name] = {h.id: h.score for h in hits[0]}
    ids = sorted(set(scores["dense"]) if keep is None else set(scores["dense"]) & keep)

    def norm(name):
        v = np.array([scores[name].get(i, 0.0) for i in ids])
        span = v.max() - v.min()
        return (v - v.min()) / span if span > 0 else np.zeros_like(v)

    return dict(zip(ids, np.maximum(norm("dense"), norm("bm25")).tolist()))


def assert_brute(hits, i: int, best: dict[str, float], k: int) -> None:
    """Query ``i``'s hits are a top ``k`` of ``best`` (ties in any order) with its scores."""
    got = hits[i]
    assert len(got) == k
    np.testing.assert_allclose([h.score for h in got], sorted(best.values(), reverse=True)[:k], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose([best[h.id] for h in got], [h.score for h in got], rtol=1e-4, atol=1e-5)


def test_a_registered_fusion_method_searches_like_brute_force(index, combmax):
    n = index.num_docs
    fusion = {"retrievers": ["dense", "bm25"]}
    hits = index.search(QUERIES, k=5, method="combmax", fusion=fusion, candidates=n)  # the union: every document
    assert hits.method == "combmax" and set(hits.components) >= {"dense", "bm25"}
    for i, q in enumerate(QUERIES):
        assert_brute(hits, i, brute(index, q), 5)
    assert CombMax.seen_vectors and all(shape[1] >= n for shape in CombMax.seen_vectors)


def test_with_a_filter_and_the_default_retrievers(index, combmax):
    n = index.num_docs
    half = {d["id"] for d in index.get(list(index.searcher.snapshot.live_ids())) if d["metadata"]["half"] == "a"}
    hits = index.search(QUERIES, k=4, method="combmax", filter={"half": "a"}, candidates=n,
                        fusion={"retrievers": ["dense", "bm25"]})
    for i, q in enumerate(QUERIES):
        assert {h.id for h in hits[i]} <= half
        assert_brute(hits, i, brute(index, q, keep=half), 4)
    plain = index.search(QUERIES[:1], k=3, method="combmax")  # FusionConfig's default retrievers: dense + sparse
    assert plain.method == "combmax" and set(plain.components) >= {"dense", "sparse"}


def test_it_is_a_method_of_the_registries_and_the_cli(combmax, index):
    from hybridret.cli._common import add_method_arg

    assert FUSERS["combmax"] is combmax and "combmax" in method_names(REGISTRY, FUSERS)
    p = argparse.ArgumentParser()
    add_method_arg(p)
    assert "combmax" in next(a for a in p._actions if a.dest == "method").choices
    assert FusionConfig("combmax").union_retrievers == ("dense", "sparse")
    with pytest.raises(ConfigError, match="fusion retrievers is empty"):
        FusionConfig("combmax", retrievers=[])


def test_registration_refuses_what_would_be_ambiguous(combmax):
    class Named(CombMax):
        def __init__(self, name):
            self.name = name

    for name, why in (("dense", "already a search method"), ("hybrid", "already a search method"),
                      ("rrf", "built-in fusion method"), ("combmax", "registered already"), ("no good", "identifier")):
        with pytest.raises(ConfigError, match=why):
            register_fusion(Named(name))
    with pytest.raises(ConfigError, match="FusionMethod instance"):
        register_fusion(lambda *a: None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="built-in fusion method"):
        unregister_fusion("gqr")


def test_an_unregistered_method_is_an_error_naming_the_methods(index):
    with pytest.raises(ConfigError, match="unknown method 'nosuch'"):
        index.search("x", method="nosuch")
    with pytest.raises(ConfigError, match="unknown search option 'methd'"):
        index.search("x", methd="rrf")
