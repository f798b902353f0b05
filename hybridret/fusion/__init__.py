"""Fusion: how several retrievers' candidates become one ranking.

* :mod:`~hybridret.fusion.config`: :class:`FusionConfig`, :class:`GQRConfig`, the method table
  :data:`FUSERS` (:class:`FusionMethod`, :func:`register_fusion`) and :func:`fuse`;
* :mod:`~hybridret.fusion.scores`: normalisation, linear and RRF over ``(nq, m)`` arrays, the
  candidate union and top-k selection;
* :mod:`~hybridret.fusion.gather`: each retriever's top list, their union and exact scores, on one snapshot;
* :mod:`~hybridret.fusion.gqr`: guided query refinement;
* :mod:`~hybridret.fusion.builtin`: the built-in methods (installed here) and ``HYBRID_DEFAULT``.

Importing any of them installs the built-in methods first (this module), so a :class:`FusionConfig`
can always name them.
"""

from .builtin import HYBRID_DEFAULT
from .config import FUSERS, FusionConfig, FusionMethod, GQRConfig, fuse, fusion_method, register_fusion, unregister_fusion
from .scores import Candidates, FusedRows

__all__ = ["FUSERS", "HYBRID_DEFAULT", "Candidates", "FusedRows", "FusionConfig", "FusionMethod", "GQRConfig", "fuse",
           "fusion_method", "register_fusion", "unregister_fusion"]
