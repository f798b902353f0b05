"""tantivy plumbing shared by the sparse-part modules: private reader views, the BM25 analyzer,
per-query threads, and the exact-search work counters."""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import IndexFormatError
from .analysis import BM25_TOKENIZER, bm25_analyzer

__all__ = ["BM25_TOKENIZER", "SparseSearchStats", "bm25_analyzer", "open_tantivy", "run_queries"]

@dataclass
class SparseSearchStats:
    """How much work the exact top-k needed on the last :meth:`SparseIndex.search` call."""

    queries: int = 0
    fetched: list[int] = field(default_factory=list)  # final tantivy depth per query
    rounds: list[int] = field(default_factory=list)  # tantivy searches per query
    brute_force: int = 0  # queries that fell back to scoring every document


_SWEPT: set[int] = set()


def _sweep_views() -> None:
    """Once per process: remove link folders left by readers that were killed (their pid is gone)."""
    if os.getpid() in _SWEPT:
        return
    _SWEPT.add(os.getpid())
    for old in Path(tempfile.gettempdir()).glob("hybridret-tantivy-*"):
        try:
            pid = int(old.name.split("-")[2])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (ValueError, IndexError, OSError):
            continue


def open_tantivy(path: Path) -> tuple[Any, Path]:
    """Open a committed tantivy index for reading, through a private folder of links to its files.

    tantivy takes a lock file in the index folder even to read (and waits on it): a reader would
    need write access (read-only volumes, image layers and shared mounts fail) and would block while
    another process, paused mid-open, holds that lock. A committed segment never changes, so the
    lock protects nothing here; opening through links keeps it private to this reader. Returns the
    index and the link folder (remove it when the index is closed)."""
    import tantivy

    if not path.is_dir():
        raise IndexFormatError(f"missing index folder {path}")
    _sweep_views()
    view = Path(tempfile.mkdtemp(prefix=f"hybridret-tantivy-{os.getpid()}-"))
    try:
        for f in path.iterdir():
            if not f.name.endswith(".lock"):
                (view / f.name).symlink_to(f.resolve())
        return tantivy.Index.open(str(view)), view
    except (ValueError, OSError) as exc:
        shutil.rmtree(view, ignore_errors=True)
        raise IndexFormatError(f"{path}: cannot open tantivy index: {exc}") from exc
    except BaseException:
        shutil.rmtree(view, ignore_errors=True)
        raise


def run_queries(fn: Any, n: int, threads: int | None) -> None:
    """Call ``fn(i)`` for every query, on at most ``threads`` worker threads (``None``: one per
    core; ``1``, or a single query: on the calling thread, starting none). tantivy releases the
    GIL, so threads scale its share; its own searches run on the thread that calls them."""
    workers = min(n, threads if threads is not None else (os.cpu_count() or 1))
    if workers <= 1:
        for i in range(n):
            fn(i)
        return
    def block(start: int) -> None:  # one strided block per worker: no per-query future overhead
        for i in range(start, n, workers):
            fn(i)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(block, range(workers)))
