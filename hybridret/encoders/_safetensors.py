"""Read a ``model.safetensors`` file into numpy arrays, without torch (and without pickle).

The format (the safetensors project's documented layout): an 8-byte little-endian header size ``N``,
``N`` bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the tensors' bytes, offsets counted from the end of the header. Every entry is checked (offsets
inside the file, a size that matches the dtype and shape) before any array is made.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..errors import EncoderError

__all__ = ["read_header", "read_safetensors"]

_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_MAX_HEADER = 100 << 20  # the format's own limit on the JSON header
# dtypes only torch reads (hybridret's numpy reader does not): their item sizes, for the header check
_OTHER_SIZES = {"BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as float32: the upper half of a float32."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def read_header(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor's ``(dtype, shape)`` from a safetensors file's header, each entry checked
    against the file's size (a truncated or damaged file is refused) without reading the tensors:
    what both encoder backends verify of a model folder before loading it.

    Raises:
        EncoderError: the file is missing, truncated, or not a valid safetensors file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            total = os.fstat(fh.fileno()).st_size
            first = fh.read(8)
            if len(first) < 8:
                raise EncoderError(f"{path}: not a safetensors file ({total} bytes)")
            size = int.from_bytes(first, "little")
            if size > _MAX_HEADER or 8 + size > total:
                raise EncoderError(f"{path}: not a safetensors file (header of {size} bytes in a {total}-byte file)")
            raw = fh.read(size)
    except OSError as exc:
        raise EncoderError(f"cannot read {path}: {exc}") from exc
    header = _parse_header(path, raw)
    body = total - 8 - size
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, entry in header.items():
        if name != "__metadata__":
            dtype_name, shape, _, _ = _entry(path, name, entry, body, known_only=False)
            out[name] = (dtype_name, tuple(shape))
    return out


def _parse_header(path: Path, raw: bytes) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise EncoderError(f"{path}: unreadable safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise EncoderError(f"{path}: the safetensors header is not a JSON object")
    return header


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file by name: floating tensors as float32 (bfloat16 and float16
    widened), others in their own dtype. Each array is a copy (the file is not kept open).

    Raises:
        EncoderError: the file is missing, truncated, or not a valid safetensors file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EncoderError(f"cannot read {path}: {exc}") from exc
    if len(data) < 8:
        raise EncoderError(f"{path}: not a safetensors file ({len(data)} bytes)")
    size = int.from_bytes(data[:8], "little")
    if size > _MAX_HEADER or 8 + size > len(data):
        raise EncoderError(f"{path}: not a safetensors file (header of {size} bytes in a {len(data)}-byte file)")
    header = _parse_header(path, data[8 : 8 + size])
    body = memoryview(data)[8 + size :]
    out: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _tensor(path, name, entry, body)
    return out


def _whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _entry(path: Path, name: str, entry: object, body: int, *, known_only: bool = True
           ) -> tuple[str, list[int], int, int]:
    """One header entry, checked: ``(dtype, shape, begin, end)`` with the bytes inside the
    ``body`` bytes after the header and of the size the dtype and shape give. ``known_only``:
    refuse a dtype the numpy reader cannot convert (else only an unknown item size is refused)."""
    try:
        dtype_name = entry["dtype"]  # type: ignore[index]
        shape = list(entry["shape"])  # type: ignore[index]
        begin, end = entry["data_offsets"]  # type: ignore[index]
    except (TypeError, KeyError, ValueError) as exc:
        raise EncoderError(f"{path}: tensor {name!r} has a malformed header entry ({exc})") from None
    if not isinstance(dtype_name, str) or not all(_whole(x) for x in (*shape, begin, end)):
        raise EncoderError(f"{path}: tensor {name!r} has a malformed header entry (dtype must be a string, shape and "
                           f"data_offsets whole numbers; got {dtype_name!r}, {shape!r}, {[begin, end]!r})")
    if dtype_name not in _DTYPES and (dtype_name != "BF16" if known_only else dtype_name not in _OTHER_SIZES):
        raise EncoderError(f"{path}: tensor {name!r} has dtype {dtype_name}, which hybridret does not read")
    itemsize = _DTYPES[dtype_name].itemsize if dtype_name in _DTYPES else _OTHER_SIZES[dtype_name]
    count = math.prod(shape)
    if any(d < 0 for d in shape) or not 0 <= begin <= end <= body or end - begin != count * itemsize:
        raise EncoderError(f"{path}: tensor {name!r} ({dtype_name} {shape}) has bytes [{begin}, {end}) that do not "
                           f"fit its shape or the file ({body} data bytes); the file is damaged (truncated?)")
    return dtype_name, shape, begin, end


def _tensor(path: Path, name: str, entry: object, body: memoryview) -> np.ndarray:
    dtype_name, shape, begin, end = _entry(path, name, entry, len(body))
    raw = body[begin:end]
    if dtype_name == "BF16":
        return _bf16_to_f32(np.frombuffer(raw, dtype="<u2")).reshape(shape)
    arr = np.frombuffer(raw, dtype=_DTYPES[dtype_name]).reshape(shape)
    if arr.dtype.kind == "f":
        return arr.astype(np.float32)  # a copy, native byte order
    return arr.astype(arr.dtype.newbyteorder("="))
