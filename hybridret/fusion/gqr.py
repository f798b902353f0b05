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

Everything GQR does lives here (its settings are :class:`~hybridret.fusion.config.GQRConfig`): the optimiser
(:func:`gqr_refine`), the guide (:func:`guide_signal`), its per-query weights from retriever
agreement (:func:`agreement`, :func:`guide_weights`), :func:`fuse_gqr` and :class:`GQRFusion`, the
fusion method ``"gqr"`` (it needs the candidates' dense vectors and a union of dense and its guides).

Agreement is a label-free, per-query signal of how far each retriever can be trusted (query
performance prediction), computed from the candidate union alone: a retriever whose top list shares
documents with the other retrievers' top lists is more likely right on that query than one that
agrees with nobody (the "wisdom of crowds" / reference-list idea of QPP, e.g. Shtok, Kurland and
Carmel, "Using statistical decision theory and relevance models for query-performance prediction",
SIGIR 2010; Diaz, "Performance prediction using spatial autocorrelation", SIGIR 2007). It needs
nothing but each retriever's exact scores and which candidates it listed, so a coordinator that
merges shards computes it once over the global union.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError
from ..retrievers import REGISTRY, QueryBatch, score_rows, search_rows, vectors_of
from .config import FusionConfig, FusionMethod, GQRConfig
from .scores import Candidates, FusedRows, linear_fusion, normalise, select

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from ..index.snapshot import Snapshot

__all__ = ["GQR_BLOCK", "GQRFusion", "adaptive_guide", "agreement", "agreement_weights", "fuse_gqr", "gqr_refine",
           "gqr_scores", "guide_signal", "guide_weights", "kl_loss_grad", "masked_softmax", "top_mask"]

GQR_BLOCK = 16  # queries optimised together: their candidate vectors stay in cache across the steps


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

    Queries are optimised :data:`GQR_BLOCK` at a time with float32 batched matrix products, each
    block cut to its widest real candidate list, so a block's candidate vectors stay in cache for
    all the Adam steps (2-2.5x faster than one einsum over the whole batch, same result to 1e-6).
    """
    q0 = np.asarray(queries, dtype=np.float32)
    D = np.asarray(docs, dtype=np.float32)
    valid = np.asarray(valid, dtype=bool)
    if D.ndim != 3 or D.shape[:2] != valid.shape or q0.shape != (D.shape[0], D.shape[2]):
        raise ConfigError(f"shape mismatch: queries {q0.shape}, docs {D.shape}, valid {valid.shape}")
    gv = valid if guide_valid is None else (np.asarray(guide_valid, dtype=bool) & valid)
    g = np.asarray(guide, dtype=np.float32)
    spread = np.where(gv, g, -np.inf).max(axis=1) - np.where(gv, g, np.inf).min(axis=1)
    active = np.isfinite(spread) & (spread > 1e-12) & (valid.sum(axis=1) > 1)
    out = q0.copy()
    if config.alpha == 0.0 or config.steps == 0 or not active.any():
        return out
    idx = np.flatnonzero(active)
    g_norm = normalise(g[idx], gv[idx], config.guide_norm)
    for a in range(0, len(idx), GQR_BLOCK):
        sel = idx[a:a + GQR_BLOCK]
        width = int(np.flatnonzero(valid[sel].any(axis=0)).max()) + 1
        Db, vb = D[sel, :width], valid[sel, :width]
        scores0 = np.matmul(Db, q0[sel, :, None])[:, :, 0]
        target = ((1.0 - config.alpha) * masked_softmax(scores0 / config.t_dense, vb)
                  + config.alpha * masked_softmax(g_norm[a:a + GQR_BLOCK, :width] / config.t_guide,
                                                  gv[sel, :width])).astype(np.float32)
        out[sel] = _adam(q0[sel], Db, vb, target, config)
    return out


def _adam(q0: np.ndarray, D: np.ndarray, valid: np.ndarray, target: np.ndarray, config: GQRConfig) -> np.ndarray:
    """``config.steps`` Adam steps on ``KL(target || softmax(D q / T))`` for one block of queries."""
    inv_t = np.float32(1.0 / config.t_dense)
    pad = np.where(valid, 0.0, -np.inf).astype(np.float32)
    q = q0.copy()
    m = np.zeros_like(q)
    v = np.zeros_like(q)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for step in range(1, config.steps + 1):
        logits = np.matmul(D, q[:, :, None])[:, :, 0] * inv_t + pad
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        resid = (e / e.sum(axis=1, keepdims=True) - target) * inv_t
        grad = np.matmul(resid[:, None, :], D)[:, 0, :]
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * grad * grad
        q -= (config.lr / (1 - b1**step)) * m / (np.sqrt(v / (1 - b2**step)) + eps)
    return q


def guide_signal(exact: Mapping[str, np.ndarray], valid: np.ndarray, guide: Mapping[str, float | np.ndarray]
                 ) -> np.ndarray:
    """The guide: one retriever's raw scores, or a weighted sum of z-scored scores. Weights are
    numbers or per-query arrays ``(nq,)``; they are normalised to sum to 1 (per query)."""
    if not guide:
        raise ConfigError("GQR needs at least one guide retriever")
    if len(guide) == 1:
        (name,) = guide
        return np.where(valid, exact[name], 0.0)
    weights = {n: np.broadcast_to(np.abs(np.asarray(w, dtype=np.float64)), (valid.shape[0],)) for n, w in guide.items()}
    total = sum(weights.values())
    total = np.where(total > 0, total, 1.0)  # type: ignore[call-overload]
    return sum((weights[n] / total)[:, None] * normalise(exact[n], valid, "zscore") for n in guide)  # type: ignore[return-value]


def gqr_scores(config: GQRConfig, guide: Mapping[str, float | np.ndarray], exact: Mapping[str, np.ndarray],
               valid: np.ndarray, queries: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GQR over gathered candidates: ``(refined queries (n, d), refined dense scores (n, m) with
    -inf padding, the guide signal (n, m))``. A mixture guide is z-scored already, so
    ``config.guide_norm`` applies to a single guide only."""
    g = guide_signal(exact, valid, guide)
    cfg = config if len(guide) == 1 else replace(config, guide_norm="none")
    refined = gqr_refine(queries, docs, valid, g, cfg)
    scores = np.matmul(np.asarray(docs, dtype=np.float32), refined[:, :, None])[:, :, 0]
    return refined, np.where(valid, scores, -np.inf).astype(np.float32), g


# ------------------------------------------------------------------ per-query guide weights: agreement


def top_mask(scores: np.ndarray, listed: np.ndarray, k: int) -> np.ndarray:
    """``(nq, m)`` bool: the ``k`` best-scored candidates among those ``listed`` (ties by position)."""
    if k < 1:
        raise ConfigError(f"top_mask needs k >= 1, got {k}")
    s = np.where(listed, scores, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    keep = np.take_along_axis(listed, order, axis=1)
    out = np.zeros(listed.shape, dtype=bool)
    np.put_along_axis(out, order, keep, axis=1)
    return out


def agreement(exact: Mapping[str, np.ndarray], listed: Mapping[str, np.ndarray], names: Sequence[str],
              k: int = 10) -> dict[str, np.ndarray]:
    """Per retriever and query, the mean over the *other* retrievers ``s`` of
    ``|top_k(r) ∩ top_k(s)| / k``: 1 when every other retriever has the same top ``k``, 0 when none
    shares a document. With fewer than two retrievers there is nothing to agree with: all ones."""
    names = list(names)
    missing = [n for n in names if n not in exact or n not in listed]
    if missing:
        raise ConfigError(f"agreement needs exact scores and listed masks of {missing}")
    nq = next(iter(exact.values())).shape[0] if exact else 0
    if len(names) < 2:
        return {n: np.ones(nq) for n in names}
    tops = {n: top_mask(exact[n], listed[n], k) for n in names}
    return {r: np.mean([(tops[r] & tops[s]).sum(axis=1) / k for s in names if s != r], axis=0) for r in names}


def agreement_weights(base: Mapping[str, float], agree: Mapping[str, np.ndarray], floor: float = 0.05
                      ) -> dict[str, np.ndarray]:
    """Per-query weights ``base[r] * (agree[r] + floor)``, normalised to sum to 1 per query.

    ``floor`` keeps a retriever that agrees with nobody from vanishing (and gives equal weights when
    no retriever agrees with any other)."""
    if floor <= 0:
        raise ConfigError(f"agreement floor must be positive, got {floor}")
    raw = {r: abs(float(w)) * (np.asarray(agree[r], dtype=np.float64) + floor) for r, w in base.items()}
    total = sum(raw.values())
    total = np.where(total > 0, total, 1.0)  # type: ignore[call-overload]
    return {r: v / total for r, v in raw.items()}


def adaptive_guide(guide: Mapping[str, float], exact: Mapping[str, np.ndarray], listed: Mapping[str, np.ndarray],
                   retrievers: Sequence[str]) -> dict[str, float | np.ndarray]:
    """Per-query guide weights: ``guide[r] * (agreement_r + 0.05)``, normalised, where
    ``agreement_r`` is the mean top-10 overlap of guide ``r`` with each other retriever of the union
    (:func:`agreement`, the dense one included). A single guide keeps its weight."""
    if len(guide) < 2:
        return dict(guide)
    names = [n for n in dict.fromkeys((*retrievers, *guide)) if n in exact and n in listed]
    return agreement_weights(guide, agreement(exact, listed, names))  # type: ignore[return-value]


def guide_weights(config: FusionConfig, cands: Candidates) -> dict[str, float | np.ndarray]:
    """GQR's guide weights for these candidates: ``config.guide`` as given (``guide_weighting="fixed"``)
    or scaled per query by agreement (``"agreement"``, see :func:`adaptive_guide`)."""
    if config.guide_weighting == "fixed":
        return dict(config.guide)
    return adaptive_guide(config.guide, cands.exact, cands.listed, config.union_retrievers)


# ----------------------------------------------------------------------------- the fusion method


def fuse_gqr(config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
             filt: Filter | None = None, threads: int | None = None) -> FusedRows:
    """GQR as a fusion method (``method="gqr"``, :class:`GQRFusion`): refine each dense
    query towards its guide over the candidates, then rank with it.

    ``config.gqr.final`` says how: ``"rerank"`` ranks the candidates by the refined dense score (plus
    ``final_guide`` times the z-scored guide, over z-scored refined dense, when set); ``"fuse"``
    min-max fuses the refined dense score with the guide (weights ``1 - alpha`` and ``alpha``);
    ``"research"`` searches the whole dense index again with the refined queries (under ``filt``),
    so it needs ``snap``. The candidates' vectors come from ``cands.vectors`` or else ``snap``; with a
    snapshot, its dense index must score by inner product. Component scores carry the refined dense
    score as ``"dense_refined"`` (``"research"``: the original dense score only)."""
    valid = cands.valid
    if snap is not None:
        metrics = {seg.dense.metric for seg in snap.segments if seg.dense is not None}
        if not REGISTRY["dense"].available(snap) or metrics != {"ip"}:
            raise ConfigError("GQR needs a dense index with inner-product scores (faiss_metric='ip')")
    gqr = config.gqr
    if gqr.final == "research" and snap is None:
        raise ConfigError("GQR with final='research' searches the dense index again: it needs the snapshot")
    if cands.vectors is not None:
        docs = cands.vectors
    elif snap is not None:
        docs = vectors_of(snap, cands.rows)
    else:
        raise ConfigError("GQR needs the candidates' dense vectors: gather them with vectors=True or pass the snapshot")
    if q.dense is None:
        raise ConfigError("GQR needs the queries' dense vectors")
    refined, refined_scores, g = gqr_scores(gqr, guide_weights(config, cands), cands.exact, valid, q.dense, docs)
    if gqr.final == "research":
        return _research(snap, q, refined, k, filt, threads)  # type: ignore[arg-type]
    exact = dict(cands.exact)
    exact["dense_refined"] = refined_scores
    if gqr.final_guide:  # a share of the guide kept in the final ranking (the ``hybrid`` default)
        fused = linear_fusion({"dense_refined": refined_scores, "guide": g}, valid,
                              {"dense_refined": 1.0, "guide": gqr.final_guide}, "zscore")
        return select(cands.rows, fused, exact, k)
    if gqr.final == "fuse":
        fused = linear_fusion({"dense_refined": refined_scores, "guide": g}, valid,
                              {"dense_refined": 1.0 - gqr.alpha, "guide": gqr.alpha}, "minmax")
        return select(cands.rows, fused, exact, k)
    return select(cands.rows, refined_scores, exact, k)


def _research(snap: Snapshot, q: QueryBatch, refined: np.ndarray, k: int, filt: Filter | None,
              threads: int | None = None) -> FusedRows:
    """``final="research"``: the top ``k`` of the whole dense index for the refined queries, each
    carrying its original dense score."""
    dense = REGISTRY["dense"]
    rows, scores = search_rows(dense, snap, q.with_(dense=refined), k, filt, threads=threads)
    comps = {"dense": np.where(rows >= 0, score_rows(dense, snap, q, rows, threads=threads), np.nan).astype(np.float32)}
    return rows, scores, comps


class GQRFusion(FusionMethod):
    """``method="gqr"``: dense is primary and ``config.guide`` names the guides; the union is dense and
    the guides (not ``config.retrievers``), and the candidates' dense vectors are read."""

    name = "gqr"
    vectors = True
    fuses_retrievers = False

    def union(self, config: FusionConfig) -> tuple[str, ...]:
        return ("dense", *[r for r in config.guide if r != "dense"])

    def check(self, config: FusionConfig) -> None:
        if not config.guide:
            raise ConfigError("GQR needs at least one guide retriever (sparse and/or bm25)")
        if "dense" in config.guide:
            raise ConfigError("GQR optimises the dense query: dense cannot also be its guide")

    def snapshot_setting(self, config: FusionConfig) -> str | None:
        return "final='research'" if config.gqr.final == "research" else None

    def fit(self, config: FusionConfig, have: Mapping[str, bool]) -> FusionConfig | None:
        """Dense and the guides the index has; ``None`` without dense or without any guide."""
        guide = {r: w for r, w in config.guide.items() if have.get(r)}
        if have.get("dense") and guide:
            return config.with_(guide=guide) if guide != dict(config.guide) else config
        return None

    def fuse(self, config: FusionConfig, cands: Candidates, k: int, snap: Snapshot | None, q: QueryBatch, *,
             filt: Filter | None = None, threads: int | None = None) -> FusedRows:
        return fuse_gqr(config, cands, k, snap, q, filt=filt, threads=threads)
