"""Running a Hugging Face transformer over many texts: tokenise once, sort by length, batch."""

from __future__ import annotations

import json
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EncoderError, HybridRetError, ModelNotFoundError
from ..models import LOAD_LOCK, resolve_model
from ._blas_threads import single_blas_thread
from ._folder import PROBE, check_model_folder, check_tokenizer
from .backends import (  # noqa: F401 - BACKENDS, DEFAULT_BACKEND and backend_config are re-exported here
    ARRAY_BACKENDS,
    BACKENDS,
    CPU_ONLY,
    DEFAULT_BACKEND,
    backend_config,
    check_backend,
    pick_device,
    require_torch,
    resolve_backend,
)

logger = logging.getLogger("hybridret.encoders")

class DeviceChoice:
    """The device an encoder runs on, decided without importing torch where it can be: an explicit
    ``"cpu"`` (or a CPU-only backend) needs no look; ``None``/``"auto"`` is decided on first use
    (:func:`~hybridret.encoders.backends.pick_device`), so that opening an index for a BM25 search,
    ``info`` or a delete loads no torch. An explicit CUDA device is checked at once (a clear error
    before any work)."""

    def __init__(self, backend: str, device: str | None) -> None:
        auto = device in (None, "auto")
        check_backend(backend, None if auto else str(device))
        self._asked = device
        self._value: str | None = None
        if auto and backend in CPU_ONLY:
            self._value = "cpu"
        elif not auto:
            self._value = str(device) if str(device).startswith("cpu") else pick_device(device)

    def get(self) -> str:
        if self._value is None:
            self._value = pick_device(self._asked)
        return self._value


def quantize_int8(model: Any) -> Any:
    """``model`` with every ``nn.Linear`` replaced by a dynamically quantised int8 one (weights with
    per-output-channel scales: per-tensor ones lose ~3x more, dense cosine ~0.94 instead of ~0.98)."""
    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch 2.x deprecates eager-mode quantisation in favour of torchao
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


def apply_backend(model: Any, backend: str, device: str) -> Any:
    """``model`` prepared for ``backend`` (see :data:`BACKENDS`)."""
    import torch

    if backend == "torch-int8":
        return quantize_int8(model)
    if backend == "torch-bf16":
        if device.startswith("cpu") and not _cpu_has_bf16():
            logger.warning("encoder backend 'torch-bf16': this CPU has no bfloat16 instructions "
                           "(avx512_bf16/AMX); expect it to be slower than 'torch'")
        return model.to(torch.bfloat16)
    return model


def _cpu_has_bf16() -> bool:
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@contextmanager
def _loading_bars(show: bool) -> Iterator[None]:
    """transformers draws a "Loading weights" bar per model; like hybridret's own bars it follows
    the log level (shown at INFO, e.g. the CLI without -q). Held under LOAD_LOCK."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if was and not show:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not show:
            hf_logging.enable_progress_bar()


def progress_enabled(show_progress: bool | None, total: int, batch_size: int) -> bool:
    """Progress bars follow the log level unless asked for explicitly."""
    if show_progress is not None:
        return show_progress
    return total > batch_size and logging.getLogger("hybridret").isEnabledFor(logging.INFO)


def check_max_length(model_name: str, path: str, max_length: int) -> int:
    """Validate ``max_length`` and clamp it to the model's positions when its config.json is on disk
    (so the limit is known before the weights are loaded)."""
    if max_length < 8:
        raise EncoderError(f"max_length must be at least 8, got {max_length}")
    config = Path(path) / "config.json"
    if not config.is_file():
        return int(max_length)
    try:
        positions = json.loads(config.read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError) as exc:
        raise EncoderError(f"model {model_name!r}: cannot read {config}: {exc}") from exc
    return _clamp(model_name, int(max_length), positions)


def _clamp(model_name: str, max_length: int, positions: Any) -> int:
    if isinstance(positions, int) and max_length > positions:
        logger.warning("%s: max_length %d exceeds the model's %d positions; using %d", model_name,
                       max_length, positions, positions)
        return positions
    return max_length


class TransformerRunner:
    """Owns a tokenizer and a model on a device, and streams length-sorted batches through it.

    Construction holds :data:`~hybridret.models.LOAD_LOCK` (transformers' loading is not
    thread-safe); :meth:`tokenize` holds a per-runner lock (a fast tokenizer's truncation settings
    are shared state: concurrent calls fail with "Already borrowed"). The forward passes run
    unlocked.
    """

    def __init__(self, model_name: str, loader: str, *, device: str | None, max_length: int, dtype: str = "auto",
                 path: str | None = None, backend: str = DEFAULT_BACKEND, numpy_blocker: str | None = None,
                 onnx_head: str | None = None) -> None:
        self.name = model_name
        self.path = path if path is not None else resolve_model(model_name)
        self.max_length = check_max_length(model_name, self.path, max_length)
        self.device = pick_device(device)
        #: the backend that runs (``"auto"`` resolved; see :mod:`hybridret.encoders.backends`)
        self.backend = resolve_backend(backend, self.path, self.device, numpy_blocker=numpy_blocker,
                                       onnx_head=onnx_head)
        self._tokenizer_lock = threading.Lock()
        check_model_folder(self.path)  # the same checks whichever backend runs, before any weight is loaded
        with LOAD_LOCK:
            if self.backend == "numpy":
                self._load_numpy(loader)
            elif self.backend in ARRAY_BACKENDS:
                self._load_onnx(str(onnx_head))
            else:
                with _loading_bars(logging.getLogger("hybridret").isEnabledFor(logging.INFO)):
                    self._load(loader, dtype)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.special_ids = set(self.tokenizer.all_special_ids)
        self._fast = self._own_backend_tokenizer()
        self._plain = self._own_backend_tokenizer(truncate=False)
        check_tokenizer(self.name, self.path, self.plain_ids(PROBE), self.special_ids,
                        getattr(self.tokenizer, "unk_token_id", None))
        self.truncated = 0  # texts cut to max_length over this runner's life
        logger.debug("%s: backend %s on %s", self.name, self.backend, self.device)

    def _load_numpy(self, loader: str) -> None:
        from ._numpy_bert import NumpyBert
        from ._tokenizer import FolderTokenizer

        self.tokenizer = FolderTokenizer(self.path)
        self.model = NumpyBert(self.path, mlm=loader == "mlm")
        self.max_length = _clamp(self.name, self.max_length, self.model.config.max_position_embeddings)
        self.autocast_dtype = None

    def _load_onnx(self, head: str) -> None:
        from ._onnx_bert import OnnxBert
        from ._tokenizer import FolderTokenizer

        self.tokenizer = FolderTokenizer(self.path)
        self.model = OnnxBert(self.path, head=head, quant="int8" if self.backend == "onnx-int8" else "fp32")
        self.max_length = _clamp(self.name, self.max_length, self.model.config.max_position_embeddings)
        self.autocast_dtype = None

    def _load(self, loader: str, dtype: str) -> None:
        import torch
        from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

        try:
            # never run code shipped with a model folder, and never ask on stdin whether to; never
            # unpickle weights (check_model_folder has refused a folder with pickled weights only)
            self.tokenizer = AutoTokenizer.from_pretrained(self.path, trust_remote_code=False)
            cls = AutoModelForMaskedLM if loader == "mlm" else AutoModel
            local = Path(self.path).is_dir()
            self.model = cls.from_pretrained(self.path, trust_remote_code=False,
                                             **({"use_safetensors": True} if local else {}))
        except OSError as exc:  # transformers raises OSError for missing/unreachable models
            raise ModelNotFoundError(f"could not load model {self.name!r} from {self.path}: {exc}") from exc
        except ValueError as exc:  # also: a folder that needs its own code (auto_map) to load
            raise EncoderError(f"model {self.name!r} cannot be loaded as {loader}: {exc}") from exc
        except HybridRetError:
            raise
        except Exception as exc:  # e.g. RuntimeError: sizes that do not match; a damaged weight file
            raise EncoderError(f"model {self.name!r} ({self.path}) cannot be loaded as {loader}: "
                               f"{type(exc).__name__}: {exc}") from exc
        self.max_length = _clamp(self.name, self.max_length, getattr(self.model.config, "max_position_embeddings", None))
        self.model.eval()
        self.model.to(self.device)
        self.model = apply_backend(self.model, self.backend, self.device)
        # fp16 on GPU halves memory and doubles throughput; CPU stays float32.
        self.autocast_dtype = None
        if dtype == "auto" and self.device.startswith("cuda"):
            self.autocast_dtype = torch.float16
        elif dtype in ("float16", "bfloat16"):
            self.autocast_dtype = getattr(torch, dtype)

    @property
    def hidden_size(self) -> int:
        """The model's hidden size (the width of its token states)."""
        return int(self.model.config.hidden_size)

    def _own_backend_tokenizer(self, *, truncate: bool = True) -> Any:
        """A private copy of a fast tokenizer's Rust tokenizer, truncating at ``max_length + 1`` and
        never padding, set once: calling it skips transformers' per-call wrapper (argument checks,
        truncation reset, BatchEncoding), about half of a short query's tokenising time, with the same
        ids. ``truncate=False``: a copy that never truncates, for :meth:`plain_ids` (a passage longer
        than the model's positions is not an error there, and transformers' wrapper would print "Token
        indices sequence length is longer than ..." for it). ``None`` for a slow (Python) tokenizer,
        which is then called as before."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or not hasattr(backend, "to_str"):
            return None
        from tokenizers import Tokenizer

        own = Tokenizer.from_str(backend.to_str())
        own.no_padding()
        if truncate:
            own.enable_truncation(self.max_length + 1)
        else:
            own.no_truncation()
        return own

    def tokenize(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """Token ids per text, cut to ``max_length`` (keeping the closing special token); also the
        number of texts that were cut. Safe to call from several threads."""
        with self._tokenizer_lock:
            if self._fast is not None:
                ids_list: list[list[int]] = [e.ids for e in self._fast.encode_batch(list(texts), add_special_tokens=True)]
            else:
                ids_list = self.tokenizer(list(texts), add_special_tokens=True, truncation=True,
                                          max_length=self.max_length + 1)["input_ids"]
        cut = 0
        limit = self.max_length
        for i, ids in enumerate(ids_list):
            if len(ids) > limit:
                cut += 1
                ids_list[i] = ids[: limit - 1] + ids[-1:] if ids[-1] in self.special_ids else ids[:limit]
        return ids_list, cut

    def plain_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens or truncation. Safe to call from several threads."""
        with self._tokenizer_lock:
            if self._plain is not None:
                return list(self._plain.encode(text, add_special_tokens=False).ids)
            return list(self.tokenizer(text, add_special_tokens=False, truncation=False, verbose=False)["input_ids"])

    def batches(
        self, texts: Sequence[str], batch_size: int, *, desc: str, show_progress: bool | None, bar: bool = True
    ) -> Iterator[tuple[np.ndarray, Any, Any]]:
        """Yield ``(positions, input_ids, attention_mask)`` for length-sorted batches on the device
        (numpy arrays on the numpy backend, torch tensors on the others)."""
        from tqdm.auto import tqdm

        numpy = self.backend in ARRAY_BACKENDS
        if not numpy:
            import torch

        if batch_size < 1:
            raise EncoderError(f"batch_size must be positive, got {batch_size}")
        ids_list, cut = self.tokenize(texts)
        with self._tokenizer_lock:  # several threads may count at once
            self.truncated += cut
        if cut:
            # callers that stream many chunks (show_progress=False) report a total themselves
            logger.log(logging.DEBUG if show_progress is False else logging.INFO,
                       "%s: truncated %d of %d texts to %d tokens", self.name, cut, len(texts), self.max_length)
        lengths = np.fromiter((len(x) for x in ids_list), dtype=np.int64, count=len(ids_list))
        order = np.argsort(-lengths, kind="stable")
        bar = tqdm(
            total=len(texts), desc=desc, unit="text",
            disable=not bar or not progress_enabled(show_progress, len(texts), batch_size))
        try:
            for start in range(0, len(order), batch_size):
                pos = order[start : start + batch_size]
                width = int(lengths[pos].max())
                input_ids = np.full((len(pos), width), self.pad_id, dtype=np.int64)
                mask = np.zeros((len(pos), width), dtype=np.int64)
                for row, p in enumerate(pos):
                    n = lengths[p]
                    input_ids[row, :n] = ids_list[p]
                    mask[row, :n] = 1
                if numpy:
                    yield pos, input_ids, mask
                else:
                    yield pos, torch.from_numpy(input_ids).to(self.device), torch.from_numpy(mask).to(self.device)
                bar.update(len(pos))
        finally:
            bar.close()

    def run(
        self,
        texts: Sequence[str],
        batch_size: int,
        step: Callable[[Any, Any], tuple[Any, ...]],
        *,
        desc: str,
        show_progress: bool | None,
    ) -> list[tuple[np.ndarray, tuple[Any, ...]]]:
        """Apply ``step(input_ids, attention_mask)`` to every batch under inference mode (numpy: see
        :meth:`_run_numpy`)."""
        if self.backend in ARRAY_BACKENDS:
            return self._run_numpy(texts, batch_size, step, desc=desc, show_progress=show_progress)
        out = []
        import torch

        with torch.inference_mode():
            for pos, ids, mask in self.batches(texts, batch_size, desc=desc, show_progress=show_progress):
                if self.autocast_dtype is not None:
                    with torch.autocast(device_type="cuda", dtype=self.autocast_dtype):
                        res = step(ids, mask)
                else:
                    res = step(ids, mask)
                out.append((pos, res))
        return out


    def _run_numpy(self, texts: Sequence[str], batch_size: int, step: Callable[[Any, Any], tuple[Any, ...]], *,
                   desc: str, show_progress: bool | None) -> list[tuple[np.ndarray, tuple[Any, ...]]]:
        """The numpy backend's batches, each on one BLAS thread, several batches at once on a pool of
        :func:`encode_workers` threads (numpy's products and ufuncs release the GIL). Coarse-grained
        threads keep a loaded machine's cores busy where OpenBLAS's own threads, which spin waiting
        for each other, halve the throughput (benchmarks/encode_speed.py; docs/architecture.md)."""
        from tqdm.auto import tqdm

        batches = list(self.batches(texts, batch_size, desc=desc, show_progress=show_progress, bar=False))
        out: list[tuple[np.ndarray, tuple[Any, ...]]] = []
        workers = min(encode_workers(), len(batches))
        with single_blas_thread(), tqdm(total=len(texts), desc=desc, unit="text",
                                        disable=not progress_enabled(show_progress, len(texts), batch_size)) as progress:
            if workers <= 1:
                for pos, ids, mask in batches:
                    out.append((pos, step(ids, mask)))
                    progress.update(len(pos))
                return out
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hybridret-encode") as pool:
                pending = [(pos, pool.submit(step, ids, mask)) for pos, ids, mask in batches]
                for pos, fut in pending:
                    out.append((pos, fut.result()))
                    progress.update(len(pos))
        return out


def encode_workers() -> int:
    """Threads the numpy backend encodes a build's batches on: ``$HYBRIDRET_ENCODE_THREADS`` when set,
    else the cores this process may run on."""
    raw = os.environ.get("HYBRIDRET_ENCODE_THREADS")
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise EncoderError(f"HYBRIDRET_ENCODE_THREADS must be a positive integer, got {raw!r}")
        return value
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def mean_pool(hidden: Any, mask: Any) -> Any:
    """Mean of token states over the attention mask."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


POOLINGS = ("mean", "cls")


def check_pooling(pooling: str) -> None:
    if pooling not in POOLINGS:
        raise EncoderError(f"unknown pooling {pooling!r}; expected one of {', '.join(POOLINGS)}")


def pool(hidden: Any, mask: Any, pooling: str) -> Any:
    """Pool token states ``(B, L, H)`` into one vector per text."""
    check_pooling(pooling)
    return mean_pool(hidden, mask) if pooling == "mean" else hidden[:, 0]
