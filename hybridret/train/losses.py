"""Training losses: contrastive InfoNCE, the FLOPS sparsity regulariser and margin-MSE distillation."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

__all__ = ["flops", "info_nce", "margin_mse"]


def info_nce(q: Any, d: Any, temperature: float = 0.05, *, mask: Any = None) -> Any:
    """Contrastive loss of ``B`` queries against ``B * (1 + n_neg)`` documents.

    Document rows are grouped per query: rows ``i * (1 + n_neg)`` is query ``i``'s positive, the
    next ``n_neg`` rows its hard negatives. Every other row of the batch (other queries'
    positives and negatives) is an in-batch negative. ``mask`` (bool ``(B, B * (1 + n_neg))``)
    marks columns to ignore, e.g. another copy of a query's positive. Scores are dot products
    divided by ``temperature``.
    """
    import torch

    b, rows = q.shape[0], d.shape[0]
    if b == 0 or rows % b:
        raise ConfigError(f"info_nce needs B * (1 + n_neg) document rows for B={b} queries, got {rows}")
    if temperature <= 0:
        raise ConfigError(f"temperature must be positive, got {temperature}")
    group = rows // b
    scores = q.float() @ d.float().T / temperature
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    labels = torch.arange(b, device=q.device) * group
    return torch.nn.functional.cross_entropy(scores, labels)


def flops(sparse_batch: Any) -> Any:
    """FLOPS regulariser (Paria et al., 2020): ``sum_j (mean_i w_ij)^2`` over a ``(B, V)`` batch of
    non-negative term weights. It approximates the expected number of floating-point operations
    of a sparse dot product, and pushes rarely useful terms to zero."""
    return (sparse_batch.float().mean(dim=0) ** 2).sum()


def margin_mse(student_pos: Any, student_neg: Any, teacher_pos: Any, teacher_neg: Any) -> Any:
    """Margin-MSE (Hofstätter et al., 2020): mean of ``((s+ - s-) - (t+ - t-))^2``.

    ``*_pos`` are ``(B,)`` scores of each query's positive; ``*_neg`` are ``(B,)`` or ``(B, n)``
    scores of its negatives (positives broadcast over the ``n`` negatives).
    """
    import torch

    def margin(pos: Any, neg: Any) -> Any:
        pos = pos.float()
        neg = neg.float()
        return (pos.unsqueeze(-1) if neg.dim() == 2 else pos) - neg

    s, t = margin(student_pos, student_neg), margin(teacher_pos, teacher_neg)
    if s.shape != t.shape:
        raise ConfigError(f"student margins {tuple(s.shape)} and teacher margins {tuple(t.shape)} differ")
    return torch.nn.functional.mse_loss(s, t.to(s.device))
