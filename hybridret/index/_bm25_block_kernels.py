"""numba kernels of the BM25 store's row-block index (``index/bm25_blocks.py``); imported only where
numba is.

Every kernel gives a document the score :meth:`BM25Store.score` gives it: float64, ``0.0`` plus
each query term's ``weight * tf factor`` in query-term order, the tf factor computed from the
posting's tf and the row's fieldnorm id as :meth:`BM25Store.tf_factors` computes it
(``f / (f + norm[fn])``, ``f`` the tf as float64): the same IEEE operations, so the same bits.

* :func:`topk_blockmax`: top-k from the blocks of rows whose quantized upper bound can reach it;
* :func:`score_tf`: given rows, by binary search per row and term.

Compiled with ``cache=True`` (numba's on-disk cache) where a cache location is writable.
"""

from __future__ import annotations

import numpy as np

from ._heap import drain as _drain
from ._heap import jit as _jit
from ._heap import push as _push

__all__ = ["score_tf", "topk_blockmax"]

BUCKETS = 512  # upper-bound buckets: blocks are visited bucket by bucket, the highest first


@_jit
def _find(docs, lo, hi, d):  # pragma: no cover
    """First position in ``[lo, hi)`` whose row is >= ``d`` (``hi`` if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if docs[mid] < d:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_jit
def score_tf(qptr, qterm, qw, indptr, docs, tfs, fn, norm, rows, out):  # pragma: no cover
    """``out[q, c]``: the score of ``rows[q, c]`` (``-1``: left as is)."""
    for q in range(rows.shape[0]):
        for c in range(rows.shape[1]):
            d = rows[q, c]
            if d < 0:
                continue
            s = 0.0
            for j in range(qptr[q], qptr[q + 1]):
                hi = indptr[qterm[j] + 1]
                p = _find(docs, indptr[qterm[j]], hi, d)
                if p < hi and docs[p] == d:
                    f = np.float64(tfs[p])
                    s += qw[j] * (f / (f + norm[fn[d]]))
            out[q, c] = s


@_jit
def _block(g, a, n, qterm, qw, indptr, docs, tfs, fn, norm, bptr, bid, bstart, slot, nb, shift, acc, allowed, use_mask,
           k, hs, hr, size, work):  # pragma: no cover
    """Every posting of the query's terms in row block ``g`` into ``acc`` (query order: the exact
    score), then its rows into the heap; ``acc`` is zero again on return. Returns the heap size."""
    g0 = g << shift
    for jj in range(n):
        j = a + jj
        t = qterm[j]
        i = slot[jj * nb + g]
        if i < bptr[t] or i >= bptr[t + 1] or bid[i] != g:
            continue  # a stale slot (another query's): the term has no posting in this block
        lo = indptr[t] + bstart[i]
        hi = indptr[t] + bstart[i + 1] if i + 1 < bptr[t + 1] else indptr[t + 1]
        w = qw[j]
        work[0] += hi - lo
        for p in range(lo, hi):
            d = docs[p]
            f = np.float64(tfs[p])
            acc[d - g0] += w * (f / (f + norm[fn[d]]))
    for r in range(acc.shape[0]):
        s = acc[r]
        if s == 0.0:
            continue
        acc[r] = 0.0
        d = g0 + r
        if size == k and (s < hs[0] or (s == hs[0] and d > hr[0])):
            continue
        if s <= 0.0 or (use_mask and not allowed[d]):
            continue
        size = _push(hs, hr, size, k, s, d)
    return size


@_jit
def topk_blockmax(qptr, qterm, qw, indptr, docs, tfs, fn, norm, bptr, bid, bstart, bmax, scale, nb, shift, ub,
                  tb, order, slot, acc, allowed, k, out_rows, out_scores, work):  # pragma: no cover
    """The exact top-k (rows, ties by row, float64 scores) of each query, visiting only the row
    blocks (``2**shift`` rows each, ``nb`` of them) whose upper bound can reach it.

    Block entries of term ``t``: ``bptr[t] .. bptr[t + 1] - 1``, each a block number ``bid``, the
    offset of its first posting in the term's list ``bstart`` and ``bmax``, the maximum tf factor
    of its postings quantized up to 1/255 under the statistics the index was built with.
    ``scale``: what turns ``bmax`` into a bound under the statistics of this call (``drift / 255``
    with a relative slack: :func:`~hybridret.index.bm25_blocks.bound_scale`), so a block's
    ``ub = sum(weight * bmax * scale)`` over the query's terms bounds every score in it.

    Per query: the bounds of the blocks the terms touch (``ub``, ``tb``: the touched blocks;
    ``slot[jj * nb + g]``: the entry of term ``jj`` in block ``g``, checked on read, so stale
    values never need clearing); blocks bucketed by bound (:data:`BUCKETS`, counting sort into
    ``order``) and visited from the highest bucket down, each scored exactly (:func:`_block`),
    until the heap is full and a bucket's top is below its worst score. ``ub`` is zero on entry and
    exit; ``acc`` (``2**shift`` float64) likewise. ``work`` (int64, 3): postings scored, blocks
    scored, block entries read."""
    use_mask = allowed.shape[0] > 0
    hs = np.empty(k, np.float64)
    hr = np.empty(k, np.int64)
    cnt = np.zeros(BUCKETS + 1, np.int64)
    for q in range(qptr.shape[0] - 1):
        a = qptr[q]
        n = qptr[q + 1] - a
        if n == 0:
            continue
        nt = 0
        top = 0.0
        for jj in range(n):
            t = qterm[a + jj]
            c = qw[a + jj] * scale
            work[2] += bptr[t + 1] - bptr[t]
            for i in range(bptr[t], bptr[t + 1]):
                g = bid[i]
                if ub[g] == 0.0:
                    tb[nt] = g
                    nt += 1
                ub[g] += c * bmax[i]
                slot[jj * nb + g] = i
        for x in range(nt):
            top = max(top, ub[tb[x]])
        if nt == 0:
            _drain(hs, hr, 0, out_rows[q], out_scores[q])
            continue
        # counting sort of the touched blocks by bucket (bucket BUCKETS - 1 holds the highest bounds)
        cnt[:] = 0
        step = top / BUCKETS
        for x in range(nt):
            u = min(BUCKETS - 1, int(ub[tb[x]] / step))
            cnt[u + 1] += 1
        for u in range(BUCKETS):
            cnt[u + 1] += cnt[u]
        for x in range(nt):
            u = min(BUCKETS - 1, int(ub[tb[x]] / step))
            order[cnt[u]] = tb[x]
            cnt[u] += 1
        # cnt[u] is now the end of bucket u (its start: cnt[u - 1], or 0)
        size = 0
        for u in range(BUCKETS - 1, -1, -1):
            start = cnt[u - 1] if u > 0 else 0
            if start == cnt[u]:
                continue
            # every bound in bucket u is <= (u + 1) * step (the top bucket: <= top)
            hi_u = top if u == BUCKETS - 1 else (u + 1) * step * (1.0 + 1e-12)
            if size == k and hi_u < hs[0]:
                break
            for x in range(start, cnt[u]):
                g = order[x]
                if size == k and ub[g] < hs[0]:
                    continue
                work[1] += 1
                size = _block(g, a, n, qterm, qw, indptr, docs, tfs, fn, norm, bptr, bid, bstart, slot, nb, shift, acc,
                              allowed, use_mask, k, hs, hr, size, work)
        for x in range(nt):
            ub[tb[x]] = 0.0
        _drain(hs, hr, size, out_rows[q], out_scores[q])
