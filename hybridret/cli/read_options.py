"""The read options of ``hybridret search`` (pages, grouping, reranking, relevance, diversity) and the JSON of a result."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import HybridRetError
from ..types import result_json

__all__ = ["add_read_args", "read_kwargs", "result_json"]


def add_read_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offset", type=int, default=0,
                   help="skip this many hits (with --group-by: groups) before the -k returned: pages that "
                        "concatenate to one longer list (default: 0)")
    p.add_argument("--group-by", default=None, metavar="FIELD",
                   help="return the top -k groups of hits sharing this metadata field's value (e.g. parent_id: the "
                        "document a chunk belongs to), each with its best --group-size chunks")
    p.add_argument("--group-size", type=int, default=None, metavar="N",
                   help="with --group-by: chunks shown per group (default: 3)")
    p.add_argument("--rerank", default=None, metavar="DIR",
                   help="rerank the first --rerank-depth hits with a local Hugging Face cross-encoder folder "
                        "(e.g. cross-encoder/ms-marco-MiniLM-L6-v2 downloaded there; safetensors weights only)")
    p.add_argument("--rerank-depth", type=int, default=None, metavar="N",
                   help="with --rerank: first-stage hits the cross-encoder scores (default: 50)")
    p.add_argument("--diversify", type=float, default=None, metavar="LAMBDA",
                   help="reorder the hits by maximal marginal relevance with this lambda in [0, 1] (1: pure "
                        "relevance; 0.5-0.9: fewer near-duplicate hits; with --group-by: fewer alike documents); "
                        "compares the candidates' stored dense vectors")
    p.add_argument("--relevance", action="store_true",
                   help="also each hit's calibrated relevance in [0, 1], a probability a fixed threshold can cut "
                        "(docs/relevance.md); in --json as \"relevance\"")


def read_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The search keywords of these options (checked by the library, which names what is wrong)."""
    if args.group_size is not None and args.group_by is None:
        raise HybridRetError("--group-size goes with --group-by FIELD")
    if args.rerank_depth is not None and args.rerank is None:
        raise HybridRetError("--rerank-depth goes with --rerank DIR")
    out: dict[str, Any] = {}
    if args.offset:
        out["offset"] = args.offset
    if args.group_by is not None:
        out["group_by"], out["group_size"] = args.group_by, args.group_size
    if args.rerank is not None:
        out["rerank"], out["rerank_depth"] = args.rerank, args.rerank_depth
    if getattr(args, "relevance", False):
        out["relevance"] = True
    if getattr(args, "diversify", None) is not None:
        out["diversify"] = args.diversify
    return out
