"""``hybridret get DIR ID...``: stored documents by id, one JSON line each (no model is loaded);
``--server URL`` asks a running ``hybridret serve`` instead."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import DocumentNotFoundError, HybridRetError
from ._common import logger

__all__ = ["add_parser", "add_server_args", "remote_client", "run", "server_words"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("get", help="print stored documents by id (JSON lines)",
                       description="Print the stored documents of the given ids, one JSON object per line "
                                   '({"id", "title", "text", "metadata"}), in the order given. In an index of '
                                   "chunks a document's id gives the document re-assembled from its chunks "
                                   '(with "num_chunks"). Unknown ids are an '
                                   "error (exit 1, after the known ones are printed) unless --ignore-missing.")
    p.add_argument("index", metavar="DIR", nargs="?", help="the index folder (left out with --server)")
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument("--ids-file", metavar="FILE", default=None, help="one id per line (- for standard input)")
    p.add_argument("--ignore-missing", action="store_true", help="print the known ids, warn about the unknown ones")
    p.add_argument("--chunks", action="store_true",
                   help="in an index of chunks: with each document (given by its id, re-assembled from its chunks) "
                        'also its chunks as stored ("chunks": [...])')
    add_server_args(p)
    p.set_defaults(run=run, usage_error=p.error)


def add_server_args(p: argparse.ArgumentParser) -> None:
    """``--server URL`` and ``--api-key-file``: go through a running ``hybridret serve``."""
    p.add_argument("--server", metavar="URL", default=None,
                   help="ask a running `hybridret serve` at URL (e.g. http://127.0.0.1:8000) instead of opening DIR; "
                        "DIR is then left out")
    p.add_argument("--api-key-file", metavar="FILE", default=None,
                   help="with --server: the key of a server started with --protect-reads")


def remote_client(args: argparse.Namespace) -> Any:
    """A :class:`~hybridret.client.Client` of ``--server`` (needs httpx: the serve extra)."""
    try:
        from ..client import Client
    except ImportError as exc:
        raise HybridRetError(f"--server needs httpx: pip install 'hybridret[serve]' ({exc})") from None
    key = None
    if args.api_key_file:
        from ..serve.auth import read_api_key

        key = read_api_key(args.api_key_file)
    return Client(args.server, api_key=key)


def server_words(first: str | None, rest: list[str]) -> list[str]:
    """With ``--server`` there is no DIR: the positional taken as DIR is the first word of the rest.
    A first word that names an index folder here is refused: the server searches its own index, and
    the folder's name would otherwise be sent as a query word (or an id)."""
    if first is not None:
        from pathlib import Path

        from ..index.manifest import MANIFEST

        here = Path(first)
        if (here / MANIFEST).is_file() or (here / "shards.json").is_file():
            raise HybridRetError(f"with --server there is no DIR: {first!r} is an index folder, and the server "
                                 "answers from the index it serves; leave the folder out "
                                 "(hybridret search --server URL QUERY), or drop --server to open it here")
    return ([first] if first is not None else []) + list(rest)


def _read_ids(args: argparse.Namespace, words: list[str]) -> list[str]:
    ids = list(words)
    if args.ids_file:
        fh = sys.stdin if args.ids_file == "-" else open(args.ids_file, encoding="utf-8")
        with fh:
            ids += [line.rstrip("\r\n") for line in fh if line.strip()]
    if not ids:
        raise HybridRetError("no ids to get: give them as arguments or with --ids-file")
    return ids


def run(args: argparse.Namespace) -> int:
    if args.server:  # every positional word is an id
        ids = _read_ids(args, server_words(args.index, args.ids))
        with remote_client(args) as client:
            docs = client.get(ids, chunks=args.chunks)
    else:
        from ..search.searcher import Searcher

        if args.index is None:  # a usage error (exit 2), as argparse gives for a missing positional
            args.usage_error("the following arguments are required: DIR (or --server URL)")
        ids = _read_ids(args, args.ids)
        searcher = Searcher(args.index)
        try:
            docs = searcher.get(ids, chunks=args.chunks)
        finally:
            searcher.close()
    missing = [i for i, d in zip(ids, docs) if d is None]
    for doc in docs:
        if doc is not None:
            print(json.dumps(doc, ensure_ascii=False))
    if missing:
        shown = ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
        if not args.ignore_missing:
            sys.stdout.flush()
            raise DocumentNotFoundError(f"{len(missing)} of {len(ids)} ids are not in the index: {shown}", missing)
        logger.warning("%d ids were not in the index: %s", len(missing), shown)
    return 0
