"""The onnx encoder backends (ONNX Runtime, no torch): the same vectors as the numpy reference (onnx)
or close to them (onnx-int8) on the real default weights, the graph cache (built once, outside the
model folder, rebuilt when the weights or the cached file change), the backend choice (auto, the
environment, the CLI) and a clear error when onnxruntime is missing."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from hybridret import HybridRetriever
from hybridret.encoders import DenseEncoder, JointEncoder, PairedEncoder, SpladeEncoder
from hybridret.errors import ConfigError, MissingDependencyError
from hybridret.models import resolve_model

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

TEXTS = [
    "Photosynthesis converts light energy into chemical energy in plants.",
    "who wrote hamlet",
    "Tectonic plates move slowly; earthquakes happen along their fault lines, e.g. the San Andreas fault.",
    "Café au lait, naïve façade, Zürich — accents and dashes.",
    "東京は日本の首都です。",
    "x",
    "The moon landing in 1969: Armstrong and Aldrin walked on the lunar surface while Collins orbited. " * 6,
    "caffeine stimulant drink",
]
# agreement asserted for float32 onnx against numpy (measured on these texts: cosine 1 - 1e-7, weights ~5e-6)
DENSE_COSINE = 0.9999
SPARSE_ATOL = 1e-4
# onnx-int8 (measured on 200 msmarco passages: dense cosine min 0.989, top-20 term overlap 0.98)
INT8_COSINE = 0.97
INT8_TOP10 = 0.7


@pytest.fixture(scope="module")
def numpy_pair() -> PairedEncoder:
    return PairedEncoder.from_names(backend="numpy").warm()


@pytest.fixture(scope="module")
def onnx_pair() -> PairedEncoder:
    return PairedEncoder.from_names(backend="onnx").warm()


def _heavy(row, atol: float) -> set[int]:
    return set(row.indices[row.data > atol].tolist())


@pytest.mark.parametrize("batch_size", [1, 3, 32])
def test_onnx_gives_the_numpy_vectors(numpy_pair, onnx_pair, batch_size: int) -> None:
    assert onnx_pair.dense.runner.backend == onnx_pair.sparse.runner.backend == "onnx"
    for call in ("encode_documents", "encode_queries"):
        got = getattr(onnx_pair, call)(TEXTS, batch_size=batch_size)
        ref = getattr(numpy_pair, call)(TEXTS, batch_size=batch_size)
        assert got.dense.dtype == np.float32 and got.sparse.dtype == np.float32
        assert (got.dense * ref.dense).sum(axis=1).min() >= DENSE_COSINE
        np.testing.assert_allclose(got.sparse.toarray(), ref.sparse.toarray(), atol=SPARSE_ATOL, rtol=0)
        for i in range(len(TEXTS)):
            assert _heavy(got.sparse[i], SPARSE_ATOL) == _heavy(ref.sparse[i], SPARSE_ATOL), TEXTS[i][:40]


def test_onnx_top_k_equals_numpy() -> None:
    a = SpladeEncoder(backend="onnx", doc_top_k=5).encode_documents(TEXTS).sparse
    b = SpladeEncoder(backend="numpy", doc_top_k=5).encode_documents(TEXTS).sparse
    assert (np.diff(a.indptr) <= 5).all()
    np.testing.assert_allclose(a.toarray(), b.toarray(), atol=SPARSE_ATOL, rtol=0)


def test_onnx_int8_is_close_and_recorded(numpy_pair) -> None:
    enc = PairedEncoder.from_names(backend="onnx-int8").warm()
    got, ref = enc.encode_documents(TEXTS), numpy_pair.encode_documents(TEXTS)
    assert (got.dense * ref.dense).sum(axis=1).min() >= INT8_COSINE
    for i in range(len(TEXTS)):
        top = lambda row: set(row.indices[np.argsort(-row.data)[:10]].tolist())  # noqa: E731
        a, b = top(got.sparse[i]), top(ref.sparse[i])
        assert len(a & b) >= INT8_TOP10 * min(10, len(b)), TEXTS[i][:40]
    # a quantised backend is part of the encoder's identity (unlike the float32 ones)
    assert enc.config()["dense"]["backend"] == "onnx-int8"
    assert PairedEncoder.from_names(backend="onnx").config() == numpy_pair.config()


def test_same_hits_as_numpy_and_indexes_shared(numpy_pair, onnx_pair, small_corpus, tmp_path: Path) -> None:
    queries = ["tectonic plates fault line", "who wrote hamlet", "how do bees make honey", "moon landing"]
    built = {b: HybridRetriever(e).index(small_corpus, workdir=tmp_path / b)
             for b, e in (("numpy", numpy_pair), ("onnx", onnx_pair))}
    for method in ("dense", "sparse", "hybrid"):
        ids = {b: np.asarray(r.search(queries, k=10, method=method).ids).tolist() for b, r in built.items()}
        assert ids["onnx"] == ids["numpy"], method
    opened = HybridRetriever.load(tmp_path / "numpy", encoder=onnx_pair)
    assert np.array_equal(opened.search(queries, k=10).ids, built["numpy"].search(queries, k=10).ids)


# ---------------------------------------------------------------------------- the graph cache


def _splade_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "splade"
    shutil.copytree(resolve_model("splade-tiny"), folder)
    return folder


def test_the_graph_is_cached_outside_the_model_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("HYBRIDRET_CACHE_DIR", str(tmp_path / "cache"))
    folder = _splade_copy(tmp_path)
    before = sorted(p.name for p in folder.iterdir())
    with caplog.at_level(logging.INFO, logger="hybridret"):
        first = SpladeEncoder(str(folder), backend="onnx").encode_documents(TEXTS[:3]).sparse
    assert "building the fp32 ONNX graph" in caplog.text
    graphs = list((tmp_path / "cache" / "onnx").glob("*.onnx"))
    assert len(graphs) == 1 and graphs[0].with_suffix(".json").is_file()
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written into the model folder
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hybridret"):
        again = SpladeEncoder(str(folder), backend="onnx").encode_documents(TEXTS[:3]).sparse
    assert "building" not in caplog.text  # loaded from the cache
    assert np.array_equal(first.toarray(), again.toarray())


def test_a_damaged_cached_graph_is_rebuilt_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("HYBRIDRET_CACHE_DIR", str(tmp_path / "cache"))
    folder = _splade_copy(tmp_path)
    ref = SpladeEncoder(str(folder), backend="onnx").encode_documents(TEXTS[:3]).sparse
    graph = next((tmp_path / "cache" / "onnx").glob("*.onnx"))
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="hybridret"):
        got = SpladeEncoder(str(folder), backend="onnx").encode_documents(TEXTS[:3]).sparse
    assert "does not match its recorded SHA-256; rebuilding it" in caplog.text
    assert np.array_equal(ref.toarray(), got.toarray())


def test_changed_weights_get_a_new_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight rewritten in the middle of model.safetensors (same size, same first and last MiB):
    the cached graph of the old weights is not used; the new graph computes the new weights' vectors."""
    monkeypatch.setenv("HYBRIDRET_CACHE_DIR", str(tmp_path / "cache"))
    from hybridret.encoders._safetensors import read_header

    folder = _splade_copy(tmp_path)
    old = SpladeEncoder(str(folder), backend="onnx").encode_documents(TEXTS[:3]).sparse
    weights = folder / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    name = next(n for n in read_header(weights) if n.endswith("layer.1.output.dense.bias"))
    begin, end = json.loads(raw[8:header])[name]["data_offsets"]
    bias = np.frombuffer(bytes(raw[header + begin: header + end]), dtype="<f4").copy()
    bias[::2] += np.float32(1.0)  # not a constant shift, which the LayerNorm after it would remove
    raw[header + begin: header + end] = bias.astype("<f4").tobytes()
    weights.write_bytes(bytes(raw))
    new = SpladeEncoder(str(folder), backend="onnx").encode_documents(TEXTS[:3]).sparse
    assert len(list((tmp_path / "cache" / "onnx").glob("*.onnx"))) == 2
    assert not np.allclose(old.toarray(), new.toarray(), atol=1e-3)
    ref = SpladeEncoder(str(folder), backend="numpy").encode_documents(TEXTS[:3]).sparse
    np.testing.assert_allclose(new.toarray(), ref.toarray(), atol=SPARSE_ATOL, rtol=0)


# ---------------------------------------------------------------------------- choosing the backend


def test_auto_prefers_onnx_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYBRIDRET_ENCODER_BACKEND", raising=False)
    enc = PairedEncoder.from_names().warm()
    assert enc.dense.runner.backend == enc.sparse.runner.backend == "onnx"
    assert type(enc.dense.runner.model).__name__ == "OnnxBert"
    monkeypatch.setenv("HYBRIDRET_ENCODER_BACKEND", "numpy")
    assert DenseEncoder().warm().runner.backend == "numpy"
    monkeypatch.setenv("HYBRIDRET_ENCODER_BACKEND", "onnx")
    assert DenseEncoder().warm().runner.backend == "onnx"
    # a joint model (a dense and a sparse head from one pass) has no onnx graph: auto keeps it on numpy
    monkeypatch.delenv("HYBRIDRET_ENCODER_BACKEND")
    assert JointEncoder("splade-tiny").warm().runner.backend in ("numpy", "torch")
    with pytest.raises(ConfigError, match="backend 'onnx' runs dense and SPLADE encoders"):
        JointEncoder("splade-tiny", backend="onnx").warm()


def test_onnx_asked_for_without_onnxruntime_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    with pytest.raises(MissingDependencyError, match=r"needs onnxruntime, which is not installed: pip install "
                                                     r"'hybridret\[onnx\]'"):
        DenseEncoder(backend="onnx")
    with pytest.raises(MissingDependencyError, match="onnxruntime"):
        SpladeEncoder(backend="onnx-int8")
    monkeypatch.setenv("HYBRIDRET_ENCODER_BACKEND", "onnx")
    with pytest.raises(MissingDependencyError, match="HYBRIDRET_ENCODER_BACKEND=onnx needs onnxruntime"):
        DenseEncoder().warm()
    monkeypatch.delenv("HYBRIDRET_ENCODER_BACKEND")
    assert DenseEncoder().warm().runner.backend in ("numpy", "torch")  # auto falls back


def test_the_cli_builds_with_the_onnx_backend(tmp_path: Path, small_corpus, capsys) -> None:
    from hybridret.cli import main
    from hybridret.cli.index import ENCODER_BACKENDS
    from hybridret.encoders.backends import BACKENDS

    assert ENCODER_BACKENDS == BACKENDS
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in small_corpus[:10]), encoding="utf-8")
    for backend in ("onnx", "onnx-int8"):
        out = tmp_path / backend
        assert main(["-q", "index", str(corpus), "-o", str(out), "--encoder-backend", backend]) == 0
        assert main(["-q", "info", str(out)]) == 0
        text = capsys.readouterr().out
        assert ("built with onnx-int8" in text) == (backend == "onnx-int8")
        assert "queries here: onnx" in text
    assert main(["-q", "search", str(tmp_path / "onnx"), "photosynthesis light", "-k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == small_corpus[0]["id"]
