"""Encoders: text -> dense vectors and/or learned sparse vectors."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import EncodedBatch, Encoder
from .cache import EncodingCache
from .dense import DenseEncoder
from .identity import FINGERPRINT_KEYS, check_fingerprint, compare_configs, model_fingerprint
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
    "compare_configs",
    "encoder_from_config",
    "model_fingerprint",
]


def encoder_from_config(config: dict[str, Any], *, device: str | None = None, verify: bool = True) -> Encoder:
    """Rebuild an encoder from :meth:`Encoder.config` output (as stored in an index manifest).

    The models load on first use (or :meth:`Encoder.warm`). With ``verify`` (the default) the
    weights the names resolve to now must have the fingerprints stored in the config; a config
    without fingerprints (older hybridret) is accepted unverified.

    Raises:
        ConfigError: an unknown encoder type or setting.
        ModelNotFoundError: a model folder or package is missing.
        EncoderError: ``verify`` and the weights are not the ones the config was made with.
    """
    if not isinstance(config, dict):
        raise ConfigError(f"an encoder config must be a mapping, got {type(config).__name__}")
    cfg = dict(config)
    kind = cfg.pop("type", None)
    if kind == "paired":
        if not isinstance(cfg.get("dense"), dict) or not isinstance(cfg.get("sparse"), dict):
            raise ConfigError("a paired encoder config needs 'dense' and 'sparse' configs")
        return PairedEncoder(
            encoder_from_config(cfg["dense"], device=device, verify=verify),  # type: ignore[arg-type]
            encoder_from_config(cfg["sparse"], device=device, verify=verify),  # type: ignore[arg-type]
        )
    classes: dict[str, type[Encoder]] = {"dense": DenseEncoder, "splade": SpladeEncoder, "joint": JointEncoder}
    if kind not in classes:
        raise ConfigError(f"unknown encoder type {kind!r}; expected paired, dense, splade or joint")
    stored = {key: cfg.pop(key, None) for key in FINGERPRINT_KEYS}
    if "model" not in cfg:
        raise ConfigError(f"the {kind} encoder config names no model")
    model = cfg.pop("model")
    try:
        encoder = classes[kind](model, device=device, **cfg)  # type: ignore[call-arg]
    except TypeError as exc:  # a setting this version does not know
        raise ConfigError(f"invalid {kind} encoder settings {sorted(cfg)}: {exc}") from exc
    if verify:
        for fp_key, model_key in FINGERPRINT_KEYS.items():
            name = model if model_key == "model" else cfg.get(model_key)
            if name is not None:
                check_fingerprint(str(name), stored[fp_key], encoder._fingerprint(str(name)))
    return encoder
