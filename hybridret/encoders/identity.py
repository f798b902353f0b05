"""Which weights an encoder config stands for.

An index manifest stores :meth:`Encoder.config`, and :func:`encoder_from_config` rebuilds the
encoder from it, possibly in another working directory, on another day, after a model folder was
retrained in place. So a config records a *location* that resolves the same from anywhere (see
:func:`hybridret.models.model_location`) and a *fingerprint* of the weights: SHA-256 over the
config and tokenizer files, and over the size, first and last MiB of each weight file. Cheap to
compute even for gigabyte checkpoints, and it changes when the weights are rewritten.
"""

from __future__ import annotations

import hashlib
import logging
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from ..errors import EncoderError
from ..models import is_hub_id, model_location, packaged_model, resolve_model

__all__ = ["FINGERPRINT_KEYS", "SOFT_KEYS", "backend_differences", "check_fingerprint", "compare_configs",
           "fingerprint_folder", "model_fingerprint"]

logger = logging.getLogger(__name__)

# config keys holding fingerprints, next to the model key each one belongs to
FINGERPRINT_KEYS = {"fingerprint": "model", "query_fingerprint": "query_model"}

# what the tokenizer and model loaders read; READMEs, ONNX exports and the like do not count
MODEL_FILES = (
    "config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "*.model", "*.safetensors", "*.safetensors.index.json",
    "pytorch_model*.bin", "pytorch_model.bin.index.json", "dense_projection.pt",
)
# settings that change how the same weights are run, not what they compute, with their defaults: a
# difference is logged as a warning, not reported as a mismatch (see compare_configs)
SOFT_KEYS = {"backend": "float32"}  # no "backend" key: a float32 backend (auto, numpy or torch), the same vectors
TOWER_DIRS = ("query", "document")  # separate-tower training output keeps one model in each
EDGE = 1 << 20  # bytes hashed at each end of a large file


def _model_files(root: Path) -> list[Path]:
    folders = [root] + [root / t for t in TOWER_DIRS if (root / t).is_dir()]
    return [f for d in folders for f in sorted(d.iterdir())
            if f.is_file() and any(fnmatch(f.name, pattern) for pattern in MODEL_FILES)]


def fingerprint_folder(root: str | Path) -> str:
    """``"sha256:<hex>"`` over the model files of a folder (and of its ``query/`` and ``document/``
    sub-folders): names, sizes, whole small files, first and last MiB of large ones.

    Raises:
        EncoderError: the folder holds no model files.
    """
    root = Path(root)
    files = _model_files(root)
    if not files:
        raise EncoderError(f"{root}: no model files (config.json, weights, tokenizer) to fingerprint")
    digest = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        digest.update(f"{f.relative_to(root).as_posix()}\0{size}\0".encode())
        with f.open("rb") as fh:
            if size <= 2 * EDGE:
                digest.update(fh.read())
            else:
                digest.update(fh.read(EDGE))
                fh.seek(size - EDGE)
                digest.update(fh.read(EDGE))
    return "sha256:" + digest.hexdigest()


def _hub_folder(repo_id: str) -> Path | None:
    """The local snapshot of a Hub model, if its config.json is in the Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id
        return None
    return Path(found).parent if isinstance(found, str) else None


def model_fingerprint(name: str | Path) -> str | None:
    """The fingerprint of the weights ``name`` resolves to now: a packaged alias, a local folder, or
    a Hub id already in the local cache. ``None`` for a Hub model not downloaded yet."""
    path = Path(str(name)).expanduser()
    if packaged_model(str(name)) is None and path.is_dir():
        return fingerprint_folder(path)  # also a separate-tower folder, which has no config.json itself
    resolved = resolve_model(name)
    folder = _hub_folder(resolved) if is_hub_id(resolved) else Path(resolved)
    return fingerprint_folder(folder) if folder is not None else None


def check_fingerprint(model: str, stored: str | None, found: str | None) -> None:
    """Raise :class:`EncoderError` when the weights of ``model`` are not those fingerprinted as
    ``stored``; a config without a fingerprint (older hybridret) is accepted with an info log."""
    if stored is None:
        logger.info("the encoder config for %r has no weights fingerprint (written by an older hybridret); "
                    "the weights are not verified", model)
        return
    if found is None:
        logger.warning("cannot fingerprint %r (a Hub model not in the local cache); the weights are not verified",
                       model)
        return
    if found != stored:
        raise EncoderError(
            f"model {model!r} ({model_location(model)}) is not the model this config was made with: stored "
            f"fingerprint {stored}, found {found}. The weights changed, or the name now means another folder; "
            "rebuild the index, or pass verify=False to use these weights anyway"
        )


def _model_differences(stored: dict[str, Any], given: dict[str, Any], prefix: str) -> list[str]:
    out = []
    for fp_key, model_key in FINGERPRINT_KEYS.items():
        s_model, g_model = stored.get(model_key), given.get(model_key)
        s_fp, g_fp = stored.get(fp_key), given.get(fp_key)
        if s_fp and g_fp:
            if s_fp != g_fp:  # the same weights under two names or paths are the same model
                out.append(f"{prefix}{model_key}: different weights: {s_model!r} (fingerprint {s_fp}) stored, "
                           f"{g_model!r} (fingerprint {g_fp}) given")
            continue
        same = s_model == g_model or (s_model is not None and g_model is not None
                                      and model_location(s_model) == model_location(g_model))
        if not same:
            out.append(f"{prefix}{model_key}: {s_model!r} stored, {g_model!r} given")
    return out


def compare_configs(stored: dict[str, Any] | None, given: dict[str, Any] | None, *, prefix: str = "") -> list[str]:
    """Human-readable differences between two :meth:`Encoder.config` dicts (``[]``: same encoder).

    Not differences: a packaged alias against its canonical name, a relative against an absolute path
    to the same folder, two locations whose fingerprints agree, a fingerprint missing on one side (an
    older config), and a missing setting against ``None``.

    Nor is another *backend* (e.g. documents encoded with ``"torch-int8"``, queries with ``"torch"``):
    the same weights give vectors that agree to a measured tolerance (dense cosine >= 0.99, the same
    heavy sparse terms), so such vectors can still be compared, at a small quality cost. That is logged
    as a warning naming both backends (see :func:`backend_differences`), so that an index is not
    refused, nor rebuilt, over it.
    """
    for diff in backend_differences(stored, given, prefix=prefix):
        logger.warning("encoder backends differ (%s): the vectors are close but not identical; expect a small "
                       "quality cost (rebuild the index, or load it without encoder=, to use one backend)", diff)
    return _compare(stored, given, prefix)


def backend_differences(stored: dict[str, Any] | None, given: dict[str, Any] | None, *, prefix: str = "") -> list[str]:
    """The :data:`SOFT_KEYS` settings (the backend) on which two encoder configs differ."""
    if not isinstance(stored, dict) or not isinstance(given, dict) or stored.get("type") != given.get("type"):
        return []
    if stored.get("type") == "paired":
        return [d for part in ("dense", "sparse")
                for d in backend_differences(stored.get(part), given.get(part), prefix=f"{prefix}{part} ")]
    return [f"{prefix}{key}: {stored.get(key, default)!r} stored, {given.get(key, default)!r} given"
            for key, default in SOFT_KEYS.items() if stored.get(key, default) != given.get(key, default)]


def _compare(stored: dict[str, Any] | None, given: dict[str, Any] | None, prefix: str) -> list[str]:
    if stored is None or given is None:
        return [] if stored is given else [f"{prefix}encoder: {stored!r} stored, {given!r} given"]
    if stored.get("type") != given.get("type"):
        return [f"{prefix}encoder type: {stored.get('type')!r} stored, {given.get('type')!r} given"]
    if stored.get("type") == "paired":
        return [d for part in ("dense", "sparse")
                for d in _compare(stored.get(part), given.get(part), prefix=f"{prefix}{part} ")]
    out = _model_differences(stored, given, prefix)
    skip = {"type", *FINGERPRINT_KEYS, *FINGERPRINT_KEYS.values(), *SOFT_KEYS}
    for key in sorted((set(stored) | set(given)) - skip):
        if stored.get(key) != given.get(key):
            out.append(f"{prefix}{key}: {stored.get(key)!r} stored, {given.get(key)!r} given")
    return out
