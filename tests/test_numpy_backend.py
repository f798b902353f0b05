"""The numpy encoder backend: its safetensors reader and tokenizer, the backend choice, and its vectors
against torch float32 on the real packaged models (those tests skip without torch).

No timing here: benchmarks/encode_speed.py compares the backends' speed.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from hybridret import HybridRetriever
from hybridret.encoders import DenseEncoder, JointEncoder, PairedEncoder, SpladeEncoder
from hybridret.encoders._safetensors import read_safetensors
from hybridret.encoders.backends import backend_config, torch_installed
from hybridret.errors import ConfigError, EncoderError
from hybridret.models import resolve_model

needs_torch = pytest.mark.skipif(not torch_installed(), reason="torch/transformers not installed (the torch extra)")

TEXTS = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "how do vaccines train the immune system",
    "a",
    "",
    "Café au lait, naïve façade, crème brûlée: ÀÉÎÕÜ àéîõü ß ø å",
    "東京は日本の首都です。北京 서울",
    "emoji 😀🚀 and symbols ∑∫√ ≠ ≤ — “quotes” … ½",
    "zero\u200bwidth\u00a0nbsp\ttab\nnewline   spaces",
    "UPPER case Words and MiXeD CaSe",
    "Photosynthesis converts light energy into chemical energy stored in glucose. " * 40,  # longer than 256 tokens
]


# ---------------------------------------------------------------------------- safetensors


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header, offset, body = {}, 0, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        body += raw
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + body)


def test_safetensors_reader_reads_the_default_models() -> None:
    tensors = read_safetensors(Path(resolve_model("splade-tiny")) / "model.safetensors")
    assert tensors["bert.embeddings.word_embeddings.weight"].shape == (30522, 128)
    assert tensors["bert.embeddings.word_embeddings.weight"].dtype == np.float32
    assert tensors["cls.predictions.bias"].shape == (30522,)


def test_safetensors_widens_half_precision(tmp_path: Path) -> None:
    values = np.array([1.5, -2.25, 0.0, 32768.0], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()  # exact: these values fit bfloat16
    _write_safetensors(tmp_path / "m.safetensors", {"a": ("BF16", [2, 2], bf16),
                                                    "b": ("F16", [4], values.astype("<f2").tobytes()),
                                                    "c": ("I64", [1], np.array([7], "<i8").tobytes())})
    got = read_safetensors(tmp_path / "m.safetensors")
    np.testing.assert_array_equal(got["a"], values.reshape(2, 2))
    np.testing.assert_array_equal(got["b"], values)
    assert got["a"].dtype == got["b"].dtype == np.float32 and got["c"].tolist() == [7]


@pytest.mark.parametrize("damage", ["truncated", "bad header", "offsets past the end", "shape mismatch", "dtype"])
def test_damaged_safetensors_is_an_encoder_error_naming_the_file(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "model.safetensors"
    raw = np.arange(4, dtype="<f4").tobytes()
    entry = {"truncated": ("F32", [4], raw), "offsets past the end": ("F32", [4], raw),
             "shape mismatch": ("F32", [5], raw), "dtype": ("C64", [2], raw), "bad header": ("F32", [4], raw)}[damage]
    _write_safetensors(path, {"w": entry})
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:-3])
    elif damage == "offsets past the end":
        path.write_bytes(data.replace(b"[0, 16]", b"[0, 99]"))
    elif damage == "bad header":
        path.write_bytes(data[:8] + b"x" + data[9:])
    with pytest.raises(EncoderError, match="model.safetensors"):
        read_safetensors(path)


@pytest.mark.parametrize("entry", [{"dtype": ["F32"], "shape": [4], "data_offsets": [0, 16]},
                                   {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 16]},
                                   {"dtype": "F32", "shape": [4], "data_offsets": ["0", 16]},
                                   {"dtype": "F32", "shape": [True, 4], "data_offsets": [0, 16]}])
def test_header_values_of_the_wrong_type_are_an_encoder_error(tmp_path: Path, entry: dict) -> None:
    path = tmp_path / "model.safetensors"
    blob = json.dumps({"w": entry}).replace("Infinity", "1e400").encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + np.arange(4, dtype="<f4").tobytes())
    with pytest.raises(EncoderError, match="model.safetensors.*malformed header entry"):
        read_safetensors(path)


def test_a_deeply_nested_header_is_an_encoder_error(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    blob = b"[" * 100_000 + b"]" * 100_000
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)
    with pytest.raises(EncoderError, match="model.safetensors"):
        read_safetensors(path)


# ---------------------------------------------------------------------------- the backend choice


def test_auto_runs_the_default_models_on_numpy_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridret.encoders import backends

    monkeypatch.setattr(backends, "torch_installed", lambda: False)
    monkeypatch.setattr(backends, "onnx_installed", lambda: False)
    enc = PairedEncoder.from_names().warm()
    assert enc.dense.runner.backend == "numpy" and enc.sparse.runner.backend == "numpy"
    assert enc.dense.device == "cpu"
    assert type(enc.dense.runner.model).__name__ == "NumpyBert"


@needs_torch
def test_auto_prefers_torch_where_installed_and_onnxruntime_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridret.encoders import backends
    from hybridret.encoders.backends import CPU_PREFERS_NUMPY

    monkeypatch.setattr(backends, "onnx_installed", lambda: False)
    assert PairedEncoder.from_names().warm().dense.runner.backend == ("numpy" if CPU_PREFERS_NUMPY else "torch")


def test_the_environment_chooses_what_auto_means(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDRET_ENCODER_BACKEND", "numpy")
    assert DenseEncoder().warm().runner.backend == "numpy"  # torch installed, numpy asked for
    monkeypatch.setenv("HYBRIDRET_ENCODER_BACKEND", "tensorflow")
    with pytest.raises(ConfigError, match="HYBRIDRET_ENCODER_BACKEND='tensorflow': expected onnx, numpy, torch or auto"):
        DenseEncoder().warm()


def test_float32_backends_are_not_recorded_in_configs() -> None:
    assert backend_config("auto") == backend_config("numpy") == backend_config("torch") == {}
    assert backend_config("torch-int8") == {"backend": "torch-int8"}
    assert DenseEncoder(backend="numpy").config() == DenseEncoder().config()


def _not_bert(tmp_path: Path) -> Path:
    folder = tmp_path / "roberta"
    shutil.copytree(resolve_model("splade-tiny"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "roberta"
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_numpy_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="numpy.*roberta.*BERT only.*backend='torch'"):
        SpladeEncoder(str(_not_bert(tmp_path)), backend="numpy").warm()
    no_tok = tmp_path / "no-tokenizer-json"
    shutil.copytree(resolve_model("splade-tiny"), no_tok)
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match="tokenizer.json"):
        SpladeEncoder(str(no_tok), backend="numpy").warm()
    with pytest.raises(ConfigError, match="CPU only"):
        DenseEncoder(backend="numpy", device="cuda")


@needs_torch
def test_auto_falls_back_to_torch_for_other_architectures(tmp_path: Path) -> None:
    from hybridret.encoders.backends import resolve_backend

    assert resolve_backend("auto", _not_bert(tmp_path), "cpu") == "torch"
    assert resolve_backend("numpy", resolve_model("splade-tiny"), "cpu") == "numpy"


def test_torch_blocked_model_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridret.encoders import backends
    from hybridret.errors import MissingDependencyError

    monkeypatch.setattr(backends, "torch_installed", lambda: False)
    with pytest.raises(MissingDependencyError, match=r"roberta.*pip install 'hybridret\[torch\]'"):
        backends.resolve_backend("auto", _not_bert(tmp_path), "cpu")
    with pytest.raises(MissingDependencyError, match=r"'torch-int8'.*pip install 'hybridret\[torch\]'"):
        DenseEncoder(backend="torch-int8")
    assert backends.pick_device(None) == "cpu"


# ---------------------------------------------------------------------------- equal to transformers / torch


@needs_torch
@pytest.mark.parametrize("model", ["all-MiniLM-L6-v2", "splade-tiny"])
def test_tokenizer_equals_transformers(model: str) -> None:
    from transformers import AutoTokenizer

    from hybridret.encoders._hf import TransformerRunner

    path = resolve_model(model)
    ref = AutoTokenizer.from_pretrained(path)
    for max_length in (16, 256):
        runner = TransformerRunner(model, "base", device="cpu", max_length=max_length, backend="numpy")
        tok = runner.tokenizer
        assert type(tok).__name__ == "FolderTokenizer"
        assert tok.get_vocab() == ref.get_vocab() and len(tok) == len(ref)
        assert sorted(tok.all_special_ids) == sorted(ref.all_special_ids) and tok.pad_token_id == ref.pad_token_id
        want = ref(TEXTS, truncation=True, max_length=max_length)["input_ids"]
        ids, cut = runner.tokenize(TEXTS)
        assert ids == want
        assert cut == sum(len(x) > max_length for x in ref(TEXTS)["input_ids"])  # what was cut is counted
        assert [runner.plain_ids(t) for t in TEXTS] == ref(TEXTS, add_special_tokens=False)["input_ids"]
        # padding: every batch is the transformers padding of its (length-sorted) texts
        for pos, batch_ids, mask in runner.batches(TEXTS, 4, desc="", show_progress=False):
            padded = ref([TEXTS[p] for p in pos], truncation=True, max_length=max_length, padding=True)
            assert batch_ids.tolist() == padded["input_ids"] and mask.tolist() == padded["attention_mask"]


@pytest.fixture(scope="module")
def pairs() -> dict[str, PairedEncoder]:
    return {b: PairedEncoder.from_names(backend=b).warm() for b in ("numpy", "torch")}


# the agreement asserted: dense cosine per text; sparse weights to this absolute tolerance (measured on
# these texts: ~4e-6; weights run 0..~3), on the same terms
DENSE_COSINE = 0.9999
SPARSE_ATOL = 1e-4


def _same_sparse(a, b) -> None:
    np.testing.assert_allclose(a.toarray(), b.toarray(), atol=SPARSE_ATOL, rtol=0)
    for i in range(a.shape[0]):
        heavy = lambda row: set(row.indices[row.data > SPARSE_ATOL].tolist())  # noqa: E731
        assert heavy(a[i]) == heavy(b[i]), TEXTS[i][:40]


@needs_torch
@pytest.mark.parametrize("batch_size", [1, 3, 32])
def test_vectors_equal_torch_float32(pairs: dict[str, PairedEncoder], batch_size: int) -> None:
    for call in ("encode_documents", "encode_queries"):
        got = getattr(pairs["numpy"], call)(TEXTS, batch_size=batch_size)
        ref = getattr(pairs["torch"], call)(TEXTS, batch_size=batch_size)
        assert got.dense.dtype == np.float32 and got.sparse.dtype == np.float32
        cos = (got.dense * ref.dense).sum(axis=1)
        assert cos.min() >= DENSE_COSINE, cos
        _same_sparse(got.sparse, ref.sparse)


@needs_torch
def test_top_k_and_joint_equal_torch() -> None:
    a = SpladeEncoder(backend="numpy", doc_top_k=5).encode_documents(TEXTS).sparse
    b = SpladeEncoder(backend="torch", doc_top_k=5).encode_documents(TEXTS).sparse
    assert (np.diff(a.indptr) <= 5).all()
    _same_sparse(a, b)
    ja, jb = (JointEncoder("splade-tiny", backend=x).encode_documents(TEXTS) for x in ("numpy", "torch"))
    assert ja.dense.shape == (len(TEXTS), 128) and (ja.dense * jb.dense).sum(axis=1).min() >= DENSE_COSINE
    _same_sparse(ja.sparse, jb.sparse)


QUERIES = ["tectonic plates fault line", "who wrote hamlet", "how do bees make honey", "electric car batteries",
           "moon landing astronauts", "what causes ocean tides", "caffeine stimulant drink", "ancient empire sea"]


@needs_torch
def test_same_top10_and_indexes_searchable_across_backends(pairs, small_corpus, tmp_path: Path) -> None:
    built = {}
    for backend, enc in pairs.items():
        built[backend] = HybridRetriever(enc).index(small_corpus, workdir=tmp_path / backend)
    for method in ("dense", "sparse", "hybrid"):
        ids = {b: np.asarray(r.search(QUERIES, k=10, method=method).ids).tolist() for b, r in built.items()}
        assert ids["numpy"] == ids["torch"], method
    # an index built on one backend, searched with the other: the same encoder, no warning, the same hits
    for built_with, other in (("numpy", "torch"), ("torch", "numpy")):
        opened = HybridRetriever.load(tmp_path / built_with, encoder=pairs[other])
        assert np.array_equal(opened.search(QUERIES, k=10).ids, built[built_with].search(QUERIES, k=10).ids)
    assert HybridRetriever.load(tmp_path / "torch").encoder.config() == pairs["numpy"].config()


def test_one_blas_thread_is_numpys_not_faiss(tmp_path: Path) -> None:
    """FAISS bundles an OpenBLAS of its own, loaded first when an index opens before a query is
    encoded: the block must change numpy's thread count (the one its products use), not FAISS's."""
    code = """
import ctypes, os, faiss, numpy
from hybridret.encoders._blas_threads import single_blas_thread
libs = os.path.dirname(numpy.__file__) + ".libs"
maps = {line.split(maxsplit=5)[-1].strip() for line in open("/proc/self/maps") if "openblas" in line.lower()}
own = [p for p in maps if p.startswith(libs)]
if not own:
    print("SKIP no bundled OpenBLAS"); raise SystemExit
get = next(getattr(ctypes.CDLL(own[0]), n) for n in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                                                  "openblas_get_num_threads") if hasattr(ctypes.CDLL(own[0]), n))
get.restype = ctypes.c_int
before, omp = get(), faiss.omp_get_max_threads()
with single_blas_thread():
    inside, omp_inside = get(), faiss.omp_get_max_threads()
print(before, inside, get(), omp, omp_inside)
"""
    import subprocess
    import sys

    env = {**__import__("os").environ, "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    if out.stdout.startswith("SKIP"):
        pytest.skip("this numpy bundles no OpenBLAS")
    before, inside, after, omp, omp_inside = map(int, out.stdout.split())
    assert (before, inside, after) == (2, 1, 2)  # numpy's pool: one thread inside, restored after
    assert omp_inside == omp  # FAISS's threads untouched


@pytest.mark.parametrize("change", [{"hidden_size": None}, {"num_attention_heads": 0}, {"vocab_size": "big"},
                                    {"intermediate_size": 1.5}])
def test_a_bad_config_is_an_encoder_error_naming_the_field(tmp_path: Path, change: dict) -> None:
    from hybridret.encoders._numpy_bert import NumpyBert

    folder = tmp_path / "model"
    shutil.copytree(resolve_model("splade-tiny"), folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        if value is None:
            del config[key]
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(EncoderError, match=f"config.json: {next(iter(change))} (is missing|must be a positive)"):
        NumpyBert(folder, mlm=True)
