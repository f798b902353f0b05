"""The shard actors of one sharded index, called together: :class:`ShardPool`.

Both sides of a sharded search talk to the shards through one pool: the
:class:`~hybridret.distributed.searcher.ShardedSearcher` (state, writes, hit views) and the
:class:`~hybridret.distributed.source.ShardedSource` of each search (statistics, top lists,
candidates). A call goes to every shard named at once; a shard that cannot answer (its actor died
and was not restarted in time, or the call timed out) is named in a
:class:`~hybridret.distributed.shard.ShardUnavailableError`, or with ``partial`` answers ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .shard import ShardUnavailableError

__all__ = ["ShardPool", "ray_module"]


def ray_module() -> Any:
    """The ``ray`` module, or a :class:`ConfigError` saying how to install it."""
    try:
        import ray
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError("the distributed path needs Ray: pip install 'hybridret[ray]'") from None
    return ray


class ShardPool:
    """One actor per shard (``actors[i]`` serves shard ``names[i]`` of the index at ``root``);
    ``timeout``: seconds a call waits for each shard (``None``: no limit)."""

    def __init__(self, root: Path, names: Sequence[str], actors: list[Any], timeout: float | None) -> None:
        self.root = root
        self.names = list(names)
        self.actors = actors
        self.timeout = timeout

    def __len__(self) -> int:
        return len(self.actors)

    def call(self, method: str, args: Sequence[tuple[Any, ...]], shards: Sequence[int] | None = None, *,
             partial: bool = False) -> list[Any]:
        """Call ``method`` on shards (all by default, ``args[i]`` for the i-th) at once; a shard that
        cannot answer raises :class:`ShardUnavailableError` naming it, or with ``partial`` gives ``None``."""
        ray = ray_module()
        shards = list(range(len(self.actors))) if shards is None else list(shards)
        refs = [getattr(self.actors[s], method).remote(*a) for s, a in zip(shards, args)]
        out: list[Any] = []
        failed: list[str] = []
        errors: list[str] = []
        for s, ref in zip(shards, refs):
            try:
                out.append(ray.get(ref, timeout=self.timeout))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                failed.append(self.names[s])
                errors.append(f"{self.names[s]}: {type(exc).__name__}")
                out.append(None)
        if failed and not partial:
            raise ShardUnavailableError(f"shards of {self.root} did not answer {method}: {', '.join(errors)}", failed)
        return out

    def call_all(self, method: str) -> list[Any]:
        """``method()`` on every shard (no arguments)."""
        return self.call(method, [() for _ in self.actors])

    def call_one(self, s: int, method: str, *args: Any) -> Any:
        """``method(*args)`` on shard ``s`` alone."""
        return self.call(method, [args], [s])[0]

    def close(self) -> None:
        """Stop every actor (they are not restarted)."""
        ray = ray_module()
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already gone
                pass
        self.actors = []
