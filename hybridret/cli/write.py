"""The living index: ``hybridret add``, ``hybridret delete`` and ``hybridret compact``, each one
atomic commit."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from ..errors import HybridRetError
from ._common import NamingPath, add_corpus_args, corpus_reader, corpus_total, logger, print_result
from ._rag import add_chunk_args, chunk_kwargs

__all__ = ["add_parsers", "run_add", "run_compact", "run_delete", "run_purge"]


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("add", help="add documents to an existing index (or replace them with --upsert)",
                       description="Encode and add the documents of a corpus file to an index, in one atomic "
                                   "commit. An id already in the index is an error unless --upsert.")
    p.add_argument("index", metavar="DIR")
    add_corpus_args(p)
    p.add_argument("--upsert", action="store_true", help="replace documents whose id is already in the index")
    p.add_argument("--batch-size", type=int, default=32, help="texts per encoder batch (default: 32)")
    p.add_argument("--encode-cache", metavar="DIR", default=None,
                   help="keep encoded documents here (keyed on content) to resume an interrupted add")
    p.add_argument("--json", action="store_true", help="print what was done as JSON")
    p.add_argument("--device", default=None)
    add_chunk_args(p, build=False)
    p.set_defaults(run=run_add)

    p = sub.add_parser("delete", help="delete documents from an index by id or by filter",
                       description="Delete documents by id (a chunked document's id deletes all its chunks), or "
                                   "every document matching --filter, in one atomic commit. Unknown ids are "
                                   "reported and, unless --ignore-missing, nothing is deleted.")
    p.add_argument("index", metavar="DIR")
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument("--ids-file", metavar="FILE", default=None, help="one id per line (- for standard input)")
    p.add_argument("--filter", metavar="JSON", default=None,
                   help='delete every document matching this metadata filter, e.g. \'{"source": "old-wiki"}\'')
    p.add_argument("--dry-run", action="store_true", help="delete nothing; print what would be deleted")
    p.add_argument("--ignore-missing", action="store_true", help="delete the known ids and report the unknown ones")
    p.add_argument("--json", action="store_true", help="print what was done as JSON")
    p.set_defaults(run=run_delete)

    p = sub.add_parser("purge", help="delete the documents that have expired",
                       description="Tombstone every document whose expires_at has passed, in one atomic commit. "
                                   "Searches never return expired documents anyway; compact also drops them.")
    p.add_argument("index", metavar="DIR")
    p.add_argument("--json", action="store_true", help="print what was done as JSON")
    p.set_defaults(run=run_purge)

    p = sub.add_parser("compact", help="merge an index's segments and drop deleted documents",
                       description="Merge all segments into one and drop deleted documents (nothing is "
                                   "re-encoded). Searches are as fast as after a fresh build, and BM25 statistics "
                                   "equal a fresh build's.")
    p.add_argument("index", metavar="DIR")
    p.add_argument("--migrate", action="store_true",
                   help="also rewrite segments of older formats (bit-plane learned sparse, BM25 in tantivy) in the "
                        "current one, move an index on the former default dense part (Flat) to the size rule "
                        "(auto), and write later segments so (nothing is re-encoded)")
    p.add_argument("--faiss", default=None, metavar="FACTORY",
                   help="the dense part of the compacted segment and of later writes: auto (Flat below 100,000 "
                        "vectors, compressed and tuned above), Flat, or a FAISS factory string (default: the "
                        "index's own setting)")
    p.add_argument("--json", action="store_true", help="print what was done as JSON")
    p.set_defaults(run=run_compact)


def run_add(args: argparse.Namespace) -> int:
    from ..retriever import HybridRetriever

    reader = corpus_reader(args)
    total = corpus_total(reader)  # before the models load: a corrupt file fails fast
    retriever = HybridRetriever.load(args.index, device=args.device)
    write = retriever.upsert if args.upsert else retriever.add
    with NamingPath(Path(args.index)):
        result = write(reader, batch_size=args.batch_size, total=total,
                       encode_cache=args.encode_cache, **chunk_kwargs(args))
    print_result(result, args, "upserted into" if args.upsert else "added to")
    return 0


def _read_ids(args: argparse.Namespace) -> list[str]:
    ids = list(args.ids)
    if getattr(args, "filter", None) is not None:
        if ids or args.ids_file:
            raise HybridRetError("give ids or --filter, not both")
        return []
    if args.ids_file:
        fh = sys.stdin if args.ids_file == "-" else open(args.ids_file, encoding="utf-8")
        with fh:
            ids += [line.rstrip("\r\n") for line in fh if line.strip()]
    if not ids:
        raise HybridRetError("no ids to delete: give them as arguments, with --ids-file, or --filter")
    return ids


def run_delete(args: argparse.Namespace) -> int:
    from ..retriever import HybridRetriever

    ids = _read_ids(args)
    retriever = HybridRetriever.load(args.index)
    with NamingPath(Path(args.index)):
        result = retriever.delete(ids if args.filter is None else None, filter=args.filter, dry_run=args.dry_run,
                                  missing="ignore" if args.ignore_missing else "error")
    if args.dry_run:
        if args.json:
            print(json.dumps(result.to_dict()))
        else:
            from ..indexer import count_words

            what = count_words(result.documents["deleted"], result.deleted) if result.documents else \
                count_words(result.deleted)
            print(f"would delete {what} from {args.index} (dry run: nothing was deleted)")
            for doc_id in result.matched or []:
                print(doc_id)
        return 0
    if result.missing:
        shown = ", ".join(result.missing[:20]) + (" ..." if len(result.missing) > 20 else "")
        logger.warning("%d ids were not in the index: %s", len(result.missing), shown)
    print_result(result, args, "deleted from")
    return 0


def run_compact(args: argparse.Namespace) -> int:
    from ..retriever import HybridRetriever

    quiet = logging.getLogger("hybridret.retriever")
    level = quiet.level
    if args.migrate:  # the load's "run compact --migrate" hint is what is being done
        quiet.setLevel(logging.WARNING)
    try:
        retriever = HybridRetriever.load(args.index)
    finally:
        quiet.setLevel(level)
    before = len(retriever.searcher.snapshot.segments)
    with NamingPath(Path(args.index)):
        result = retriever.compact(migrate=args.migrate, faiss_factory=args.faiss)
    if args.json:
        print(json.dumps(result.to_dict()))
    elif result.commit is None:
        print(f"{args.index}: nothing to compact ({before} segment, no deleted documents"
              + (", already in the current format)" if args.migrate else ")"))
    else:
        from ..indexer import count_words

        snap = retriever.searcher.snapshot
        documents, chunks = retriever.document_counts()
        print(f"compacted {before} segments of {args.index} into {len(snap.segments)} "
              f"({count_words(documents, chunks or None)}) (commit {result.commit})")
    return 0


def run_purge(args: argparse.Namespace) -> int:
    from ..retriever import HybridRetriever

    retriever = HybridRetriever.load(args.index)
    with NamingPath(Path(args.index)):
        result = retriever.purge()
    print_result(result, args, "purged expired documents from")
    return 0
