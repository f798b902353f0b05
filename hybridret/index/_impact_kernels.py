"""numba kernels of the impact-layered learned-sparse part (see :mod:`hybridret.index.impact`).

Imported only when a part is built or searched (it imports numba and compiles on first call,
or loads numba's on-disk cache)."""

from __future__ import annotations

import numpy as np

from ._heap import drain as _drain
from ._heap import enters as _enters
from ._heap import jit as _jit
from ._heap import push as _push


@_jit
def row_score(d, fptr, fidx, fdat, qbuf):  # pragma: no cover - compiled
    """The exact score of forward row ``d``: float32, in the row's term order (the only routine
    that makes a score this part returns)."""
    s = np.float32(0.0)
    for p in range(fptr[d], fptr[d + 1]):
        s += qbuf[fidx[p]] * fdat[p]
    return s


@_jit
def fill(fptr, fidx, fdat, row0, pos, docs, w):  # pragma: no cover - compiled
    """Counting sort of forward rows into term-major postings (rows ascending per term)."""
    for r in range(fptr.shape[0] - 1):
        for p in range(fptr[r], fptr[r + 1]):
            t = fidx[p]
            q = pos[t]
            docs[q] = row0 + r
            w[q] = fdat[p]
            pos[t] = q + 1


@_jit
def layer(tptr, docs, w, fracs, min_layered, lptr, lmax):  # pragma: no cover - compiled
    """Split every term's postings into impact layers by weight rank, rows ascending in each."""
    V = tptr.shape[0] - 1
    L = fracs.shape[0]
    longest = 0
    for t in range(V):
        longest = max(longest, tptr[t + 1] - tptr[t])
    tmp_d = np.empty(longest, np.int32)
    tmp_w = np.empty(longest, np.float32)
    cuts = np.empty(L, np.float32)
    starts = np.empty(L + 1, np.int64)
    for t in range(V):
        lo = tptr[t]
        hi = tptr[t + 1]
        m = hi - lo
        base = t * L
        if m == 0:
            for j in range(L):
                lptr[base + j] = lo
                lmax[base + j] = 0.0
            continue
        if m < min_layered or L == 1:
            top = np.float32(0.0)
            for p in range(lo, hi):
                top = max(top, w[p])
            lptr[base] = lo
            lmax[base] = top
            for j in range(1, L):
                lptr[base + j] = hi
                lmax[base + j] = 0.0
            continue
        ws = np.sort(w[lo:hi])  # ascending
        for j in range(L - 1):
            c = max(1, int(np.ceil(fracs[j] * m)))
            cuts[j] = ws[m - c]
        cuts[L - 1] = -1.0
        counts = np.zeros(L, np.int64)
        for p in range(lo, hi):
            j = 0
            while w[p] < cuts[j]:
                j += 1
            counts[j] += 1
        starts[0] = 0
        for j in range(L):
            starts[j + 1] = starts[j] + counts[j]
            lptr[base + j] = lo + starts[j]
            lmax[base + j] = 0.0
        fillp = starts[:L].copy()
        for p in range(lo, hi):
            j = 0
            while w[p] < cuts[j]:
                j += 1
            q = fillp[j]
            tmp_d[q] = docs[p]
            tmp_w[q] = w[p]
            fillp[j] = q + 1
            if w[p] > lmax[base + j]:
                lmax[base + j] = w[p]
        for q in range(m):
            docs[lo + q] = tmp_d[q]
            w[lo + q] = tmp_w[q]


@_jit
def score(qptr, qterm, qw, fptr, fidx, fdat, qbuf, rows, out):  # pragma: no cover - compiled
    """out[q, c] = exact score of rows[q, c] (``-1`` -> 0)."""
    for q in range(qptr.shape[0] - 1):
        for j in range(qptr[q], qptr[q + 1]):
            qbuf[qterm[j]] = qw[j]
        for c in range(rows.shape[1]):
            r = rows[q, c]
            if r >= 0:
                out[q, c] = row_score(r, fptr, fidx, fdat, qbuf)
        for j in range(qptr[q], qptr[q + 1]):
            qbuf[qterm[j]] = 0.0


@_jit
def _best(acc, cap, hs, hr):  # pragma: no cover - compiled
    """The ``cap`` best (partial sum, row) of ``acc`` into the heap; returns how many are > 0.
    The heap starts full of (0, n) sentinels, so the scan's only test, ``s > root``, is rarely
    true (a predictable branch: about 3x faster than testing ``s > 0`` first)."""
    n = acc.shape[0]
    for i in range(cap):
        hs[i] = 0.0
        hr[i] = n + i
    for d in range(n):
        s = acc[d]
        if s > hs[0]:
            _push(hs, hr, cap, cap, s, d)
    real = 0
    for i in range(cap):
        if hs[i] > 0.0:
            real += 1
    return real


@_jit
def _theta(acc, k, hs, hr, fptr, fidx, fdat, qbuf, theta):  # pragma: no cover - compiled
    """max(theta, the k-th best exact score of the k best partial sums): a lower bound on the
    k-th best score (those are k distinct rows with at least that score). One pass over ``acc``."""
    if _best(acc, k, hs, hr) < k:
        return theta
    low = np.inf
    for i in range(k):
        e = row_score(hr[i], fptr, fidx, fdat, qbuf)
        if e < low:
            low = e
    return max(theta, np.float64(low))


@_jit
def _count(acc, lim):  # pragma: no cover - compiled
    """Rows with a partial sum > 0 and >= ``lim`` (branch-free)."""
    c = 0
    lo = max(lim, np.float64(np.nextafter(np.float32(0.0), np.float32(1.0))))
    for d in range(acc.shape[0]):
        c += acc[d] >= lo
    return c


@_jit
def _take(acc, docs, w, s0, s1, x, allowed, use_mask):  # pragma: no cover - compiled
    """Add one run of postings times the query weight ``x`` into ``acc``."""
    for p in range(s0, s1):
        d = docs[p]
        if use_mask and not allowed[d]:
            continue
        acc[d] += x * w[p]


@_jit
def search(qptr, qterm, qw, lptr, lmax, L, docs, w, fptr, fidx, fdat, acc, qbuf, allowed, k, depth,
           rescore_cost, stop, div, out_rows, out_scores, work):  # pragma: no cover - compiled
    """Top-k per query (see the module docstring of hybridret.index.impact). ``depth == 0``:
    exact (MaxScore over impact layers, then exact scores of the survivors; ``stop`` unused);
    ``depth > 0``: approximate (stop once ``R < stop * theta``, where ``stop = 1`` is the point
    from which no untouched row can enter, then only the ``depth`` best partial sums re-scored);
    approximate mode refreshes theta every ``n // div`` postings (exact: every ``n``). ``acc`` is
    zero on entry and on exit."""
    use_mask = allowed.shape[0] > 0
    exact = depth == 0
    cap = max(k, depth)
    hs = np.empty(cap, np.float32)
    hr = np.empty(cap, np.int64)
    ths = np.empty(k, np.float32)
    thr = np.empty(k, np.int64)
    n = fptr.shape[0] - 1
    avg_len = max(1.0, fptr[n] / max(1, n))
    slack = 1.0 + 1e-5
    # postings between two refreshes of theta (a refresh reads acc once)
    every = max(n, int(8 * k * avg_len)) if exact else max(n // div, int(8 * k * avg_len))
    for q in range(qptr.shape[0] - 1):
        a = qptr[q]
        m = qptr[q + 1] - a
        if m == 0:
            continue
        ub = np.empty(m * L, np.float64)
        lj = np.empty(m * L, np.int64)
        ll = np.empty(m * L, np.int64)
        rem = np.zeros(m, np.float64)
        cnt = 0
        total = 0
        for j in range(m):
            t = qterm[a + j]
            x = qw[a + j]
            qbuf[t] = x
            total += lptr[t * L + L] - lptr[t * L]
            for lay in range(L):
                if lptr[t * L + lay + 1] > lptr[t * L + lay]:
                    ub[cnt] = np.float64(x) * np.float64(lmax[t * L + lay])
                    lj[cnt] = j
                    ll[cnt] = lay
                    if rem[j] == 0.0:
                        rem[j] = ub[cnt]
                    cnt += 1
        order = np.argsort(-ub[:cnt], kind="mergesort")  # stable: a term's layers stay in order
        R = 0.0
        for j in range(m):
            R += rem[j]
        theta = 0.0
        taken = 0
        since = 0
        i = 0
        while i < cnt:
            o = order[i]
            j = lj[o]
            lay = ll[o]
            t = qterm[a + j]
            s0 = lptr[t * L + lay]
            s1 = lptr[t * L + lay + 1]
            _take(acc, docs, w, s0, s1, qw[a + j], allowed, use_mask)
            taken += s1 - s0
            since += s1 - s0
            nxt = 0.0
            for l2 in range(lay + 1, L):
                if lptr[t * L + l2 + 1] > lptr[t * L + l2]:
                    nxt = np.float64(qw[a + j]) * np.float64(lmax[t * L + l2])
                    break
            R += nxt - rem[j]
            rem[j] = nxt
            i += 1
            if since >= every and i < cnt:
                theta = _theta(acc, k, ths, thr, fptr, fidx, fdat, qbuf, theta)
                since = 0
                # no row not reached yet can enter once R < theta. Exact: stop when scoring the
                # survivors from the forward store costs less than taking the remaining postings;
                # approximate: stop once R < stop * theta, and re-score only the ``depth`` best partial sums
                bar = theta if exact else stop * theta
                if R * slack < bar and (not exact or _count(acc, theta / slack - R) * avg_len * rescore_cost
                                        <= total - taken):
                    break
        if i == cnt:
            R = 0.0
        rescored = 0
        size = 0
        if exact:
            if since > 0:
                theta = _theta(acc, k, ths, thr, fptr, fidx, fdat, qbuf, theta)
            if R > 0.0 and not (R * slack < theta and
                                _count(acc, theta / slack - R) * avg_len * rescore_cost <= total - taken):
                while i < cnt:  # take the rest: cheaper than scoring the survivors
                    o = order[i]
                    j = lj[o]
                    t = qterm[a + j]
                    s0 = lptr[t * L + ll[o]]
                    s1 = lptr[t * L + ll[o] + 1]
                    _take(acc, docs, w, s0, s1, qw[a + j], allowed, use_mask)
                    taken += s1 - s0
                    i += 1
                R = 0.0
                theta = _theta(acc, k, ths, thr, fptr, fidx, fdat, qbuf, theta)
            lim = max(theta / slack - R, np.float64(np.nextafter(np.float32(0.0), np.float32(1.0))))
            for d in range(n):
                s = acc[d]
                acc[d] = 0.0
                if s >= lim:  # rare: a predictable branch
                    e = row_score(d, fptr, fidx, fdat, qbuf)
                    rescored += 1
                    if e > 0.0 and _enters(hs, hr, size, k, e, d):
                        size = _push(hs, hr, size, k, e, d)
        else:
            _best(acc, depth, hs, hr)
            acc[:] = 0.0
            cand = hr[:depth].copy()
            for ii in range(depth):
                d = cand[ii]
                if d >= n:
                    continue
                e = row_score(d, fptr, fidx, fdat, qbuf)
                rescored += 1
                if e > 0.0 and _enters(hs, hr, size, k, e, d):
                    size = _push(hs, hr, size, k, e, d)
        _drain(hs, hr, size, out_rows[q], out_scores[q])
        for j in range(m):
            qbuf[qterm[a + j]] = 0.0
        work[q, 0] = taken
        work[q, 1] = total
        work[q, 2] = rescored
