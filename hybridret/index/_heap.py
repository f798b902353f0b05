"""numba building blocks of the top-k kernels (BM25 store, impact part): a size-``k`` heap of
(score, row) whose root is the worst kept (lower score, or the same score and a larger row), so
results come out score descending, ties by row ascending. Imported only where numba is."""

from __future__ import annotations

from typing import Any

import numba


def jit(fn: Any) -> Any:
    """``numba.njit(nogil=True)``, cached on disk where a cache location is writable."""
    try:
        return numba.njit(nogil=True, cache=True)(fn)
    except RuntimeError:  # pragma: no cover - no writable cache location: compile in memory
        return numba.njit(nogil=True)(fn)


@jit
def enters(hs, hr, size, k, s, d):  # pragma: no cover - compiled
    """Would ``(s, d)`` enter the heap? Callers test before :func:`push` (inline: much cheaper
    than calling for every value)."""
    return size < k or s > hs[0] or (s == hs[0] and d < hr[0])


@jit
def push(hs, hr, size, k, s, d):  # pragma: no cover - compiled
    """Keep ``(s, d)`` in the heap (it must enter); returns the new size."""
    if size < k:  # push and sift up
        c = size
        size += 1
        while c > 0:
            par = (c - 1) // 2
            if hs[par] < s or (hs[par] == s and hr[par] > d):
                break
            hs[c] = hs[par]
            hr[c] = hr[par]
            c = par
        hs[c] = s
        hr[c] = d
        return size
    c = 0  # replace the root and sift down
    while True:
        lft = 2 * c + 1
        if lft >= size:
            break
        m = lft
        rgt = lft + 1
        if rgt < size and (hs[rgt] < hs[lft] or (hs[rgt] == hs[lft] and hr[rgt] > hr[lft])):
            m = rgt
        if hs[m] < s or (hs[m] == s and hr[m] > d):
            hs[c] = hs[m]
            hr[c] = hr[m]
            c = m
        else:
            break
    hs[c] = s
    hr[c] = d
    return size


@jit
def drain(hs, hr, size, out_rows, out_scores):  # pragma: no cover - compiled
    """Pop the heap, worst first, into the last free slot: ``out`` best first."""
    while size > 0:
        size -= 1
        out_scores[size] = hs[0]
        out_rows[size] = hr[0]
        ls, lr = hs[size], hr[size]
        c = 0
        while True:
            lft = 2 * c + 1
            if lft >= size:
                break
            m = lft
            rgt = lft + 1
            if rgt < size and (hs[rgt] < hs[lft] or (hs[rgt] == hs[lft] and hr[rgt] > hr[lft])):
                m = rgt
            if hs[m] < ls or (hs[m] == ls and hr[m] > lr):
                hs[c] = hs[m]
                hr[c] = hr[m]
                c = m
            else:
                break
        hs[c] = ls
        hr[c] = lr
