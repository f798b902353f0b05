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


def test_fuzzed_config_sizes_are_accepted_or_an_encoder_error(tmp_path: Path) -> None:
    """Whatever sizes config.json holds, the folder check answers with an EncoderError or nothing."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    from hybridret.encoders._folder import check_model_folder

    folder = _copy(tmp_path, "fuzz")
    base = json.loads((folder / "config.json").read_text())
    value = st.one_of(st.integers(-3, 40_000), st.sampled_from([128, 2, 512, 30522]), st.none(), st.booleans(),
                      st.floats(allow_nan=True), st.text(max_size=3))
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
            "intermediate_size", "embedding_size")

    @hypothesis.settings(max_examples=80, deadline=None)
    @hypothesis.given(st.dictionaries(st.sampled_from(keys), value, max_size=3))
    def prop(change: dict) -> None:
        (folder / "config.json").write_text(json.dumps({**base, **change}))
        try:
            check_model_folder(folder)
        except EncoderError as exc:
            assert "config.json" in str(exc)

    prop()


def test_fuzzed_safetensors_headers_are_an_encoder_error(tmp_path: Path) -> None:
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    from hybridret.encoders._safetensors import read_header

    path = tmp_path / "model.safetensors"
    entry = st.fixed_dictionaries({"dtype": st.sampled_from(["F32", "BF16", "F16", "X9", 3]),
                                   "shape": st.lists(st.integers(-2, 8), max_size=3),
                                   "data_offsets": st.lists(st.integers(-4, 300), min_size=0, max_size=3)})

    @hypothesis.settings(max_examples=80, deadline=None)
    @hypothesis.given(st.dictionaries(st.text(min_size=1, max_size=4), entry, max_size=3), st.integers(0, 256))
    def prop(header: dict, body: int) -> None:
        raw = json.dumps(header).encode()
        path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(body))
        try:
            got = read_header(path)
        except EncoderError as exc:
            assert str(path) in str(exc)
        else:
            assert set(got) == set(header)

    prop()
