"""Encoders: text -> dense vectors and/or learned sparse vectors."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import EncodedBatch, Encoder
from .cache import EncodingCache
from .dense import DenseEncoder
from .joint import JointEncoder
from .paired import PairedEncoder
from .splade import SpladeEncoder

__all__ = [
    "DenseEncoder",
    "EncodedBatch",
    "Encoder",
    "EncodingCache",
    "JointEncoder",
    "PairedEncoder",
    "SpladeEncoder",
    "encoder_from_config",
]


def encoder_from_config(config: dict[str, Any], *, device: str | None = None) -> Encoder:
    """Rebuild an encoder from :meth:`Encoder.config` output (as stored in an index manifest)."""
    cfg = dict(config)
    kind = cfg.pop("type", None)
    if kind == "paired":
        return PairedEncoder(
            encoder_from_config(cfg["dense"], device=device),  # type: ignore[arg-type]
            encoder_from_config(cfg["sparse"], device=device),  # type: ignore[arg-type]
        )
    classes: dict[str, type[Encoder]] = {"dense": DenseEncoder, "splade": SpladeEncoder, "joint": JointEncoder}
    if kind not in classes:
        raise ConfigError(f"unknown encoder type {kind!r}; expected paired, dense, splade or joint")
    model = cfg.pop("model")
    return classes[kind](model, device=device, **cfg)  # type: ignore[call-arg]
