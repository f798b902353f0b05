"""A model folder's ``tokenizer.json`` through the ``tokenizers`` package, without transformers.

:class:`FolderTokenizer` offers what hybridret reads of a transformers fast tokenizer (the runner,
the sparse vocabulary mask, chunking): ``backend_tokenizer``, ``get_vocab()``, ``len()``,
``all_special_ids``, ``pad_token_id``, ``name_or_path`` and a call returning ``{"input_ids": ...}``.
The padding and truncation a ``tokenizer.json`` may carry (all-MiniLM-L6-v2's pads every text to 128
tokens and cuts it there) are switched off, as transformers does: callers pad and cut themselves.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import EncoderError

__all__ = ["FolderTokenizer"]

# the named special tokens of transformers' tokenizer configs
_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_LISTS = ("additional_special_tokens", "extra_special_tokens")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EncoderError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class FolderTokenizer:
    """The tokenizer of a model folder (``tokenizer.json`` + ``tokenizer_config.json`` /
    ``special_tokens_map.json`` for the named special tokens).

    Raises:
        EncoderError: the folder has no readable ``tokenizer.json``.
    """

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer

        self.name_or_path = str(folder)
        path = Path(folder) / "tokenizer.json"
        try:
            self.backend_tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a plain Exception for a malformed file
            raise EncoderError(f"cannot load the tokenizer {path}: {exc}") from exc
        self.backend_tokenizer.no_padding()
        self.backend_tokenizer.no_truncation()
        named: dict[str, str] = {}
        extra: list[str] = []
        for config in (_read_json(Path(folder) / "special_tokens_map.json"), _read_json(Path(folder) / "tokenizer_config.json")):
            for key in _NAMED:
                token = _content(config.get(key))
                if token is not None:
                    named[key] = token
            for key in _LISTS:
                values = config.get(key)
                if isinstance(values, list):
                    extra += [t for t in (_content(v) for v in values) if t is not None]
                elif isinstance(values, dict):
                    extra += [t for t in (_content(v) for v in values.values()) if t is not None]
        tok = self.backend_tokenizer
        special = [tok.token_to_id(t) for t in [*named.values(), *extra]]
        special += [i for i, added in tok.get_added_tokens_decoder().items() if added.special]
        self.all_special_ids: list[int] = sorted({i for i in special if i is not None})
        pad = named.get("pad_token")
        pad_id = tok.token_to_id(pad) if pad is not None else None
        self.pad_token_id: int | None = pad_id
        self.special_tokens = named

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return int(self.backend_tokenizer.get_vocab_size(with_added_tokens=True))

    def __call__(self, texts: str | Sequence[str], *, add_special_tokens: bool = True, truncation: bool = False,
                 max_length: int | None = None, **_: Any) -> dict[str, Any]:
        """``{"input_ids": ids}`` of one text (a list of ids) or of several (a list of lists), cut to
        ``max_length`` tokens (special tokens included) when ``truncation``."""
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        tok = self.backend_tokenizer
        if truncation and max_length is not None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_str(tok.to_str())  # a copy: the shared one's settings stay untouched
            tok.enable_truncation(int(max_length))
        ids = [e.ids for e in tok.encode_batch(batch, add_special_tokens=add_special_tokens)]
        return {"input_ids": ids[0] if single else ids}

    def __repr__(self) -> str:
        return f"FolderTokenizer({self.name_or_path!r})"
