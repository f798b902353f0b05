"""numba kernels of the windowed learned-sparse part (see :mod:`hybridret.index.impact_windows`).

Imported only when a part is built or searched (it imports numba and compiles on first call, or
loads numba's on-disk cache)."""

from __future__ import annotations

import numpy as np

from ._heap import drain as _drain
from ._heap import enters as _enters
from ._heap import jit as _jit
from ._heap import push as _push
from ._impact_kernels import row_score as _row_score


@_jit
def term_max(fidx, fdat, out):  # pragma: no cover - compiled
    """``out[t] = max(out[t], largest weight of term t)`` over these forward entries."""
    for p in range(fidx.shape[0]):
        t = fidx[p]
        if fdat[p] > out[t]:
            out[t] = fdat[p]


@_jit
def _quant(w, inv):  # pragma: no cover - compiled
    """The 8-bit impact of weight ``w > 0`` for a term whose step is ``1 / inv``: the nearest step,
    at least 1 (so a row with a positive score always has a positive partial score) and at most
    255; within one step of ``w * inv``."""
    v = int(np.float64(w) * inv + 0.5)
    return min(max(v, 1), 255)


@_jit
def count_runs(fptr, fidx, fdat, row0, inv, V, shift, cnt):  # pragma: no cover - compiled
    """Non-zero impacts per (window, term) run of forward rows ``row0 ...`` (``cnt[w * V + t]``)."""
    for r in range(fptr.shape[0] - 1):
        base = ((row0 + r) >> shift) * V
        for p in range(fptr[r], fptr[r + 1]):
            t = fidx[p]
            if fdat[p] > 0.0:
                cnt[base + t] += 1


@_jit
def fill_runs(fptr, fidx, fdat, row0, inv, V, shift, pos, dense_id, offs, imps, dense):  # pragma: no cover
    """Write forward rows ``row0 ...`` into their runs: a dense run's row of impacts
    (``dense[dense_id * W + offset]``), or a sparse run's (offset, impact) pairs, rows ascending."""
    mask = (1 << shift) - 1
    W = 1 << shift
    for r in range(fptr.shape[0] - 1):
        d = row0 + r
        base = (d >> shift) * V
        off = d & mask
        for p in range(fptr[r], fptr[r + 1]):
            t = fidx[p]
            if not fdat[p] > 0.0:
                continue
            v = _quant(fdat[p], inv[t])
            key = base + t
            di = dense_id[key]
            if di >= 0:
                dense[di * W + off] = v
            else:
                q = pos[key]
                offs[q] = off
                imps[q] = v
                pos[key] = q + 1


@_jit
def _sparse_run(acc, offs, imps, s0, s1, x):  # pragma: no cover - compiled
    # slices first: indexes known to be non-negative let LLVM drop the wraparound checks
    o = offs[s0:s1]
    v = imps[s0:s1]
    for p in range(o.shape[0]):
        acc[o[p]] += x * np.float32(v[p])


@_jit
def _dense_run(acc, dense, start, count, x):  # pragma: no cover - compiled
    row = dense[start:start + count]  # slices: the loop vectorizes (about 10x faster than indexing)
    a = acc[:count]
    for i in range(count):
        a[i] += x * np.float32(row[i])


@_jit
def _hits(chunk, barf):  # pragma: no cover - compiled
    """How many values of ``chunk`` reach ``barf`` (no branch: vectorized)."""
    c = 0
    for i in range(chunk.shape[0]):
        c += chunk[i] >= barf
    return c


@_jit
def _below(bar):  # pragma: no cover - compiled
    """The largest float32 not above ``bar`` (and above 0): comparing float32 values with it is
    the same as comparing them with ``bar``."""
    f = np.float32(max(bar, 0.0))
    if np.float64(f) > bar:
        f = np.nextafter(f, np.float32(-1.0))
    return max(f, np.nextafter(np.float32(0.0), np.float32(1.0)))


@_jit
def keep(d, v, cd, cq, nc, hs, hr, size, cap, bar, ratio, slack, collect):  # pragma: no cover - compiled
    """Row ``d`` (partial score ``v``, allowed, at least ``bar``) into the candidate buffer (when
    ``collect``; it has room) and the heap of the ``cap`` best partial scores; returns the buffer
    size, the heap size and the bar (once the heap is full: ``ratio`` times its worst less
    ``slack``, if that is higher)."""
    if collect:
        cd[nc] = d
        cq[nc] = v
        nc += 1
    if _enters(hs, hr, size, cap, v, d):
        size = _push(hs, hr, size, cap, v, d)
        if size == cap and ratio * np.float64(hs[0]) - slack > bar:
            bar = ratio * np.float64(hs[0]) - slack
    return nc, size, bar


@_jit
def _scan(acc, i0, count, lo, bar, hs, hr, size, cap, slack, cd, cq, nc, allowed, use_mask, collect, ratio):  # pragma: no cover
    """Read (and zero) ``acc[i0:count]`` of the window starting at row ``lo``: rows with a partial
    score > 0 and >= ``bar`` go to the candidate buffer (when ``collect``) and the heap of the
    ``cap`` best partial scores, whose worst raises ``bar`` (once the heap is full: ``ratio`` times
    its worst less ``slack``). The window is read in chunks of 64 whose hits are counted without a
    branch first (most chunks have none once the heap is full). Returns where it stopped
    (``count``, or earlier, at a chunk start, when the buffer is full) and the new buffer size,
    heap size and bar."""
    space = cd.shape[0]
    barf = _below(bar)
    for c0 in range(i0, count, 64):
        chunk = acc[c0:min(count, c0 + 64)]
        if _hits(chunk, barf) > 0:
            if collect and nc + chunk.shape[0] > space:
                return c0, nc, size, bar
            for ii in range(chunk.shape[0]):
                s = chunk[ii]
                if s >= barf:
                    d = lo + c0 + ii
                    if not use_mask or allowed[d]:
                        nc, size, raised = keep(d, s, cd, cq, nc, hs, hr, size, cap, bar, ratio, slack, collect)
                        if raised > bar:
                            bar = raised
                            barf = _below(bar)
        chunk[:] = 0.0
    return count, nc, size, bar


@_jit
def room(cd, cq, nc, bar):  # pragma: no cover - compiled
    """The candidate buffer (rows ``cd``, partial scores ``cq``, ``nc`` used) is full: keep what
    still clears ``bar``; a new buffer of twice the size when that is more than half of it."""
    kept = 0
    for c in range(nc):
        if cq[c] >= bar:
            cd[kept] = cd[c]
            cq[kept] = cq[c]
            kept += 1
    if kept > cd.shape[0] // 2:
        cd2 = np.empty(cd.shape[0] * 2, np.int64)
        cq2 = np.empty(cd.shape[0] * 2, np.float32)
        cd2[:kept] = cd[:kept]
        cq2[:kept] = cq[:kept]
        return cd2, cq2, kept
    return cd, cq, kept


@_jit
def search(qptr, qterm, qw, inv, tmax, ptr, dense_id, offs, imps, dense, V, n, shift, fptr, fidx, fdat,
           acc, qbuf, allowed, k, depth, keep, out_rows, out_scores, work, certified):  # pragma: no cover
    """Top-k per query (see the module docstring of hybridret.index.impact_windows).

    ``depth == 0``: exact. Every run of the query's terms is added into the window's accumulator
    as 8-bit impacts times the query weight over the term's step; a partial score ``Q`` is then
    within ``E`` (one step per query term, plus float slack) of the float score, so every row
    of the exact top-k has ``Q >= Q_k - 2E`` (``Q_k`` the k-th best ``Q``): those rows are scored
    from the float forward store and the top-k taken from their exact scores.

    ``depth > 0``: approximate. The query's terms with the smallest bounds (weight times the
    term's largest weight) are dropped while their bounds sum to at most ``1 - keep`` of the
    total ``U``; the ``depth`` best partial scores of the rest are scored exactly. The answer is
    certified exact when no row left out can reach the k-th exact score: the best partial score
    not re-scored, plus ``E``, plus the dropped terms' bounds, stays below it.

    ``allowed`` (empty: every row) masks rows out at the scan. ``acc`` (one window) and ``qbuf``
    (the vocabulary) are zero on entry and on exit."""
    W = 1 << shift
    nw = (n + W - 1) >> shift
    use_mask = allowed.shape[0] > 0
    exact = depth == 0
    cap = k if exact else depth + 1
    hs = np.empty(cap, np.float32)
    hr = np.empty(cap, np.int64)
    ks = np.empty(k, np.float32)
    kr = np.empty(k, np.int64)
    cd = np.empty(1 << 14, np.int64)
    cq = np.empty(1 << 14, np.float32)
    for q in range(qptr.shape[0] - 1):
        a = qptr[q]
        m = qptr[q + 1] - a
        certified[q] = exact
        if m == 0:
            continue
        bound = np.empty(m, np.float64)
        total_u = 0.0
        for j in range(m):
            t = qterm[a + j]
            qbuf[t] = qw[a + j]
            bound[j] = np.float64(qw[a + j]) * np.float64(tmax[t])
            total_u += bound[j]
        order = np.argsort(bound)  # ascending: the cheapest to drop first
        dropped = 0.0
        first = 0
        if not exact:
            while first < m - 1 and dropped + bound[order[first]] <= (1.0 - keep) * total_u:
                dropped += bound[order[first]]
                first += 1
        kept = order[first:]
        qf = np.empty(m - first, np.float32)
        err = 0.0
        for jj in range(m - first):
            j = kept[jj]
            qf[jj] = np.float32(qw[a + j] / inv[qterm[a + j]])
            err += np.float64(qf[jj])
        err = err * (1.0 + 1e-4) + 1e-5 * total_u + 1e-7
        slack = 2.0 * err if exact else 0.0
        size = 0
        nc = 0
        bar = 0.0
        taken = 0
        for w in range(nw):
            base = w * V
            lo = w * W
            count = min(n, lo + W) - lo
            for jj in range(m - first):
                key = base + qterm[a + kept[jj]]
                di = dense_id[key]
                if di >= 0:
                    _dense_run(acc, dense, di * W, count, qf[jj])
                    taken += count
                else:
                    _sparse_run(acc, offs, imps, ptr[key], ptr[key + 1], qf[jj])
                    taken += ptr[key + 1] - ptr[key]
            i0 = 0
            while True:
                i0, nc, size, bar = _scan(acc, i0, count, lo, bar, hs, hr, size, cap, slack, cd, cq, nc,
                                          allowed, use_mask, exact, 1.0)
                if i0 >= count:
                    break
                cd, cq, nc = room(cd, cq, nc, bar)
        # exact scores of the candidates
        ksize = 0
        rescored = 0
        best_left = 0.0  # the best partial score of a candidate not re-scored (approximate mode)
        if exact:
            for c in range(nc):
                if cq[c] >= bar:
                    d = cd[c]
                    e = _row_score(d, fptr, fidx, fdat, qbuf)
                    rescored += 1
                    if e > 0.0 and _enters(ks, kr, ksize, k, e, d):
                        ksize = _push(ks, kr, ksize, k, e, d)
        else:
            # the heap holds the depth + 1 best partial scores: score all but its worst
            worst = -1
            if size == cap:
                worst = 0  # the root
                best_left = np.float64(hs[0])
            for c in range(size):
                if c == worst:
                    continue
                d = hr[c]
                e = _row_score(d, fptr, fidx, fdat, qbuf)
                rescored += 1
                if e > 0.0 and _enters(ks, kr, ksize, k, e, d):
                    ksize = _push(ks, kr, ksize, k, e, d)
            # a row not re-scored: touched, with a partial score <= best_left (only when the heap
            # was full), or untouched by the kept terms (every positive weight has an impact >= 1)
            reach = dropped * (1.0 + 1e-5)
            if size == cap:
                reach += best_left + err
            if reach == 0.0 or (ksize == k and reach < np.float64(ks[0]) / (1.0 + 1e-5)):
                certified[q] = True
        _drain(ks, kr, ksize, out_rows[q], out_scores[q])
        for j in range(m):
            qbuf[qterm[a + j]] = 0.0
        work[q, 0] = taken
        work[q, 2] = rescored
