"""Hardening of the encoders, on the real packaged models: concurrent first use, no remote code, and
model locations + weight fingerprints in encoder configs."""

from __future__ import annotations

import io
import json
import logging
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from hybridret.encoders import (
    DenseEncoder,
    JointEncoder,
    PairedEncoder,
    SpladeEncoder,
    compare_configs,
    encoder_from_config,
)
from hybridret.errors import ConfigError, EncoderError, HybridRetError, ModelNotFoundError
from hybridret.models import resolve_model

TEXTS = [
    "The cat sat on the mat.",
    "Photosynthesis converts sunlight, water and carbon dioxide into glucose and oxygen.",
    "Who wrote Hamlet?",
    "Battery electric vehicles run on lithium-ion batteries and produce no tailpipe emissions.",
    "Jazz began in New Orleans.",
    "Everest is the highest mountain on Earth " * 40,  # long: truncated
]
SPLADE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def copy_splade(dest: Path) -> Path:
    """A local model folder holding the packaged SPLADE-tiny's config, tokenizer and weights."""
    src = Path(resolve_model("splade-tiny"))
    dest.mkdir(parents=True)
    for name in SPLADE_FILES:
        shutil.copy(src / name, dest / name)
    return dest


def corrupt_tail(weights: Path) -> None:
    """Change a few bytes near the end of a weight file (tensor data, so it still loads)."""
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(64)
    weights.write_bytes(bytes(data))


def same_sparse(a, b) -> None:
    np.testing.assert_allclose(a.toarray(), b.toarray(), atol=1e-6, rtol=0)


def run_threads(n: int, work) -> list:
    """Run ``work(i)`` in ``n`` threads released together; re-raise the first failure."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:  # noqa: B036 -- collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


# ------------------------------------------------------------------------------ concurrency


def test_concurrent_first_encodes_on_fresh_paired_encoder(paired_encoder):
    fresh = PairedEncoder.from_names(None, None)
    assert not fresh.loaded and not fresh.dense.loaded and not fresh.sparse.loaded  # lazy: nothing loaded yet
    queries = [i % 2 == 0 for i in range(8)]

    def work(i: int):
        return fresh.encode_queries(TEXTS) if queries[i] else fresh.encode_documents(TEXTS)

    results = run_threads(8, work)
    assert fresh.dense.loaded and fresh.sparse.loaded
    expected_q, expected_d = paired_encoder.encode_queries(TEXTS), paired_encoder.encode_documents(TEXTS)
    for is_query, got in zip(queries, results):
        want = expected_q if is_query else expected_d
        np.testing.assert_allclose(got.dense, want.dense, atol=1e-5, rtol=0)
        np.testing.assert_allclose(got.sparse.toarray(), want.sparse.toarray(), atol=1e-5, rtol=0)
    # the texts truncated by all eight threads are all counted
    assert fresh.truncation_counts()[fresh.sparse.model_name] == 8
    # and loading still works in this process afterwards
    assert DenseEncoder().warm().runner.model is not None


def test_concurrent_encoder_from_config(paired_encoder):
    """Like two first searches on a freshly loaded index: every thread builds and loads its own encoder."""
    cfg = paired_encoder.sparse.config()
    results = run_threads(6, lambda i: encoder_from_config(cfg).encode_queries(TEXTS[:3]).sparse)
    want = paired_encoder.sparse.encode_queries(TEXTS[:3]).sparse
    for got in results:
        same_sparse(got, want)


def test_tokenize_and_term_ids_thread_hammer(paired_encoder):
    """One tokenizer, many threads: truncating (tokenize) and untruncated (text_term_ids) calls
    interleaved must each see their own truncation setting, and never fail ("Already borrowed")."""
    enc = paired_encoder.sparse
    runner = enc.runner
    tail = " zebra giraffe walrus platypus narwhal"  # only past max_length: lost if truncated by mistake
    texts = [TEXTS[5] * 2 + tail, TEXTS[1], TEXTS[3] * 12 + tail]
    batches = [texts[i:] + TEXTS[:4] for i in range(len(texts))]
    want_tok = [runner.tokenize(b) for b in batches]
    want_ids = [enc.text_term_ids(t) for t in texts]
    assert want_ids[0] > enc.text_term_ids(TEXTS[5] * 2)  # the tail terms are in the full set

    def work(i: int) -> int:
        for step in range(150):
            k = (i + step) % len(texts)
            if (i + step) % 2:
                assert runner.tokenize(batches[k]) == want_tok[k]
            else:
                assert enc.text_term_ids(texts[k]) == want_ids[k]
        return 150

    assert run_threads(8, work) == [150] * 8


def test_warm_loads_once():
    enc = SpladeEncoder()
    assert not enc.loaded and enc.truncation_counts() == {}
    assert enc.has_sparse and not enc.has_dense and not enc.loaded  # known without loading
    assert enc.warm() is enc and enc.loaded
    runner = enc.runner
    enc.warm()
    assert enc.runner is runner  # a no-op once loaded
    paired = PairedEncoder.from_names()
    paired.warm()
    assert paired.loaded and paired.dense.loaded and paired.sparse.loaded
    joint = JointEncoder("splade-tiny").warm()
    assert joint.loaded and joint.dense_dim == 128


def test_bad_settings_fail_at_construction(tmp_path: Path):
    with pytest.raises(ModelNotFoundError):
        SpladeEncoder(str(tmp_path / "missing"))
    with pytest.raises(EncoderError):
        SpladeEncoder(doc_top_k=0)
    with pytest.raises(EncoderError):
        DenseEncoder(max_length=4)


# ---------------------------------------------------------------------------- remote code


def evil_folder(root: Path, marker: Path, *, local_architecture: bool) -> Path:
    """SPLADE-tiny whose config points (auto_map) at a modeling file that writes ``marker`` when run."""
    folder = copy_splade(root)
    (folder / "modeling_evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import BertConfig, BertForMaskedLM\n"
        "class EvilConfig(BertConfig):\n    model_type = 'evil'\n"
        "class EvilModel(BertForMaskedLM):\n    config_class = EvilConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "modeling_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel",
                          "AutoModelForMaskedLM": "modeling_evil.EvilModel"}
    if not local_architecture:
        del config["model_type"]  # only the folder's own code can load it
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def says_yes(monkeypatch):
    """stdin answers every prompt with "y", like ``yes | hybridret ...``."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 100))


def test_remote_code_never_runs_standard_architecture_loads(tmp_path: Path, says_yes):
    marker = tmp_path / "marker"
    folder = evil_folder(tmp_path / "evil", marker, local_architecture=True)
    for backend, cls in (("numpy", "NumpyBert"), ("torch", "BertForMaskedLM")):  # neither runs the folder's code
        enc = SpladeEncoder(str(folder), backend=backend)
        got = enc.encode_documents(TEXTS[:2]).sparse
        assert type(enc.runner.model).__name__ == cls
        assert not marker.exists()
        same_sparse(got, SpladeEncoder(backend=backend).encode_documents(TEXTS[:2]).sparse)


def test_remote_code_only_model_is_refused(tmp_path: Path, says_yes):
    marker = tmp_path / "marker"
    folder = evil_folder(tmp_path / "evil", marker, local_architecture=False)
    for load in (lambda: SpladeEncoder(str(folder)).warm(), lambda: DenseEncoder(str(folder)).warm(),
                 lambda: encoder_from_config({"type": "joint", "model": str(folder)}).warm()):
        with pytest.raises(EncoderError, match="cannot be loaded"):
            load()
        assert not marker.exists()


def test_remote_code_not_run_by_trainer_loader(tmp_path: Path, says_yes):
    from hybridret.train.model import HybridModel

    marker = tmp_path / "marker"
    folder = evil_folder(tmp_path / "evil", marker, local_architecture=False)
    with pytest.raises((ValueError, HybridRetError)):
        HybridModel.from_pretrained(folder, max_length=32, device="cpu")
    assert not marker.exists()


# ---------------------------------------------------------------- locations and fingerprints


def test_relative_local_path_loads_from_another_cwd(tmp_path: Path, monkeypatch):
    copy_splade(tmp_path / "a" / "mymodel")
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    enc = SpladeEncoder("mymodel")
    cfg = enc.config()
    assert cfg["model"] == str((tmp_path / "a" / "mymodel").resolve())
    assert cfg["fingerprint"].startswith("sha256:") and len(cfg["fingerprint"]) == 71
    want = enc.encode_queries(TEXTS[:3]).sparse
    monkeypatch.chdir(tmp_path / "b")
    clone = encoder_from_config(json.loads(json.dumps(cfg)))  # as read back from a manifest
    assert clone.config() == cfg
    same_sparse(clone.encode_queries(TEXTS[:3]).sparse, want)


def test_same_named_folder_elsewhere_is_not_used(tmp_path: Path, monkeypatch):
    original = copy_splade(tmp_path / "a" / "mymodel")
    corrupt_tail(copy_splade(tmp_path / "b" / "mymodel") / "model.safetensors")
    monkeypatch.chdir(tmp_path / "a")
    cfg = SpladeEncoder("mymodel").config()
    monkeypatch.chdir(tmp_path / "b")
    assert Path(encoder_from_config(cfg).runner.path) == original.resolve()
    shutil.rmtree(original)
    with pytest.raises(ModelNotFoundError):
        encoder_from_config(cfg)  # gone: an error, not b/mymodel
    # even a config that stored the relative name (and a fingerprint) refuses b's other weights
    with pytest.raises(EncoderError, match="fingerprint"):
        encoder_from_config(dict(cfg, model="mymodel"))


def test_changed_weights_are_detected(tmp_path: Path, caplog):
    folder = copy_splade(tmp_path / "m")
    cfg = SpladeEncoder(str(folder)).config()
    corrupt_tail(folder / "model.safetensors")
    with pytest.raises(EncoderError) as err:
        encoder_from_config(cfg)
    msg = str(err.value)
    assert str(folder) in msg and cfg["fingerprint"] in msg and "verify=False" in msg
    changed = encoder_from_config(cfg, verify=False)
    new_fp = changed.config()["fingerprint"]
    assert new_fp != cfg["fingerprint"] and new_fp in msg
    diffs = compare_configs(cfg, changed.config())
    assert len(diffs) == 1 and "different weights" in diffs[0]
    # a tokenizer change counts too
    cfg2 = changed.config()
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(tok, do_lower_case=False)))
    with pytest.raises(EncoderError):
        encoder_from_config(cfg2)


def test_paired_config_verifies_each_model(tmp_path: Path):
    folder = copy_splade(tmp_path / "m")
    enc = PairedEncoder(DenseEncoder(), SpladeEncoder(str(folder)))
    cfg = enc.config()
    assert cfg["dense"]["model"] == "all-MiniLM-L6-v2" and cfg["dense"]["fingerprint"]
    encoder_from_config(cfg)
    corrupt_tail(folder / "model.safetensors")
    with pytest.raises(EncoderError, match="stored fingerprint"):
        encoder_from_config(cfg)


def test_packaged_aliases_resolve_anywhere(tmp_path: Path, monkeypatch, paired_encoder):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilm").mkdir()  # a same-named folder does not shadow the packaged model
    (tmp_path / "minilm" / "config.json").write_text("{}")
    cfg = PairedEncoder(DenseEncoder("minilm"), SpladeEncoder("SPLADE_tiny")).config()
    assert cfg["dense"]["model"] == "all-MiniLM-L6-v2" and cfg["sparse"]["model"] == "splade-tiny"
    assert cfg == paired_encoder.config()
    assert compare_configs(paired_encoder.config(), cfg) == []
    clone = encoder_from_config(cfg)
    np.testing.assert_allclose(clone.encode_queries(TEXTS[:2]).dense,
                               paired_encoder.encode_queries(TEXTS[:2]).dense, atol=1e-6, rtol=0)


def test_old_configs_without_fingerprint_load(tmp_path: Path, monkeypatch, caplog, paired_encoder):
    old = {"type": "paired",
           "dense": {"type": "dense", "model": "minilm", "max_length": 256, "pooling": "mean", "normalize": True,
                     "query_prefix": "", "document_prefix": ""},
           "sparse": {"type": "splade", "model": "splade-tiny", "max_length": 256, "doc_top_k": None,
                      "query_top_k": None}}
    with caplog.at_level(logging.INFO, logger="hybridret"):
        enc = encoder_from_config(old)
    assert sum("no weights fingerprint" in r.getMessage() for r in caplog.records) == 2
    same_sparse(enc.encode_documents(TEXTS[:2]).sparse, paired_encoder.encode_documents(TEXTS[:2]).sparse)
    assert compare_configs(old, paired_encoder.config()) == []  # alias vs name, missing fingerprint: noise
    # an old relative local path still resolves against the working directory, as it did
    copy_splade(tmp_path / "mymodel")
    monkeypatch.chdir(tmp_path)
    local = encoder_from_config(dict(old["sparse"], model="mymodel"))
    assert Path(local.runner.path) == (tmp_path / "mymodel").resolve()


def test_compare_configs_reports_real_differences(tmp_path: Path, monkeypatch, paired_encoder):
    base = paired_encoder.config()
    assert compare_configs(base, base) == []
    other = json.loads(json.dumps(base))
    other["dense"]["max_length"] = 128
    other["sparse"]["query_top_k"] = 10
    diffs = compare_configs(base, other)
    assert diffs == ["dense max_length: 256 stored, 128 given", "sparse query_top_k: None stored, 10 given"]
    assert compare_configs(base, base["sparse"]) == ["encoder type: 'paired' stored, 'splade' given"]
    # a relative path and the absolute one are the same folder; another folder is not
    copy_splade(tmp_path / "mymodel")
    monkeypatch.chdir(tmp_path)
    absolute = SpladeEncoder("mymodel").config()
    relative = dict(absolute, model="mymodel", fingerprint=None)
    assert compare_configs(relative, absolute) == []
    elsewhere = dict(relative, model="splade-tiny")
    assert compare_configs(elsewhere, absolute) == [f"model: 'splade-tiny' stored, {absolute['model']!r} given"]
    # a copy of the same weights under another name is the same model
    assert compare_configs(dict(absolute, model="splade-tiny"), absolute) == []


def test_bad_configs_are_config_errors():
    with pytest.raises(ConfigError):
        encoder_from_config({"type": "splade", "model": "splade-tiny", "colour": "red"})
    with pytest.raises(ConfigError):
        encoder_from_config({"type": "splade"})
    with pytest.raises(ConfigError):
        encoder_from_config({"type": "paired", "dense": None})
