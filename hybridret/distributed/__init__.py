"""Scale-out on Ray (optional extra ``hybridret[ray]``): sharded indexes, scatter-gather search
equal to one index, routed writes, and a distributed build. See docs/cluster.md.

Nothing here imports Ray at ``import hybridret`` time: Ray is imported when a sharded searcher is
opened or a distributed build starts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ShardLayout", "ShardUnavailableError", "ShardedSearcher", "build_sharded", "read_layout", "shard_of"]

_WHERE = {"ShardLayout": "layout", "read_layout": "layout", "shard_of": "layout", "ShardUnavailableError": "shard",
          "ShardedSearcher": "searcher", "build_sharded": "build"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        from importlib import import_module

        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
