"""The ``"onnx"`` and ``"onnx-int8"`` encoder backends: a BERT forward pass on ONNX Runtime, no torch.

The graph is never exported from torch and never read from a model folder (nothing a model folder
ships is executed): :func:`~hybridret.encoders._onnx_graph.build_graph` writes it from the weights the
numpy backend reads (``model.safetensors``, no pickle), on first use, and it is kept in a user cache
folder (:func:`cache_dir`), never in the model folder. ``"onnx-int8"`` quantises the matrix products
of that graph to int8 (``onnxruntime.quantization.quantize_dynamic``: per-output-channel weight
scales, activations quantised per call), except each layer's FFN output projection.

Cache entries are named by a SHA-256 key over what decides the graph: the graph builder's
version, the head, the quantisation, the weights' fingerprint (:func:`~hybridret.encoders.identity.fingerprint_folder`:
the config and tokenizer files whole, the size and first and last MiB of the weights) and each model
file's size and modification time; a changed weight file gives a new key, so a stale graph is never
used. Next to each ``<key>.onnx`` a ``<key>.json`` records the graph's own SHA-256, checked each time
the graph is loaded: a damaged or altered file is rebuilt, not run.

Building needs the ``onnx`` package and the weights; loading a cached graph needs only
``onnxruntime`` (the ``onnx`` extra installs both: ``pip install 'hybridret[onnx]'``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EncoderError, MissingDependencyError
from ._numpy_bert import WEIGHTS_FILE, BertConfig, NumpyBert, _read_config
from ._onnx_graph import GRAPH_VERSION, SPLADE_TOKENS, build_graph
from .backends import ONNX_INSTALL

__all__ = ["CACHE_ENV", "OnnxBert", "cache_dir", "cache_key"]

logger = logging.getLogger("hybridret.encoders")

CACHE_ENV = "HYBRIDRET_CACHE_DIR"
QUANTS = ("fp32", "int8")


def cache_dir() -> Path:
    """Where built graphs are kept: ``$HYBRIDRET_CACHE_DIR/onnx``, else ``$XDG_CACHE_HOME/hybridret/onnx``,
    else ``~/.cache/hybridret/onnx``."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser() / "onnx"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "hybridret" / "onnx"


def cache_key(path: str | Path, head: str, quant: str) -> str:
    """The cache key of the graph of the model folder ``path`` with output ``head`` and ``quant``."""
    from .identity import _model_files, fingerprint_folder

    folder = Path(path)
    digest = hashlib.sha256(f"hybridret-onnx\0{GRAPH_VERSION}\0{head}\0{quant}\0".encode())
    digest.update(fingerprint_folder(folder).encode())
    for f in _model_files(folder):
        st = f.stat()
        digest.update(f"\0{f.name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return digest.hexdigest()


def _import_ort() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependencyError(f"encoder backends 'onnx' and 'onnx-int8' need onnxruntime, which is not "
                                     f"installed: {ONNX_INSTALL}") from exc
    return onnxruntime


class OnnxBert:
    """A BERT checkpoint run by ONNX Runtime, with the numpy backend's interface for what the
    encoders call: ``config``, ``vocab_out_size``, :meth:`hidden` (``head="hidden"``) and
    :meth:`splade` (``head="splade"``). One session, one intra-op thread: the runner runs several
    batches at once on its own threads (ONNX Runtime's ``run`` is thread-safe and releases the GIL).

    Raises:
        MissingDependencyError: onnxruntime is not installed (or onnx, when a graph must be built).
        EncoderError: the folder is not a BERT checkpoint the numpy backend reads (the graph is
            built from the same weights), or the cache folder cannot be written.
    """

    def __init__(self, path: str | Path, *, head: str, quant: str = "fp32") -> None:
        if quant not in QUANTS:
            raise EncoderError(f"unknown quantisation {quant!r}; expected one of {', '.join(QUANTS)}")
        ort = _import_ort()
        self.path = Path(path)
        self.head = head
        self.quant = quant
        self.config = BertConfig.from_dict(_read_config(self.path), str(self.path / "config.json"))
        self.key = cache_key(self.path, head, quant)
        self.graph_file = cache_dir() / f"{self.key}.onnx"
        graph = self._cached() or self._build()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        # EXTENDED: the fusions; ALL adds layout transforms for convolutions (none here) and costs load time
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.log_severity_level = 3  # onnxruntime's shape-merge warnings are not the user's business
        try:
            self.session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph classes
            raise EncoderError(f"onnxruntime cannot load the graph built for {self.path} ({self.graph_file}): "
                               f"{type(exc).__name__}: {exc}") from exc

    @property
    def vocab_out_size(self) -> int:
        return int(self.config.vocab_size)

    def describe(self) -> str:
        return f"onnxruntime {self.quant} graph {self.graph_file}"

    # -- the cache ------------------------------------------------------------------------------
    def _cached(self) -> bytes | None:
        meta_file = self.graph_file.with_suffix(".json")
        if not self.graph_file.is_file() or not meta_file.is_file():
            return None
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            data = self.graph_file.read_bytes()
        except (OSError, ValueError) as exc:
            logger.warning("cannot read the cached graph %s (%s); rebuilding it", self.graph_file, exc)
            return None
        if not isinstance(meta, dict) or meta.get("sha256") != hashlib.sha256(data).hexdigest():
            logger.warning("the cached graph %s does not match its recorded SHA-256; rebuilding it", self.graph_file)
            return None
        logger.debug("%s: cached graph %s", self.path, self.graph_file)
        return data

    def _build(self) -> bytes:
        try:
            import onnx  # noqa: F401 - the graph builder's helper API
        except ImportError as exc:
            raise MissingDependencyError(f"encoder backend 'onnx' builds its graph with the onnx package, which is "
                                         f"not installed: {ONNX_INSTALL}") from exc
        logger.info("%s: building the %s ONNX graph (%s, once; cached in %s)", self.path, self.quant, self.head,
                    self.graph_file.parent)
        model = build_graph(NumpyBert(self.path, mlm=self.head == "splade"), self.head)
        data = model.SerializeToString()
        if self.quant == "int8":
            data = _quantise(data)
        folder = self.graph_file.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, payload in ((self.graph_file, data),
                                  (self.graph_file.with_suffix(".json"),
                                   json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "model": str(self.path),
                                               "head": self.head, "quant": self.quant, "graph_version": GRAPH_VERSION,
                                               "weights": WEIGHTS_FILE}, indent=1).encode())):
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
                with os.fdopen(fd, "wb") as fh:
                    fh.write(payload)
                os.replace(tmp, name)
        except OSError as exc:  # the graph still runs from memory; the next start builds it again
            logger.warning("cannot write the ONNX graph cache %s (%s); set %s to a writable folder", folder, exc,
                           CACHE_ENV)
        return data

    # -- forward passes -------------------------------------------------------------------------
    def _check(self, input_ids: np.ndarray) -> None:
        cfg = self.config
        if input_ids.shape[1] > cfg.max_position_embeddings:
            raise EncoderError(f"{input_ids.shape[1]} tokens exceed the model's {cfg.max_position_embeddings} positions")
        if input_ids.size and (int(input_ids.max()) >= cfg.vocab_size or int(input_ids.min()) < 0):
            raise EncoderError(f"{self.path}: the tokenizer gave token id {int(input_ids.max())}, beyond the model's "
                               f"vocab_size {cfg.vocab_size}: tokenizer.json does not belong to these weights")

    def hidden(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The last hidden states ``(B, L, H)`` of a right-padded batch (a ``"hidden"`` graph)."""
        if self.head != "hidden":
            raise EncoderError(f"{self.path}: this graph computes {self.head!r}, not the hidden states")
        self._check(input_ids)
        return self.session.run(None, {"input_ids": input_ids.astype(np.int64, copy=False),
                                       "attention_mask": attention_mask.astype(np.int64, copy=False)})[0]

    def splade(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """``max over real tokens of relu(logits)`` per text, ``(B, V)`` (a ``"splade"`` graph), run
        on slices of at most :data:`SPLADE_TOKENS` tokens (one text per slice at least)."""
        if self.head != "splade":
            raise EncoderError(f"{self.path}: this graph computes {self.head!r}, not SPLADE weights")
        self._check(input_ids)
        ids = input_ids.astype(np.int64, copy=False)
        mask = attention_mask.astype(np.int64, copy=False)
        step = max(1, SPLADE_TOKENS // max(1, ids.shape[1]))
        parts = [self.session.run(None, {"input_ids": ids[s : s + step], "attention_mask": mask[s : s + step]})[0]
                 for s in range(0, ids.shape[0], step)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _quantise(data: bytes) -> bytes:
    """The graph with its matrix products in int8 (per-output-channel weight scales), except the FFN
    output projections."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load_from_string(data)
    # the FFN's output projections stay float32: their inputs (GELU's outputs, skewed, down to -0.17) lose
    # the most to 8 bits. Measured on 64 msmarco passages (MiniLM): dense cosine to float32 mean 0.9954 with
    # every MatMul in int8, 0.9984 with these kept, at 3.0x and 2.0x float32's speed (benchmarks/encode_speed.py)
    keep = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1].endswith("ffn_out_w")]
    with tempfile.TemporaryDirectory(prefix="hybridret-onnx-") as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        src.write_bytes(data)
        quantize_dynamic(src, dst, per_channel=True, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                         nodes_to_exclude=keep, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        return dst.read_bytes()
