"""The ``--ray`` paths of ``hybridret index`` and ``hybridret search``: a sharded index on Ray
(:mod:`hybridret.distributed`). Ray is imported only when one of them runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import HybridRetError
from ._common import build_retriever, logger

if TYPE_CHECKING:  # pragma: no cover
    from ..distributed.searcher import ShardedSearcher

__all__ = ["index_ray", "open_searcher"]


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
    from ..distributed.build import build_sharded
    from ._common import corpus_reader

    if args.shards < 1:
        raise HybridRetError(f"--shards must be positive, got {args.shards}")
    reader = corpus_reader(args, on_empty=args.on_empty)
    _init(args.ray_address)
    encoder = build_retriever(args).encoder  # the models of --dense-model / --sparse-model / --joint-model
    settings = {"faiss_factory": args.faiss, "sparse_scheme": args.sparse_scheme, "sparse_bits": args.sparse_bits,
                "sparse_max_weight": args.sparse_max_weight, "bm25": not args.no_bm25, "store_text": not args.no_text}
    cache = None if args.no_encode_cache else args.encode_cache
    report = build_sharded(reader, Path(args.output), shards=args.shards, encoder=encoder, settings=settings,
                           address=args.ray_address, workers=args.ray_workers, batch_size=args.batch_size,
                           encode_cache=cache, overwrite=args.overwrite, chunk_size=args.chunk_size)
    logger.info("indexed %d documents into %d shards at %s in %.1f s (%d encoded)", report["num_docs"], args.shards,
                args.output, report["seconds"]["total"], report["encoded"])
    return 0


def open_searcher(args: argparse.Namespace) -> ShardedSearcher:
    """The :class:`~hybridret.distributed.searcher.ShardedSearcher` of ``args.index`` on the Ray
    cluster of ``--ray-address`` (default: a local one); the caller closes it."""
    from ..distributed.searcher import ShardedSearcher

    _init(args.ray_address)
    return ShardedSearcher.open(args.index, device=args.device)
