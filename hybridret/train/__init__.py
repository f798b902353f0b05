"""Training dual hybrid encoders (dense + learned sparse, jointly, contrastively).

``from hybridret.train import HybridModel, TrainConfig, train, read_triples, ...``. Importing this
package does not import torch; the model and trainer modules load on first use, and need the
``torch`` extra (``pip install 'hybridret[torch]'``; without it they raise
:class:`~hybridret.errors.MissingDependencyError` saying so).
"""

from __future__ import annotations

import importlib
from typing import Any

from .data import TrainExample, examples_from_beir, mine_negatives, read_triples, write_triples
from .losses import flops, info_nce, margin_mse

__all__ = [
    "HybridModel",
    "TrainConfig",
    "TrainExample",
    "examples_from_beir",
    "flops",
    "info_nce",
    "margin_mse",
    "mine_negatives",
    "read_triples",
    "train",
    "write_triples",
]

_LAZY = {"HybridModel": ".model", "TrainConfig": ".trainer", "train": ".trainer"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
