"""The posting-block size the BM25 store and its numba kernels share (a module of its own: the
kernels import numba, the store must not at import)."""

BLOCK = 128  # postings per block of a term's list (row order) for the block maxima of TfFactors
