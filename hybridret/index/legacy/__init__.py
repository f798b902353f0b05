"""Readers of older segment layouts, opened as named parts without rewriting anything.

* Format-2 segments (``segment.json`` format ``hybridret-segment-v1``, or none) keep learned terms
  and BM25 together in ``sparse/`` (``meta.json`` format ``hybridret-sparse-v2``): ``sparse/learned/``
  opens as the ``"sparse"`` part, ``sparse/bm25/`` as the ``"bm25"`` part.
* Format-1 sparse folders (``hybridret-sparse-v1``: bit planes or weight buckets in tantivy, BM25 text
  in the same tantivy index) open as the ``"sparse"`` part (:class:`~.sparse.SparseIndex`) and, for
  BM25, their posting store when they have one, else :class:`~.tantivy_bm25.TantivyBM25`.

``hybridret compact --migrate`` rewrites both into the current layout (one folder per part).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import IndexFormatError
from ..storage import read_json

__all__ = ["open_legacy_parts", "upgrade_manifest"]

SPARSE_V1 = "hybridret-sparse-v1"
SPARSE_V2 = "hybridret-sparse-v2"


def open_legacy_parts(root: Path, *, device: str | None = None) -> dict[str, Any]:
    """The named parts of a segment folder written before parts had folders of their own."""
    from ..bm25 import BM25Store
    from ..dense import DenseIndex
    from ..learned import LearnedIndex

    parts: dict[str, Any] = {}
    if (root / "dense").is_dir():
        parts["dense"] = DenseIndex(root / "dense", device=device)
    folder = root / "sparse"
    if not folder.is_dir():
        return parts
    meta = read_json(folder / "meta.json")
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if fmt == SPARSE_V2:
        n = int(meta["num_docs"])
        learned = LearnedIndex(folder / "learned")
        if learned.num_docs != n:
            raise IndexFormatError(f"{folder}/learned holds {learned.num_docs} documents, meta.json says {n}")
        if int(meta.get("vocab_size", 1)) > 1:  # a BM25-only index kept an empty learned part
            parts["sparse"] = learned
        if meta.get("bm25"):
            parts["bm25"] = BM25Store(folder / "bm25")
    elif fmt == SPARSE_V1:
        from .sparse import SparseIndex
        from .tantivy_bm25 import TantivyBM25

        ix = SparseIndex(folder)
        if ix.vocab_size > 1:
            parts["sparse"] = ix
        if meta.get("bm25", True):
            parts["bm25"] = ix.bm25_store if ix.bm25_store is not None else TantivyBM25(ix)
    else:
        raise IndexFormatError(f"{folder}: unsupported sparse index format {fmt!r}")
    return parts


def upgrade_manifest(manifest: dict[str, Any], root: Path | None = None) -> dict[str, Any]:
    """A format-1/2 manifest with the ``representations`` and ``parts`` tables of format 3, as its
    ``shape`` and ``settings`` imply (``shape`` is read from the first segment's folders where a
    format-1 manifest has none). Nothing is written."""
    from ..formats import builtin_parts

    out = dict(manifest)
    shape = dict(manifest.get("shape") or {})
    if not shape and root is not None and manifest.get("segments"):
        seg = root / manifest["segments"][0]["name"]
        dense = read_json(seg / "dense" / "meta.json") if (seg / "dense" / "meta.json").is_file() else {}
        sparse = read_json(seg / "sparse" / "meta.json") if (seg / "sparse" / "meta.json").is_file() else {}
        vocab = int(sparse.get("vocab_size", 0) or 0)
        shape = {"dense_dim": dense.get("dim"), "vocab_size": vocab if vocab > 1 else None}
    reps: dict[str, dict[str, Any]] = {}
    if shape.get("dense_dim"):
        reps["dense"] = {"kind": "dense", "dim": int(shape["dense_dim"])}
    if shape.get("vocab_size"):
        reps["sparse"] = {"kind": "sparse", "dim": int(shape["vocab_size"])}
    out["representations"] = reps
    # their segments have no phrases part (it came later: a compaction adds it, see IndexWriter._layout)
    settings = {**(manifest.get("settings") or {}), "phrase_index": False}
    out["parts"] = {name: spec.to_dict() for name, spec in builtin_parts(settings, reps).items()}
    out.pop("shape", None)
    return out
