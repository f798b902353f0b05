"""Document ids and texts: ``docids.txt`` (one id per line, row order) and a memory-mapped text store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import IndexFormatError
from .storage import NpyAppender, load_npy

__all__ = ["DocStore", "DocStoreWriter"]


class DocStoreWriter:
    """Appends ``(id, title, text)`` rows. Texts are JSON ``[title, text]`` records in ``texts.bin``,
    located by ``texts.offsets.npy`` (``n + 1`` byte offsets)."""

    def __init__(self, root: str | Path, *, store_text: bool = True) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.ids = open(self.root / "docids.txt", "w", encoding="utf-8", newline="\n")
        self.store_text = store_text
        if store_text:
            self.texts = open(self.root / "texts.bin", "wb")
            self.offsets = NpyAppender(self.root / "texts.offsets.npy", np.int64)
            self.offsets.append(np.zeros(1, dtype=np.int64))
            self.pos = 0
        self.count = 0

    def add(self, ids: list[str], titles: list[str], texts: list[str]) -> None:
        self.ids.write("".join(f"{i}\n" for i in ids))
        if self.store_text:
            ends = []
            for title, text in zip(titles, texts):
                blob = json.dumps([title, text], ensure_ascii=False).encode("utf-8")
                self.texts.write(blob)
                self.pos += len(blob)
                ends.append(self.pos)
            self.offsets.append(np.asarray(ends, dtype=np.int64))
        self.count += len(ids)

    def close(self) -> None:
        for fh in [self.ids] + ([self.texts] if self.store_text else []):
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
        if self.store_text:
            self.offsets.close()

    def abort(self) -> None:
        """Close without flushing anything more (the folder is removed next); never raises."""
        for fh in [self.ids] + ([self.texts] if self.store_text else []):
            try:
                fh.close()
            except OSError:  # buffered data could not be written (disk full): it is discarded anyway
                pass
        if self.store_text:
            self.offsets.abort()


class DocStore:
    """Row <-> external id, and the stored title/text of any row."""

    def __init__(self, root: str | Path, expected: int | None = None) -> None:
        self.root = Path(root)
        path = self.root / "docids.txt"
        if not path.is_file():
            raise IndexFormatError(f"missing index file {path}")
        with open(path, encoding="utf-8") as fh:
            ids = fh.read().split("\n")
        if ids and ids[-1] == "":
            ids.pop()
        self.ids = np.array(ids, dtype=object)
        if expected is not None and len(self.ids) != expected:
            raise IndexFormatError(f"{path} lists {len(self.ids)} ids, the manifest says {expected}")
        self._row: dict[str, int] | None = None
        self.has_text = (self.root / "texts.bin").is_file()
        if self.has_text:
            self.offsets = load_npy(self.root / "texts.offsets.npy")
            if self.offsets.shape[0] != len(self.ids) + 1:
                raise IndexFormatError(f"{self.root}: text offsets do not match the id list")
            size = os.path.getsize(self.root / "texts.bin")
            if size != int(self.offsets[-1]):
                raise IndexFormatError(f"{self.root / 'texts.bin'} has {size} bytes, its offsets need "
                                       f"{int(self.offsets[-1])} (truncated?)")
            self.blob = np.memmap(self.root / "texts.bin", dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self.ids)

    def row_of(self, doc_id: str) -> int:
        """Row number of an external id (``KeyError`` if absent)."""
        if self._row is None:
            self._row = {str(d): i for i, d in enumerate(self.ids)}
        return self._row[doc_id]

    def get(self, row: int) -> tuple[str, str]:
        """``(title, text)`` of a row; empty strings when texts were not stored."""
        if not self.has_text:
            return "", ""
        lo, hi = int(self.offsets[row]), int(self.offsets[row + 1])
        try:
            title, text = json.loads(bytes(self.blob[lo:hi]).decode("utf-8"))
        except (ValueError, UnicodeDecodeError, TypeError) as exc:
            raise IndexFormatError(f"{self.root / 'texts.bin'}: the text of row {row} is damaged ({exc})") from None
        return title, text
