"""The ``--ray`` paths of ``hybridret index`` and ``hybridret search`` (called from :mod:`hybridret.cli`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..errors import HybridRetError

__all__ = ["index_ray", "search_ray"]

logger = logging.getLogger(__name__)


def _init(address: str | None, num_cpus: int | None = None) -> None:
    try:
        import ray
    except ImportError:
        raise HybridRetError("--ray needs Ray: pip install 'hybridret[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, num_cpus=num_cpus if address is None else None, include_dashboard=False,
                 log_to_driver=False)


def index_ray(args: argparse.Namespace) -> int:
    """``hybridret index CORPUS -o DIR --ray [--shards N] [--ray-address ADDR]``."""
    from ..cli import _build_retriever
    from ..data import CorpusReader
    from .build import build_sharded

    if args.shards < 1:
        raise HybridRetError(f"--shards must be positive, got {args.shards}")
    reader = CorpusReader(args.corpus, format=args.format, on_empty=args.on_empty)
    _init(args.ray_address)
    encoder = _build_retriever(args).encoder  # the models of --dense-model / --sparse-model / --joint-model
    settings = {"faiss_factory": args.faiss, "sparse_scheme": args.sparse_scheme, "sparse_bits": args.sparse_bits,
                "sparse_max_weight": args.sparse_max_weight, "bm25": not args.no_bm25, "store_text": not args.no_text}
    cache = None if args.no_encode_cache else args.encode_cache
    report = build_sharded(reader, Path(args.output), shards=args.shards, encoder=encoder, settings=settings,
                           address=args.ray_address, workers=args.ray_workers, batch_size=args.batch_size,
                           encode_cache=cache, overwrite=args.overwrite, chunk_size=args.chunk_size)
    logger.info("indexed %d documents into %d shards at %s in %.1f s (%d encoded)", report["num_docs"], args.shards,
                args.output, report["seconds"]["total"], report["encoded"])
    return 0


def search_ray(args: argparse.Namespace, filt: object) -> int:
    """``hybridret search DIR QUERY`` / ``--queries FILE`` over a sharded index."""
    from ..cli import _read_batch_queries, _search_one_query
    from .searcher import ShardedSearcher

    _init(args.ray_address)
    searcher = ShardedSearcher.open(args.index, device=args.device)
    try:
        if args.queries is None:
            _search_one_query(searcher, args, filt)
            return 0
        if args.trec:
            raise HybridRetError("--trec is not available with a sharded index yet; use JSON lines (--output)")
        queries = _read_batch_queries(args.queries)
        out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
        try:
            for start in range(0, len(queries), args.batch_size):
                chunk = queries[start:start + args.batch_size]
                hits = searcher.search([t for _, t in chunk], k=args.k, method=args.method,
                                       candidates=args.candidates, filter=filt)
                for i, (qid, text) in enumerate(chunk):
                    out.write(json.dumps({"query_id": qid, "query": text, "method": args.method,
                                          "resolved": hits.method, "hits": [h.to_dict() for h in hits[i]]},
                                         ensure_ascii=False) + "\n")
        finally:
            if out is not sys.stdout:
                out.close()
        return 0
    finally:
        searcher.close()
