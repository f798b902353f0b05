"""What both encoder backends check of a model folder before anything is encoded.

The numpy backend reads a checkpoint itself and so checks everything it reads; the torch backend
hands the folder to transformers, which unpickles ``pytorch_model.bin`` when there are no
safetensors, initialises layers the weights lack at random (a warning, not an error), and reports a
truncated file or a size mismatch as an internal error. :func:`check_model_folder` applies the same
checks whichever backend runs, from ``config.json`` and the safetensors headers only (no tensor is
read): weights present and in safetensors (a folder holding only pickled weights is refused, never
unpickled), every header entry inside its file, and the sizes ``config.json`` gives equal to the
weights' shapes (embeddings, layer count). :func:`check_tokenizer` refuses a tokenizer that reads
every word as the same token (a folder without a usable vocabulary), which would otherwise build an
index in which nothing can be told apart.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import EncoderError
from ._safetensors import read_header

__all__ = ["PROBE", "check_model_folder", "check_tokenizer", "weight_shapes"]

WEIGHTS_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
# checkpoint files that hold pickles (loading one can run code); hybridret reads none of them
_PICKLED = re.compile(r"^(pytorch_model(-[0-9]+-of-[0-9]+)?\.bin|pytorch_model\.bin\.index\.json|"
                      r"model\.(pt|pth|ckpt)|.*\.ckpt)$")
_LAYER = re.compile(r"(?:^|\.)layers?\.([0-9]+)\.")
PROBE = "the quick brown fox jumps over the lazy dog while honey bees make honey in the hive"
"""An English sentence a usable tokenizer reads as several distinct tokens."""


def weight_shapes(folder: Path) -> tuple[str, dict[str, tuple[int, ...]]]:
    """``(file name, {tensor: shape})`` of the folder's safetensors weights (a sharded checkpoint:
    every shard its index names), each header checked against its file's size.

    Raises:
        EncoderError: no safetensors weights (only pickled ones are named as such), a damaged
            file, or a shard index naming a file outside the folder or missing.
    """
    if (folder / WEIGHTS_FILE).is_file():
        return WEIGHTS_FILE, {k: v[1] for k, v in read_header(folder / WEIGHTS_FILE).items()}
    if (folder / SHARD_INDEX).is_file():
        try:
            index = json.loads((folder / SHARD_INDEX).read_text(encoding="utf-8"))
            files = sorted(set(index["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EncoderError(f"{folder / SHARD_INDEX}: not a shard index ({exc})") from None
        shapes: dict[str, tuple[int, ...]] = {}
        for name in files:
            if not isinstance(name, str) or Path(name).name != name:
                raise EncoderError(f"{folder / SHARD_INDEX}: names {name!r}, not a file of the folder")
            if not (folder / name).is_file():
                raise EncoderError(f"{folder / SHARD_INDEX}: names {name}, which is missing")
            shapes.update({k: v[1] for k, v in read_header(folder / name).items()})
        return SHARD_INDEX, shapes
    pickled = sorted(f.name for f in folder.iterdir() if _PICKLED.match(f.name))
    if pickled:
        raise EncoderError(f"{folder}: its weights are pickled only ({', '.join(pickled)}); hybridret never unpickles a "
                           f"model file (loading a pickle can run code): save the model as {WEIGHTS_FILE} "
                           "(model.save_pretrained(folder, safe_serialization=True))")
    raise EncoderError(f"{folder}: no model weights ({WEIGHTS_FILE} or {SHARD_INDEX})")


def _read_config(folder: Path) -> dict[str, Any] | None:
    path = folder / "config.json"
    if not path.is_file():
        return None  # the loaders say so, as before
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EncoderError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise EncoderError(f"{path} is not a JSON object")
    return raw


def _size(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_model_folder(path: str | Path) -> None:
    """Check the model folder ``path`` as both backends must before loading it (a Hub id or
    anything that is not a local folder is left to the loader): the weights (:func:`weight_shapes`)
    and, for the sizes ``config.json`` gives, that the weights have them: the word and position
    embeddings ``(vocab_size, hidden_size)`` / ``(max_position_embeddings, hidden_size)`` and
    ``num_hidden_layers`` layers. A BERT config's sizes must be positive integers (the numpy
    backend's rule, :class:`~hybridret.encoders._numpy_bert.BertConfig`).

    Raises:
        EncoderError: naming the file and the field.
    """
    folder = Path(path)
    if not folder.is_dir():
        return
    config = _read_config(folder)
    if config is None:
        return
    where = folder / "config.json"
    if config.get("model_type") == "bert":
        from ._numpy_bert import BertConfig

        BertConfig.from_dict(config, str(where))
    source, shapes = weight_shapes(folder)
    hidden = _size(config, "embedding_size") or _size(config, "hidden_size")  # ALBERT's embeddings are narrower
    for suffix, rows_key in (("embeddings.word_embeddings.weight", "vocab_size"),
                             ("embeddings.position_embeddings.weight", "max_position_embeddings")):
        rows = _size(config, rows_key)
        for name, shape in shapes.items():
            if not (name == suffix or name.endswith("." + suffix)):
                continue
            want = (rows if rows is not None else shape[0], hidden if hidden is not None else shape[-1])
            if len(shape) != 2 or shape != want:
                raise EncoderError(f"{where}: {rows_key} {rows} and a width of {hidden} imply {name} of shape "
                                   f"{want}, but {folder / source} holds {shape}: the config does not belong to these "
                                   "weights")
    layers = _size(config, "num_hidden_layers")
    found = {int(m.group(1)) for name in shapes for m in [_LAYER.search(name)] if m}
    if layers is not None and found and found != set(range(layers)):
        raise EncoderError(f"{where}: num_hidden_layers is {layers}, but {folder / source} holds layers "
                           f"{_span(found)}: the missing ones would be initialised at random (or the extra ones "
                           "ignored)")


def _span(found: set[int]) -> str:
    ordered = sorted(found)
    return f"0 to {ordered[-1]}" if ordered == list(range(len(ordered))) else ", ".join(map(str, ordered[:8]))


def check_tokenizer(name: str, path: str | Path, ids: list[int], special: set[int], unk: int | None) -> None:
    """Refuse a tokenizer that read :data:`PROBE` (``ids``, without special tokens) as fewer than
    two distinct tokens, or as unknown tokens only: its vocabulary is missing or unusable, and
    every text would be encoded alike.

    Raises:
        EncoderError: naming the model and its folder.
    """
    known = {i for i in ids if i not in special and i != unk}
    if len(known) < 2:
        got = "nothing" if not ids else "the unknown token only" if not known else "one token only"
        raise EncoderError(f"model {name!r}: the tokenizer in {path} reads {len(PROBE.split())} English words as "
                           f"{got}: its vocabulary is missing or unusable (vocab.txt / tokenizer.json), and every text "
                           "would be encoded alike")
