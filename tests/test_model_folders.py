"""Model folders get the same checks on both encoder backends, before anything is encoded (issue
#32): truncated weights, config sizes that do not match the weights, pickled-only weights (never
unpickled) and a tokenizer without a usable vocabulary are EncoderErrors naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hybridret.encoders import SpladeEncoder
from hybridret.errors import ConfigError, EncoderError
from hybridret.models import resolve_model

BACKENDS = ("numpy", "torch")


def _copy(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(resolve_model("splade-tiny"), tmp_path / name))


def _config(folder: Path, **change) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))


def _load(folder: Path, backend: str) -> None:
    SpladeEncoder(str(folder), backend=backend).encode_documents(["honey bees make honey"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncated_weights(tmp_path: Path, backend: str) -> None:
    folder = _copy(tmp_path, "trunc")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(EncoderError, match="model.safetensors: tensor .* do not fit its shape or the file"):
        _load(folder, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change, match", [
    ({"vocab_size": 30529}, "config.json: vocab_size 30529 and a width of 128 imply .*word_embeddings.weight of shape "
                            "\\(30529, 128\\), but .*model.safetensors holds \\(30522, 128\\)"),
    ({"hidden_size": 256, "num_attention_heads": 4}, "a width of 256 imply"),
    ({"max_position_embeddings": 1024}, "max_position_embeddings 1024 .*position_embeddings.weight"),
    ({"num_hidden_layers": 3}, "config.json: num_hidden_layers is 3, but .*model.safetensors holds layers 0 to 1"),
    ({"num_hidden_layers": 1}, "num_hidden_layers is 1, but .* holds layers 0 to 1"),
    ({"vocab_size": "big"}, "config.json: vocab_size must be a positive integer"),
])
def test_config_sizes_must_match_the_weights(tmp_path: Path, backend: str, change: dict, match: str) -> None:
    folder = _copy(tmp_path, "cfg")
    _config(folder, **change)
    with pytest.raises(EncoderError, match=match):
        _load(folder, backend)


def test_a_folder_with_pickled_weights_only_is_refused_never_unpickled(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from hybridret.encoders._safetensors import read_safetensors

    folder = _copy(tmp_path, "pickled")
    state = {k: torch.from_numpy(v.copy()) for k, v in read_safetensors(folder / "model.safetensors").items()}
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(EncoderError, match="pickled only \\(pytorch_model.bin\\); hybridret never unpickles"):
        _load(folder, "torch")
    with pytest.raises(EncoderError, match="pickled only"):
        _load(folder, "auto")  # auto picks torch for a folder the numpy backend cannot read
    with pytest.raises(ConfigError, match="pickled ones are never read"):
        _load(folder, "numpy")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tokenizer_without_a_usable_vocabulary_is_refused(tmp_path: Path, backend: str) -> None:
    folder = _copy(tmp_path, "novocab")
    tok = json.loads((folder / "tokenizer.json").read_text())
    specials = sorted((k for k in tok["model"]["vocab"] if k.startswith("[")), key=tok["model"]["vocab"].get)
    tok["model"]["vocab"] = {k: i for i, k in enumerate(specials)}
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(EncoderError, match="reads 17 English words as the unknown token only: its vocabulary is "
                                           "missing or unusable"):
        _load(folder, backend)


def test_a_folder_without_tokenizer_files_is_refused_on_torch(tmp_path: Path) -> None:
    folder = _copy(tmp_path, "notok")
    for f in folder.iterdir():
        if f.name.startswith("tokenizer"):
            f.unlink()
    with pytest.raises((EncoderError, ConfigError)):
        _load(folder, "torch")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_intact_copy_loads_on_both_backends(tmp_path: Path, backend: str) -> None:
    folder = _copy(tmp_path, "ok")
    out = SpladeEncoder(str(folder), backend=backend).encode_documents(["honey bees make honey"]).sparse
    assert out.nnz > 0
