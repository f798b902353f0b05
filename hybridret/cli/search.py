"""``hybridret search DIR QUERY``: one query, a batch from ``--queries FILE`` (JSON lines or a TREC
run), or an interactive prompt; a sharded index (``DIR/shards.json`` or ``--ray``) through Ray."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HybridRetError
from ..types import result_json
from ._common import add_method_arg, add_ray_args, check_text_args, logger, print_hits
from .get import add_server_args, remote_client, server_words
from .read_options import add_read_args, read_kwargs

if TYPE_CHECKING:  # pragma: no cover
    from ..filters import Filter
    from ..retriever import HybridRetriever
    from ..types import SearchBackend

__all__ = ["add_parser", "read_batch_queries", "run", "search_batches", "search_one_query"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("search", help="search an index")
    p.add_argument("index", metavar="DIR", nargs="?", help="the index folder (left out with --server)")
    p.add_argument("query", nargs="*", help="query text (several words are joined); none: --queries, or an "
                                           "interactive prompt on a terminal")
    p.add_argument("--queries", metavar="FILE", default=None,
                   help="search many queries with the models loaded once: one query per line, or JSONL objects with "
                        '"_id"/"id" and "text" (- for standard input); writes one JSON line of hits per query')
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="with --queries: write the JSON lines here (default: standard output)")
    p.add_argument("--trec", metavar="FILE", default=None,
                   help="with --queries: write a TREC run file (qid Q0 docid rank score tag) instead of JSON lines")
    p.add_argument("--batch-size", type=int, default=32, help="with --queries: queries per search call (default: 32)")
    p.add_argument("-k", type=int, default=10, help="hits to return (default: 10)")
    add_method_arg(p, help="default hybrid: the fusion `hybridret tune` stored in the index, else GQR (the dense "
                           "query refined towards learned-sparse + BM25 scores); on an index without a dense part, "
                           "linear fusion of what it has")
    p.add_argument("--filter", default=None, metavar="JSON",
                   help='metadata filter applied before top-k, e.g. \'{"source": "wiki", "year": {"$gte": 2020}}\' '
                        "(operators: $eq $ne $in $nin $gt $gte $lt $lte $exists $and $or $not; full text: "
                        '{"$text": {"phrase": "...", "all": [...], "any": [...], "none": [...]}})')
    p.add_argument("--candidates", type=int, default=None, help="per-retriever depth of fused methods (default: 100)")
    add_read_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--device", default=None)
    add_ray_args(p, build=False)
    add_server_args(p)
    p.set_defaults(run=run, usage_error=p.error)


def run(args: argparse.Namespace) -> int:
    from ..filters import parse_filter
    from ..retrievers import REGISTRY

    if args.candidates is not None and args.method in REGISTRY:
        raise HybridRetError(f"--candidates sets the per-retriever depth of fused methods; --method {args.method} "
                             "is a single retriever (use -k for its depth)")
    filt = parse_filter(args.filter)  # a malformed filter fails before any model loads
    read_kwargs(args)
    if args.server:
        return _search_server(args, filt)
    if args.index is None:  # a usage error (exit 2), as argparse gives for a missing positional
        args.usage_error("the following arguments are required: DIR (or --server URL)")
    if args.ray or (Path(args.index) / "shards.json").is_file():
        return _search_sharded(args, filt)
    if args.queries is not None:
        if args.query:
            raise HybridRetError("give a query or --queries FILE, not both")
        return _search_file(args, filt)
    if args.output or args.trec:
        raise HybridRetError("--output and --trec go with --queries FILE")
    from ..retriever import HybridRetriever

    if not args.query:
        if not sys.stdin.isatty():
            raise HybridRetError("no query given: pass a query, --queries FILE (one per line or JSONL; - reads "
                                 "standard input), or run on a terminal for an interactive prompt")
        return _search_prompt(HybridRetriever.load(args.index, device=args.device, warm=True), args, filt)
    search_one_query(HybridRetriever.load(args.index, device=args.device), args, filt)
    return 0


def _search_server(args: argparse.Namespace, filt: Filter | None) -> int:
    """Through a running ``hybridret serve`` (``--server URL``): no model loads in this process."""
    args.query = server_words(args.index, args.query)
    check_text_args(args)  # the word taken as DIR is query text here
    if (args.output or args.trec) and args.queries is None:
        raise HybridRetError("--output and --trec go with --queries FILE")
    if args.ray:
        raise HybridRetError("--server and --ray are two ways to reach an index: choose one")
    if args.queries is not None and args.query:
        raise HybridRetError("give a query or --queries FILE, not both")
    if args.queries is None and not args.query:
        raise HybridRetError("with --server, give a query or --queries FILE")
    queries = _batch_queries(args) if args.queries is not None else None
    with remote_client(args) as client:
        if queries is None:
            search_one_query(client, args, filt)
        else:
            search_batches(client, args, filt, queries)
    return 0


def _search_sharded(args: argparse.Namespace, filt: Filter | None) -> int:
    """A sharded index, on Ray: one query or ``--queries FILE`` (no prompt, no TREC run yet)."""
    from .sharded import open_searcher

    if args.query and args.queries is not None:
        raise HybridRetError("give a query or --queries FILE, not both")
    if not args.query and args.queries is None:
        raise HybridRetError("a sharded index is searched with a query or --queries FILE")
    queries = None
    if args.queries is not None:
        if args.trec:
            raise HybridRetError("--trec is not available with a sharded index yet; use JSON lines (--output)")
        queries = _batch_queries(args)  # bad input fails before Ray starts
    searcher = open_searcher(args)
    try:
        if queries is None:
            search_one_query(searcher, args, filt)
        else:
            search_batches(searcher, args, filt, queries)
        return 0
    finally:
        searcher.close()


def _search_file(args: argparse.Namespace, filt: Filter | None) -> int:
    from ..retriever import HybridRetriever

    queries = _batch_queries(args)  # bad input fails before the models load
    search_batches(HybridRetriever.load(args.index, device=args.device), args, filt, queries)
    return 0


def search_one_query(searcher: SearchBackend, args: argparse.Namespace, filt: Filter | None) -> None:
    """Search the command line's query with any searcher and print the hits (or JSON)."""
    query = " ".join(args.query)
    hits = searcher.search([query], k=args.k, method=args.method, candidates=args.candidates, filter=filt,
                           **read_kwargs(args))
    if args.json:
        print(json.dumps({"query": query, "method": args.method, "resolved": hits.method, **result_json(hits, 0)},
                         ensure_ascii=False, indent=2))
    else:
        print_hits(hits, 0)


def _batch_queries(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.batch_size < 1:
        raise HybridRetError(f"--batch-size must be positive, got {args.batch_size}")
    if args.output and args.trec:
        raise HybridRetError("--output writes JSON lines and --trec a run file: choose one")
    return read_batch_queries(args.queries)


def read_batch_queries(path: str) -> list[tuple[str, str]]:
    """(id, text) from one query per line, or JSONL objects with "_id"/"id" and "text". Plain lines
    are numbered from 1; blank lines are skipped."""
    fh = sys.stdin if path == "-" else open(path, encoding="utf-8")
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    name = "<stdin>" if path == "-" else path
    with fh:
        for lineno, line in enumerate(fh, 1):
            text = line.rstrip("\r\n")
            if not text.strip():
                continue
            if text.lstrip().startswith("{"):
                try:
                    obj = json.loads(text)
                except ValueError as exc:
                    raise HybridRetError(f"{name}:{lineno}: not valid JSON ({exc})") from None
                qid = obj.get("_id", obj.get("id")) if isinstance(obj, dict) else None
                qtext = obj.get("text", obj.get("query")) if isinstance(obj, dict) else None
                if isinstance(qid, int) and not isinstance(qid, bool):
                    qid = str(qid)
                if not isinstance(qid, str) or not qid.strip():
                    raise HybridRetError(f"{name}:{lineno}: a JSON query needs an \"_id\" or \"id\" (string)")
                if not isinstance(qtext, str) or not qtext.strip():
                    raise HybridRetError(f"{name}:{lineno}: query {qid!r} needs a non-empty \"text\"")
            else:
                qid, qtext = str(len(out) + 1), text
            if qid in seen:
                raise HybridRetError(f"{name}:{lineno}: duplicate query id {qid!r}")
            seen.add(qid)
            out.append((qid, qtext))
    if not out:
        raise HybridRetError(f"no queries in {name}")
    return out


def search_batches(searcher: SearchBackend, args: argparse.Namespace, filt: Filter | None,
                   queries: list[tuple[str, str]]) -> None:
    """Search ``queries`` ``--batch-size`` at a time; write one JSON line per query (to ``--output``
    or standard output), or a TREC run file with ``--trec``."""
    run: dict[str, dict[str, float]] = {}
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    method = args.method
    try:
        for start in range(0, len(queries), args.batch_size):
            chunk = queries[start:start + args.batch_size]
            hits = searcher.search([t for _, t in chunk], k=args.k, method=args.method, candidates=args.candidates,
                                   filter=filt, **read_kwargs(args))
            method = hits.method
            for i, (qid, text) in enumerate(chunk):
                view = hits[i]
                if args.trec:
                    run[qid] = {h.id: h.score for h in view if h.score == h.score and abs(h.score) != float("inf")}
                else:
                    out.write(json.dumps({"query_id": qid, "query": text, "method": args.method,
                                          "resolved": hits.method, **result_json(hits, i)},
                                         ensure_ascii=False) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    if args.trec:
        from ..runs import write_run

        write_run(run, args.trec, tag=f"hybridret-{method}".replace(" ", "_"))
    logger.info("searched %d queries (%s)%s", len(queries), method,
                f"; run written to {args.trec}" if args.trec else f"; hits written to {args.output}" if args.output else "")


def _search_prompt(retriever: HybridRetriever, args: argparse.Namespace, filt: Filter | None) -> int:
    """A small interactive prompt: one query per line, an empty line or EOF quits."""
    print(f"hybridret search {args.index} ({retriever.num_docs} documents, --method {args.method}); "
          "an empty line or Ctrl-D quits")
    while True:
        sys.stdout.write("query> ")
        sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:  # EOF (Ctrl-D)
            print()
            return 0
        query = line.rstrip("\r\n")
        if not query.strip():
            return 0
        hits = retriever.search([query], k=args.k, method=args.method, candidates=args.candidates, filter=filt,
                                **read_kwargs(args))
        print_hits(hits, 0)
