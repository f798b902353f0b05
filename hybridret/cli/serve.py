"""``hybridret serve DIR``: the HTTP server (:mod:`hybridret.serve`; a sharded index through Ray)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import HybridRetError

if TYPE_CHECKING:  # pragma: no cover
    from ..types import SearchBackend

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve an index over HTTP (search page, JSON API, OpenAPI docs)",
                       description="Serve an index with FastAPI + uvicorn: POST /search, POST/DELETE /documents, "
                                   "POST /compact, GET /health, GET /info, the search page at / and the API docs at "
                                   "/docs. Needs the serve extra: pip install 'hybridret[serve]'.")
    p.add_argument("index", metavar="DIR")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--api-key-file", metavar="FILE", default=None,
                   help="require 'Authorization: Bearer KEY' (the key in FILE) for writes (/health stays open)")
    p.add_argument("--protect-reads", action="store_true", help="with --api-key-file: require the key for reads too")
    p.add_argument("--batch-window-ms", type=float, default=3.0,
                   help="collect concurrent searches for this long and encode them together (default: 3)")
    p.add_argument("--max-batch", type=int, default=32, help="most queries per micro-batch (default: 32)")
    p.add_argument("--no-batching", action="store_true", help="search each request on its own")
    p.add_argument("--no-group-commit", action="store_true",
                   help="commit each write on its own (default: concurrent adds, upserts and deletes by id are "
                        "grouped into one commit, each answered once that commit is durable)")
    p.add_argument("--max-request-chunks", type=int, default=None, metavar="N",
                   help="refuse (413) a write request that would write more than N rows: chunks in an index of "
                        "chunks, else documents (default: 10000)")
    p.add_argument("--max-request-tokens", type=int, default=None, metavar="N",
                   help="refuse (413) a write request whose documents hold more than N tokens to encode "
                        "(default: 1048576)")
    p.add_argument("--max-body-mb", type=float, default=None, metavar="MB",
                   help="refuse (413) a request body larger than MB mebibytes (default: 16)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="on SIGTERM: stop within about SECONDS; running writes get half of it to commit, then stop "
                        "before their commit (default: 10)")
    p.add_argument("--refresh-every", type=float, default=None, metavar="SECONDS",
                   help="also pick up commits made by other processes every SECONDS, between requests (by default "
                        "each request already checks the manifest: a stat)")
    p.add_argument("--no-auto-refresh", action="store_true",
                   help="do not check for other processes' commits before each request (the server's own writes "
                        "are always served at once)")
    p.add_argument("--rerank", default=None, metavar="DIR",
                   help='a local cross-encoder folder that search requests with "rerank": true use (e.g. '
                        "cross-encoder/ms-marco-MiniLM-L6-v2 downloaded there; safetensors weights only)")
    p.add_argument("--device", default=None)
    g = p.add_argument_group("cluster (needs the ray extra: pip install 'hybridret[ray]'; see docs/cluster.md)")
    g.add_argument("--ray", action="store_true",
                   help="serve a sharded index through Ray shard actors (implied by a sharded DIR: DIR/shards.json)")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="an existing Ray cluster (e.g. ray://head:10001 or auto; default: start a local one)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from ..serve.app import ServeConfig, serve
    except ImportError as exc:
        raise HybridRetError(f"serving needs FastAPI and uvicorn: pip install 'hybridret[serve]' ({exc})") from None
    from ..serve.auth import read_api_key

    if args.protect_reads and not args.api_key_file:
        raise HybridRetError("--protect-reads needs --api-key-file")
    if not 1 <= args.port <= 65535 and args.port != 0:
        raise HybridRetError(f"--port must be 1..65535, got {args.port}")
    if args.max_batch < 1 or args.batch_window_ms < 0:
        raise HybridRetError("--max-batch must be >= 1 and --batch-window-ms >= 0")
    if args.refresh_every is not None and args.refresh_every <= 0:
        raise HybridRetError(f"--refresh-every must be positive, got {args.refresh_every}")
    key = read_api_key(args.api_key_file) if args.api_key_file else None
    limits: dict[str, Any] = {}
    for name in ("max_request_chunks", "max_request_tokens"):
        if getattr(args, name) is not None:
            limits[name] = getattr(args, name)
    if args.max_body_mb is not None:
        if not args.max_body_mb > 0:
            raise HybridRetError(f"--max-body-mb must be positive, got {args.max_body_mb}")
        limits["max_body_bytes"] = int(args.max_body_mb * 2**20)
    config = ServeConfig(api_key=key, protect_reads=args.protect_reads, batching=not args.no_batching,
                         batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                         refresh_every=args.refresh_every, auto_refresh=not args.no_auto_refresh,
                         rerank=_rerank_folder(args.rerank), group_commit=not args.no_group_commit,
                         shutdown_timeout=args.shutdown_timeout, **limits)
    from ..serve.backends import ShardedBackend, is_sharded

    index: str | SearchBackend
    if args.ray or is_sharded(args.index):
        index = ShardedBackend.open(args.index, address=args.ray_address, device=args.device)
    elif args.ray_address:
        raise HybridRetError(f"--ray-address is for a sharded index, and {args.index} has no shards.json "
                             "(build one with: hybridret index CORPUS -o DIR --ray)")
    elif args.device:
        from ..retriever import HybridRetriever

        index = HybridRetriever.load(args.index, device=args.device, warm=True)
    else:
        index = args.index
    serve(index, host=args.host, port=args.port, config=config,
          log_level="debug" if args.verbose else "warning" if args.quiet else "info")
    return 0


def _rerank_folder(path: str | None) -> str | None:
    """``--rerank DIR``, checked before the server starts (the model loads on the first request):
    a cross-encoder folder, and torch installed to run it."""
    if path is None:
        return None
    from pathlib import Path

    from ..encoders.backends import require_torch

    if not (Path(path) / "config.json").is_file() or not (Path(path) / "model.safetensors").is_file():
        raise HybridRetError(f"--rerank {path}: not a cross-encoder folder with config.json and model.safetensors")
    require_torch(f"--rerank {path} (the cross-encoder reranker)",
                  'Start the server without --rerank (requests then cannot ask for "rerank": true).')
    return str(Path(path).resolve())
