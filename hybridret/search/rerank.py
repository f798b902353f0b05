"""A reranking stage: score the first stage's top ``rerank_depth`` hits against the query.

``search(..., rerank=reranker, rerank_depth=n)`` hands each query and the texts (title and text)
of its first-stage top ``n`` to a :class:`Reranker`; its score becomes the hit's score and its
``"rerank"`` component, and the hits are ordered by it (see :mod:`hybridret.search.run`).

:class:`Reranker` is one method, so any model plugs in. :class:`CrossEncoderReranker` runs a local
Hugging Face cross-encoder folder (``AutoModelForSequenceClassification``), e.g. one downloaded
with ``huggingface-cli download cross-encoder/ms-marco-MiniLM-L6-v2 --local-dir models/minilm``:
``search(..., rerank="models/minilm")``. It never runs code from the folder: ``trust_remote_code``
is off, and only ``model.safetensors`` weights are read (a pickled ``pytorch_model.bin`` is
refused, since unpickling can run code). The score of a pair is the model's single logit (a model
with several labels: the last label's logit, by the convention that it is "relevant").

**Offline**: the folder is all it reads (``local_files_only=True``: no download, no look-up on the
Hub, whatever ``HF_HUB_OFFLINE`` says), so a folder copied from a connected machine, or one written
with ``model.save_pretrained(folder, safe_serialization=True)`` and ``tokenizer.save_pretrained(folder)``,
works on a machine without a network. It needs ``config.json``, ``model.safetensors`` and the
tokenizer's files. Without torch (``make demo`` installs none) the reranker says so in one line, naming
the extra (``pip install 'hybridret[torch]'``); ``hybridret serve --rerank DIR`` checks this before it starts.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, EncoderError, ModelNotFoundError

__all__ = ["CrossEncoderReranker", "Reranker", "check_rerank", "check_scores", "load_reranker"]

logger = logging.getLogger(__name__)

RERANK_WITHOUT_TORCH = ("Search without rerank, or pass a Reranker of your own (one scores() method) that runs "
                        "without torch.")

DEFAULT_RERANK_DEPTH = 50
MAX_RERANK_DEPTH = 1000


class Reranker(ABC):
    """Scores passages against one query; higher is better."""

    @abstractmethod
    def scores(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """One score per passage (float array of ``len(passages)``)."""


class CrossEncoderReranker(Reranker):
    """A local Hugging Face cross-encoder folder, batched (``batch_size`` pairs per forward pass,
    ``max_length`` tokens per pair, the passage truncated first) on ``device`` (``None``: CUDA when
    available, else the CPU)."""

    def __init__(self, path: str | Path, *, device: str | None = None, batch_size: int = 32,
                 max_length: int = 512) -> None:
        folder = Path(path)
        if not folder.is_dir():
            raise ModelNotFoundError(f"reranker {str(path)!r} is not a folder (give a local cross-encoder folder, "
                                     "e.g. one downloaded from cross-encoder/ms-marco-MiniLM-L6-v2)")
        if not (folder / "config.json").is_file():
            raise ModelNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
        if not (folder / "model.safetensors").is_file():
            raise ConfigError(f"{folder}: no model.safetensors; hybridret loads reranker weights from safetensors "
                              "only (a pickled pytorch_model.bin can run code when loaded)")
        if batch_size < 1 or max_length < 8:
            raise ConfigError(f"batch_size must be >= 1 and max_length >= 8, got {batch_size} and {max_length}")
        from ..encoders.backends import pick_device, require_torch

        require_torch("the cross-encoder reranker", RERANK_WITHOUT_TORCH)
        self.path, self.batch_size, self.max_length = folder, int(batch_size), int(max_length)
        self.device = pick_device(device)
        try:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
            load = AutoModelForSequenceClassification.from_pretrained
            model = load(folder, local_files_only=True, trust_remote_code=False, use_safetensors=True)
        except (OSError, ValueError, KeyError) as exc:
            raise EncoderError(f"{folder}: cannot load a sequence-classification model: {exc}") from None
        self.model = model.to(self.device).eval()
        self._lock = threading.Lock()  # tokenizers are not safe to share between threads
        logger.info("reranker %s on %s (%d labels)", folder, self.device, model.config.num_labels)

    def scores(self, query: str, passages: Sequence[str]) -> np.ndarray:
        import torch

        out = np.zeros(len(passages), dtype=np.float32)
        for a in range(0, len(passages), self.batch_size):
            chunk = list(passages[a:a + self.batch_size])
            with self._lock:
                enc = self.tokenizer([query] * len(chunk), chunk, padding=True, truncation="only_second",
                                     max_length=self.max_length, return_tensors="pt")
            enc = {k: v.to(self.device) for k, v in enc.items()}
            with torch.inference_mode():
                logits = self.model(**enc).logits
            out[a:a + len(chunk)] = logits[:, -1].float().cpu().numpy()
        return out

    def __repr__(self) -> str:
        return f"CrossEncoderReranker({str(self.path)!r}, device={self.device!r})"


def load_reranker(spec: Reranker | str | Path, *, device: str | None = None,
                  cache: dict[str, Reranker] | None = None, lock: threading.Lock | None = None) -> Reranker:
    """``spec`` as a :class:`Reranker`: itself, or a :class:`CrossEncoderReranker` of the folder it
    names (kept in ``cache`` by resolved path, so a searcher loads each model once)."""
    if isinstance(spec, Reranker):
        return spec
    if not isinstance(spec, (str, Path)):
        raise ConfigError(f"rerank must be a Reranker or a cross-encoder folder, got {type(spec).__name__}")
    key = str(Path(spec).resolve())
    if cache is None:
        return CrossEncoderReranker(spec, device=device)
    with lock or threading.Lock():
        if key not in cache:
            cache[key] = CrossEncoderReranker(spec, device=device)
        return cache[key]


def check_rerank(rerank: Any, rerank_depth: Any) -> int:
    """The validated ``rerank_depth`` (``0`` without a reranker)."""
    if rerank is None:
        if rerank_depth is not None:
            raise ConfigError("rerank_depth needs rerank (a Reranker or a cross-encoder folder)")
        return 0
    depth = DEFAULT_RERANK_DEPTH if rerank_depth is None else rerank_depth
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or not 1 <= depth <= MAX_RERANK_DEPTH:
        raise ConfigError(f"rerank_depth must be an integer from 1 to {MAX_RERANK_DEPTH}, got {rerank_depth!r}")
    return int(depth)


def check_scores(reranker: Reranker, got: Any, n: int) -> np.ndarray:
    """The scores a user-supplied ``reranker`` returned for ``n`` passages, as float32, refusing
    what cannot rank: not one real number per passage (strings, booleans, objects, another count)
    or a score that is not finite (NaN would order the hits arbitrarily)."""
    what = f"reranker {reranker!r}"
    try:
        arr = np.asarray(got)
    except Exception as exc:  # a ragged or exotic object: say what came back
        raise ConfigError(f"{what} returned {type(got).__name__}, not an array of {n} numbers ({exc})") from None
    if arr.dtype.kind not in "iuf":
        kind = "booleans" if arr.dtype.kind == "b" else f"{arr.dtype} values"
        sample = ", ".join(repr(v) for v in arr.reshape(-1)[:3].tolist()) if arr.size else ""
        raise ConfigError(f"{what} returned {kind} ({sample}); Reranker.scores must return one real number per "
                          "passage")
    if arr.shape != (n,):
        count = arr.shape[0] if arr.ndim == 1 else f"an array of shape {arr.shape}, not"
        raise ConfigError(f"{what} returned {count} scores for {n} passages (one score per passage expected)")
    out = arr.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(out))
    if len(bad):
        raise ConfigError(f"{what} returned a non-finite score ({float(arr[bad[0]])} for passage {int(bad[0])} of {n}, "
                          f"{len(bad)} in all); scores must be finite numbers")
    return out
