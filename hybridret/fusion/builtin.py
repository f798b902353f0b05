"""The built-in fusion methods (``linear``, ``rrf``, ``gqr``), registered in :data:`~hybridret.fusion.config.FUSERS`,
and :data:`HYBRID_DEFAULT`, what ``method="hybrid"`` runs.

Linear and RRF fuse ``config.retrievers``' exact scores of the candidate union; GQR is
:class:`hybridret.fusion.gqr.GQRFusion`. A method from outside is one :class:`FusionMethod`
subclass and one :func:`~hybridret.fusion.config.register_fusion` call, the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import FusionConfig, FusionMethod, GQRConfig, install_builtin
from .gqr import GQRFusion
from .scores import Candidates, FusedRows, linear_fusion, rrf_fusion, select

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from ..index.snapshot import Snapshot
    from ..retrievers import QueryBatch

__all__ = ["HYBRID_DEFAULT", "HYBRID_FINAL_GUIDE", "LinearFusion", "RRFFusion"]


class LinearFusion(FusionMethod):
    """Weighted sum of the retrievers' normalised exact scores (``config.normalisation``)."""

    name = "linear"

    def fuse(self, config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
             filt: Filter | None = None, threads: int | None = None) -> FusedRows:
        fused = linear_fusion({r: cands.exact[r] for r in config.retrievers}, cands.valid, config.weights,
                              config.normalisation)
        return select(cands.rows, fused, cands.exact, k)


class RRFFusion(FusionMethod):
    """Reciprocal rank fusion over the retrievers whose own list holds each candidate."""

    name = "rrf"

    def fuse(self, config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
             filt: Filter | None = None, threads: int | None = None) -> FusedRows:
        fused = rrf_fusion({r: cands.exact[r] for r in config.retrievers}, cands.listed, config.rrf_k, config.weights)
        return select(cands.rows, fused, cands.exact, k)


install_builtin(LinearFusion(), RRFFusion(), GQRFusion())

HYBRID_FINAL_GUIDE = 0.25  # picked on 6 of 7 leave-one-collection-out folds of a sweep (docs/fusion.md)
HYBRID_DEFAULT = FusionConfig(method="gqr", guide_weighting="agreement", gqr=GQRConfig(final_guide=HYBRID_FINAL_GUIDE))
"""What ``method="hybrid"`` runs on an index with dense, learned sparse and BM25: GQR with the guide
weighted per query by top-10 agreement, ranking by the z-scored refined dense score plus a quarter
of the z-scored guide."""
