"""The windowed learned-sparse part (``hybridret-impact-v2``, the default since issue #30): exact
top-k equal to brute force over the float forward store (seeded corpora across several windows,
dense and sparse runs, ties, masks, threads), approximate answers that are exact whenever they say
so, escalation, memory per posting, damage, and a living index: several segments, deletes,
filters, 2 shards (tests/test_impact_index.py's living-index tests, which run on the default part),
and a format-3 index on the v1 part compacted into v2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from hybridret import HybridRetriever
from hybridret.errors import ConfigError, IndexFormatError
from hybridret.index import formats
from hybridret.index.impact import ImpactIndex, ImpactSearchStats
from hybridret.index.impact_windows import SHIFT, WindowImpactIndex

sys.path.insert(0, str(Path(__file__).parent))
from test_impact_index import QUERIES, _docs, assert_exact, brute, corpus, queries  # noqa: E402 - shared seeded data

W = 1 << SHIFT


def build(root: Path, D: sp.csr_matrix, chunk: int = 0) -> WindowImpactIndex:
    b = WindowImpactIndex.create(root, D.shape[1])
    step = chunk or max(1, D.shape[0])
    for s in range(0, D.shape[0], step):
        b.add(D[s:s + step])
    b.close()
    return WindowImpactIndex(root)


def wide_corpus(seed: int, n: int) -> sp.csr_matrix:
    """Rows across several windows: a few terms in most rows (dense runs), a Zipf tail (sparse
    runs), short rows; duplicated rows make exact ties across windows."""
    rng = np.random.default_rng(seed)
    vocab = 300
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    p /= p.sum()
    lens = rng.integers(1, 9, size=n)
    indptr = np.concatenate([[0], np.cumsum(lens)])
    terms = rng.choice(vocab, size=int(indptr[-1]), p=p)
    w = rng.lognormal(-1.0, 0.9, size=len(terms)).astype(np.float32)
    D = sp.csr_matrix((w, terms, indptr), shape=(n, vocab))
    D.sum_duplicates()
    D = D.tolil()
    for r in range(0, 40, 4):  # a row in the last window repeats one of the first
        D[n - 1 - r] = D[r]
    return D.tocsr()


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    D = wide_corpus(7, 2 * W + 5_000)
    return build(tmp_path_factory.mktemp("wide") / "p", D, chunk=40_000), D


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 10, 50])
def test_exact_top_k_equals_brute_force(tmp_path, seed, k):
    D = corpus(seed, 3_000)
    part = build(tmp_path / "p", D, chunk=700)
    Q = queries(seed + 10, 40, D)
    assert_exact(part.search(Q, k), brute(part, Q, k))


def test_several_windows_dense_and_sparse_runs_are_exact(wide):
    part, D = wide
    assert part.windows == 3 and part.meta["dense_runs"] > 0 and part.meta["sparse_postings"] > 0
    Q = queries(3, 30, D)
    for k in (1, 10, 40):
        assert_exact(part.search(Q, k), brute(part, Q, k))


@pytest.mark.parametrize("share", [0.5, 0.05, 0.0005])
def test_allowed_mask_is_exact(wide, share):
    part, D = wide
    allowed = np.random.default_rng(5).random(part.num_docs) < share
    Q = queries(4, 20, D)
    assert_exact(part.search(Q, 10, allowed=allowed), brute(part, Q, 10, allowed))
    assert_exact(part.search(Q, 10, allowed=np.zeros(part.num_docs, bool)), brute(part, Q, 10, np.zeros(part.num_docs, bool)))


def test_threads_give_the_same_result(wide):
    part, D = wide
    Q = queries(6, 48, D)
    one = part.search(Q, 10, threads=1)
    many = part.search(Q, 10, threads=4)
    np.testing.assert_array_equal(one[0], many[0])
    np.testing.assert_array_equal(one[1], many[1])


def test_edge_queries(tmp_path):
    D = corpus(2, 500)
    part = build(tmp_path / "p", D)
    empty = sp.csr_matrix((3, D.shape[1]), dtype=np.float32)
    rows, scores = part.search(empty, 5)
    assert (rows == -1).all() and np.isneginf(scores).all()
    unknown = sp.csr_matrix(([1.0], ([0], [D.shape[1] - 1])), shape=(1, D.shape[1]))
    if part.df[D.shape[1] - 1] == 0:
        assert (part.search(unknown, 5)[0] == -1).all()
    tiny = sp.csr_matrix(([1e-30], ([0], [int(np.argmax(part.df))])), shape=(1, D.shape[1]))
    assert_exact(part.search(tiny, 5), brute(part, tiny, 5))  # scores near the float floor
    assert_exact(part.search(D[:3], 2000), brute(part, D[:3], 2000))  # k beyond the matching rows


def test_a_weight_far_below_its_terms_step_still_counts(tmp_path):
    """Weights that round to zero steps are stored as one step: their rows are found (the only
    matches of a query), with their exact float scores."""
    D = sp.csr_matrix(np.array([[1000.0, 0.0], [1e-4, 1.0], [0.0, 2.0], [3e-4, 0.0]], dtype=np.float32))
    part = build(tmp_path / "p", D)
    q = sp.csr_matrix(np.array([[1.0, 0.0]], dtype=np.float32))
    rows, scores = part.search(q, 3)
    assert rows[0].tolist() == [0, 3, 1]
    np.testing.assert_array_equal(scores[0], np.array([1000.0, 3e-4, 1e-4], dtype=np.float32))


def test_approx_answers_are_exact_when_certified_and_escalation_makes_all_exact(wide, tmp_path):
    part, D = wide
    Q = queries(8, 60, D)
    want = brute(part, Q, 10)
    for keep, depth in ((1.0, 400), (0.9, 30), (0.5, 11)):
        st = ImpactSearchStats()
        got = part.search(Q, 10, mode="approx", approx_keep=keep, approx_depth=depth, stats=st)
        assert st.certified.shape == (60,)
        for i in np.flatnonzero(st.certified):  # when it says exact, it is
            assert_exact((got[0][i:i + 1], got[1][i:i + 1]), ([want[0][i]], [want[1][i]]))
        esc = ImpactSearchStats()
        assert_exact(part.search(Q, 10, mode="approx", approx_keep=keep, approx_depth=depth, escalate=True,
                                 stats=esc), want)
        assert esc.certified.all()
    loose = ImpactSearchStats()
    part.search(Q, 10, mode="approx", approx_keep=0.3, approx_depth=11, stats=loose)
    assert not loose.certified.all()  # the certificate is not vacuous: a rough pass is not always exact
    exact = ImpactSearchStats()
    part.search(Q, 10, stats=exact)
    assert exact.certified.all()


def test_memory_per_posting(wide):
    part, _ = wide
    bpp = part.bytes_per_posting()
    assert bpp["resident"] <= 5.0 < bpp["disk"]  # the float forward store stays on disk


def test_bad_input_is_refused(tmp_path):
    D = corpus(0, 200)
    part = build(tmp_path / "p", D)
    Q = queries(1, 2, D)
    for kw in ({"mode": "fast"}, {"mode": "approx", "approx_keep": 0.0}, {"mode": "approx", "approx_keep": 1.5},
               {"mode": "approx", "approx_depth": 0}, {"allowed": np.ones(3, bool)}):
        with pytest.raises(ConfigError):
            part.search(Q, 10, **kw)
    with pytest.raises(ConfigError):
        part.search(Q, 0)
    with pytest.raises(ConfigError):
        part.search(-Q, 10)
    with pytest.raises(ConfigError):
        WindowImpactIndex.create(tmp_path / "p", 10)  # not empty


def test_damaged_part_is_detected(tmp_path):
    D = corpus(1, 300)
    build(tmp_path / "p", D)
    imp = np.load(tmp_path / "p" / "postings.impacts.npy")
    np.save(tmp_path / "p" / "postings.impacts.npy", imp[:-1])
    with pytest.raises(IndexFormatError, match="do not match"):
        WindowImpactIndex(tmp_path / "p")
    np.save(tmp_path / "p" / "postings.impacts.npy", imp)
    data = np.load(tmp_path / "p" / "forward.data.npy")
    data[0] = -1.0
    np.save(tmp_path / "p" / "forward.data.npy", data)
    assert any("negative" in p for p in WindowImpactIndex(tmp_path / "p").check())
    data[0] = abs(data[0])
    np.save(tmp_path / "p" / "forward.data.npy", data)
    assert WindowImpactIndex(tmp_path / "p").check() == []
    meta = json.loads((tmp_path / "p" / "meta.json").read_text())
    meta["window_shift"] = 12
    (tmp_path / "p" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(IndexFormatError, match="window_shift"):
        WindowImpactIndex(tmp_path / "p")


# -- a living index (the living-index tests of test_impact_index.py run on this part: it is the default) --
def test_a_format_3_index_on_the_v1_part_compacts_into_v2(paired_encoder, small_corpus, tmp_path, monkeypatch, capsys):
    docs = _docs(small_corpus)
    with monkeypatch.context() as m:  # the default before issue #30
        m.setattr(formats, "IMPACT_V2", formats.IMPACT_V1)
        r = HybridRetriever(paired_encoder, max_segments=0)
        r.index(docs[:50], workdir=tmp_path / "idx")
        r.add(docs[50:])
        r.delete([docs[7]["id"]])
    assert {type(s.part("sparse")) for s in r.searcher.snapshot.segments} == {ImpactIndex}
    texts = QUERIES
    before = r.search(texts, k=10, method="sparse")
    r.add([dict(docs[0], id="late")])  # a write after the upgrade: a new segment in v2, the old ones as they were
    kinds = [type(s.part("sparse")).__name__ for s in r.searcher.snapshot.segments]
    assert kinds[-1] == "WindowImpactIndex" and "ImpactIndex" in kinds
    r.delete(["late"])
    mixed = r.search(texts, k=10, method="sparse")
    assert mixed.ids.tolist() == before.ids.tolist()
    r.compact()
    assert {type(s.part("sparse")).__name__ for s in r.searcher.snapshot.segments} == {"WindowImpactIndex"}
    after = r.search(texts, k=10, method="sparse")
    assert after.ids.tolist() == before.ids.tolist()
    np.testing.assert_allclose(after.scores, before.scores, rtol=1e-6)
    from hybridret.cli import main

    assert main(["info", str(tmp_path / "idx"), "--json"]) == 0
    sparse = json.loads(capsys.readouterr().out)["components"]["sparse"]
    assert sparse["format"] == "hybridret-impact-v2"
    # stated for every part; a segment this small is mostly its run directory (12 bytes per vocabulary term)
    assert 0 < sparse["bytes_per_posting_resident"] and 0 < sparse["bytes_per_posting_disk"]
