"""numba kernels of the BM25 posting store (``index/bm25.py``); imported only where numba is.

Every kernel gives a document the score :meth:`BM25Store.score` gives it: float64, ``0.0`` plus
each query term's ``weight * tf factor`` in query-term order. The top-k kernels return the best
``k`` (score descending, ties by row ascending) of the allowed rows with a score > 0.

* :func:`score`: given rows, by binary search per row and term.
* :func:`topk_exhaustive`: every posting of every query term into a dense accumulator.
* :func:`topk_pruned`: MaxScore over terms with block-max bounds, the same result (see its doc).

Compiled with ``cache=True`` (numba's on-disk cache) where a cache location is writable.
"""

from __future__ import annotations

import numpy as np

from ._blocks import BLOCK
from ._heap import drain as _drain
from ._heap import jit as _jit
from ._heap import push as _push

__all__ = ["score", "topk_exhaustive", "topk_pruned"]

EPS = 1e-9  # relative slack of every bound test: float rounding (~1e-15 here) never drops a top-k row
SMALL = 4096  # queries with fewer postings than this are searched exhaustively (pruning cannot pay)
GATE = 0.7  # a checkpoint once theta (from the last one) is at least this share of the UBs left


# ----------------------------------------------------------------------------------- helpers

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
def _gallop(docs, p, hi, d):  # pragma: no cover
    """:func:`_find` from a cursor ``p`` (rows before it are < ``d``): exponential steps, then
    binary search; cheap for the rows of a list in ascending order (each search starts where the
    last ended)."""
    if p >= hi or docs[p] >= d:
        return p
    step = 1
    while p + step < hi and docs[p + step] < d:
        p += step
        step <<= 1
    return _find(docs, p + 1, min(p + step, hi), d)


@_jit
def _exact(qterm, qw, a, b, indptr, docs, fac, d):  # pragma: no cover
    """The score of row ``d``: 0.0 plus entries ``a..b-1`` (query order), as every path adds them."""
    s = 0.0
    for j in range(a, b):
        hi = indptr[qterm[j] + 1]
        p = _find(docs, indptr[qterm[j]], hi, d)
        if p < hi and docs[p] == d:
            s += qw[j] * fac[p]
    return s


@_jit
def _exhaustive_query(qterm, qw, a, b, indptr, docs, fac, acc, touched, allowed, use_mask, k, hs, hr,
                      out_rows, out_scores):  # pragma: no cover
    """One query: every posting into ``acc`` (query order), then the heap over the touched rows."""
    nt = 0
    for j in range(a, b):
        t = qterm[j]
        w = qw[j]
        for p in range(indptr[t], indptr[t + 1]):
            d = docs[p]
            if acc[d] == 0.0:
                touched[nt] = d
                nt += 1
            acc[d] += w * fac[p]
    size = 0
    for i in range(nt):
        d = touched[i]
        s = acc[d]
        acc[d] = 0.0
        if size == k and (s < hs[0] or (s == hs[0] and d > hr[0])):
            continue
        if s <= 0.0 or (use_mask and not allowed[d]):
            continue
        size = _push(hs, hr, size, k, s, d)
    _drain(hs, hr, size, out_rows, out_scores)


@_jit
def _single_term(j, qterm, qw, indptr, docs, fac, bptr, bmax, allowed, use_mask, k, hs, hr, out_rows, out_scores,
                 work):  # pragma: no cover
    """A query of one entry: its score is ``0.0 + w * fac`` of a posting, so a block whose maximum
    times ``w`` does not beat the heap's worst (rows only grow along the list) is skipped whole."""
    t = qterm[j]
    w = qw[j]
    lo = indptr[t]
    hi = indptr[t + 1]
    b0 = bptr[t]
    size = 0
    for x in range(bptr[t + 1] - b0):
        if size == k and w * bmax[b0 + x] <= hs[0]:
            continue
        s0 = lo + x * BLOCK
        e0 = min(s0 + BLOCK, hi)
        work[0] += e0 - s0
        for p in range(s0, e0):
            s = 0.0 + w * fac[p]
            if size == k and s <= hs[0]:  # a tie loses too: its row is larger than every kept one
                continue
            d = docs[p]
            if use_mask and not allowed[d]:
                continue
            size = _push(hs, hr, size, k, s, d)
    _drain(hs, hr, size, out_rows, out_scores)


# ----------------------------------------------------------------------------------- kernels

@_jit
def score(qptr, qterm, qw, indptr, docs, fac, rows, out):  # pragma: no cover
    """``out[q, c]``: the score of ``rows[q, c]`` (``-1``: left as is)."""
    for q in range(rows.shape[0]):
        for c in range(rows.shape[1]):
            r = rows[q, c]
            if r >= 0:
                out[q, c] = _exact(qterm, qw, qptr[q], qptr[q + 1], indptr, docs, fac, r)


@_jit
def topk_exhaustive(qptr, qterm, qw, indptr, docs, fac, acc, touched, allowed, k, out_rows,
                    out_scores):  # pragma: no cover
    """Top-k of each query from every posting of its terms (``acc``: zeros on entry and exit)."""
    use_mask = allowed.shape[0] > 0
    hs = np.empty(k, np.float64)
    hr = np.empty(k, np.int64)
    for q in range(qptr.shape[0] - 1):
        _exhaustive_query(qterm, qw, qptr[q], qptr[q + 1], indptr, docs, fac, acc, touched, allowed, use_mask, k,
                          hs, hr, out_rows[q], out_scores[q])


@_jit
def _theta(touched, nt, acc, allowed, use_mask, k, hs, hr):  # pragma: no cover
    """A lower bound of the k-th best score: the k-th best partial sum of the allowed touched rows
    (each a lower bound of its row's score), less the slack; 0.0 with fewer than ``k`` such rows.
    (Completing those rows with the terms not yet added, by look-ups, raised it too little to pay:
    measured, the same postings read, 5-10 % slower.)"""
    size = 0
    for i in range(nt):
        d = touched[i]
        s = acc[d]
        if size == k and (s < hs[0] or (s == hs[0] and d > hr[0])):
            continue
        if s <= 0.0 or (use_mask and not allowed[d]):
            continue
        size = _push(hs, hr, size, k, s, d)
    return hs[0] * (1.0 - EPS) if size == k else 0.0


@_jit
def _settle(qterm, qw, a, b, indptr, docs, fac, acc, touched, nt, allowed, use_mask, k, hs, hr, size,
            work):  # pragma: no cover
    """The heap ``hs``/``hr`` of the k best full sums added in another order than the query's,
    made exact: the rows ``F`` within the slack of its worst are the only ones that can be in the
    top k. Two float sums of the same ``m <= n`` positive terms in two orders differ by at most
    ``2 (m - 1) u`` of their value (``u = 2^-53``), so a row of ``F`` whose sum is farther than
    ``n * 1e-15`` of its value from its neighbours' (in sorted order) and from a float32 rounding
    boundary has its exact rank, and its exact float32 score; only the others (ties above all) are
    rescored in query order, each list walked once along them. Returns the new heap size."""
    low = hs[0] * (1.0 - EPS) if size == k else 0.0
    nf = 0
    for i in range(nt):  # F to the front of touched (in its order: ascending runs)
        d = touched[i]
        if acc[d] > 0.0 and acc[d] >= low and not (use_mask and not allowed[d]):
            touched[nf], touched[i] = d, touched[nf]
            nf += 1
    val = np.empty(nf, np.float64)
    for f in range(nf):
        val[f] = acc[touched[f]]
    rank = np.argsort(-val)
    tol = (b - a) * 1e-15
    unsure = np.zeros(nf, np.bool_)
    for r in range(nf):
        f = rank[r]
        x = val[f]
        if np.float32(x * (1.0 - tol)) != np.float32(x * (1.0 + tol)):
            unsure[f] = True
        if r + 1 < nf and x - val[rank[r + 1]] <= tol * x:
            unsure[f] = True
            unsure[rank[r + 1]] = True
    nu = 0
    for f in range(nf):
        nu += unsure[f]
    work[2] += nu
    if nu:
        for f in range(nf):
            if unsure[f]:
                val[f] = 0.0
        for j in range(a, b):
            w = qw[j]
            lo = indptr[qterm[j]]
            hi = indptr[qterm[j] + 1]
            p = lo
            prev = -1
            for f in range(nf):
                if not unsure[f]:
                    continue
                d = touched[f]
                if d < prev:
                    p = lo
                prev = d
                p = _gallop(docs, p, hi, d)
                if p < hi and docs[p] == d:
                    val[f] += w * fac[p]
    size = 0
    for f in range(nf):
        d = touched[f]
        s = val[f]
        if size == k and (s < hs[0] or (s == hs[0] and d > hr[0])):
            continue
        size = _push(hs, hr, size, k, s, d)
    return size


@_jit
def topk_pruned(qptr, qterm, qw, indptr, docs, fac, bptr, bmax, tmax, acc, touched, allowed, k, out_rows,
                out_scores, work):  # pragma: no cover
    """:func:`topk_exhaustive`'s result (rows, ties, float32 scores), pruned: MaxScore over the
    terms, with block-max bounds. A query of one term takes :func:`_single_term`; one of fewer
    than :data:`SMALL` postings the exhaustive path. Else, the terms in descending upper bound
    ``UB = weight * max tf factor of the term's postings``:

    1. *essential* terms: whole lists into ``acc``, in that order, until the UBs of the terms left
       sum below ``theta``, a lower bound of the k-th best score (:func:`_theta`: the k-th best
       partial sum, at a checkpoint after a term when the postings left outnumber the touched rows
       and the last checkpoint's ``theta`` came within :data:`GATE` of the UBs left); a row that
       none of them holds then cannot reach the top k. Once ``theta`` is known, a row first met
       whose posting plus the UBs left stays below it is not added (nor can it reach the top k);
    2. the touched allowed rows whose partial sum plus the UBs left reaches ``theta`` are the
       candidates. Each *non-essential* term (descending UB) adds its factor of each candidate: by
       a block search from a cursor (``touched`` is ascending runs), the search inside the block
       skipped when the block's maximum cannot lift the candidate to ``theta``; or by a scan of its
       list when the candidates are many. Candidates that fall below ``theta`` are dropped, and
       ``theta`` rises from the partial sums of those left;
    3. the candidates hold their full sums added in UB order: exact when that is the query order;
       else :func:`_settle` rescores the few rows whose rank or float32 value rounding could change.

    Every bound test has a relative slack :data:`EPS`, so float rounding (sums in another order
    than the query's) never drops a top-k row. ``bptr``/``bmax``/``tmax``: block numbering per
    term, per-block and per-term maxima of ``fac`` (:class:`~hybridret.index.bm25.TfFactors`).
    ``acc``: zeros on entry and exit; ``touched``: scratch of the same length. ``out_scores``
    (float64) equal the exact scores once rounded to float32 (the store returns float32). ``work``
    (int64, 3) counts, over the queries: postings read, row look-ups in a list, rows rescored."""
    use_mask = allowed.shape[0] > 0
    hs = np.empty(k, np.float64)
    hr = np.empty(k, np.int64)
    for q in range(qptr.shape[0] - 1):
        a = qptr[q]
        b = qptr[q + 1]
        n = b - a
        if n == 0:
            continue
        total = 0
        for j in range(a, b):
            total += indptr[qterm[j] + 1] - indptr[qterm[j]]
        if n == 1:
            _single_term(a, qterm, qw, indptr, docs, fac, bptr, bmax, allowed, use_mask, k, hs, hr, out_rows[q],
                         out_scores[q], work)
            continue
        if total < SMALL:
            work[0] += total
            _exhaustive_query(qterm, qw, a, b, indptr, docs, fac, acc, touched, allowed, use_mask, k, hs, hr,
                              out_rows[q], out_scores[q])
            continue
        ub = np.empty(n, np.float64)
        for i in range(n):
            ub[i] = -(qw[a + i] * tmax[qterm[a + i]])
        order = np.argsort(ub, kind="mergesort")  # descending UB, ties in query order
        in_order = True
        for i in range(n):
            ub[i] = -ub[i]
            if order[i] != i:
                in_order = False
        rem = np.zeros(n + 1, np.float64)  # rem[i]: the UBs of order[i:]
        left = np.zeros(n + 1, np.int64)  # left[i]: the postings of order[i:]
        for i in range(n - 1, -1, -1):
            t = qterm[a + order[i]]
            rem[i] = rem[i + 1] + ub[order[i]]
            left[i] = left[i + 1] + indptr[t + 1] - indptr[t]
        # 1. essential terms
        theta = 0.0
        done = 0.0  # theta of the last checkpoint
        nt = 0
        ne = n
        for i in range(n):
            j = a + order[i]
            w = qw[j]
            t = qterm[j]
            nxt = rem[i + 1] * (1.0 + EPS)
            work[0] += indptr[t + 1] - indptr[t]
            if theta > 0.0:
                for p in range(indptr[t], indptr[t + 1]):
                    d = docs[p]
                    c = w * fac[p]
                    if acc[d] == 0.0:
                        if c + nxt < theta:
                            continue
                        touched[nt] = d
                        nt += 1
                    acc[d] += c
            else:
                for p in range(indptr[t], indptr[t + 1]):
                    d = docs[p]
                    if acc[d] == 0.0:
                        touched[nt] = d
                        nt += 1
                    acc[d] += w * fac[p]
            if i + 1 < n and nt >= k and left[i + 1] > nt and (done == 0.0 or done >= GATE * nxt):
                done = _theta(touched, nt, acc, allowed, use_mask, k, hs, hr)
                theta = max(theta, done)
                if nxt < theta:
                    ne = i + 1
                    break
        # 2. candidates, completed with the non-essential terms
        if ne < n:
            rest = rem[ne] * (1.0 + EPS)
            m = 0
            for i in range(nt):
                d = touched[i]
                if (use_mask and not allowed[d]) or acc[d] + rest < theta:
                    acc[d] = 0.0
                else:
                    touched[m] = d
                    m += 1
            nt = m
            for i in range(ne, n):
                j = a + order[i]
                w = qw[j]
                t = qterm[j]
                lo = indptr[t]
                hi = indptr[t + 1]
                rest = rem[i + 1] * (1.0 + EPS)
                m = 0
                if nt * 24 > hi - lo:  # scan the list: only candidates have acc > 0
                    work[0] += hi - lo
                    for p in range(lo, hi):
                        d = docs[p]
                        if acc[d] > 0.0:
                            acc[d] += w * fac[p]
                    for c in range(nt):
                        d = touched[c]
                        if acc[d] + rest < theta:
                            acc[d] = 0.0
                        else:
                            touched[m] = d
                            m += 1
                else:
                    work[1] += nt
                    nb = bptr[t + 1] - bptr[t]
                    b0 = bptr[t]
                    x = 0
                    prev = -1
                    for c in range(nt):
                        d = touched[c]
                        s = acc[d]
                        if d < prev:  # touched is ascending runs (one per essential term): a new run
                            x = 0
                        prev = d
                        # the block of d: the first (from the cursor) whose last row is >= d
                        if x < nb and docs[min(lo + (x + 1) * BLOCK, hi) - 1] < d:
                            step = 1
                            while x + step < nb and docs[min(lo + (x + step + 1) * BLOCK, hi) - 1] < d:
                                x += step
                                step <<= 1
                            y = min(x + step, nb)
                            x += 1
                            while x < y:
                                mid = (x + y) >> 1
                                if docs[min(lo + (mid + 1) * BLOCK, hi) - 1] < d:
                                    x = mid + 1
                                else:
                                    y = mid
                        if x < nb:
                            if s + w * bmax[b0 + x] + rest < theta:
                                acc[d] = 0.0
                                continue
                            p = _find(docs, lo + x * BLOCK, min(lo + (x + 1) * BLOCK, hi), d)
                            if docs[p] == d:
                                s += w * fac[p]
                        if s + rest < theta:
                            acc[d] = 0.0
                        else:
                            acc[d] = s
                            touched[m] = d
                            m += 1
                nt = m
                if i + 1 < n and nt > 2 * k:  # a higher theta from the partial sums so far
                    theta = max(theta, _theta(touched, nt, acc, allowed, use_mask, k, hs, hr))
        # 3. rank: full sums in UB order, exact when that is the query order
        size = 0
        for i in range(nt):
            d = touched[i]
            s = acc[d]
            if size == k and (s < hs[0] or (s == hs[0] and d > hr[0])):
                continue
            if s <= 0.0 or (use_mask and not allowed[d]):
                continue
            size = _push(hs, hr, size, k, s, d)
        if not in_order:
            size = _settle(qterm, qw, a, b, indptr, docs, fac, acc, touched, nt, allowed, use_mask, k, hs, hr, size,
                           work)
        for i in range(nt):
            acc[touched[i]] = 0.0
        _drain(hs, hr, size, out_rows[q], out_scores[q])
