"""numba kernels of the v2 BM25 store's quantized impacts (``index/bm25_impacts.py``); imported
only where numba is.

Every score returned is the one :meth:`BM25Store.score` gives: float64, ``0.0`` plus each query
term's ``weight * tf factor`` in query-term order, the factor computed from the posting's tf and
the row's fieldnorm id exactly as :meth:`BM25Store.tf_factors` computes it (``f / (f + norm[fn])``,
``f`` the tf as float64): the same IEEE operations, so the same bits. The u8 impacts only choose
which rows are scored.

* :func:`topk_impacts`: windowed MaxScore over the impacts, then exact scores of the rows that can
  still reach the top k;
* :func:`score_tf`: given rows, by binary search per row and term.

Compiled with ``cache=True`` (numba's on-disk cache) where a cache location is writable.
"""

from __future__ import annotations

import numpy as np

from ._bm25_kernels import _find, _gallop
from ._heap import drain as _drain
from ._heap import jit as _jit
from ._heap import push as _push

__all__ = ["score_tf", "topk_impacts"]

WALK = 16  # walk a non-essential term's window rather than gallop when candidates * WALK exceed its postings
SLACK = 1e-9  # relative slack of lower and upper bounds (float rounding of the bounds themselves)


@_jit
def _exact(qterm, qw, a, b, indptr, docs, tfs, fn, norm, d):  # pragma: no cover
    """The score of row ``d``: 0.0 plus entries ``a..b-1`` (query order), as every path adds them."""
    s = 0.0
    for j in range(a, b):
        hi = indptr[qterm[j] + 1]
        p = _find(docs, indptr[qterm[j]], hi, d)
        if p < hi and docs[p] == d:
            f = np.float64(tfs[p])
            s += qw[j] * (f / (f + norm[fn[d]]))
    return s


@_jit
def score_tf(qptr, qterm, qw, indptr, docs, tfs, fn, norm, rows, out):  # pragma: no cover
    """``out[q, c]``: the score of ``rows[q, c]`` (``-1``: left as is)."""
    for q in range(rows.shape[0]):
        for c in range(rows.shape[1]):
            d = rows[q, c]
            if d >= 0:
                out[q, c] = _exact(qterm, qw, qptr[q], qptr[q + 1], indptr, docs, tfs, fn, norm, d)


@_jit
def topk_impacts(qptr, qterm, qw, indptr, docs, tfs, fn, norm, imp, tmax, kth, scale, unit, rmin, rmax, shift, gamma,
                 acc, wc, allowed, k, out_rows, out_scores, work):  # pragma: no cover
    """The exact top-k (rows, ties by row ascending, float64 scores) of each query.

    ``imp``: each posting's tf factor ``f0`` under the build's ``avgdl0`` in units of its term's
    ``scale`` (v2: ``1 / 255`` for every term, rounded, ``unit = 0.5``; v3: the term's largest
    factor / 255, rounded and at least 1, ``unit = 1``), so ``f0`` is within ``unit`` units of
    ``imp * scale``; ``tmax``: each term's largest ``imp``; ``kth`` (empty: not used), each term's
    k-th largest or less (``theta`` starts from the best term's ``w * scale * (kth - unit) * rmin``:
    that many rows have at least this score; only without a row mask). Under the live ``avgdl``
    every factor lies within ``[f0 * rmin, f0 * rmax]`` (:func:`~.bm25_impacts.drift`); so a row's
    approximate score ``a = sum(w * scale * imp)`` (float32 adds) gives
    ``lb = (a - E) rmin <= score <= (a + E) rmax = ub`` with ``E`` the ``unit`` of every query term
    (times its ``w * scale``) plus a float32 rounding allowance (and a relative slack each).

    Rows are taken in windows of ``2**shift`` (``acc``: a float32 accumulator of that many, zero on
    entry and exit, cache-resident; ``wc``: int32 scratch of the same size). ``theta``, the k-th
    best ``lb`` of the allowed rows completed so far, bounds the k-th best score from below. Per
    window, MaxScore: the terms of smallest ``w * scale * tmax`` whose sum stays below what a row must
    reach (``theta / rmax - E``) are *non-essential*; the others' postings in the window go into
    ``acc``, and a row whose partial sum crosses the rest of the way is a candidate (no scan of the
    window; while ``theta`` is 0 every term is essential and the window is scanned). Candidates get
    the non-essential terms' impacts by binary search, their ``lb`` feeds ``theta`` and those whose
    ``ub`` reaches ``theta`` are kept; the accumulator is zeroed by walking the same postings.
    Once no row can reach ``theta`` the query stops. Finally the kept rows whose ``ub`` reaches the
    final ``theta`` (a superset of the top k, ties included) are scored exactly (:func:`_exact`).
    ``work`` (int64, 3): postings accumulated, candidates completed, rows scored exactly."""
    use_mask = allowed.shape[0] > 0
    nd = fn.shape[0]
    size_w = 1 << shift
    nw = (nd + size_w - 1) >> shift
    hs = np.empty(k, np.float64)
    hr = np.empty(k, np.int64)
    ls = np.empty(k, np.float64)
    lr = np.empty(k, np.int64)
    cap = 4096
    gd = np.empty(cap, np.int64)
    gu = np.empty(cap, np.float64)
    most = 1
    for q in range(qptr.shape[0] - 1):
        most = max(most, qptr[q + 1] - qptr[q])
    # per-query arrays, made once per call (a query of 30,000 rows takes tens of microseconds)
    ubj = np.empty(most, np.float64)
    wj = np.empty(most, np.float32)
    order = np.empty(most, np.int64)
    rest = np.zeros(most + 1, np.float64)
    cur = np.empty(most, np.int64)
    endp = np.empty(most, np.int64)
    for q in range(qptr.shape[0] - 1):
        a = qptr[q]
        n = qptr[q + 1] - a
        if n == 0:
            continue
        total_w = 0.0
        for jj in range(n):
            sc = qw[a + jj] * scale[qterm[a + jj]]
            ubj[jj] = sc * tmax[qterm[a + jj]]
            wj[jj] = np.float32(sc)
            total_w += sc
        e = total_w * (unit + 1e-6) + total_w * 255.0 * (n + 4) * 2.0 ** -22
        for i in range(n):  # descending upper bound (insertion sort: queries have few terms)
            x = i
            while x > 0 and ubj[order[x - 1]] < ubj[i]:
                order[x] = order[x - 1]
                x -= 1
            order[x] = i
        rest[n] = 0.0  # rest[i]: the bounds of order[i:]
        for i in range(n - 1, -1, -1):
            rest[i] = rest[i + 1] + ubj[order[i]]
        for jj in range(n):
            cur[jj] = indptr[qterm[a + jj]]
        theta = 0.0
        if kth.shape[0] > 0:
            for jj in range(n):
                kv = np.float64(kth[qterm[a + jj]])
                if kv > 0.0:
                    sc = qw[a + jj] * scale[qterm[a + jj]]
                    theta = max(theta, sc * (kv - unit - 1e-6) * rmin * (1.0 - SLACK))
        lsize = 0
        ng = 0
        for w in range(nw):
            base = w << shift
            wend = base + size_w
            ne = n
            thr = 0.0
            if theta > 0.0:
                thr = theta / (rmax * (1.0 + SLACK)) - e
                if rest[0] < thr:
                    break  # no row left can reach theta
                while ne > 1 and rest[ne - 1] < (1.0 - gamma) * thr:
                    ne -= 1
            tcross = thr - rest[ne]
            scan = tcross <= 0.0
            nc = 0
            for i in range(ne):
                jj = order[i]
                c = wj[jj]
                p = cur[jj]
                hi = indptr[qterm[a + jj] + 1]
                if scan:
                    while p < hi and docs[p] < wend:
                        acc[docs[p] - base] += c * np.float32(imp[p])
                        p += 1
                else:
                    while p < hi and docs[p] < wend:
                        o = docs[p] - base
                        old = acc[o]
                        nv = old + c * np.float32(imp[p])
                        acc[o] = nv
                        if nv >= tcross and old < tcross:
                            wc[nc] = o
                            nc += 1
                        p += 1
                work[0] += p - cur[jj]
                endp[jj] = p
            for i in range(ne, n):  # non-essential: the window's range of each list
                jj = order[i]
                hi = indptr[qterm[a + jj] + 1]
                p = cur[jj]
                if p < hi and docs[p] < wend:
                    step = 1
                    while p + step < hi and docs[p + step] < wend:
                        p += step
                        step <<= 1
                    p = _find(docs, p + 1, min(p + step, hi), wend)
                endp[jj] = p
            if scan:
                for o in range(min(size_w, nd - base)):
                    if acc[o] > 0.0:
                        wc[nc] = o
                        nc += 1
            if ne < n and nc:  # complete the candidates with the non-essential terms
                wc[:nc].sort()  # row order: a galloping cursor along each list
                for x in range(nc):
                    acc[wc[x]] = -acc[wc[x]]  # a candidate's sum is negative while it is completed
                for i in range(ne, n):
                    jj = order[i]
                    c = wj[jj]
                    if nc * WALK > endp[jj] - cur[jj]:  # many candidates: walk the term's window
                        for p in range(cur[jj], endp[jj]):
                            o = docs[p] - base
                            if acc[o] < 0.0:
                                acc[o] -= c * np.float32(imp[p])
                    else:
                        p = cur[jj]
                        hi = endp[jj]
                        for x in range(nc):
                            d = base + wc[x]
                            p = _gallop(docs, p, hi, d)
                            if p < hi and docs[p] == d:
                                acc[wc[x]] -= c * np.float32(imp[p])
                for x in range(nc):
                    acc[wc[x]] = -acc[wc[x]]
            for x in range(nc):
                o = wc[x]
                d = base + o
                s = np.float64(acc[o])
                if scan:
                    acc[o] = 0.0
                if use_mask and not allowed[d]:
                    continue
                work[1] += 1
                ub = (s + e) * rmax * (1.0 + SLACK)
                if ub < theta:
                    continue
                lb = (s - e) * rmin * (1.0 - SLACK)
                if lb > 0.0 and (lsize < k or lb > ls[0]):
                    lsize = _push(ls, lr, lsize, k, lb, d)
                    if lsize == k:
                        theta = max(theta, ls[0])
                if ng == cap:
                    cap *= 2
                    gd2 = np.empty(cap, np.int64)
                    gu2 = np.empty(cap, np.float64)
                    gd2[:ng] = gd[:ng]
                    gu2[:ng] = gu[:ng]
                    gd = gd2
                    gu = gu2
                gd[ng] = d
                gu[ng] = ub
                ng += 1
            if not scan:
                for i in range(ne):
                    jj = order[i]
                    for p in range(cur[jj], endp[jj]):
                        acc[docs[p] - base] = 0.0
            for jj in range(n):
                cur[jj] = endp[jj]
            m = 0
            for x in range(ng):  # keep the rows that can still reach theta
                if gu[x] >= theta:
                    gd[m] = gd[x]
                    gu[m] = gu[x]
                    m += 1
            ng = m
        size = 0
        for x in range(ng):
            if gu[x] < theta:
                continue
            d = gd[x]
            work[2] += 1
            s = _exact(qterm, qw, a, a + n, indptr, docs, tfs, fn, norm, d)
            if size == k and (s < hs[0] or (s == hs[0] and d > hr[0])):
                continue
            if s <= 0.0:
                continue
            size = _push(hs, hr, size, k, s, d)
        _drain(hs, hr, size, out_rows[q], out_scores[q])
