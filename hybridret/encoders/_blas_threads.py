"""One BLAS thread for small forward passes of the numpy backend (a query), all of them for large ones.

numpy's matrix products run on the OpenBLAS it bundles, with a pool of one thread per core. For a
query's few tokens, waking and syncing that pool costs more than the product: measured on this
project's 2-core machine under load, one 10-token MiniLM pass took 140 ms median on 2 BLAS threads and
15 ms on one; and OpenBLAS's idle threads spin for a while after each call, starving the FAISS search
that follows a query encoding (the same effect ``OMP_WAIT_POLICY=PASSIVE`` removes for torch and FAISS).

:func:`single_blas_thread` sets OpenBLAS's thread count to one for the duration of a ``with`` block,
through OpenBLAS's documented ``openblas_set_num_threads`` (under the symbol names numpy's and other
builds export) of the OpenBLAS numpy itself loaded (never FAISS's private copy, which is loaded too).
The count is process-wide: nested and concurrent blocks share one reference count, and the count
before the first is restored when the last one ends. Where no OpenBLAS is loaded (MKL, Apple's
Accelerate) the block changes nothing.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["single_blas_thread"]

logger = logging.getLogger(__name__)

_SUFFIXES = ("64_", "")  # the ILP64 builds (numpy's scipy-openblas) append 64_
_PREFIXES = ("scipy_openblas", "openblas")
_lock = threading.Lock()
_state: dict[str, Any] = {"found": None, "users": 0, "before": None}


def _find() -> tuple[Any, Any] | None:
    """``(set_num_threads, get_num_threads)`` of the loaded OpenBLAS, or ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    import numpy  # noqa: F401 - numpy's BLAS must be loaded to be found

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            paths = {line.split(maxsplit=5)[-1].strip() for line in fh if "openblas" in line.lower()}
    except OSError:
        return None
    for path in _numpy_first(p for p in paths if p.startswith("/")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    setter.argtypes, setter.restype = [ctypes.c_int], None
                    getter.argtypes, getter.restype = [], ctypes.c_int
                    logger.debug("OpenBLAS thread control: %s (%s_set_num_threads%s)", path, prefix, suffix)
                    return setter, getter
    return None


def _numpy_first(paths: Iterable[str]) -> list[str]:
    """numpy's own OpenBLAS (in its package folder or the wheel's ``numpy.libs``) before any other;
    others (a system OpenBLAS a distribution's numpy links) only where numpy bundles none, and never
    another wheel's private copy (``faiss_cpu.libs``, ``scipy.libs``: changing those would change
    FAISS's threads, not numpy's)."""
    import os

    import numpy

    home = os.path.dirname(os.path.abspath(numpy.__file__))
    own = [p for p in paths if p.startswith((home + os.sep, home + ".libs" + os.sep))]
    if own:
        return sorted(own)
    return sorted(p for p in paths if not os.path.basename(os.path.dirname(p)).endswith(".libs"))


def _control() -> tuple[Any, Any] | None:
    if _state["found"] is None:
        _state["found"] = _find() or ()
    return _state["found"] or None


@contextmanager
def single_blas_thread(active: bool = True) -> Iterator[None]:
    """Run the block with one OpenBLAS thread (``active=False``: leave the count alone)."""
    if not active:
        yield
        return
    with _lock:
        control = _control()
        if control is not None:
            if _state["users"] == 0:
                _state["before"] = int(control[1]())
                control[0](1)
            _state["users"] += 1
    try:
        yield
    finally:
        if control is not None:
            with _lock:
                _state["users"] -= 1
                if _state["users"] == 0:
                    control[0](int(_state["before"]))
