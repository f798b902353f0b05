"""Plain files on disk: growable ``.npy`` arrays, atomic JSON writes, memory-mapped loads."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IndexFormatError

__all__ = ["NpyAppender", "atomic_write_json", "atomic_write_npy", "fsync_dir", "fsync_file", "load_npy", "read_json"]

_HEADER_LEN = 128  # bytes reserved for the .npy header: room for any 2-D shape we write


class NpyAppender:
    """Write a C-ordered ``.npy`` array whose first dimension grows as rows are appended.

    The file is valid ``.npy`` only after :meth:`close`, which writes the final shape into the
    header slot reserved at the start; readers memory-map it with :func:`load_npy`.
    """

    def __init__(self, path: str | Path, dtype: Any, tail_shape: tuple[int, ...] = ()) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.tail_shape = tuple(int(x) for x in tail_shape)
        self.rows = 0
        self._fh = open(self.path, "wb")
        self._fh.write(b"\0" * _HEADER_LEN)

    def append(self, block: np.ndarray) -> None:
        arr = np.ascontiguousarray(block, dtype=self.dtype)
        if arr.shape[1:] != self.tail_shape:
            raise ValueError(f"{self.path.name}: expected rows of shape {self.tail_shape}, got {arr.shape[1:]}")
        self._fh.write(arr.tobytes())
        self.rows += int(arr.shape[0])

    def close(self) -> None:
        if self._fh.closed:
            return
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                  "shape": (self.rows, *self.tail_shape)}
        text = repr(header).encode("latin1")
        body_len = _HEADER_LEN - 10  # magic (6) + version (2) + header length (2)
        if len(text) + 1 > body_len:
            raise ValueError(f"{self.path.name}: shape too large for the reserved header")
        text = text + b" " * (body_len - len(text) - 1) + b"\n"
        self._fh.seek(0)
        self._fh.write(b"\x93NUMPY\x01\x00" + body_len.to_bytes(2, "little") + text)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()

    def abort(self) -> None:
        try:
            self._fh.close()
        except OSError:  # unflushed data on a full disk: discarded with the file
            pass
        self.path.unlink(missing_ok=True)


def load_npy(path: str | Path, *, mmap: bool = True) -> np.ndarray:
    """Load an ``.npy`` file, memory-mapped by default; a clear error when it is missing or damaged."""
    path = Path(path)
    if not path.is_file():
        raise IndexFormatError(f"missing index file {path}")
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise IndexFormatError(f"corrupt index file {path}: {exc}") from exc


def _fsync(path: str | Path, *, quiet: bool) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        if not quiet:
            raise
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Flush a directory entry (so a rename inside it survives a crash); a no-op where unsupported."""
    _fsync(path, quiet=True)


def fsync_file(path: str | Path) -> None:
    """Flush a file's data to disk (an error flushing it is raised: the write is not durable)."""
    _fsync(path, quiet=False)


def _atomic_write(path: Path, write: Any, mode: str) -> None:
    """Write through ``write(fh)`` to a temporary sibling, fsync it, then rename over ``path``
    (atomic on POSIX) and flush the directory entry."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: str | Path, data: Any) -> None:
    """Write JSON atomically (a temporary sibling, fsync, rename)."""
    def write(fh: Any) -> None:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")

    _atomic_write(Path(path), write, "w")


def atomic_write_npy(path: str | Path, array: np.ndarray) -> None:
    """Write an ``.npy`` file atomically (a temporary sibling, fsync, rename)."""
    _atomic_write(Path(path), lambda fh: np.save(fh, np.asarray(array), allow_pickle=False), "wb")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise IndexFormatError(f"missing index file {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"corrupt JSON in {path}: {exc}") from exc
