"""A sharded index on disk: ``DIR/shards.json`` plus ``DIR/shard-000/`` ... each a normal index.

Every shard is an ordinary hybridret index directory (``HybridRetriever.load`` opens it, ``hybridret
info`` checks it). The top-level manifest records how many shards there are, how documents are
routed to them (a stable hash of the document id: blake2b of its UTF-8 bytes, never Python's
salted ``hash()``), and the encoder every shard was built with, so that a reader can refuse shards
built by different models and encode each query once for all of them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, IndexFormatError, IndexNotFoundError
from ..index.storage import atomic_write_json

__all__ = ["FORMAT", "LAYOUT_FILE", "ROUTING", "ShardLayout", "is_sharded", "read_layout", "shard_name", "shard_of",
           "split_by_shard", "write_layout"]

FORMAT = "hybridret-sharded-v1"
LAYOUT_FILE = "shards.json"
ROUTING = "blake2b-64-mod"  # shard = int.from_bytes(blake2b(id, digest_size=8), "big") % num_shards
MAX_SHARDS = 4096


def shard_name(i: int) -> str:
    return f"shard-{i:03d}"


def shard_of(doc_id: str, num_shards: int) -> int:
    """The shard that owns ``doc_id``: stable across processes, machines and Python versions."""
    if num_shards < 1:
        raise ConfigError(f"the number of shards must be positive, got {num_shards}")
    digest = hashlib.blake2b(str(doc_id).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def split_by_shard(items: Iterable[Any], num_shards: int, key: Any = None) -> list[list[Any]]:
    """``items`` grouped by owning shard (order kept within each group); ``key(item)`` gives the id."""
    out: list[list[Any]] = [[] for _ in range(num_shards)]
    for item in items:
        out[shard_of(key(item) if key is not None else item, num_shards)].append(item)
    return out


@dataclass
class ShardLayout:
    """What ``shards.json`` says."""

    root: Path
    num_shards: int
    encoder: dict[str, Any] | None
    routing: str = ROUTING
    fusion: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def shard_dir(self, i: int) -> Path:
        return self.root / shard_name(i)

    @property
    def names(self) -> list[str]:
        return [shard_name(i) for i in range(self.num_shards)]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "num_shards": self.num_shards, "routing": self.routing,
                "shards": self.names, "encoder": self.encoder, "fusion": self.fusion, **self.extra}


def is_sharded(root: str | Path) -> bool:
    return (Path(root) / LAYOUT_FILE).is_file()


def write_layout(root: str | Path, num_shards: int, encoder: Mapping[str, Any] | None, *,
                 fusion: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None) -> ShardLayout:
    """Write ``DIR/shards.json`` atomically (the shard folders are written by their builders)."""
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or not 1 <= num_shards <= MAX_SHARDS:
        raise ConfigError(f"the number of shards must be an integer in 1..{MAX_SHARDS}, got {num_shards!r}")
    layout = ShardLayout(Path(root), num_shards, dict(encoder) if encoder else None,
                         fusion=dict(fusion) if fusion else None, extra=dict(extra or {}))
    layout.root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(layout.root / LAYOUT_FILE, layout.to_dict())
    return layout


def read_layout(root: str | Path) -> ShardLayout:
    """Read and check ``DIR/shards.json`` (every shard folder must hold an index)."""
    root = Path(root)
    path = root / LAYOUT_FILE
    if not path.is_file():
        raise IndexNotFoundError(f"no sharded index at {root} (no {LAYOUT_FILE})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise IndexFormatError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise IndexFormatError(f"{path}: not a {FORMAT} layout (format {found!r})")
    if data.get("routing") != ROUTING:
        raise IndexFormatError(f"{path}: unknown routing {data.get('routing')!r}; this version routes by {ROUTING}")
    n = data.get("num_shards")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or data.get("shards") != [shard_name(i) for i in range(n)]:
        raise IndexFormatError(f"{path}: inconsistent shard list for num_shards={n!r}")
    known = {"format", "num_shards", "routing", "shards", "encoder", "fusion"}
    layout = ShardLayout(root, n, data.get("encoder"), routing=ROUTING, fusion=data.get("fusion"),
                         extra={k: v for k, v in data.items() if k not in known})
    missing = [name for i, name in enumerate(layout.names) if not (layout.shard_dir(i) / "manifest.json").is_file()]
    if missing:
        raise IndexFormatError(f"{root}: shards without an index: {', '.join(missing)}")
    return layout
