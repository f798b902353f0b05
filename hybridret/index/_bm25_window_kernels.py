"""numba kernels of the v3 BM25 store's impact windows (``index/bm25_windows.py``); imported only
where numba is.

Every score returned is the one :meth:`BM25Store.score` gives (computed from the posting's tf by
:func:`._bm25_impact_kernels._exact`, the same float64 operations in query-term order); the 8-bit
impacts only choose which rows are scored.

* :func:`long_bounds`: where each window's run starts in the lists of long terms (build);
* :func:`topk_windows`: the exact top-k of each query (search).
"""

from __future__ import annotations

import numpy as np

from ._bm25_impact_kernels import _exact
from ._heap import drain as _drain
from ._heap import enters as _enters
from ._heap import jit as _jit
from ._heap import push as _push
from ._window_kernels import _below, _scan, _sparse_run, keep, room


@_jit
def long_bounds(indptr, docs, longs, shift, nw, out):  # pragma: no cover - compiled
    """``out[i, w]``: the position in term ``longs[i]``'s list (from its start) of its first row
    in window ``w`` or later (``out[i, nw]`` = the list's length)."""
    for i in range(longs.shape[0]):
        t = longs[i]
        lo = indptr[t]
        hi = indptr[t + 1]
        p = lo
        for w in range(nw):
            start = w << shift
            while p < hi and docs[p] < start:
                p += 1
            out[i, w] = p - lo
        out[i, nw] = hi - lo


@_jit
def topk_windows(qptr, qterm, qw, indptr, docs, tfs, fn, norm, offs, imps, step, long_row, bounds, rmin, rmax,
                 shift, n, acc, allowed, k, out_rows, out_scores, work):  # pragma: no cover - compiled
    """The exact top-k (rows, ties by row ascending, float64 scores) of each query.

    ``imps``: each posting's tf factor under the build's ``avgdl0`` over its term's ``step``
    (the term's largest factor / 255), nearest, at least 1; ``offs``: its row within its window of
    ``2**shift`` rows. A row's partial score ``Q`` (impacts times ``weight * step``, float32 adds)
    is within ``E`` (one step of every query term, plus float slack) of ``S0``, its score under
    ``avgdl0``; under the live ``avgdl`` its score lies in ``[S0 rmin, S0 rmax]``
    (:func:`~.bm25_impacts.drift`). So a row of the top k (ties included) has
    ``rmax (Q + E) >= rmin (Q_k - E)`` (``Q_k``: the k-th best ``Q``), that is
    ``Q >= rho (Q_k - E) - E`` with ``rho = rmin / rmax``.

    Window by window, the runs of the query's terms are added into ``acc`` (one window of float32,
    cache-resident, zero on entry and exit) and the window is read once: in chunks of 64 whose
    hits are counted without a branch (:func:`._window_kernels._scan`), or, when the window holds
    few postings, by walking its runs again; rows that clear the bar under the k best ``Q`` so far
    are kept. The kept rows that still clear it at the end are scored exactly (a few dozen per
    query) and the top k of those scores is returned (scores > 0).

    A long term's run starts at ``bounds[long_row[t] * (windows + 1) + w]`` of its list; a short
    term's (``long_row[t] == -1``) is found by walking its rows (``docs``). ``allowed`` (empty:
    every row) masks rows at the read. ``work`` (int64, 3): postings added, candidates, rows scored."""
    W = 1 << shift
    nw = (n + W - 1) >> shift
    nb = nw + 1
    use_mask = allowed.shape[0] > 0
    rho = rmin / rmax
    hs = np.empty(k, np.float32)
    hr = np.empty(k, np.int64)
    ks = np.empty(k, np.float64)
    kr = np.empty(k, np.int64)
    cd = np.empty(1 << 14, np.int64)
    cq = np.empty(1 << 14, np.float32)
    most = 1
    for q in range(qptr.shape[0] - 1):
        most = max(most, qptr[q + 1] - qptr[q])
    qf = np.empty(most, np.float32)
    cur = np.empty(most, np.int64)
    r0 = np.empty(most, np.int64)
    r1 = np.empty(most, np.int64)
    for q in range(qptr.shape[0] - 1):
        a = qptr[q]
        m = qptr[q + 1] - a
        if m == 0:
            continue
        err = 0.0
        total = 0.0
        for j in range(m):
            t = qterm[a + j]
            qf[j] = np.float32(qw[a + j] * step[t])
            err += np.float64(qf[j])
            total += np.float64(qf[j]) * 255.0
            cur[j] = indptr[t]
        err = err * (1.0 + 1e-4) + 1e-5 * total + 1e-7
        slack = (rho + 1.0) * err  # the scan's bar: rho * (k-th best Q) - slack
        size = 0
        nc = 0
        bar = 0.0
        taken = 0
        for w in range(nw):
            lo = w * W
            count = min(n, lo + W) - lo
            here = 0
            for j in range(m):
                t = qterm[a + j]
                r = long_row[t]
                if r >= 0:
                    r0[j] = indptr[t] + bounds[r * nb + w]
                    r1[j] = indptr[t] + bounds[r * nb + w + 1]
                else:
                    s1 = cur[j]
                    r0[j] = s1
                    hi = indptr[t + 1]
                    end = lo + W
                    while s1 < hi and docs[s1] < end:
                        s1 += 1
                    r1[j] = s1
                    cur[j] = s1
                if r1[j] > r0[j]:
                    _sparse_run(acc, offs, imps, r0[j], r1[j], qf[j])
                    here += r1[j] - r0[j]
            taken += here
            if here == 0:
                continue  # nothing added: the window's accumulator is still zero
            if here * 8 < count:  # few postings: walk the runs again (zeroing what is read)
                barf = _below(bar)
                for j in range(m):
                    for p in range(r0[j], r1[j]):
                        o = offs[p]
                        v = acc[o]
                        if v > 0.0:
                            acc[o] = 0.0
                            d = lo + o
                            if v >= barf and (not use_mask or allowed[d]):
                                if nc == cd.shape[0]:
                                    cd, cq, nc = room(cd, cq, nc, bar)
                                nc, size, raised = keep(d, v, cd, cq, nc, hs, hr, size, k, bar, rho, slack, True)
                                if raised > bar:
                                    bar = raised
                                    barf = _below(bar)
                continue
            i0 = 0
            while True:
                i0, nc, size, bar = _scan(acc, i0, count, lo, bar, hs, hr, size, k, slack, cd, cq, nc,
                                          allowed, use_mask, True, rho)
                if i0 >= count:
                    break
                cd, cq, nc = room(cd, cq, nc, bar)
        ksize = 0
        scored = 0
        for c in range(nc):
            if cq[c] >= bar:
                d = cd[c]
                s = _exact(qterm, qw, a, a + m, indptr, docs, tfs, fn, norm, d)
                scored += 1
                if s > 0.0 and _enters(ks, kr, ksize, k, s, d):
                    ksize = _push(ks, kr, ksize, k, s, d)
        _drain(ks, kr, ksize, out_rows[q], out_scores[q])
        work[0] += taken
        work[1] += nc
        work[2] += scored

