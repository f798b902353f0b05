"""A BERT encoder's forward pass in numpy (float32): the ``"numpy"`` encoder backend, no torch needed.

What it computes is transformers' ``BertModel`` / ``BertForMaskedLM`` in evaluation mode (no dropout),
for absolute positions and the erf form of GELU, as the default models use:

* embeddings: word + position (``0..L-1``) + token type 0, then LayerNorm;
* per layer: self-attention (``softmax(QK^T / sqrt(d) + mask)``, padding keys masked out) -> output
  projection -> residual -> LayerNorm -> ``GELU(x W1 + b1) W2 + b2`` -> residual -> LayerNorm;
* the masked-LM head (SPLADE): dense -> GELU -> LayerNorm -> the word embeddings (tied) + bias.

Weights come from ``model.safetensors`` (:func:`~hybridret.encoders._safetensors.read_safetensors`),
under either naming transformers reads (``bert.`` prefix or none; ``LayerNorm.gamma``/``beta`` or
``weight``/``bias``). Other architectures stay on torch: :func:`numpy_support` says why one cannot run here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EncoderError
from ._safetensors import read_safetensors

__all__ = ["BertConfig", "NumpyBert", "numpy_support"]

WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
_NEG = np.float32(np.finfo(np.float32).min)  # what transformers adds to the scores of padding keys


@dataclass(frozen=True)
class BertConfig:
    """The settings of a BERT checkpoint the forward pass needs (from its config.json)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> BertConfig:
        """Raises :class:`EncoderError` naming ``where`` and the field for a missing or bad value."""
        sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        values: dict[str, Any] = {"max_position_embeddings": 512, "layer_norm_eps": 1e-12}
        for name in (*sizes, "max_position_embeddings", "layer_norm_eps"):
            if name not in raw and name in sizes:
                raise EncoderError(f"{where}: {name} is missing")
            value = raw.get(name, values.get(name))
            kind = float if name == "layer_norm_eps" else int
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not value > 0 or (kind is int and value != int(value)):
                raise EncoderError(f"{where}: {name} must be a positive {'number' if kind is float else 'integer'}, "
                                   f"got {value!r}")
            values[name] = kind(value)
        return cls(**values)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EncoderError(f"cannot read {path / 'config.json'}: {exc}") from exc
    if not isinstance(raw, dict):
        raise EncoderError(f"{path / 'config.json'} is not a JSON object")
    return raw


def numpy_support(path: str | Path) -> str | None:
    """Why the model folder ``path`` cannot run on the numpy backend (``None``: it can).

    The numpy forward pass covers BERT (absolute positions, GELU, an encoder only) with its weights
    in one ``model.safetensors`` and a ``tokenizer.json``; anything else runs on torch."""
    folder = Path(path)
    if not folder.is_dir():
        return f"{path} is not a local folder"
    try:
        raw = _read_config(folder)
    except EncoderError as exc:
        return str(exc)
    kind = raw.get("model_type")
    if kind != "bert":
        return f"it is a {kind!r} model; the numpy backend runs BERT only"
    checks = (
        (raw.get("position_embedding_type", "absolute") == "absolute",
         f"position_embedding_type {raw.get('position_embedding_type')!r} (the numpy backend has absolute positions)"),
        (raw.get("hidden_act", "gelu") == "gelu", f"hidden_act {raw.get('hidden_act')!r} (the numpy backend has 'gelu')"),
        (not raw.get("is_decoder") and not raw.get("add_cross_attention"), "it is a decoder"),
        ((folder / WEIGHTS_FILE).is_file(),
         f"it has no {WEIGHTS_FILE} (sharded weights need torch; pickled ones are never read)"),
        ((folder / TOKENIZER_FILE).is_file(), f"it has no {TOKENIZER_FILE} (a slow tokenizer needs transformers)"),
    )
    for ok, why in checks:
        if not ok:
            return why
    return None


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    centred /= np.sqrt(var + np.float32(eps))
    centred *= weight
    centred += bias
    return centred


# GELU's erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, below float32's resolution near 1), in
# cache-sized slices: ~4x faster than scipy.special.erf, whose float32 loop calls libm's erf per element
_P = np.float32(0.3275911)
_A = tuple(np.float32(c) for c in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429))
_SQRT_HALF = np.float32(1.0 / math.sqrt(2.0))
_SLICE = 1 << 14


def _gelu_slice(x: np.ndarray) -> None:
    """``x * (1 + erf(x / sqrt(2))) / 2`` in place, as ``relu(x) - |x| * (1 - erf(|x| / sqrt(2))) / 2``."""
    a = np.abs(x)
    z = a * _SQRT_HALF
    t = z * _P
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    poly = t * _A[4]
    for c in (_A[3], _A[2], _A[1], _A[0]):
        poly += c
        poly *= t
    np.multiply(z, z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    poly *= z  # 1 - erf(|x| / sqrt(2))
    poly *= np.float32(0.5)
    poly *= a
    np.maximum(x, np.float32(0.0), out=x)
    x -= poly


def _gelu(x: np.ndarray) -> np.ndarray:
    """GELU in its exact (erf) form, in place (``x`` must be C-contiguous)."""
    flat = x.reshape(-1)
    for start in range(0, flat.size, _SLICE):
        _gelu_slice(flat[start : start + _SLICE])
    return x


class _Weights:
    """A checkpoint's tensors under one naming: no ``bert.`` prefix, ``LayerNorm.weight``/``bias``."""

    def __init__(self, path: Path, tensors: dict[str, np.ndarray]) -> None:
        self.path = path
        body = {k[len("bert."):]: v for k, v in tensors.items() if k.startswith("bert.")}
        rest = {k: v for k, v in tensors.items() if not k.startswith("bert.")}
        merged = {**rest, **body}
        self.tensors = {_plain_name(k): v for k, v in merged.items()}

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        arr = self.tensors.get(name)
        if arr is None:
            raise EncoderError(f"{self.path}: no tensor {name!r} in {WEIGHTS_FILE} (not a BERT checkpoint hybridret's "
                               "numpy backend can read; backend='torch' loads it through transformers)")
        if tuple(arr.shape) != shape:
            raise EncoderError(f"{self.path}: tensor {name!r} has shape {tuple(arr.shape)}, the config implies {shape}")
        return np.ascontiguousarray(arr, dtype=np.float32)

    def has(self, name: str) -> bool:
        return name in self.tensors


def _plain_name(name: str) -> str:
    if name.endswith("LayerNorm.gamma"):
        return name[: -len("gamma")] + "weight"
    if name.endswith("LayerNorm.beta"):
        return name[: -len("beta")] + "bias"
    return name


class _Layer:
    """One transformer layer's weights, the linear ones transposed (``x @ W``) and Q/K/V fused."""

    def __init__(self, w: _Weights, i: int, cfg: BertConfig) -> None:
        h, m = cfg.hidden_size, cfg.intermediate_size
        p = f"encoder.layer.{i}."
        qkv = [w.get(f"{p}attention.self.{n}.weight", (h, h)) for n in ("query", "key", "value")]
        self.qkv_w = np.ascontiguousarray(np.concatenate(qkv, axis=0).T)
        self.qkv_b = np.concatenate([w.get(f"{p}attention.self.{n}.bias", (h,)) for n in ("query", "key", "value")])
        self.out_w = np.ascontiguousarray(w.get(f"{p}attention.output.dense.weight", (h, h)).T)
        self.out_b = w.get(f"{p}attention.output.dense.bias", (h,))
        self.ln1 = (w.get(f"{p}attention.output.LayerNorm.weight", (h,)), w.get(f"{p}attention.output.LayerNorm.bias", (h,)))
        self.ffn_w = np.ascontiguousarray(w.get(f"{p}intermediate.dense.weight", (m, h)).T)
        self.ffn_b = w.get(f"{p}intermediate.dense.bias", (m,))
        self.ffn_out_w = np.ascontiguousarray(w.get(f"{p}output.dense.weight", (h, m)).T)
        self.ffn_out_b = w.get(f"{p}output.dense.bias", (h,))
        self.ln2 = (w.get(f"{p}output.LayerNorm.weight", (h,)), w.get(f"{p}output.LayerNorm.bias", (h,)))


class NumpyBert:
    """A BERT checkpoint run in numpy float32. ``mlm=True`` also loads the masked-LM head.

    Thread-safe: a forward pass reads the weights and writes only its own arrays.

    Raises:
        EncoderError: the folder is not a BERT checkpoint this backend runs (see :func:`numpy_support`),
            or its weights do not match its config.
    """

    def __init__(self, path: str | Path, *, mlm: bool) -> None:
        self.path = Path(path)
        why = numpy_support(self.path)
        if why is not None:
            raise EncoderError(f"model {str(path)!r} cannot run on the numpy backend: {why}")
        self.config = cfg = BertConfig.from_dict(_read_config(self.path), str(self.path / "config.json"))
        if cfg.hidden_size % cfg.num_attention_heads:
            raise EncoderError(f"{self.path}: hidden_size {cfg.hidden_size} is not a multiple of "
                               f"num_attention_heads {cfg.num_attention_heads}")
        w = _Weights(self.path, read_safetensors(self.path / WEIGHTS_FILE))
        h = cfg.hidden_size
        self.word = w.get("embeddings.word_embeddings.weight", (cfg.vocab_size, h))
        self.position = w.get("embeddings.position_embeddings.weight", (cfg.max_position_embeddings, h))
        self.token_type0 = w.tensors.get("embeddings.token_type_embeddings.weight", np.zeros((1, h), np.float32))[0]
        self.token_type0 = np.ascontiguousarray(self.token_type0, dtype=np.float32)
        self.emb_ln = (w.get("embeddings.LayerNorm.weight", (h,)), w.get("embeddings.LayerNorm.bias", (h,)))
        self.layers = [_Layer(w, i, cfg) for i in range(cfg.num_hidden_layers)]
        self.head: tuple[np.ndarray, ...] | None = None
        if mlm:
            self.head = self._load_head(w, cfg)

    def _load_head(self, w: _Weights, cfg: BertConfig) -> tuple[np.ndarray, ...]:
        h, v = cfg.hidden_size, cfg.vocab_size
        p = "cls.predictions."
        dense_w = np.ascontiguousarray(w.get(p + "transform.dense.weight", (h, h)).T)
        dense_b = w.get(p + "transform.dense.bias", (h,))
        ln = (w.get(p + "transform.LayerNorm.weight", (h,)), w.get(p + "transform.LayerNorm.bias", (h,)))
        # the decoder is tied to the word embeddings unless the checkpoint stores its own
        decoder = w.get(p + "decoder.weight", (v, h)) if w.has(p + "decoder.weight") else self.word
        bias = w.get(p + "bias", (v,)) if w.has(p + "bias") else w.get(p + "decoder.bias", (v,))
        return dense_w, dense_b, ln[0], ln[1], np.ascontiguousarray(decoder.T), bias

    @property
    def vocab_out_size(self) -> int:
        """Rows of the masked-LM head's output (the sparse vocabulary's size)."""
        return int(self.config.vocab_size)

    def hidden(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The last hidden states ``(B, L, H)`` of a right-padded batch."""
        cfg = self.config
        b, n = input_ids.shape
        if n > cfg.max_position_embeddings:
            raise EncoderError(f"{n} tokens exceed the model's {cfg.max_position_embeddings} positions")
        heads, h = cfg.num_attention_heads, cfg.hidden_size
        d = h // heads
        if input_ids.size and (int(input_ids.max()) >= cfg.vocab_size or int(input_ids.min()) < 0):
            raise EncoderError(f"{self.path}: the tokenizer gave token id {int(input_ids.max())}, beyond the model's "
                               f"vocab_size {cfg.vocab_size}: tokenizer.json does not belong to these weights")
        x = self.word[input_ids]  # (B, L, H), a new array
        x += self.position[:n]
        x += self.token_type0
        x = _layer_norm(x, *self.emb_ln, cfg.layer_norm_eps).reshape(b * n, h)
        key_bias = np.where(attention_mask.astype(bool), np.float32(0.0), _NEG)[:, None, None, :]  # (B, 1, 1, L)
        scale = np.float32(1.0 / math.sqrt(d))
        for layer in self.layers:
            qkv = x @ layer.qkv_w
            qkv += layer.qkv_b
            # (3, B, heads, L, d), contiguous: numpy's matmul runs BLAS on contiguous stacks only
            qkv = np.ascontiguousarray(qkv.reshape(b, n, 3, heads, d).transpose(2, 0, 3, 1, 4))
            qkv[0] *= scale
            scores = qkv[0] @ qkv[1].transpose(0, 1, 3, 2)  # (B, heads, L, L)
            scores += key_bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            ctx = (scores @ qkv[2]).transpose(0, 2, 1, 3).reshape(b * n, h)
            attn = ctx @ layer.out_w
            attn += layer.out_b
            attn += x
            attn = _layer_norm(attn, *layer.ln1, cfg.layer_norm_eps)
            inner = attn @ layer.ffn_w
            inner += layer.ffn_b
            out = _gelu(inner) @ layer.ffn_out_w
            out += layer.ffn_out_b
            out += attn
            x = _layer_norm(out, *layer.ln2, cfg.layer_norm_eps)
        return x.reshape(b, n, h)

    def transform(self, states: np.ndarray) -> np.ndarray:
        """The masked-LM head's transform (dense -> GELU -> LayerNorm) of token states ``(N, H)``."""
        if self.head is None:
            raise EncoderError(f"model {str(self.path)!r} was loaded without its masked-LM head")
        dense_w, dense_b, ln_w, ln_b, _, _ = self.head
        t = states @ dense_w
        t += dense_b
        return _layer_norm(_gelu(t), ln_w, ln_b, self.config.layer_norm_eps)

    def logits(self, transformed: np.ndarray) -> np.ndarray:
        """Vocabulary logits ``(N, V)`` of transformed token states (see :meth:`transform`)."""
        assert self.head is not None  # transform() ran first
        out = transformed @ self.head[4]
        out += self.head[5]
        return out
