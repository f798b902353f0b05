"""Split an existing index into shards without re-encoding anything (its stored vectors are copied).

Useful to scale out an index that was built on one machine, and to make sharded copies of a
collection for tests and benchmarks. Runs in this process (no Ray needed); each shard is written by
an ordinary :class:`~hybridret.indexer.IndexWriter` in ``build`` mode, fed the stored encodings.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..data import Document
from ..errors import ConfigError, IndexExistsError
from ..index.snapshot import open_snapshot
from .encoding import PrecomputedEncoder
from .layout import LAYOUT_FILE, ShardLayout, shard_name, shard_of, write_layout

__all__ = ["reshard"]


def reshard(source: str | Path, output: str | Path, shards: int, *, ids: Iterable[str] | None = None,
            settings: dict[str, Any] | None = None, overwrite: bool = False) -> ShardLayout:
    """Write the live documents of the index at ``source`` (or only ``ids``, in that order) as a
    sharded index with ``shards`` shards at ``output``; the index settings are kept unless
    ``settings`` overrides some."""
    output = Path(output)
    if (output / LAYOUT_FILE).exists() and not overwrite:
        raise IndexExistsError(f"{output} already holds a sharded index; pass overwrite=True")
    snap = open_snapshot(source)
    m = snap.manifest
    from ..indexer import DEFAULT_SETTINGS, IndexWriter, Layout, stored_values

    layout = Layout.of(m)
    shape = {"config": m.get("encoder"), "representations": layout.reps}
    if shape["config"] is None:
        raise ConfigError(f"{source} records no encoder; it cannot be resharded")
    wanted = list(ids) if ids is not None else snap.live_ids()
    groups: list[list[Document]] = [[] for _ in range(shards)]
    tables: list[dict[str, Any]] = [{} for _ in range(shards)]
    for doc_id in wanted:
        row = snap.row_of(doc_id)
        if row is None:
            raise ConfigError(f"{doc_id!r} is not in {source}")
        title, text, meta = snap.get(row)
        seg, local = snap.locate(np.array([row]))
        segment, r = snap.segments[int(seg[0])], int(local[0])
        doc = Document(id=doc_id, text=text, title=title, metadata=meta)
        s = shard_of(doc_id, shards)
        groups[s].append(doc)
        tables[s][doc.full_text] = stored_values(segment, np.array([r]), layout, required=True)
    empty = [shard_name(i) for i, g in enumerate(groups) if not g]
    if empty:
        raise ConfigError(f"{len(wanted)} documents leave {', '.join(empty)} empty; use fewer shards")
    base = {k: v for k, v in (m.get("settings") or {}).items() if k in DEFAULT_SETTINGS}
    base.update(settings or {})
    for i in range(shards):
        enc = PrecomputedEncoder(shape, tables[i], what=shard_name(i))
        with IndexWriter(output / shard_name(i), encoder=enc, settings=base) as writer:
            writer.write(groups[i], mode="build", show_progress=False)
    return write_layout(output, shards, shape["config"], fusion=m.get("fusion"),
                        extra={"resharded_from": str(source), "num_docs": len(wanted)})
