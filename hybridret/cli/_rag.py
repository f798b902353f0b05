"""Arguments the RAG features add to the write commands: chunking (``--chunk-tokens``,
``--chunk-overlap``) and expiry (``--ttl``), for ``index`` and ``add``."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import HybridRetError

__all__ = ["add_chunk_args", "chunk_kwargs"]


def add_chunk_args(p: argparse.ArgumentParser, *, build: bool) -> None:
    default = "" if build else " (default: as the index was built; 0: none)"
    p.add_argument("--chunk-tokens", type=int, default=None, metavar="N",
                   help="cut each document into chunks of at most N tokens of the dense model, indexed as ID#0, "
                        "ID#1, ... with parent_id, chunk, start and end in their metadata" + default)
    p.add_argument("--chunk-overlap", type=int, default=None, metavar="M",
                   help="tokens repeated between neighbouring chunks (at most N/2; default: 0)")
    p.add_argument("--ttl", type=float, default=None, metavar="SECONDS",
                   help="documents without an expires_at field expire this many seconds from now")


def chunk_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The library keywords of those arguments (only the ones given)."""
    if args.chunk_overlap is not None and args.chunk_tokens is None:
        raise HybridRetError("--chunk-overlap needs --chunk-tokens")
    out: dict[str, Any] = {}
    if args.chunk_tokens is not None:
        out["chunk_tokens"] = args.chunk_tokens
        out["chunk_overlap"] = args.chunk_overlap
    if args.ttl is not None:
        out["ttl"] = args.ttl
    return out
