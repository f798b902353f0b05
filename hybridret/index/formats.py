"""The built-in part formats, registered with :mod:`hybridret.index.parts` when first needed.

| format | kind | reader | part names it serves |
|---|---|---|---|
| ``hybridret-dense-v1`` | dense | :class:`~.dense.DenseIndex` (FAISS + exact vectors) | ``dense`` |
| ``hybridret-impact-v2`` | sparse | :class:`~.impact_windows.WindowImpactIndex` (8-bit impacts in row windows, exact top-k; the default) | ``sparse`` |
| ``hybridret-impact-v1`` | sparse | :class:`~.impact.ImpactIndex` (impact layers, pruned exact top-k) | ``sparse`` |
| ``hybridret-learned-v1`` | sparse | :class:`~.learned.LearnedIndex` (tf-grid tantivy; ``tfgrid``) | ``sparse`` |
| ``hybridret-bm25-v3`` | text | :class:`~.bm25.BM25Store` (v1 + u8 impacts in row windows, :mod:`.bm25_windows`; the default) | ``bm25`` |
| ``hybridret-bm25-v2`` | text | :class:`~.bm25.BM25Store` (v1 + u8 impacts, :mod:`.bm25_impacts`) | ``bm25`` |
| ``hybridret-bm25-v1`` | text | :class:`~.bm25.BM25Store` (posting arrays, tantivy's analyzer) | ``bm25`` |
| ``hybridret-phrases-v1`` | text | :class:`~.phrases.PhraseIndex` (tantivy with positions over analysed tokens; ``$text`` phrases) | ``phrases`` |
| ``hybridret-sparse-v1`` | sparse | :class:`~.legacy.sparse.SparseIndex` (format 1: bit planes / buckets) | ``sparse`` |
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from .parts import PART_TYPES, TEXT, PartSpec, PartType, register_part_type
from .storage import read_json

__all__ = ["BM25_V1", "BM25_V2", "BM25_V3", "BUILTIN_FORMATS", "DENSE_V1", "IMPACT_V1", "IMPACT_V2", "LEARNED_V1", "PHRASES_V1",
           "SPARSE_V1", "builtin_parts",
           "open_part", "part_type"]

DENSE_V1 = "hybridret-dense-v1"
LEARNED_V1 = "hybridret-learned-v1"
IMPACT_V1 = "hybridret-impact-v1"
IMPACT_V2 = "hybridret-impact-v2"
BM25_V1 = "hybridret-bm25-v1"
BM25_V2 = "hybridret-bm25-v2"
BM25_V3 = "hybridret-bm25-v3"
SPARSE_V1 = "hybridret-sparse-v1"
PHRASES_V1 = "hybridret-phrases-v1"
BUILTIN_FORMATS = frozenset({DENSE_V1, IMPACT_V1, IMPACT_V2, LEARNED_V1, BM25_V1, BM25_V2, BM25_V3, SPARSE_V1, PHRASES_V1})
_HEAP = 256_000_000  # tantivy writer heap of a learned-sparse part


def _dense_create(root: Path, dim: int | None, opts: Mapping[str, Any]) -> Any:
    from .dense import DenseIndex

    from .dense_auto import AUTO_MIN_ROWS

    return DenseIndex.create(root, int(dim or 0), factory=str(opts.get("factory", "Flat")),
                             metric=str(opts.get("metric", "ip")), min_rows=int(opts.get("min_rows", AUTO_MIN_ROWS)))


def _dense_open(root: Path, device: str | None) -> Any:
    from .dense import DenseIndex

    return DenseIndex(root, device=device)


def _learned_create(root: Path, dim: int | None, opts: Mapping[str, Any]) -> Any:
    from .learned import LearnedIndex

    return LearnedIndex.create(root, int(dim or 1), heap_size=_HEAP)


def _learned_open(root: Path, device: str | None) -> Any:
    from .learned import LearnedIndex

    return LearnedIndex(root)


def _impact_create(root: Path, dim: int | None, opts: Mapping[str, Any]) -> Any:
    from .impact import ImpactIndex

    return ImpactIndex.create(root, int(dim or 1))


def _impact_open(root: Path, device: str | None) -> Any:
    from .impact import ImpactIndex

    return ImpactIndex(root)


def _windows_create(root: Path, dim: int | None, opts: Mapping[str, Any]) -> Any:
    from .impact_windows import WindowImpactIndex

    return WindowImpactIndex.create(root, int(dim or 1))


def _windows_open(root: Path, device: str | None) -> Any:
    from .impact_windows import WindowImpactIndex

    return WindowImpactIndex(root)


def _bm25_create(root: Path, dim: int | None, opts: Mapping[str, Any]) -> Any:
    from ._tantivy import bm25_analyzer
    from .bm25 import BM25StoreBuilder

    return BM25StoreBuilder(root, bm25_analyzer())


def _bm25_v2_create(root: Path, dim: int | None, opts: Mapping[str, Any]) -> Any:
    from ._tantivy import bm25_analyzer
    from .bm25 import BM25StoreBuilder

    return BM25StoreBuilder(root, bm25_analyzer(), impacts=True, version=2)


def _bm25_v3_create(root: Path, dim: int | None, opts: Mapping[str, Any]) -> Any:
    from ._tantivy import bm25_analyzer
    from .bm25 import BM25StoreBuilder

    return BM25StoreBuilder(root, bm25_analyzer(), impacts=True, version=3)


def _bm25_open(root: Path, device: str | None) -> Any:
    from .bm25 import BM25Store

    return BM25Store(root)


def _phrases_create(root: Path, dim: int | None, opts: Mapping[str, Any]) -> Any:
    from .phrases import PhraseIndexBuilder

    return PhraseIndexBuilder(root)


def _phrases_open(root: Path, device: str | None) -> Any:
    from .phrases import PhraseIndex

    return PhraseIndex(root)


def _v1_create(root: Path, dim: int | None, opts: Mapping[str, Any]) -> Any:
    from .legacy.sparse import SparseIndex

    scheme = str(opts.get("scheme", "planes"))
    slots = {"bits" if scheme == "planes" else "buckets": int(opts.get("bits", 6))}
    return SparseIndex.create(root, int(dim or 1), scheme=scheme, max_weight=float(opts.get("max_weight", 5.0)),
                              bm25=False, **slots)


def _v1_open(root: Path, device: str | None) -> Any:
    from .legacy.sparse import SparseIndex

    return SparseIndex(root)


def _forward_rows(part: Any, rows: np.ndarray) -> Any:
    return part.forward[rows]


def _vector_rows(part: Any, rows: np.ndarray) -> Any:
    return np.asarray(part.vectors[rows], dtype=np.float32)


for _pt in (PartType(DENSE_V1, "dense", _dense_create, _dense_open, _vector_rows),
            PartType(IMPACT_V2, "sparse", _windows_create, _windows_open, _forward_rows),
            PartType(IMPACT_V1, "sparse", _impact_create, _impact_open, _forward_rows),
            PartType(LEARNED_V1, "sparse", _learned_create, _learned_open, _forward_rows),
            PartType(BM25_V1, "text", _bm25_create, _bm25_open),
            PartType(BM25_V3, "text", _bm25_v3_create, _bm25_open),
            PartType(BM25_V2, "text", _bm25_v2_create, _bm25_open),
            PartType(PHRASES_V1, TEXT, _phrases_create, _phrases_open),
            PartType(SPARSE_V1, "sparse", _v1_create, _v1_open, _forward_rows)):
    register_part_type(_pt, replace=True)


def builtin_parts(settings: Mapping[str, Any], reps: Mapping[str, Mapping[str, Any]]) -> dict[str, PartSpec]:
    """The parts an index with these settings writes for the encoder's heads: ``dense`` (FAISS
    factory and metric from the settings; ``"auto"``, the default, chooses per segment by size:
    :mod:`.dense_auto`), ``sparse`` (learned terms: 8-bit impacts in row windows by
    default, :mod:`.impact_windows`; ``sparse_scheme="tfgrid"`` the tantivy tf grid, or a format-1 scheme), ``bm25`` (when ``settings["bm25"]``)
    and ``phrases`` (:mod:`.phrases`, for ``$text`` phrase filters: when ``settings["phrase_index"]``, the default,
    and the texts are stored, so that merges can rebuild it)."""
    parts: dict[str, PartSpec] = {}
    if "dense" in reps:
        from .dense_auto import AUTO_MIN_ROWS, is_auto

        factory = str(settings.get("faiss_factory", "auto"))
        opts: dict[str, Any] = {"factory": factory, "metric": str(settings.get("faiss_metric", "ip"))}
        if is_auto(factory):
            rows = settings.get("faiss_auto_min_rows")
            opts["min_rows"] = int(AUTO_MIN_ROWS if rows is None else rows)  # 0 is a value: compress every size
        parts["dense"] = PartSpec(DENSE_V1, "dense", opts)
    if "sparse" in reps:
        scheme = str(settings.get("sparse_scheme", "impact"))
        if scheme == "impact":
            parts["sparse"] = PartSpec(IMPACT_V2, "sparse")
        elif scheme == "tfgrid":
            parts["sparse"] = PartSpec(LEARNED_V1, "sparse")
        else:
            parts["sparse"] = PartSpec(SPARSE_V1, "sparse", {
                "scheme": scheme, "bits": int(settings.get("sparse_bits", 6)),
                "max_weight": float(settings.get("sparse_max_weight", 5.0))})
    if settings.get("bm25", True):
        parts["bm25"] = PartSpec(BM25_V3, TEXT)
    if settings.get("phrase_index", True) and settings.get("store_text", True):
        parts["phrases"] = PartSpec(PHRASES_V1, TEXT)  # $text phrase filters (merges rebuild it from the texts)
    return parts


def part_type(fmt: str, where: Path | str | None = None) -> PartType:
    pt = PART_TYPES.get(fmt)
    if pt is None:
        at = f"{where}: " if where is not None else ""
        known = ", ".join(sorted(PART_TYPES))
        raise IndexFormatError(f"{at}part format {fmt!r} is not known to this hybridret (known: {known}); if a "
                               "retriever you registered wrote it, register it before opening the index")
    return pt


def open_part(root: Path, expected: str | None = None, *, device: str | None = None) -> Any:
    """Open the part folder ``root`` with the reader its ``meta.json`` names (checked against
    ``expected``, the format the segment lists)."""
    meta_file = root / "meta.json"
    if not meta_file.is_file():
        raise IndexFormatError(f"missing index file {meta_file}")
    meta = read_json(meta_file)
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if not isinstance(fmt, str):
        raise IndexFormatError(f"{meta_file} names no part format")
    if expected is not None and fmt != expected:
        raise IndexFormatError(f"{meta_file}: format {fmt!r}, the segment lists {expected!r}")
    return part_type(fmt, root).open(root, device)
