"""Headroom of fusion over the candidate union, for benchmarks/fusion.py (issue #13).

Two questions: how much could *any* fusion of these retrievers' scores gain over the default, and
does a combiner learned on other collections get any of it?

* :func:`linear_grid`: z-score linear fusion of dense, sparse, BM25 and the default's refined
  dense score with every weight vector in ``{0, 1, 2}^4``; the best vector per collection (chosen on
  that collection's own test queries) is an upper bound on fixed linear fusion, and the one chosen
  leave-one-collection-out (LOCO) is the honest number.
* :func:`train_combiner`: a listwise (ListNet, Cao et al., ICML 2007) linear combiner of per-candidate
  features whose weights depend linearly on per-query features (top-10 agreement), trained on the
  other collections with each collection weighted equally and regularised towards the default
  (the refined dense score alone); scored on the held-out collection.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from hybridret.fusion.gqr import agreement
from hybridret.fusion.scores import Candidates, _ranks, normalise

GRID_SIGNALS = ("dense", "sparse", "bm25", "refined")
GRID = [w for w in itertools.product((0, 1, 2), repeat=len(GRID_SIGNALS)) if any(w)]


def _rrf_terms(scores: np.ndarray, listed: np.ndarray, k: float = 60.0) -> np.ndarray:
    """``k / (k + rank)`` within the retriever's own list (0 outside it): RRF's term, scaled to (0, 1]."""
    return np.where(listed, k / (k + _ranks(scores, listed)), 0.0)


def signals(c: Candidates, refined: np.ndarray, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Each retriever's and the refined dense score, z-scored over the union."""
    out = {n: normalise(c.exact[n], c.valid, "zscore") for n in names}
    out["refined"] = normalise(refined, c.valid, "zscore")
    return out


def linear_grid(z: dict[str, np.ndarray], valid: np.ndarray) -> dict[tuple[int, ...], np.ndarray]:
    """Fused scores for every weight vector of :data:`GRID` (over :data:`GRID_SIGNALS`)."""
    return {w: np.where(valid, sum(wi * z[s] for wi, s in zip(w, GRID_SIGNALS) if wi), -np.inf) for w in GRID}


def features(c: Candidates, z: dict[str, np.ndarray], names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-candidate features ``(nq, m, F)`` (z-scores, refined z-score, RRF terms) and per-query
    features ``(nq, G)`` (a constant and each retriever's top-10 agreement). Column 3 is the refined
    dense score: the default's own ranking signal."""
    cand = [z[n] for n in names] + [z["refined"]] + [_rrf_terms(c.exact[n], c.listed[n]) for n in names]
    agree = agreement(c.exact, c.listed, names)
    query = [np.ones(c.rows.shape[0])] + [agree[n] for n in names]
    return np.stack(cand, -1), np.stack(query, -1)


PRIOR_COLUMN = 3


def combine(W: np.ndarray, cand: np.ndarray, query: np.ndarray, valid: np.ndarray) -> np.ndarray:
    return np.where(valid, (cand * (query @ W.T)[:, None, :]).sum(-1), -np.inf)


def train_combiner(data: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], l2: float,
                   steps: int = 200) -> np.ndarray:
    """Weights ``(F, G)`` from ``(cand, query, grades, valid)`` per training collection: ListNet's
    cross-entropy between the grade distribution and the softmax of the scores, averaged per
    collection, plus ``l2 * ||W - W_default||^2`` where ``W_default`` ranks by the refined score."""
    import torch

    n_feat, n_q = data[0][0].shape[-1], data[0][1].shape[-1]
    prior = torch.zeros(n_feat, n_q, dtype=torch.float64)
    prior[PRIOR_COLUMN, 0] = 1.0
    delta = torch.zeros(n_feat, n_q, dtype=torch.float64, requires_grad=True)
    sets = []
    for cand, query, grades, valid in data:
        g = np.where(valid, np.maximum(grades, 0), 0).astype(np.float64)
        keep = g.sum(1) > 0
        sets.append((torch.tensor(cand[keep]), torch.tensor(query[keep]),
                     torch.tensor(g[keep] / g[keep].sum(1, keepdims=True)), torch.tensor(valid[keep])))
    opt = torch.optim.LBFGS([delta], lr=1, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = l2 * (delta ** 2).sum()
        for cand, query, target, valid in sets:
            s = (cand * (query @ (prior + delta).T)[:, None, :]).sum(-1).masked_fill(~valid, -1e9)
            loss = loss - (target * torch.log_softmax(s, 1)).sum(1).mean() / len(sets)
        loss.backward()
        return loss

    opt.step(closure)
    return (prior + delta).detach().numpy()


def grades_of(rows: np.ndarray, ids: Sequence[str], qids: Sequence[str], qrels: dict[str, dict[str, int]]) -> np.ndarray:
    """``(nq, m)`` relevance grade of each candidate (0 for unjudged and padding)."""
    out = np.zeros(rows.shape, dtype=np.int64)
    for i, q in enumerate(qids):
        judged = qrels.get(q, {})
        for j, r in enumerate(rows[i]):
            if r >= 0:
                out[i, j] = judged.get(ids[r], 0)
    return out
