"""Settings the native libraries (torch, FAISS) read once, when they first load.

torch and FAISS each bring an OpenMP runtime. With OpenMP's default "active" wait policy, the
idle threads of one spin and starve the other: on 2 cores, query encoding right after a FAISS
search ran 15-26x slower. hybridret therefore asks for the passive policy *before* it first loads
either library (never at import of hybridret itself). Where the application loaded torch or FAISS
first, the setting can no longer take effect, and a :class:`~hybridret.errors.PerformanceWarning`
(:mod:`warnings`, seen without any logging set-up) says how to set it.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

from .errors import PerformanceWarning

__all__ = ["prepare_native_libraries"]

logger = logging.getLogger("hybridret")
_state = {"done": False}


def prepare_native_libraries() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a policy; idempotent."""
    if _state["done"]:
        return
    _state["done"] = True
    if "OMP_WAIT_POLICY" in os.environ:
        return
    loaded = [m for m in ("torch", "faiss") if m in sys.modules]
    if loaded:
        # warnings, not only the logger: a library user sees it without configuring logging
        warnings.warn(f"{' and '.join(loaded)} was imported before hybridret could set OMP_WAIT_POLICY=PASSIVE; "
                      "hybrid queries may run many times slower on few cores. Set OMP_WAIT_POLICY=PASSIVE in the "
                      f"environment before Python starts, or create hybridret's retriever before importing {loaded[0]}.",
                      PerformanceWarning, stacklevel=3)
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
