"""The memory-capped SPLADE max-pool and the int8 encoder backend, on the real packaged models.

No timing here: speed and memory are measured by benchmarks/encode_speed.py.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from hybridret.encoders import DenseEncoder, PairedEncoder, SpladeEncoder, compare_configs, encoder_from_config
from hybridret.encoders.identity import backend_differences
from hybridret.encoders.splade import HEAD_ROWS, mlm_parts, splade_weights, splade_weights_sliced
from hybridret.errors import ConfigError

torch = pytest.importorskip("torch")

TEXTS = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "how do vaccines train the immune system",
    "a",
    "Photosynthesis converts light energy into chemical energy stored in glucose; chlorophyll absorbs "
    "mostly blue and red light. " * 6,
    "Rust's borrow checker enforces that references never outlive the data they point to.",
    "The 2008 financial crisis began with the collapse of the US housing bubble and subprime mortgages.",
    "symptoms of vitamin d deficiency in adults",
    "Mitochondria are the powerhouse of the cell. " * 40,  # longer than max_length: truncated
]


@pytest.fixture(scope="module")
def splade() -> SpladeEncoder:
    return SpladeEncoder(backend="torch").warm()


@pytest.fixture(scope="module")
def splade_int8() -> SpladeEncoder:
    return SpladeEncoder(backend="torch-int8").warm()


def _batches(enc: SpladeEncoder, batch_size: int):
    return list(enc.runner.batches(TEXTS, batch_size, desc="", show_progress=False))


@pytest.mark.parametrize("rows", [1, 7, HEAD_ROWS])
@pytest.mark.parametrize("top_k", [None, 5])
def test_sliced_max_pool_equals_full_logits(splade: SpladeEncoder, rows: int, top_k: int | None) -> None:
    model = splade.runner.model
    parts = mlm_parts(model)
    assert parts is not None, "BERT-family masked LMs split into body and head"
    body, head = parts
    with torch.inference_mode():
        for _, ids, mask in _batches(splade, 3):
            full = splade_weights(model(input_ids=ids, attention_mask=mask).logits, mask, splade.keep, top_k)
            hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state
            sliced = splade_weights_sliced(hidden, mask, head, splade.keep, top_k, rows=rows)
            assert sliced.shape == full.shape
            # the same terms (top-k aside: a near tie may swap the k-th term), the same weights to GEMM rounding
            if top_k is None:
                assert torch.equal(sliced > 0, full > 0)
            else:
                assert ((sliced > 0) != (full > 0)).sum().item() <= 2 * ids.shape[0]
                continue
            assert (sliced - full).abs().max().item() <= 1e-5


def test_encoder_output_matches_full_logits_path(splade: SpladeEncoder) -> None:
    got = splade.encode_documents(TEXTS, batch_size=4).sparse
    model = splade.runner.model
    rows = {}
    with torch.inference_mode():
        for pos, ids, mask in _batches(splade, 4):
            w = splade_weights(model(input_ids=ids, attention_mask=mask).logits, mask, splade.keep).numpy()
            for row, p in enumerate(pos):
                rows[int(p)] = w[row]
    want = np.stack([rows[i] for i in range(len(TEXTS))])
    assert np.array_equal(got.toarray() > 0, want > 0)
    np.testing.assert_allclose(got.toarray(), want, atol=1e-5, rtol=0)


def test_sliced_max_pool_of_no_tokens_is_empty(splade: SpladeEncoder) -> None:
    _, head = mlm_parts(splade.runner.model)
    hidden = torch.zeros((2, 4, 128))
    mask = torch.zeros((2, 4), dtype=torch.int64)
    out = splade_weights_sliced(hidden, mask, head, splade.keep)
    assert out.shape == (2, splade.keep.shape[0]) and out.abs().sum().item() == 0


def _top_terms(row, k: int) -> set[int]:
    return {int(i) for i in row.indices[np.argsort(-row.data, kind="stable")[:k]]}


def test_int8_sparse_keeps_the_heavy_terms(splade: SpladeEncoder, splade_int8: SpladeEncoder) -> None:
    ref = splade.encode_documents(TEXTS).sparse
    got = splade_int8.encode_documents(TEXTS).sparse
    assert got.shape == ref.shape
    for i, text in enumerate(TEXTS):
        k = min(10, ref[i].nnz)
        overlap = len(_top_terms(ref[i], k) & _top_terms(got[i], k))
        assert overlap >= 0.7 * k, (text[:40], overlap, k)


@pytest.fixture(scope="module")
def dense_ref() -> np.ndarray:
    return DenseEncoder(backend="torch").encode_documents(TEXTS).dense


def test_bf16_vectors_close_to_fp32(dense_ref: np.ndarray, splade: SpladeEncoder) -> None:
    got = DenseEncoder(backend="torch-bf16").encode_documents(TEXTS).dense
    assert got.dtype == np.float32
    assert (dense_ref * got).sum(axis=1).min() >= 0.999
    ref = splade.encode_documents(TEXTS).sparse
    sparse = SpladeEncoder(backend="torch-bf16").encode_documents(TEXTS).sparse
    for i in range(len(TEXTS)):
        k = min(10, ref[i].nnz)
        assert len(_top_terms(ref[i], k) & _top_terms(sparse[i], k)) >= 0.8 * k


def test_int8_dense_vectors_close_to_fp32(dense_ref: np.ndarray) -> None:
    got = DenseEncoder(backend="torch-int8").encode_documents(TEXTS).dense
    cos = (dense_ref * got).sum(axis=1)
    # int8 is the lossy one: ~0.98 on average (its nDCG@10 cost is in benchmarks/results/encode-speed.json)
    assert cos.min() >= 0.93 and cos.mean() >= 0.97, cos
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_backend_recorded_in_config_and_rebuilt() -> None:
    fp32 = PairedEncoder.from_names()
    int8 = PairedEncoder.from_names(backend="torch-int8")
    assert "backend" not in fp32.config()["dense"] and "backend" not in fp32.config()["sparse"]  # manifests unchanged
    cfg = int8.config()
    assert cfg["dense"]["backend"] == "torch-int8" and cfg["sparse"]["backend"] == "torch-int8"
    rebuilt = encoder_from_config(cfg)
    assert rebuilt.dense.backend == "torch-int8" and rebuilt.sparse.backend == "torch-int8"
    assert rebuilt.config() == cfg
    assert int8.dense.device == "cpu"  # a CPU-only backend picks the CPU even where CUDA is present


def test_backend_mismatch_is_reported_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    fp32 = PairedEncoder.from_names().config()
    int8 = PairedEncoder.from_names(backend="torch-int8").config()
    assert backend_differences(int8, fp32) == ["dense backend: 'torch-int8' stored, 'float32' given",
                                               "sparse backend: 'torch-int8' stored, 'float32' given"]
    with caplog.at_level(logging.WARNING, logger="hybridret.encoders.identity"):
        assert compare_configs(int8, fp32) == []  # same weights: comparable vectors, not a mismatch
    assert "torch-int8" in caplog.text and "backends differ" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hybridret.encoders.identity"):
        assert compare_configs(fp32, PairedEncoder.from_names().config()) == []
        assert compare_configs(int8, PairedEncoder.from_names(backend="torch-int8").config()) == []
    assert caplog.text == ""
    # another model is still a mismatch, whatever the backend
    other = dict(int8, dense=dict(int8["dense"], max_length=128))
    assert compare_configs(other, fp32) == ["dense max_length: 128 stored, 256 given"]


def test_backend_mismatch_on_index_load_is_logged(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    from hybridret import HybridRetriever

    docs = [{"id": str(i), "text": t} for i, t in enumerate(TEXTS[:5])]
    built = HybridRetriever.from_models(backend="torch-int8", bm25=False, store_text=False).index(docs)
    built.save(tmp_path / "idx")
    loaded = HybridRetriever.load(tmp_path / "idx")
    assert loaded.encoder.config()["dense"]["backend"] == "torch-int8"  # queries encoded as the documents were
    with caplog.at_level(logging.WARNING):
        opened = HybridRetriever.load(tmp_path / "idx", encoder=PairedEncoder.from_names())
    assert "backend: 'torch-int8' stored, 'float32' given" in caplog.text
    assert opened.search("eiffel tower paris", k=1, method="dense").ids[0][0] == "0"


@pytest.mark.parametrize("make", [
    lambda: DenseEncoder(backend="onnx-int9"),
    lambda: SpladeEncoder(backend="int8"),
    lambda: PairedEncoder.from_names(backend="TORCH"),
    lambda: DenseEncoder(backend="torch-int8", device="cuda"),
    lambda: encoder_from_config({"type": "dense", "model": "all-MiniLM-L6-v2", "backend": "bogus"}),
])
def test_bad_backend_is_a_config_error(make) -> None:
    with pytest.raises(ConfigError, match="backend"):
        make()
