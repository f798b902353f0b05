"""Shared helpers for the benchmark scripts (not part of the library)."""

from __future__ import annotations

import json
import os

# Before torch / FAISS load: their two OpenMP runtimes otherwise spin against each other (README).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"


def machine() -> dict[str, Any]:
    import numpy
    import torch

    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "numpy": numpy.__version__, "cuda": torch.cuda.is_available()}


class Timer:
    def __enter__(self) -> "Timer":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {path}")


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c), *(len(x[i]) for x in cells)]) for i, c in enumerate(columns)]  # no rows: the header
    line = "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(x.ljust(w) for x, w in zip(r, widths)) + " |" for r in cells]
    return "\n".join([line, sep, *body])


def encode_queries(r: Any, texts: list[str], dense: bool = True, sparse: bool = True) -> Any:
    """The queries of ``texts`` as a :class:`hybridret.retrievers.QueryBatch` (``.dense``, ``.sparse``)."""
    return r.encode_queries(texts, {n for n, on in (("dense", dense), ("sparse", sparse)) if on})
