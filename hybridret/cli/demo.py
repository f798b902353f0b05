"""``hybridret demo``: index the bundled sample corpus and run a few queries."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import NamingPath, check_output, count_records, logger, print_hits

__all__ = ["DEMO_QUERIES", "SAMPLE_DIR", "add_parser", "run"]

SAMPLE_DIR = Path(__file__).resolve().parent.parent / "resources" / "sample"
DEMO_QUERIES = ("q06", "q13", "q26")  # ids in resources/sample/queries.jsonl: a paraphrase, a how-to, a why


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="index the bundled sample corpus and run a few queries")
    p.add_argument("-o", "--output", default="indexes/sample", metavar="DIR", help="default: indexes/sample")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index at DIR")
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--device", default=None)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..data import CorpusReader, load_queries
    from ..retriever import HybridRetriever

    corpus = SAMPLE_DIR / "corpus.jsonl"
    out = Path(args.output)
    check_output(out, args.overwrite)
    reader = CorpusReader(corpus)
    retriever = HybridRetriever.from_models(device=args.device)
    with NamingPath(out):
        retriever.index(reader, workdir=out, total=count_records(reader.file), overwrite=True)
    logger.info("indexed the %d-passage sample corpus into %s", retriever.num_docs, out)
    queries = load_queries(SAMPLE_DIR / "queries.jsonl")
    hits = retriever.search([queries[q] for q in DEMO_QUERIES], k=args.k)
    for i in range(len(hits)):
        print_hits(hits, i)
    print(f"\nTry: hybridret search {out} \"your question\" --method sparse")
    return 0
