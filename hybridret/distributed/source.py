"""The sharded :class:`~hybridret.search.source.CandidateSource`: a search plan's candidates from the shard
actors, at one pinned set of commits.

Rows are global keys (``shard << SHARD_SHIFT | row``, :mod:`~hybridret.distributed.merge`). For
a chunk of queries (put in the object store once):

1. ``statistics``: every shard's collection statistics of the retrievers that declare them
   (:attr:`Retriever.global_stats`), summed with ``+``: the whole collection's;
2. ``top``: every shard's top-k of one retriever (scored with those sums), merged into the global
   top-k (ties by document id);
3. ``gather``: every shard's top ``depth`` of each retriever, the union of its own lists and every
   retriever's exact score of that union; the coordinator merges each retriever's lists into the
   global top ``depth``, forms the global union, looks each candidate's exact scores up in its
   owning shard's answer and, for GQR, asks the owners for the dense vectors.

Fusion itself then runs once, here, on the global candidates (:func:`hybridret.search.run.execute`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..fusion.config import FUSION_CHUNK, fusion_method
from ..fusion.scores import Candidates
from ..retrievers import REGISTRY, QueryBatch
from ..search.plan import SearchPlan
from ..search.source import NO_DENSE, CandidateSource
from .merge import global_union, key_of, lookup, merge_lists, shard_list, split_key
from .shard import ShardUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from .pool import ShardPool

__all__ = ["ShardedSource"]


class ShardedSource(CandidateSource):
    """Candidates of one sharded search (one instance per call: it records the shards that did not
    answer in :attr:`missing` and the ids of the keys it returned). ``partial``: a shard that
    cannot answer is left out (and named in :attr:`missing`) instead of failing the search."""

    top_chunk = FUSION_CHUNK  # bounded messages to and from the shards
    snapshot = None

    def __init__(self, pool: ShardPool, commits: list[int], infos: list[dict[str, Any]], *,
                 partial: bool = False) -> None:
        self.pool = pool
        self.commits = list(commits)
        self.infos = infos  # each shard's state at those commits
        self.partial = partial
        self.missing: set[str] = set()
        self._id_of: dict[int, str] = {}
        self._q: QueryBatch | None = None
        self._ref: Any = None

    # -- checks -------------------------------------------------------------------------------------
    def check(self, plan: SearchPlan) -> None:
        for name in plan.retrievers:
            if not REGISTRY[name].shardable:
                raise ConfigError(f"{name} is not available on a sharded index: one round of summed collection "
                                  "statistics cannot make it equal to a single index")
        if plan.diversify is not None and any("dense" not in (i["representations"] or {}) for i in self.infos):
            raise ConfigError(NO_DENSE)
        cfg = plan.fusion
        if cfg is None:
            return
        method = fusion_method(cfg.method)
        if method.vectors and any(i["dense_metrics"] not in ([], ["ip"]) for i in self.infos):
            raise ConfigError(f"{cfg.method} fusion reads the candidates' dense vectors: it needs a dense index with "
                              "inner-product scores (faiss_metric='ip')")
        setting = method.snapshot_setting(cfg)
        if setting is not None:
            raise ConfigError(f"{cfg.method} fusion with {setting} is not available on a sharded index: it reads the "
                              "whole index at once; change that setting or search an unsharded index")

    # -- calls --------------------------------------------------------------------------------------
    def _put(self, q: QueryBatch) -> Any:
        """``q`` in the object store, once per chunk (statistics and search read the same copy)."""
        if self._q is not q:
            import ray

            self._q, self._ref = q, ray.put(q)
        return self._ref

    def _ask(self, method: str, args: list[tuple[Any, ...]]) -> list[tuple[int, Any]]:
        """``(shard, answer)`` of every shard that answered (all, unless ``partial``)."""
        s = self.pool
        got = s.call(method, args, partial=self.partial)
        self.missing.update(s.names[i] for i, a in enumerate(got) if a is None)
        answered = [(i, a) for i, a in enumerate(got) if a is not None]
        if not answered:
            raise ShardUnavailableError(f"no shard of {s.root} answered", list(s.names))
        return answered

    def _remember(self, answers: list[tuple[int, Any]]) -> None:
        """Record the id of every key the shards listed (for :meth:`ids`)."""
        for s, a in answers:
            ids = a["ids"]
            if ids:
                keys = key_of(s, np.fromiter(ids.keys(), np.int64, len(ids)))
                self._id_of.update(zip(keys.tolist(), ids.values()))

    # -- the source ---------------------------------------------------------------------------------
    def statistics(self, q: QueryBatch, names: tuple[str, ...]) -> dict[str, Any]:
        if not names:
            return {}
        total: dict[str, Any] = {}
        for _, got in self._ask("stats", [(c, self._put(q), tuple(names)) for c in self.commits]):
            for name, value in got.items():
                if value is not None:
                    total[name] = value if name not in total else total[name] + value
        return total

    def top(self, name: str, depth: int, q: QueryBatch, *, filt: Filter | None = None,
            stats: Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        ref, st = self._put(q), dict(stats or {})
        answers = self._ask("search", [(c, ref, (name,), depth, filt, st, False) for c in self.commits])
        keys, scores, ids = merge_lists([shard_list(s, a, name) for s, a in answers], depth, len(q))
        ok = keys >= 0
        self._id_of.update(zip(keys[ok].tolist(), ids[ok].tolist()))
        return keys, scores

    def gather(self, names: tuple[str, ...], depth: int, q: QueryBatch, *, filt: Filter | None = None,
               stats: Mapping[str, Any] | None = None, vectors: bool = False) -> Candidates:
        ref, st = self._put(q), dict(stats or {})
        answers = self._ask("search", [(c, ref, tuple(names), depth, filt, st, True) for c in self.commits])
        nq = len(q)
        lists = {name: merge_lists([shard_list(s, a, name) for s, a in answers], depth, nq)[0] for name in names}
        union, listed = global_union(lists)
        all_keys = np.concatenate([key_of(s, a["union"]) for s, a in answers], axis=1)
        exact = {name: lookup(union, all_keys, np.concatenate([a["exact"][name] for _, a in answers], axis=1)
                              ).astype(np.float32) for name in names}
        if "dense" in exact:  # padding scores -inf, as the dense index does
            exact["dense"] = np.where(union >= 0, exact["dense"], -np.inf).astype(np.float32)
        self._remember(answers)
        vecs = self._vectors(union) if vectors else None
        return Candidates(rows=union, exact=exact, listed=listed, vectors=vecs)

    def ids(self, rows: np.ndarray) -> np.ndarray:
        id_of = self._id_of
        return np.vectorize(lambda x: id_of.get(int(x), ""), otypes=[object])(rows) if rows.size else \
            np.full(rows.shape, "", dtype=object)

    # -- grouping and reranking (hybridret.search.run): asked of the owning shards ---------------------
    @property
    def size(self) -> int:
        return int(sum(int(i["num_docs"]) for i in self.infos))

    def _per_owner(self, method: str, keys: np.ndarray, *extra: Any, fill: Any, dtype: Any) -> np.ndarray:
        """``method(commit, local rows, *extra)`` on each shard owning some of ``keys`` (the others'
        rows sent as ``-1``), each answer placed at its own keys."""
        keys = np.asarray(keys, dtype=np.int64)
        out = np.full(keys.shape, fill, dtype=dtype)
        shard, row = split_key(keys)
        owners = sorted(set(shard[shard >= 0].tolist()))
        if not owners:
            return out
        args = [(self.commits[s], np.where(shard == s, row, -1), *extra) for s in owners]
        for s, got in zip(owners, self.pool.call(method, args, owners)):
            mine = shard == s
            out[mine] = np.asarray(got, dtype=dtype)[mine]
        return out

    def group_keys(self, rows: np.ndarray, field: str) -> np.ndarray:
        return self._per_owner("group_keys", rows, field, fill=None, dtype=object)

    def group_members(self, groups: Any, field: str, filt: Filter | None) -> np.ndarray:
        answers = self._ask("group_members", [(c, groups, field, filt) for c in self.commits])
        for s, a in answers:
            ids = a["ids"]
            if ids:
                self._id_of.update(zip(key_of(s, np.fromiter(ids.keys(), np.int64, len(ids))).tolist(), ids.values()))
        return np.concatenate([key_of(s, a["rows"]) for s, a in answers], axis=1)

    def score(self, name: str, rows: np.ndarray, q: QueryBatch, *, stats: Mapping[str, Any] | None = None
              ) -> np.ndarray:
        keys = np.asarray(rows, dtype=np.int64)
        out = np.zeros(keys.shape, dtype=np.float32)
        shard, row = split_key(keys)
        owners = sorted(set(shard[shard >= 0].tolist()))
        ref = self._put(q)
        args = [(self.commits[s], ref, name, np.where(shard == s, row, -1), dict(stats or {})) for s in owners]
        for s, got in zip(owners, self.pool.call("score", args, owners)):
            mine = shard == s
            out[mine] = np.asarray(got, dtype=np.float32)[mine]
        return out

    def texts(self, rows: np.ndarray) -> list[list[str]]:
        got = self._per_owner("texts", rows, fill="", dtype=object)
        return got.tolist()

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if not (rows >= 0).any():  # nothing to ask the shards for
            dim = int(next(i["representations"]["dense"]["dim"] for i in self.infos))
            return np.zeros((*rows.shape, dim), dtype=np.float32)
        return self._vectors(rows)

    def _vectors(self, keys: np.ndarray) -> np.ndarray:
        """The stored dense vectors of global ``keys`` ``(nq, m)`` from their owning shards (zeros at ``-1``)."""
        valid = keys >= 0
        table_keys, inverse = np.unique(keys[valid], return_inverse=True)
        dim = int(next(i["representations"]["dense"]["dim"] for i in self.infos))
        table = np.zeros((len(table_keys), dim), dtype=np.float32)
        shard, row = split_key(table_keys)
        owners = sorted(set(shard.tolist()))
        got = self.pool.call("vectors", [(self.commits[s], row[shard == s]) for s in owners], owners)
        for s, v in zip(owners, got):
            table[shard == s] = v
        out = np.zeros((*keys.shape, dim), dtype=np.float32)
        out[valid] = table[inverse.ravel()]
        return out
