"""Which engine runs an encoder's transformer, and on which device: decided without importing torch
where it can be.

Backends (benchmarks/encode_speed.py measures each):

* ``"onnx"``: ONNX Runtime, float32, on the CPU (:mod:`hybridret.encoders._onnx_bert`): a graph written
  from the numpy backend's weights with the ``onnx`` helper API (never exported from torch, never read
  from a model folder), cached per weights in a user cache folder; fused attention, LayerNorm and GELU
  kernels, and SPLADE's vocabulary projection and max pooling inside the graph. The same vectors as
  ``"numpy"`` to float32 rounding. Needs the ``onnx`` extra (``pip install 'hybridret[onnx]'``).
* ``"onnx-int8"``: the same graph with its matrix products dynamically quantised to int8: faster, at a
  quality cost (benchmarks/encode_speed.py; docs/benchmarks.md "CPU encoding").
* ``"numpy"``: the BERT forward pass in numpy float32 (:mod:`hybridret.encoders._numpy_bert`), on the
  CPU; needs neither torch nor transformers. BERT checkpoints with ``model.safetensors`` and
  ``tokenizer.json`` only (both default models are; so for ``"onnx"``).
* ``"torch"``: transformers on torch, float32 on the CPU (fp16 autocast on CUDA). The same vectors as
  ``"numpy"`` to float32 rounding (dense cosine >= 0.9999 per text, tests/test_numpy_backend.py).
* ``"torch-bf16"``: the weights cast to bfloat16: ~2x the documents/s of a build on a CPU with bf16
  instructions (avx512_bf16 / AMX), near-lossless (dense cosine to float32 ~0.9999, nDCG@10 within ~0.001).
* ``"torch-int8"``: every nn.Linear dynamically quantised to int8 (fbgemm): CPU only, ~2.3x, at a larger
  quality cost (dense cosine to float32 ~0.98; nDCG@10 within ~0.01).
* ``"auto"`` (the default), on the CPU: ``"onnx"`` where onnxruntime is installed and the model is a
  BERT dense or SPLADE encoder it runs; else ``"torch"`` where torch is installed; else ``"numpy"`` for a
  model it runs; a model neither runs needs torch. On a GPU: ``"torch"``. The environment variable
  ``HYBRIDRET_ENCODER_BACKEND`` (``onnx`` / ``numpy`` / ``torch``) overrides that choice; the CLI's
  query-side commands (``search``, ``eval``, ``tune``, ``calibrate``) never pick torch unless it is set
  (onnx where installed, else numpy).

The torch backends need the ``torch`` extra (``pip install 'hybridret[torch]'``), the onnx ones the
``onnx`` extra; without it they raise :class:`~hybridret.errors.MissingDependencyError` saying so. The
float32 backends (``auto``/``numpy``/``onnx``/``torch``) compute the same vectors, so an encoder config (an index manifest, an
encode-cache key) does not record which of them ran: an index built with one is searched with the other.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError, EncoderError, MissingDependencyError

__all__ = ["ARRAY_BACKENDS", "AUTO_ENV", "BACKENDS", "CPU_PREFERS_NUMPY", "DEFAULT_BACKEND", "FLOAT32_BACKENDS",
           "ONNX_BACKENDS", "TORCH_INSTALL", "auto_override", "backend_config", "prefer_numpy_for_queries",
           "check_backend", "cuda_possible", "onnx_installed", "pick_device", "require_onnx", "require_torch",
           "resolve_backend", "torch_installed"]

BACKENDS = ("auto", "onnx", "onnx-int8", "numpy", "torch", "torch-bf16", "torch-int8")
DEFAULT_BACKEND = "auto"
FLOAT32_BACKENDS = ("auto", "numpy", "onnx", "torch")  # the same vectors: not recorded in an encoder config
ONNX_BACKENDS = ("onnx", "onnx-int8")
ARRAY_BACKENDS = ("numpy", *ONNX_BACKENDS)  # numpy arrays in and out, CPU only, no torch
CPU_ONLY = ("torch-int8", *ARRAY_BACKENDS)
ONNX_INSTALL = "pip install 'hybridret[onnx]'"
TORCH_INSTALL = "pip install 'hybridret[torch]'"
# "auto" on the CPU with torch installed: torch. Measured on this project's 2-core machine, interleaved in one
# run (benchmarks/encode_speed.py; docs/architecture.md "Encoder backends"): torch encodes a build ~1.5x
# faster (both models: 9.8-9.9 vs 6.5-6.6 docs/s) and one query ~1.3x faster (median 39-56 vs 49-71 ms);
# numpy is the default where torch is absent. backend="numpy" chooses numpy anyway.
CPU_PREFERS_NUMPY = False
# Set to "onnx", "numpy" or "torch": what "auto" prefers in this process
AUTO_ENV = "HYBRIDRET_ENCODER_BACKEND"
_QUERY_PREFERENCE: str | None = None  # "light" inside prefer_numpy_for_queries(), when AUTO_ENV is unset


def torch_installed() -> bool:
    """Whether torch and transformers can be imported (looked up without importing them)."""
    for name in ("torch", "transformers"):
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken install
            return False
    return True


def onnx_installed() -> bool:
    """Whether onnxruntime can be imported (looked up without importing it)."""
    try:
        return importlib.util.find_spec("onnxruntime") is not None
    except (ImportError, ValueError):
        return False


def require_onnx(what: str) -> None:
    """Raise :class:`MissingDependencyError` naming the extra when onnxruntime is missing."""
    if not onnx_installed():
        raise MissingDependencyError(f"{what} needs onnxruntime, which is not installed: {ONNX_INSTALL} "
                                     "(no torch needed). The default models also run on backend='numpy'.")


def require_torch(what: str, instead: str = "The default models run without them on backend='numpy'.") -> None:
    """Raise :class:`MissingDependencyError` naming the extra when torch/transformers are missing
    (``instead``: the sentence that says what works without them)."""
    if not torch_installed():
        raise MissingDependencyError(
            f"{what} needs torch and transformers, which are not installed: {TORCH_INSTALL} (install the CPU "
            "build of torch first to avoid a multi-GB CUDA download, e.g. pip install torch --index-url "
            f"https://download.pytorch.org/whl/cpu). {instead}")


def check_backend(backend: str, device: str | None = None) -> str:
    """Validate a backend name (that it exists, is installed, and can run on ``device``); returns it."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown encoder backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    on_gpu = device is not None and str(device) not in ("auto", "cpu") and not str(device).startswith("cpu")
    if backend in CPU_ONLY and on_gpu:
        raise ConfigError(f"encoder backend {backend!r} runs on the CPU only, not on {device!r}; "
                          "use backend='torch' (fp16 on CUDA) there")
    if backend.startswith("torch"):
        require_torch(f"encoder backend {backend!r}")
    if backend in ONNX_BACKENDS:
        require_onnx(f"encoder backend {backend!r}")
    return backend


def cuda_possible() -> bool:
    """Whether a CUDA (or ROCm) device may be present, without importing torch: on Linux a GPU needs
    its kernel driver, whose device files are absent on a CPU-only machine. ``True`` where unsure."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd"))


def pick_device(device: str | None) -> str:
    """``None``/``"auto"``: CUDA when torch is installed and sees a GPU, else the CPU (torch is imported
    only where a GPU may exist). An explicit CUDA device needs torch and a GPU."""
    if device in (None, "auto"):
        if not torch_installed() or not cuda_possible():
            return "cpu"
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda"):
        require_torch(f"device {device!r}")
        import torch

        if not torch.cuda.is_available():
            raise EncoderError(f"device {device!r} requested but CUDA is not available")
    return str(device)


def resolve_backend(backend: str, path: str | Path, device: str, *, numpy_blocker: str | None = None,
                    onnx_head: str | None = None) -> str:
    """The backend that runs the model at ``path`` on ``device``: ``backend`` itself, or for ``"auto"``
    the choice described in the module's docstring. ``numpy_blocker``: a reason (besides the model's
    architecture) why numpy (and so onnx, built from numpy's weights) cannot run it, e.g. a torch-only
    file next to the weights. ``onnx_head``: the graph output the encoder needs (``"hidden"`` or
    ``"splade"``); ``None``: the encoder has no onnx graph (onnx is never chosen for it).

    Raises:
        ConfigError: ``"numpy"``/``"onnx"`` asked for a model, encoder or device it does not run.
        MissingDependencyError: the model needs torch (or onnxruntime), which is not installed.
    """
    from ._numpy_bert import numpy_support

    override = auto_override() if backend == "auto" else None
    if override == "torch":
        backend = "torch"
    check_backend(backend, device)
    if backend in ONNX_BACKENDS:
        if onnx_head is None:
            raise ConfigError(f"encoder backend {backend!r} runs dense and SPLADE encoders of BERT models, not this "
                              "encoder; use backend='numpy' or 'torch'")
        why = numpy_blocker or numpy_support(path)
        if why is not None:
            raise ConfigError(f"encoder backend {backend!r} cannot run {str(path)!r}: {why}; use backend='torch' "
                              f"({TORCH_INSTALL})")
        return backend
    cpu = str(device).startswith("cpu")
    if backend == "auto" and cpu and override == "onnx":
        require_onnx(f"{AUTO_ENV}=onnx")
    onnx_ok = onnx_head is not None and override != "numpy" and onnx_installed()
    prefers_array = CPU_PREFERS_NUMPY or override in ("numpy", "onnx", "light") or onnx_ok or not torch_installed()
    if backend == "numpy" or (backend == "auto" and cpu and prefers_array):
        why = numpy_blocker or numpy_support(path)
        if why is None:
            return "onnx" if backend == "auto" and onnx_ok else "numpy"
        if backend == "numpy":
            raise ConfigError(f"encoder backend 'numpy' cannot run {str(path)!r}: {why}; use backend='torch' "
                              f"({TORCH_INSTALL})")
        require_torch(f"model {str(path)!r} (the numpy and onnx backends cannot run it: {why})")
    if backend == "auto":
        require_torch(f"device {device!r}")
        return "torch"
    return backend


def auto_override() -> str | None:
    """What ``"auto"`` means in this process when :data:`AUTO_ENV` is set: ``"onnx"`` or ``"numpy"``
    (that backend for every model it runs, torch for the others) or ``"torch"``; ``None`` when unset.
    The CLI's query-side commands return ``"light"`` (onnx where installed, else numpy; never torch)
    while they run, unless the variable is set (:func:`prefer_numpy_for_queries`)."""
    value = os.environ.get(AUTO_ENV, "").strip().lower()
    if not value:
        return _QUERY_PREFERENCE
    if value == "auto":
        return None
    if value not in ("onnx", "numpy", "torch"):
        raise ConfigError(f"{AUTO_ENV}={os.environ[AUTO_ENV]!r}: expected onnx, numpy, torch or auto")
    return value


@contextmanager
def prefer_numpy_for_queries() -> Iterator[None]:
    """Within the block, ``auto`` never picks torch (onnx where installed, else numpy) unless
    :data:`AUTO_ENV` says otherwise: for a
    short-lived command that encodes only queries (the CLI's ``search``, ``eval``, ``tune``,
    ``calibrate``). Importing torch and transformers costs more than such a command's encoding
    (``benchmarks/cli_startup.py``, torch installed: a hybrid ``hybridret search`` 9.7 s on torch,
    2.4 s without torch); the vectors are the same. The preference is process-wide while the block
    runs (every encoder loaded then, in any thread): meant for the CLI's one command at a time, not
    for concurrent library use, where ``backend=`` or :data:`AUTO_ENV` say what to run."""
    global _QUERY_PREFERENCE
    before, _QUERY_PREFERENCE = _QUERY_PREFERENCE, "light"
    try:
        yield
    finally:
        _QUERY_PREFERENCE = before


def backend_config(backend: str) -> dict[str, str]:
    """The config entry for ``backend``: none for the float32 backends (the same vectors whichever
    ran), so configs written before backends existed stay equal to today's."""
    return {} if backend in FLOAT32_BACKENDS else {"backend": backend}
