"""HybridRetriever end to end on the packaged models: search, hit views, save/load, load errors,
and crash safety of save (a child process SIGKILLed mid-save never leaves a broken index)."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hybridret import HybridRetriever
from hybridret.errors import CorpusFormatError, IndexExistsError, IndexFormatError, IndexNotFoundError
from hybridret.fusion.scores import normalise
from hybridret.search.snippets import WordMatcher

REPO = Path(__file__).resolve().parents[1]


def segment_dirs(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_dir() and p.name.startswith(("seg-", "gen-"))]

QUERIES = [
    "Who wrote Hamlet and Macbeth?",
    "how do bees make honey",
    "tallest mountain in the Himalayas",
    "Apollo 11 astronauts walked on the Moon",
    "what causes ocean tides",
    "first antibiotic penicillin",
]
EXPECTED_TOP = ["d24", "d05", "d04", "d17", "d40", "d33"]
K = 5
METHODS = ("hybrid", "dense", "sparse", "bm25")

B_DOCS = [
    {"id": "b01", "title": "Lighthouses", "text": "A lighthouse guides ships at night with a rotating lamp."},
    {"id": "b02", "title": "Origami", "text": "Origami is the Japanese art of folding paper into shapes."},
    {"id": "b03", "title": "Hamlet", "text": "Hamlet, Prince of Denmark, is a tragedy by William Shakespeare."},
    {"id": "b04", "title": "Beekeeping", "text": "Beekeepers keep bee colonies in hives to harvest honey."},
    {"id": "b05", "title": "Tides", "text": "Tides rise and fall twice a day because of the Moon's gravity."},
    {"id": "b06", "title": "Himalayas", "text": "The Himalayas contain the highest peaks in the world."},
    {"id": "b07", "title": "Moon", "text": "Astronauts of Apollo 11 landed on the Moon in 1969."},
    {"id": "b08", "title": "Penicillin", "text": "Penicillin was the first antibiotic, found by Fleming in 1928."},
]


def results(r: HybridRetriever, k: int = K) -> dict[str, tuple[list[list[str]], np.ndarray]]:
    out = {}
    for method in METHODS:
        hits = r.search(QUERIES, k=k, method=method)
        out[method] = (hits.ids.tolist(), hits.scores.copy())
    return out


def assert_same_results(got, expected) -> None:
    assert set(got) == set(expected)
    for method in expected:
        assert got[method][0] == expected[method][0], method
        np.testing.assert_allclose(got[method][1], expected[method][1], atol=1e-6, rtol=0, err_msg=method)


def which_index(path: Path, encoder, expected_a, expected_b) -> str:
    """Load ``path`` and say whether it serves exactly A's or exactly B's results."""
    got = results(HybridRetriever.load(path, encoder=encoder))
    for name, exp in (("A", expected_a), ("B", expected_b)):
        if got["hybrid"][0] == exp["hybrid"][0]:
            assert_same_results(got, exp)
            return name
    raise AssertionError(f"{path} serves neither A nor B: {got['hybrid'][0]}")


def copy_index(src: Path, dst: Path) -> Path:
    """A physical copy (new inodes): saved indexes share hard links with the live retriever's files,
    so damaging a file in place must never happen to those."""
    shutil.copytree(src, dst)
    return dst


def child_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"child exited with {proc.returncode} before {path.name}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {path.name}:\n{log.read_text()}")
        time.sleep(0.02)


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


# -------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def retriever(paired_encoder, small_corpus) -> HybridRetriever:
    return HybridRetriever(paired_encoder).index(small_corpus, batch_size=16)


@pytest.fixture(scope="module")
def expected_a(retriever):
    return results(retriever)


@pytest.fixture(scope="module")
def saved_a(retriever, tmp_path_factory) -> Path:
    """A's index on disk. Nothing ever overwrites it: tests work on copies."""
    path = tmp_path_factory.mktemp("saved") / "a"
    assert retriever.save(path) == path
    return path


@pytest.fixture(scope="module")
def retriever_b(paired_encoder) -> HybridRetriever:
    return HybridRetriever(paired_encoder).index(B_DOCS)


@pytest.fixture(scope="module")
def expected_b(retriever_b):
    return results(retriever_b)


@pytest.fixture(scope="module")
def saved_b(retriever_b, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("saved") / "b"
    retriever_b.save(path)
    return path


# ---------------------------------------------------------------------------------------- search


@pytest.mark.parametrize("method", METHODS)
def test_result_shapes_ids_and_order(retriever, small_corpus, method):
    hits = retriever.search(QUERIES, k=K, method=method)
    assert hits.method.split(":")[0] == method and len(hits) == len(QUERIES)
    assert hits.ids.shape == hits.rows.shape == hits.scores.shape == (len(QUERIES), K)
    known = {d["id"] for d in small_corpus}
    for i in range(len(QUERIES)):
        valid = hits.rows[i] >= 0
        assert valid[0], "every query finds something"
        assert set(hits.ids[i][valid]) <= known
        assert len(set(hits.ids[i][valid])) == valid.sum(), "no duplicates"
        assert (hits.ids[i][~valid] == "").all() and (hits.scores[i][~valid] == -np.inf).all()
        s = hits.scores[i][valid]
        assert np.isfinite(s).all() and (np.diff(s) <= 1e-7).all(), s
        assert [str(retriever.docs.ids[r]) for r in hits.rows[i][valid]] == list(hits.ids[i][valid])
    one = retriever.search(QUERIES[0], k=K, method=method)  # a single string is one query
    assert one.ids.shape == (1, K) and one.ids[0].tolist() == hits.ids[0].tolist()


def test_obvious_queries_rank_first(retriever):
    hits = retriever.search(QUERIES, k=3)
    assert hits.method.startswith("hybrid")
    assert [row[0] for row in hits.ids.tolist()] == EXPECTED_TOP
    bm25 = retriever.search(QUERIES[:1], k=3, method="bm25")
    assert bm25.ids[0, 0] == "d24"


def test_dense_and_sparse_are_exact(retriever, paired_encoder):
    """Dense and learned-sparse top-k equal brute force over the stored vectors."""
    k = 10
    qd = paired_encoder.dense.encode_queries(QUERIES).dense
    qs = paired_encoder.sparse.encode_queries(QUERIES).sparse
    dense = retriever.search(QUERIES, k=k, method="dense")
    full = qd @ np.asarray(retriever.dense.vectors).T
    np.testing.assert_array_equal(dense.rows, np.argsort(-full, axis=1, kind="stable")[:, :k])
    np.testing.assert_allclose(dense.scores, np.sort(full, axis=1)[:, ::-1][:, :k], atol=1e-5)
    for kk in (3, k):  # small k exercises deeper tantivy rounds
        sparse = retriever.search(QUERIES, k=kk, method="sparse")
        full = (qs @ retriever.sparse.forward.T).toarray()
        for i in range(len(QUERIES)):
            order = np.lexsort((np.arange(full.shape[1]), -full[i]))
            order = order[full[i, order] > 0][:kk]
            got = sparse.rows[i][sparse.rows[i] >= 0]
            np.testing.assert_array_equal(got, order)
            np.testing.assert_allclose(sparse.scores[i, : len(order)], full[i, order], rtol=1e-5)


def test_linear_is_minmax_fusion_of_exact_scores(retriever, paired_encoder):
    """With more candidates than documents, linear = 0.5 minmax(dense) + 0.5 minmax(sparse) over the
    union of both candidate lists, with each retriever's exact score carried along."""
    hits = retriever.search(QUERIES, k=K, method="linear")
    qd = paired_encoder.dense.encode_queries(QUERIES).dense
    qs = paired_encoder.sparse.encode_queries(QUERIES).sparse
    dense = qd @ np.asarray(retriever.dense.vectors).T
    sparse = (qs @ retriever.sparse.forward.T).toarray()
    valid = np.ones(dense.shape, dtype=bool)  # dense ranks every document, so the union is everything
    fused = 0.5 * normalise(dense, valid) + 0.5 * normalise(sparse, valid)
    for i in range(len(QUERIES)):
        rows = hits.rows[i]
        np.testing.assert_allclose(hits.scores[i], fused[i, rows], atol=1e-5)
        np.testing.assert_allclose(hits.components["dense"][i], dense[i, rows], atol=1e-5)
        np.testing.assert_allclose(hits.components["sparse"][i], sparse[i, rows], rtol=1e-5, atol=1e-6)
        assert np.isclose(hits.scores[i, 0], fused[i].max(), atol=1e-6)
    dense_only = retriever.search(QUERIES, k=K, method="linear", fusion={"weights": {"dense": 1.0, "sparse": 0.0}})
    assert dense_only.ids.tolist() == retriever.search(QUERIES, k=K, method="dense").ids.tolist()


def test_hit_view(retriever, small_corpus):
    by_id = {d["id"]: d for d in small_corpus}
    hits = retriever.search(QUERIES, k=K, method="linear")
    term_id = {t: i for i, t in enumerate(retriever.encoder.vocab)}
    expansion_seen = 0
    matcher = WordMatcher()
    for i in range(len(QUERIES)):
        view = hits[i]
        assert [h.id for h in view] == hits.ids[i].tolist()
        assert [h.rank for h in view] == list(range(1, K + 1))
        for h in view:
            doc = by_id[h.id]
            assert (h.title, h.text) == (doc["title"], doc["text"])
            assert set(h.scores) == {"dense", "sparse"}
            assert h.score == pytest.approx(float(hits.scores[i, h.rank - 1]))
            row = retriever.docs.row_of(h.id)
            forward = retriever.sparse.forward[row].toarray().ravel()
            q = hits.query_sparse[i].toarray().ravel()
            literal_text = f"{doc['title']} {doc['text']}".lower()
            for m in h.matched_terms:
                t = term_id[m.term]
                assert m.query_weight == pytest.approx(float(q[t])) and m.query_weight > 0
                assert m.doc_weight == pytest.approx(float(forward[t])) and m.doc_weight > 0
                assert m.contribution == pytest.approx(m.query_weight * m.doc_weight)
                if m.term.startswith("##"):  # a word piece: literal when the text's own pieces hold it
                    assert m.expansion or m.term.removeprefix("##") in literal_text, m.term
                else:  # a word: literal when a word of the text has its stem ("mountains"; a stop word: itself)
                    stems = matcher.stems(m.term)
                    there = bool(stems & matcher.stems(literal_text)) if stems else \
                        m.term in re.findall(r"[^\W_]+", literal_text)
                    assert there != m.expansion, m.term
                expansion_seen += m.expansion
            contributions = [m.contribution for m in h.matched_terms]
            assert contributions == sorted(contributions, reverse=True)
            assert sum(contributions) == pytest.approx(h.scores["sparse"], rel=1e-4, abs=1e-6)
            d = h.to_dict()
            assert d["id"] == h.id and d["text"] == doc["text"]
    assert expansion_seen >= 1, "SPLADE expansion terms are marked"
    assert [h.id for h in hits[0]][0] == "d24"
    assert any(not m.expansion and m.term == "hamlet" for m in hits[0][0].matched_terms)


def test_hit_views_of_other_methods(retriever):
    dense = retriever.search(QUERIES[:1], k=3, method="dense")[0]
    assert set(dense[0].scores) == {"dense"} and dense[0].matched_terms == []
    bm25 = retriever.search(QUERIES[:1], k=3, method="bm25")[0]
    assert set(bm25[0].scores) == {"bm25"} and bm25[0].text
    sparse = retriever.search(QUERIES[:1], k=3, method="sparse")[0]
    assert sparse[0].matched_terms and sparse[0].score == pytest.approx(
        sum(m.contribution for m in sparse[0].matched_terms), rel=1e-4)


# -------------------------------------------------------------------------------- save and load


def test_save_load_round_trip(saved_a, expected_a, retriever, small_corpus):
    loaded = HybridRetriever.load(saved_a)  # encoder rebuilt from the manifest
    assert loaded.num_docs == len(small_corpus)
    assert loaded.encoder.config() == retriever.encoder.config()
    assert loaded.manifest["num_docs"] == len(small_corpus) and loaded.manifest["format_version"] == 3
    assert_same_results(results(loaded), expected_a)
    hits = loaded.search(QUERIES[:1], k=1)[0]
    assert hits[0].text == small_corpus[23]["text"] and hits[0].matched_terms
    manifest = json.loads((saved_a / "manifest.json").read_text())
    (seg,) = manifest["segments"]
    assert (saved_a / seg["name"]).is_dir() and seg["num_docs"] == len(small_corpus) and not seg["deleted"]
    assert not (saved_a / seg["name"] / ".building").exists()
    assert len(segment_dirs(saved_a)) == 1


def test_save_refuses_to_overwrite(saved_a, saved_b, paired_encoder, expected_a, expected_b, tmp_path):
    target = copy_index(saved_a, tmp_path / "idx")
    a = HybridRetriever.load(target, encoder=paired_encoder)
    assert a.save(target) == target  # every write is committed there already: nothing to do
    b = HybridRetriever.load(saved_b, encoder=paired_encoder)
    with pytest.raises(IndexExistsError):
        b.save(target)
    assert which_index(target, paired_encoder, expected_a, expected_b) == "A"
    b.save(target, overwrite=True)
    assert which_index(target, paired_encoder, expected_a, expected_b) == "B"
    # `a` still reads the replaced segment: its lease keeps it on disk, and `a` keeps working
    assert len(segment_dirs(target)) == 2
    assert a.search(QUERIES[:1], k=1, method="dense").ids[0, 0] == EXPECTED_TOP[0]
    del a
    gc.collect()  # the reader is gone, and with it its lease
    b.save(target, overwrite=True)  # saving over itself reuses its segment, and tidies up
    assert len(segment_dirs(target)) == 1, "the replaced segment is removed once no reader uses it"
    assert which_index(target, paired_encoder, expected_a, expected_b) == "B"


def test_save_again_after_someone_else_overwrote(saved_a, saved_b, paired_encoder, expected_a, expected_b,
                                                  tmp_path):
    a = HybridRetriever.load(saved_a, encoder=paired_encoder)
    b = HybridRetriever.load(saved_b, encoder=paired_encoder)
    target = tmp_path / "shared"
    a.save(target)
    b.save(target, overwrite=True)  # deletes the generation `a` now points at
    a.save(target, overwrite=True)  # writes a manifest naming that deleted generation
    assert which_index(target, paired_encoder, expected_a, expected_b) == "A"


def test_load_errors(saved_a, tmp_path):
    with pytest.raises(IndexNotFoundError):
        HybridRetriever.load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexNotFoundError):
        HybridRetriever.load(tmp_path / "empty")

    newer = copy_index(saved_a, tmp_path / "newer")
    manifest = json.loads((newer / "manifest.json").read_text())
    (newer / "manifest.json").write_text(json.dumps({**manifest, "format_version": 999}))
    with pytest.raises(IndexFormatError, match="newer"):
        HybridRetriever.load(newer)

    missing = copy_index(saved_a, tmp_path / "missing")
    shutil.rmtree(missing / manifest["segments"][0]["name"])
    with pytest.raises(IndexFormatError, match="missing"):
        HybridRetriever.load(missing)

    garbled = copy_index(saved_a, tmp_path / "garbled")
    (garbled / "manifest.json").write_text('{"format_version": 1, "generat')
    with pytest.raises(IndexFormatError):
        HybridRetriever.load(garbled)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
@pytest.mark.parametrize("name", ["sparse/forward.data.npy", "sparse/forward.indptr.npy", "sparse/forward.indices.npy",
                                  "bm25/postings.docs.npy", "bm25/lengths.npy", "bm25/vocab.json"])
def test_corrupt_forward_store(saved_a, tmp_path, name, damage):
    copy = copy_index(saved_a, tmp_path / "c")
    gen = json.loads((copy / "manifest.json").read_text())["segments"][0]["name"]
    path = copy / gen / name
    size = path.stat().st_size
    if damage == "truncate":
        with open(path, "r+b") as fh:
            fh.truncate(size - 8)
    else:
        path.write_bytes(os.urandom(size))
    with pytest.raises(IndexFormatError):
        HybridRetriever.load(copy)


def test_corrupt_docstore_and_dense(saved_a, tmp_path):
    for rel in ("texts.offsets.npy", "dense/vectors.npy"):
        copy = copy_index(saved_a, tmp_path / rel.replace("/", "_"))
        gen = json.loads((copy / "manifest.json").read_text())["segments"][0]["name"]
        with open(copy / gen / rel, "r+b") as fh:
            fh.truncate(100)
        with pytest.raises(IndexFormatError):
            HybridRetriever.load(copy)
    copy = copy_index(saved_a, tmp_path / "ids")
    gen = json.loads((copy / "manifest.json").read_text())["segments"][0]["name"]
    ids = (copy / gen / "docids.txt").read_text().splitlines()
    (copy / gen / "docids.txt").write_text("\n".join(ids[:-1]) + "\n")
    with pytest.raises(IndexFormatError):
        HybridRetriever.load(copy)


# ------------------------------------------------------------------------------------ input data


def test_duplicate_ids_rejected(paired_encoder):
    docs = [{"id": "x", "text": "one"}, {"id": "y", "text": "two"}, {"id": "x", "text": "three"}]
    with pytest.raises(CorpusFormatError, match="duplicate"):
        HybridRetriever(paired_encoder).index(docs)


def test_empty_documents_skipped_and_counted(paired_encoder, tmp_path):
    docs = [
        {"id": "e1", "title": "", "text": "   "},
        {"id": "k1", "title": "Kites", "text": "Kites fly on windy days."},
        {"id": "e2", "text": "\n\t"},
        {"id": "k2", "title": "", "text": "Snails carry their shells."},
        {"id": "k3", "title": "Only a title", "text": ""},
    ]
    r = HybridRetriever(paired_encoder).index(docs)
    assert r.num_docs == 3 and r.manifest["skipped_empty"] == 2
    assert r.docs.ids.tolist() == ["k1", "k2", "k3"]
    assert r.search("kites in the wind", k=1).ids[0, 0] == "k1"
    r.save(tmp_path / "e")
    loaded = HybridRetriever.load(tmp_path / "e", encoder=paired_encoder)
    assert loaded.manifest["skipped_empty"] == 2 and loaded.num_docs == 3
    with pytest.raises(CorpusFormatError):
        HybridRetriever(paired_encoder).index([{"id": "e", "text": " "}])


# --------------------------------------------------------------------------------- crash safety


CRASH_IN_COMMIT = r"""
import json, os, sys, time
from pathlib import Path
from hybridret import HybridRetriever
from hybridret.encoders import PairedEncoder

target, marker, docs = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
r = HybridRetriever(PairedEncoder.from_names()).index(docs)
real_replace = os.replace

def stalled_replace(src, dst, *args, **kwargs):
    if os.path.basename(str(dst)) == "manifest.json":
        marker.write_text(str(src))  # the new manifest is written and fsynced, not yet renamed
        time.sleep(60)
    return real_replace(src, dst, *args, **kwargs)

os.replace = stalled_replace
r.save(target, overwrite=True)
print("save returned", flush=True)
"""


def test_sigkill_during_commit_keeps_old_index(saved_a, paired_encoder, expected_a, expected_b, tmp_path):
    target = copy_index(saved_a, tmp_path / "idx")
    marker, log = tmp_path / "marker", tmp_path / "child.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", CRASH_IN_COMMIT, str(target), str(marker), json.dumps(B_DOCS)],
                                env=child_env(), cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_for(marker, proc, log)
    finally:
        if proc.poll() is None:
            kill(proc)
    # the child died with B's generation complete on disk and its manifest written beside the old one
    assert len(segment_dirs(target)) == 2
    assert Path(marker.read_text()).exists()
    assert which_index(target, paired_encoder, expected_a, expected_b) == "A"
    # the next save tidies the orphaned generation away
    HybridRetriever.load(saved_a, encoder=paired_encoder).save(target, overwrite=True)
    assert len(segment_dirs(target)) == 1
    assert which_index(target, paired_encoder, expected_a, expected_b) == "A"


SAVE_LOOP = r"""
import json, sys
from pathlib import Path
from hybridret import HybridRetriever
from hybridret.encoders import PairedEncoder

target, a_copy, progress, docs = sys.argv[1], sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4])
# Widen the windows inside save() (hard-linking files, fsyncs) so the parent's random freezes land
# inside them often; the operations themselves are the real ones.
import os, time
_link, _fsync = os.link, os.fsync
def slow_link(*args, **kwargs):
    time.sleep(0.01)
    return _link(*args, **kwargs)
def slow_fsync(*args, **kwargs):
    time.sleep(0.003)
    return _fsync(*args, **kwargs)
os.link, os.fsync = slow_link, slow_fsync
enc = PairedEncoder.from_names()
HybridRetriever(enc).index(docs[:2])  # warm up, so the loop below is all index + save work
progress.write_text("0")
i = 0
while True:
    if i % 2 == 0:  # build B (every other time directly inside the target directory), then save it
        r = HybridRetriever(enc).index(docs, batch_size=4, workdir=target if i % 4 == 0 else None, overwrite=True)
    else:           # put A back
        r = HybridRetriever.load(a_copy, encoder=enc)
    r.save(target, overwrite=True)
    i += 1
    progress.write_text(str(i))
"""


def test_sigkill_at_random_points_of_index_and_save(saved_a, paired_encoder, expected_a, expected_b, tmp_path):
    """A child loops index() + save(), alternating B and A; the parent freezes it (SIGSTOP) at random
    moments -- what is on disk then is exactly what a crash there would leave -- checks the
    directory, lets it go on, and finally SIGKILLs it at a random moment. The directory must always
    load to A's or B's complete results."""
    rng = np.random.default_rng(2024)
    target = copy_index(saved_a, tmp_path / "idx")
    a_copy = copy_index(saved_a, tmp_path / "a_copy")
    progress, log = tmp_path / "progress", tmp_path / "child.log"

    def commits() -> int:
        text = progress.read_text() if progress.exists() else ""
        return int(text) if text.strip() else 0

    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", SAVE_LOOP, str(target), str(a_copy), str(progress), json.dumps(B_DOCS)],
            env=child_env(), cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
    seen = []
    try:
        wait_for(progress, proc, log)
        deadline = time.monotonic() + 60
        while commits() < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(float(rng.uniform(0.02, 0.25)))
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                seen.append(which_index(target, paired_encoder, expected_a, expected_b))
            finally:
                os.kill(proc.pid, signal.SIGCONT)
        time.sleep(float(rng.uniform(0.0, 0.3)))
    finally:
        if proc.poll() is None:
            kill(proc)
    assert proc.returncode == -signal.SIGKILL, log.read_text()
    assert commits() >= 4, f"the child got through only {commits()} saves:\n{log.read_text()}"
    seen.append(which_index(target, paired_encoder, expected_a, expected_b))
    assert len(seen) >= 3 and set(seen) <= {"A", "B"}
    print(f"{commits()} commits; the directory served {''.join(seen)}")
    # writers are not stuck either: a fresh save over the wreck succeeds and tidies up
    HybridRetriever.load(saved_a, encoder=paired_encoder).save(target, overwrite=True)
    assert which_index(target, paired_encoder, expected_a, expected_b) == "A"
    assert len(segment_dirs(target)) == 1
