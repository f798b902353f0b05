"""Guided Query Refinement (GQR): test-time optimisation of the dense query vector.

After Uzan et al., "Guided Query Refinement: Multimodal Hybrid Retrieval with Test-Time
Optimization" (ICLR 2026). For each query, over its candidate set U (the union of every
retriever's top list, each candidate scored exactly by every retriever):

* target ``m = (1 - alpha) * softmax(s_dense / T_dense) + alpha * softmax(g / T_guide)``, fixed from
  the initial scores, where ``g`` is the guide's score (learned sparse, BM25, or a weighted mixture
  of their normalised scores);
* loss ``KL(m || p)``, ``p = softmax(D_U q / T_dense)``, minimised over ``q`` by Adam; the gradient is
  ``D_U^T (p - m) / T_dense`` in closed form, computed for all queries at once.

Dense cosines live in [-1, 1] while sparse dot products run to 10-40 and BM25 to 5-30, so each side
has its own temperature, and guide scores are z-scored over U by default (then ``T_guide = 1``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .errors import ConfigError, check_fields
from .fusion import normalise

__all__ = ["GQRConfig", "gqr_refine", "kl_loss_grad", "masked_softmax"]

FINAL_MODES = ("rerank", "research", "fuse")


@dataclass(frozen=True)
class GQRConfig:
    """GQR settings. Defaults were checked on the shared collections (see docs/benchmarks.md)."""

    alpha: float = 0.5  # weight of the guide in the target; 0 leaves the dense ranking unchanged
    t_dense: float = 0.1  # temperature of the dense (cosine) scores
    t_guide: float = 1.0  # temperature of the (normalised) guide scores
    guide_norm: str = "zscore"  # none | minmax | zscore, applied to guide scores over U
    steps: int = 50
    lr: float = 1e-3
    final: str = "rerank"  # rerank U | research the dense index | fuse refined dense with guide

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"GQR alpha must be in [0, 1], got {self.alpha}")
        if self.t_dense <= 0 or self.t_guide <= 0:
            raise ConfigError("GQR temperatures must be positive")
        if self.steps < 0 or self.lr <= 0:
            raise ConfigError("GQR needs steps >= 0 and lr > 0")
        if self.final not in FINAL_MODES:
            raise ConfigError(f"GQR final must be one of {', '.join(FINAL_MODES)}, got {self.final!r}")
        if self.guide_norm not in ("none", "minmax", "zscore"):
            raise ConfigError(f"GQR guide_norm must be none, minmax or zscore, got {self.guide_norm!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GQRConfig:
        check_fields(cls, data, "GQR")
        return cls(**data)


def masked_softmax(logits: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Row-wise softmax over valid entries (invalid -> probability 0)."""
    x = np.where(valid, logits, -np.inf)
    x = x - x.max(axis=1, keepdims=True)
    e = np.where(valid, np.exp(x), 0.0)
    return e / np.maximum(e.sum(axis=1, keepdims=True), 1e-30)


def kl_loss_grad(q: np.ndarray, D: np.ndarray, valid: np.ndarray, target: np.ndarray, t_dense: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``KL(target || softmax(D q / T))`` per query and its gradient ``D^T (p - target) / T``."""
    logits = np.einsum("nd,nmd->nm", q, D) / t_dense
    p = masked_softmax(logits, valid)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(valid & (target > 0), target * (np.log(target) - np.log(np.maximum(p, 1e-30))), 0.0)
    grad = np.einsum("nm,nmd->nd", p - target, D) / t_dense
    return terms.sum(axis=1), grad


def gqr_refine(
    queries: np.ndarray,
    docs: np.ndarray,
    valid: np.ndarray,
    guide: np.ndarray,
    config: GQRConfig = GQRConfig(),
    *,
    guide_valid: np.ndarray | None = None,
) -> np.ndarray:
    """Refine dense query vectors ``(n, d)`` against candidate vectors ``(n, m, d)``.

    ``valid`` marks real candidates; ``guide`` holds the guide's exact scores ``(n, m)`` (raw: they
    are normalised here per ``config.guide_norm``). A query whose guide gives every candidate the
    same score (for example no query term matches anything) keeps its original vector.
    """
    # float32 throughout: twice the speed of float64, and far more precision than rankings need
    q0 = np.asarray(queries, dtype=np.float32)
    D = np.asarray(docs, dtype=np.float32)
    valid = np.asarray(valid, dtype=bool)
    if D.ndim != 3 or D.shape[:2] != valid.shape or q0.shape != (D.shape[0], D.shape[2]):
        raise ConfigError(f"shape mismatch: queries {q0.shape}, docs {D.shape}, valid {valid.shape}")
    gv = valid if guide_valid is None else (np.asarray(guide_valid, dtype=bool) & valid)
    g = np.asarray(guide, dtype=np.float32)
    spread = np.where(gv, g, -np.inf).max(axis=1) - np.where(gv, g, np.inf).min(axis=1)
    active = np.isfinite(spread) & (spread > 1e-12) & (valid.sum(axis=1) > 1)
    if config.alpha == 0.0 or config.steps == 0 or not active.any():
        return q0.astype(np.float32)
    q = q0[active].copy()
    D, valid, gv, g = D[active], valid[active], gv[active], g[active]
    scores0 = np.einsum("nd,nmd->nm", q, D)
    g_norm = normalise(g, gv, config.guide_norm)
    target = ((1.0 - config.alpha) * masked_softmax(scores0 / config.t_dense, valid)
              + config.alpha * masked_softmax(g_norm / config.t_guide, gv)).astype(np.float32)
    m = np.zeros_like(q)
    v = np.zeros_like(q)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for step in range(1, config.steps + 1):
        _, grad = kl_loss_grad(q, D, valid, target, config.t_dense)
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad * grad
        q -= config.lr * (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + eps)
    out = q0.copy()
    out[active] = q
    return out.astype(np.float32)
