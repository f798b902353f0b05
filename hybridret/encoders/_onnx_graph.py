"""A BERT forward pass written as an ONNX graph from the numpy backend's weights: no torch, no export.

:func:`build_graph` turns a :class:`~hybridret.encoders._numpy_bert.NumpyBert` (weights read from
``model.safetensors`` without pickle) into an ONNX ``ModelProto`` with the ``onnx`` package's helper
API. It computes what :meth:`NumpyBert.hidden` computes, with ONNX Runtime's fused CPU kernels
(``com.microsoft`` domain): ``Attention`` (Q/K/V projection, scaled dot products, padding keys
masked, softmax, context), ``SkipLayerNormalization`` (residual + bias + LayerNorm in one pass) and
``BiasGelu`` (the erf form of GELU, as the default models use). Two outputs, by ``head``:

* ``"hidden"``: the last hidden states ``(B, L, H)`` (the dense models pool them in numpy);
* ``"splade"``: the masked-LM head and SPLADE's max pooling inside the graph, ``(B, V)``:
  ``relu(max over real tokens of the logits)`` (= the numpy backend's running max started at 0).
  Padding positions are given their text's first token's state (a repeated row leaves a max
  unchanged) and the bias is added after the max (it is the same for every token), so the
  ``(B, L, V)`` products pass once through ``ReduceMax``: no bias, mask or ReLU pass over them.
  ``log1p``, the vocabulary mask and top-k stay in numpy. The graph never hands back the logits;
  callers bound ``B x L`` (:data:`SPLADE_TOKENS`).

Inputs: ``input_ids`` and ``attention_mask``, int64 ``(B, L)``, right-padded. Opset 17 (the
standard ``LayerNormalization``) plus ``com.microsoft`` 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._numpy_bert import NumpyBert

__all__ = ["GRAPH_VERSION", "HEADS", "SPLADE_TOKENS", "build_graph"]

# bump when the graph built for the same weights changes: cached graphs of an older version are rebuilt
GRAPH_VERSION = 4
HEADS = ("hidden", "splade")
# tokens (rows of B x L) per run of a "splade" graph: its (rows, V) logits are 4 x rows x V bytes
# (62 MB for a 30,522-term vocabulary), whatever the batch size
SPLADE_TOKENS = 512
_MS = "com.microsoft"


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, kind: str, inputs: list[str], domain: str = "", **attrs: Any) -> str:
        from onnx import helper

        self._n += 1
        out = f"{kind.lower()}_{self._n}"
        self.nodes.append(helper.make_node(kind, inputs, [out], name=out, domain=domain, **attrs))
        return out


def build_graph(model: NumpyBert, head: str) -> Any:
    """The ONNX model of ``model``'s forward pass with output ``head`` (see the module docstring).

    Raises:
        ValueError: an unknown head, or ``"splade"`` for a model loaded without its masked-LM head.
    """
    from onnx import TensorProto, helper

    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; expected one of {', '.join(HEADS)}")
    if head == "splade" and model.head is None:
        raise ValueError(f"{model.path}: the 'splade' graph needs the masked-LM head (mlm=True)")
    cfg = model.config
    eps = float(cfg.layer_norm_eps)
    g = _Builder()
    ids, mask = "input_ids", "attention_mask"
    # embeddings: word + position (0..L-1) + token type 0, then LayerNorm
    words = g.op("Gather", [g.const("word_embeddings", model.word), ids])
    length = g.op("Shape", [ids], start=1, end=2)  # [L], 1-D
    pos = g.op("Slice", [g.const("position_embeddings", model.position), g.const("zero_1d", np.array([0], np.int64)),
                         length, g.const("axis0_1d", np.array([0], np.int64))])
    g.const("one_1d", np.array([1], np.int64))
    g.const("one_1d_axis", np.array([1], np.int64))
    x = g.op("Add", [g.op("Add", [words, pos]), g.const("token_type0", model.token_type0)])
    x = g.op("LayerNormalization", [x, g.const("emb_ln_w", model.emb_ln[0]), g.const("emb_ln_b", model.emb_ln[1])],
             axis=-1, epsilon=eps)
    mask32 = g.op("Cast", [mask], to=TensorProto.INT32)
    for i, layer in enumerate(model.layers):
        p = f"l{i}_"
        ctx = g.op("Attention", [x, g.const(p + "qkv_w", layer.qkv_w), g.const(p + "qkv_b", layer.qkv_b), mask32],
                   domain=_MS, num_heads=cfg.num_attention_heads)
        attn = g.op("MatMul", [ctx, g.const(p + "out_w", layer.out_w)])
        x1 = g.op("SkipLayerNormalization", [attn, x, g.const(p + "ln1_w", layer.ln1[0]),
                                             g.const(p + "ln1_b", layer.ln1[1]), g.const(p + "out_b", layer.out_b)],
                  domain=_MS, epsilon=eps)
        inner = g.op("BiasGelu", [g.op("MatMul", [x1, g.const(p + "ffn_w", layer.ffn_w)]),
                                  g.const(p + "ffn_b", layer.ffn_b)], domain=_MS)
        out = g.op("MatMul", [inner, g.const(p + "ffn_out_w", layer.ffn_out_w)])
        x = g.op("SkipLayerNormalization", [out, x1, g.const(p + "ln2_w", layer.ln2[0]),
                                            g.const(p + "ln2_b", layer.ln2[1]), g.const(p + "ffn_out_b", layer.ffn_out_b)],
                 domain=_MS, epsilon=eps)
    if head == "hidden":
        shape = ["batch", "length", cfg.hidden_size]
    else:
        assert model.head is not None
        dense_w, dense_b, ln_w, ln_b, decoder, bias = model.head
        t = g.op("BiasGelu", [g.op("MatMul", [x, g.const("head_dense_w", dense_w)]), g.const("head_dense_b", dense_b)],
                 domain=_MS)
        t = g.op("LayerNormalization", [t, g.const("head_ln_w", ln_w), g.const("head_ln_b", ln_b)], axis=-1, epsilon=eps)
        # padding positions take the text's first token's state: a repeated row leaves the max unchanged,
        # so no (B, L, V) mask or ReLU pass is needed; the ReLU runs on the pooled (B, V)
        first = g.op("Slice", [t, "zero_1d", "one_1d", "one_1d_axis"])
        real = g.op("Unsqueeze", [g.op("Cast", [mask], to=TensorProto.BOOL), g.const("axis_last", np.array([2], np.int64))])
        t = g.op("Where", [real, t, first])
        # the bias is the same for every token: added after the max, to (B, V) instead of (B, L, V)
        pooled = g.op("ReduceMax", [g.op("MatMul", [t, g.const("decoder_w", decoder)])], axes=[1], keepdims=0)
        g.op("Relu", [g.op("Add", [pooled, g.const("decoder_b", bias)])])
        shape = ["batch", model.vocab_out_size]
    g.nodes[-1].output[0] = "output"  # the last node written is the graph's output
    graph = helper.make_graph(
        g.nodes, f"hybridret-bert-{head}",
        [helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "length"]),
         helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "length"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
        g.inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(_MS, 1)],
                                   producer_name="hybridret")
    onnx_model.ir_version = 8  # readable by every onnxruntime that has opset 17
    return onnx_model
