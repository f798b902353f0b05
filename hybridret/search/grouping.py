"""Document-level grouping: the top-k *groups* of chunks (e.g. the chunks of one document) of a search.

``search(..., group_by="parent_id", group_size=g, k=k)`` returns the ``k`` groups whose best
chunk scores highest, each with its best ``g`` chunks and every leg's exact score of each chunk.

* **Group key**: the value of the metadata field ``group_by`` (a string, number or boolean; the
  JSON types stay distinct, so ``1`` and ``"1"`` are two groups). A document without the field
  (or with ``null``) is a group of its own whose key is its id, so a corpus mixing chunked and
  whole documents groups sensibly (a whole document ``"a"`` and chunks with ``parent_id="a"`` are
  one group). A list or object value is refused (:class:`~hybridret.errors.ConfigError`).
* **Group score**: the score of the group's best chunk (``max``). ``benchmarks/rag.py`` measures
  one alternative (a decayed sum of the top chunks) against it.
* **Single retrievers are exact**: the ``k`` groups (and each group's best ``g`` chunks) equal
  brute-force grouping of the retriever's scores of every live, filter-matching chunk. The
  retriever's top list is deepened (``4 x`` per round, from ``2 x (offset + k)``) until it holds
  ``offset + k`` distinct groups or every document; then every member of those groups is scored
  exactly (so a group's second chunk is found however deep it ranks). Cost: the deepening rounds
  (at most ``log4(N)``; usually one) plus scoring the members of the returned groups.
* **Fused methods** group the fused ranking of the candidate union: the groups are the best
  ``offset + k`` by max fused score among the groups that have a chunk in some leg's top
  ``depth``; the per-leg depth is deepened (``4 x``) until the union holds that many groups or
  every leg is exhausted. A group's chunks are its chunks in the union (each with every leg's
  exact score); a chunk of the group outside every leg's list is not shown (the same bound as the
  ungrouped fused search).

Rows of a snapshot are mapped to group codes once per snapshot and field (one pass over the
metadata columns, cached in :attr:`Snapshot.cache`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from ..index.snapshot import Snapshot

__all__ = ["DEFAULT_GROUP_SIZE", "GroupIndex", "GroupSpec", "check_group", "group_index", "key_value",
           "members_of"]

DEFAULT_GROUP_SIZE = 3
MAX_GROUP_SIZE = 100

Key = tuple[str, Any]  # ("s", str) | ("n", float) | ("b", bool): JSON types stay distinct


@dataclass(frozen=True)
class GroupSpec:
    """Group by metadata field ``field``, keeping each group's best ``size`` chunks."""

    field: str
    size: int = DEFAULT_GROUP_SIZE


def check_group(group_by: Any, group_size: Any) -> GroupSpec | None:
    """The validated grouping of a search (``None``: no grouping)."""
    if group_by is None:
        if group_size is not None:
            raise ConfigError("group_size needs group_by (the metadata field that names each chunk's document)")
        return None
    if not isinstance(group_by, str) or not group_by or group_by.startswith("$"):
        raise ConfigError(f"group_by must be a metadata field name, got {group_by!r}")
    size = DEFAULT_GROUP_SIZE if group_size is None else group_size
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= MAX_GROUP_SIZE:
        raise ConfigError(f"group_size must be an integer from 1 to {MAX_GROUP_SIZE}, got {group_size!r}")
    return GroupSpec(group_by, int(size))


def key_value(key: Key | None) -> Any:
    """The JSON value a group key stands for (integral numbers as ``int``)."""
    if key is None:
        return None
    kind, v = key
    if kind == "n" and float(v).is_integer():
        return int(v)
    return v


def key_values(keys: np.ndarray | None) -> np.ndarray | None:
    """An object array of internal group keys as their JSON values (``None`` stays ``None``)."""
    if keys is None:
        return None
    out = np.full(keys.shape, None, dtype=object)
    for idx, k in np.ndenumerate(keys):
        out[idx] = key_value(k)
    return out


class GroupIndex:
    """The group code of every row of one snapshot for one field, and the rows of every code."""

    def __init__(self, snap: Snapshot, field: str) -> None:
        code_of: dict[Hashable, int] = {}
        codes = np.empty(snap.num_rows, dtype=np.int64)
        for i, seg in enumerate(snap.segments):
            col = seg.columns.get(field)
            ids = seg.docs.ids
            base = int(snap.offsets[i])
            for j in range(seg.num_docs):
                key = _key_of(col, j, ids[j], field)
                codes[base + j] = code_of.setdefault(key, len(code_of))
        self.keys: list[Key] = list(code_of)
        self.key_array = np.empty(len(self.keys), dtype=object)  # code -> key, for vectorised lookups
        for c, key in enumerate(self.keys):
            self.key_array[c] = key
        self.code_of = code_of
        self.codes = codes
        self.rows = np.argsort(codes, kind="stable")
        self.starts = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(code_of)))]).astype(np.int64)

    def members(self, key: Key) -> np.ndarray:
        c = self.code_of.get(key)
        if c is None:
            return np.zeros(0, dtype=np.int64)
        return self.rows[self.starts[c]:self.starts[c + 1]]


def _key_of(col: Any, j: int, doc_id: Any, field: str) -> Key:
    if col is None or not col.present[j] or col.is_null[j]:
        return ("s", str(doc_id))
    if col.is_str[j]:
        return ("s", str(col.str[j]))
    if col.is_num[j]:
        return ("n", float(col.num[j]))
    if col.is_bool[j]:
        return ("b", bool(col.bool[j]))
    what = "a list" if j in col.lists else "an object"
    raise ConfigError(f"document {str(doc_id)!r}: metadata field {field!r} is {what}; group_by needs a string, "
                      "number or boolean")


def group_index(snap: Snapshot, field: str) -> GroupIndex:
    """The snapshot's :class:`GroupIndex` for ``field`` (built once per snapshot)."""
    return snap.cache.get(("grouping.index", field), lambda: GroupIndex(snap, field))


def keys_of(snap: Snapshot, rows: np.ndarray, field: str) -> np.ndarray:
    """The group key of every row ``(nq, m)`` (``None`` at ``-1``), as an object array."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full(rows.shape, None, dtype=object)
    if not rows.size or not snap.num_rows:
        return out
    gi = group_index(snap, field)
    ok = rows >= 0
    out[ok] = gi.key_array[gi.codes[rows[ok]]]
    return out


def members_of(snap: Snapshot, groups: Sequence[Sequence[Key]], field: str, filt: Filter | None) -> np.ndarray:
    """Per query, every live row matching ``filt`` of its ``groups`` ``(nq, M)``, ``-1`` padded."""
    from ..retrievers.base import allowed_mask

    gi = group_index(snap, field) if snap.num_rows else None
    masks: dict[int, np.ndarray | None] = {}
    per_query = []
    for keys in groups:
        rows = np.concatenate([gi.members(k) for k in keys]) if gi is not None and keys else np.zeros(0, np.int64)
        if len(rows):
            seg, local = snap.locate(rows)
            keep = np.ones(len(rows), dtype=bool)
            for s in np.unique(seg).tolist():
                if s not in masks:
                    masks[s] = allowed_mask(snap, s, filt)
                m = masks[s]
                if m is not None:
                    here = seg == s
                    keep[here] = m[local[here]]
            rows = rows[keep]
        per_query.append(rows)
    width = max([len(r) for r in per_query] + [1])
    out = np.full((len(groups), width), -1, dtype=np.int64)
    for i, r in enumerate(per_query):
        out[i, :len(r)] = r
    return out


def first_groups(rows: np.ndarray, scores: np.ndarray, keys: np.ndarray, need: int) -> list[list[Key]]:
    """Per query, the first ``need`` distinct group keys of a ranked list (``rows`` ``-1`` ends it)."""
    out = []
    for i in range(rows.shape[0]):
        seen: dict[Key, None] = {}
        for j in range(rows.shape[1]):
            if rows[i, j] < 0:
                break
            seen.setdefault(keys[i, j], None)
            if len(seen) >= need:
                break
        out.append(list(seen))
    return out


def best_of_groups(groups: Sequence[Sequence[Key]], rows: np.ndarray, scores: np.ndarray,
                   comps: dict[str, np.ndarray], keys: np.ndarray, size: int, *, resort: bool
                   ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Arrange a ranked (``resort=False``) or unranked (``resort=True``: by score, ties by row)
    candidate list into groups: rows / scores / components ``(nq, G * size)`` (each group's best
    ``size`` chunks, ``-1`` / ``-inf`` / ``nan`` padded), group keys ``(nq, G)`` (``None`` padded)
    and group scores ``(nq, G)`` (its best chunk's score, ``-inf`` padded). Groups are ordered by
    group score (ties: the order given); groups with no chunk in the list are dropped."""
    nq = rows.shape[0]
    width = max([len(g) for g in groups] + [1])
    out_rows = np.full((nq, width * size), -1, dtype=np.int64)
    out_scores = np.full((nq, width * size), -np.inf, dtype=np.float32)
    out_comps = {n: np.full((nq, width * size), np.nan, dtype=np.float32) for n in comps}
    gkeys = np.full((nq, width), None, dtype=object)
    gscores = np.full((nq, width), -np.inf, dtype=np.float32)
    for i in range(nq):
        valid = np.flatnonzero((rows[i] >= 0) & np.isfinite(scores[i]))
        if resort:
            valid = valid[np.lexsort((rows[i, valid], -scores[i, valid].astype(np.float64)))]
        slot = {k: n for n, k in enumerate(groups[i])}
        picked: list[list[int]] = [[] for _ in groups[i]]
        for j in valid.tolist():
            g = slot.get(keys[i, j])
            if g is not None and len(picked[g]) < size:
                picked[g].append(j)
        order = sorted((n for n in range(len(picked)) if picked[n]),
                       key=lambda n: (-float(scores[i, picked[n][0]]), n))
        for out_g, n in enumerate(order):
            cols = picked[n]
            a = out_g * size
            out_rows[i, a:a + len(cols)] = rows[i, cols]
            out_scores[i, a:a + len(cols)] = scores[i, cols]
            for name, v in comps.items():
                out_comps[name][i, a:a + len(cols)] = v[i, cols]
            gkeys[i, out_g] = groups[i][n]
            gscores[i, out_g] = scores[i, cols[0]]
    return out_rows, out_scores, out_comps, gkeys, gscores


def next_depth(depth: int, cap: int) -> int:
    """The next depth of the deepening: ``4 x``, at most ``cap`` (the number of documents)."""
    return int(min(max(depth * 4, depth + 1), max(cap, 1)))


def start_depth(need: int, cap: int) -> int:
    return int(min(max(2 * need, need + 10), max(cap, 1)))


def rounds_bound(need: int, cap: int) -> int:
    """At most how many deepening rounds a search takes (for documentation and tests)."""
    return 1 + max(0, math.ceil(math.log(max(cap, 1) / start_depth(need, cap), 4)))
