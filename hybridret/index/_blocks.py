"""Small shared pieces of the numba-backed parts that must not import numba at import time: the
posting-block size of the BM25 store and its kernels, and the thread pool over query blocks."""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCK = 128  # postings per block of a term's list (row order) for the block maxima of TfFactors


def in_blocks(nq: int, workers: int, block: Any) -> None:
    """``block(a, b)`` over ``nq`` queries: at once, or cut into ``workers`` slices run on a thread pool."""
    if workers <= 1:
        block(0, nq)
        return
    from concurrent.futures import ThreadPoolExecutor

    cuts = np.linspace(0, nq, workers + 1).astype(int)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda w: block(int(cuts[w]), int(cuts[w + 1])), range(workers)))
