"""Pure functions of the coordinator: global top lists and candidate sets from per-shard answers.

A document lives in exactly one shard, so a retriever's global top-``d`` is the top-``d`` of the
concatenation of every shard's own top-``d`` (scores are exact and shard-independent: dense and
learned sparse by construction, BM25 with the global statistics). Rows are addressed globally by
``key = shard << SHARD_SHIFT | row``. Ties are broken by document id (a single index breaks them
by row number), so results agree with one index up to the order of equal scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["SHARD_SHIFT", "global_union", "key_of", "lookup", "merge_lists", "shard_list", "split_key"]

SHARD_SHIFT = 40  # up to 2^40 rows per shard, 2^23 shards
_PAD_ID = "\U0010ffff"


def key_of(shard: int, rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64)
    return np.where(rows >= 0, (np.int64(shard) << SHARD_SHIFT) | rows, -1)


def split_key(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(shard, row)`` of global keys (``-1`` keys give ``(-1, -1)``)."""
    keys = np.asarray(keys, dtype=np.int64)
    shard = np.where(keys >= 0, keys >> SHARD_SHIFT, -1)
    row = np.where(keys >= 0, keys & ((np.int64(1) << SHARD_SHIFT) - 1), -1)
    return shard, row


def shard_list(shard: int, answer: Mapping[str, Any], name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One shard's top list of retriever ``name`` from its ``search`` answer, as ``(keys, scores,
    ids)`` for :func:`merge_lists`."""
    rows, scores = answer["lists"][name]
    id_map = answer["ids"]
    ids = np.vectorize(lambda r: id_map.get(int(r), ""), otypes=[object])(rows) if rows.size else \
        np.full(rows.shape, "", dtype=object)
    return key_of(shard, rows), scores, ids


def merge_lists(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], k: int, nq: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge per-shard ``(keys, scores, ids)`` top lists (each ``(nq, k_s)``) into the global top-k:
    best score first, ties by document id. Returns ``(keys, scores, ids)`` of shape ``(nq, k)``."""
    if not parts:
        return (np.full((nq, k), -1, np.int64), np.full((nq, k), -np.inf, np.float32),
                np.full((nq, k), "", dtype=object))
    keys = np.concatenate([p[0] for p in parts], axis=1)
    scores = np.concatenate([p[1] for p in parts], axis=1).astype(np.float32)
    ids = np.concatenate([np.asarray(p[2], dtype=object) for p in parts], axis=1)
    valid = keys >= 0
    scores = np.where(valid, scores, -np.inf)
    sort_ids = np.where(valid, ids, _PAD_ID).astype(str)
    order = np.lexsort((sort_ids, -scores), axis=1)[:, :k]
    keys, scores, ids = (np.take_along_axis(a, order, axis=1) for a in (keys, scores, ids))
    if keys.shape[1] < k:
        pad = k - keys.shape[1]
        keys = np.pad(keys, ((0, 0), (0, pad)), constant_values=-1)
        scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        ids = np.pad(ids, ((0, 0), (0, pad)), constant_values="")
    ids = np.where(keys >= 0, ids, "")
    return keys, scores, ids


def global_union(lists: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The per-query union of several retrievers' global key lists (first-seen order, as
    :func:`hybridret.fusion.candidate_union`) and, per retriever, which union entries it listed."""
    from ..fusion.scores import candidate_union

    union = candidate_union(*lists.values())
    listed = {}
    for name, keys in lists.items():
        mask = np.zeros(union.shape, dtype=bool)
        for i in range(union.shape[0]):
            mask[i] = np.isin(union[i], keys[i][keys[i] >= 0]) & (union[i] >= 0)
        listed[name] = mask
    return union, listed


def lookup(union: np.ndarray, keys: np.ndarray, values: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """``values[i, j]`` of the entry whose ``keys[i, j]`` equals ``union[i, u]``, for every union
    entry (``fill`` where a key is not found): scores gathered from the shards' answers."""
    out = np.full(union.shape, fill, dtype=np.float64)
    for i in range(union.shape[0]):
        k = keys[i]
        ok = k >= 0
        k, v = k[ok], values[i][ok]
        if not len(k):
            continue
        order = np.argsort(k, kind="stable")
        k, v = k[order], v[order]
        u = union[i]
        pos = np.clip(np.searchsorted(k, u), 0, len(k) - 1)
        hit = (u >= 0) & (k[pos] == u)
        out[i] = np.where(hit, v[pos], fill)
    return out
