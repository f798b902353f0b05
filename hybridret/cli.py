"""Command line: ``hybridret index | add | delete | compact | search | eval | tune | info | demo | train |
mine-negatives``
(also ``python -m hybridret``)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._version import __version__
from .errors import HybridRetError

__all__ = ["main"]

logger = logging.getLogger("hybridret")

SAMPLE_DIR = Path(__file__).resolve().parent / "resources" / "sample"
DEMO_QUERIES = ("q06", "q13", "q26")  # ids in resources/sample/queries.jsonl: a paraphrase, a how-to, a why


def _add_encoder_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("encoders")
    g.add_argument("--dense-model", default=None, metavar="NAME",
                   help="dense model: packaged alias, local folder or Hub id (default: all-MiniLM-L6-v2)")
    g.add_argument("--sparse-model", default=None, metavar="NAME",
                   help="SPLADE model: packaged alias, local folder or Hub id (default: splade-tiny)")
    g.add_argument("--joint-model", default=None, metavar="NAME",
                   help="one *ForMaskedLM checkpoint for both heads, instead of --dense-model/--sparse-model")
    g.add_argument("--max-length", type=int, default=256, help="max tokens per text (default: 256)")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: CUDA when available)")


def _add_ray_args(p: argparse.ArgumentParser, *, build: bool) -> None:
    g = p.add_argument_group("cluster (needs the ray extra: pip install 'hybridret[ray]'; see docs/cluster.md)")
    if build:
        g.add_argument("--ray", action="store_true", help="build a sharded index on Ray (encoding on an actor pool)")
        g.add_argument("--shards", type=int, default=2, help="with --ray: number of shards (default: 2)")
        g.add_argument("--ray-workers", type=int, default=None,
                       help="with --ray: encoding actors (default: one per GPU, else one per free CPU)")
    else:
        g.add_argument("--ray", action="store_true",
                       help="search a sharded index through Ray shard actors (implied by a sharded DIR)")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="an existing Ray cluster (e.g. ray://head:10001 or auto; default: start a local one)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridret", description="Hybrid dense + learned-sparse retrieval.")
    parser.add_argument("--version", action="version", version=f"hybridret {__version__}")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only (no progress bars)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("index", help="encode and index a corpus",
                       description="Index a JSONL file, a BEIR folder or an MS MARCO collection.tsv. "
                                   "Documents whose title and text are both empty are skipped and counted.")
    p.add_argument("corpus", help="corpus.jsonl, a BEIR folder, or collection.tsv (.gz accepted)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="index directory to write")
    p.add_argument("--format", choices=("jsonl", "beir", "tsv"), default=None, help="default: from the path")
    p.add_argument("--faiss", default="Flat", metavar="FACTORY",
                   help="FAISS factory string (default: Flat = exact; e.g. HNSW32,Flat or IVF1024,PQ64)")
    p.add_argument("--batch-size", type=int, default=32, help="texts per encoder batch (default: 32)")
    p.add_argument("--encoder-backend", choices=("torch", "torch-bf16", "torch-int8"), default="torch",
                   help="faster CPU encoding: torch-bf16 (near-lossless, needs avx512_bf16/AMX) or torch-int8 "
                        "(fastest, small quality cost); see benchmarks/encode_speed.py (default: torch)")
    p.add_argument("--chunk-size", type=int, default=1024, help="documents per indexing chunk (default: 1024)")
    p.add_argument("--sparse-scheme", choices=("tfgrid", "planes", "buckets"), default="tfgrid",
                   help="tantivy encoding of learned weights: tfgrid (default, format 2: weights on tantivy's tf "
                        "curve, BM25 from a posting store) or the format-1 planes/buckets; results are exact either way")
    p.add_argument("--sparse-bits", type=int, default=6,
                   help="planes/buckets only: bit planes (or buckets) per term (default: 6)")
    p.add_argument("--sparse-max-weight", type=float, default=5.0,
                   help="learned weights are quantised on [0, this]; larger ones are clipped in tantivy but still "
                        "scored exactly (default: 5.0)")
    p.add_argument("--no-bm25", action="store_true", help="do not index text for BM25")
    p.add_argument("--no-text", action="store_true", help="do not store document texts")
    p.add_argument("--on-empty", choices=("skip", "error"), default="skip", help="empty documents (default: skip)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing index (it stays usable until the new one is complete)")
    p.add_argument("--encode-cache", metavar="DIR", default=None,
                   help="keep encoded chunks here so that rerunning the same command after an interruption "
                        "re-encodes only what is missing (default: encode-cache inside the output folder, "
                        "removed after a successful build)")
    p.add_argument("--no-encode-cache", action="store_true", help="do not cache encoded chunks (no resume)")
    _add_ray_args(p, build=True)
    _add_encoder_args(p)

    p = sub.add_parser("search", help="search an index")
    p.add_argument("index", metavar="DIR")
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
    p.add_argument("--method", default="hybrid", choices=METHOD_CHOICES,
                   help="default hybrid: the fusion `hybridret tune` stored in the index, else GQR (the dense query "
                        "refined towards learned-sparse + BM25 scores); on an index without a dense part, linear "
                        "fusion of what it has")
    p.add_argument("--filter", default=None, metavar="JSON",
                   help='metadata filter applied before top-k, e.g. \'{"source": "wiki", "year": {"$gte": 2020}}\' '
                        "(operators: $eq $ne $in $nin $gt $gte $lt $lte $exists $and $or $not)")
    p.add_argument("--candidates", type=int, default=None, help="per-retriever depth of fused methods (default: 100)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--device", default=None)
    _add_ray_args(p, build=False)

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
    p.add_argument("--refresh-every", type=float, default=None, metavar="SECONDS",
                   help="also pick up commits made by other processes every SECONDS (the server's own writes are "
                        "served at once)")
    p.add_argument("--device", default=None)
    g = p.add_argument_group("cluster (needs the ray extra: pip install 'hybridret[ray]'; see docs/cluster.md)")
    g.add_argument("--ray", action="store_true",
                   help="serve a sharded index through Ray shard actors (implied by a sharded DIR: DIR/shards.json)")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="an existing Ray cluster (e.g. ray://head:10001 or auto; default: start a local one)")

    p = sub.add_parser("add", help="add documents to an existing index (or replace them with --upsert)",
                       description="Encode and add the documents of a corpus file to an index, in one atomic "
                                   "commit. An id already in the index is an error unless --upsert.")
    p.add_argument("index", metavar="DIR")
    p.add_argument("corpus", help="corpus.jsonl, a BEIR folder, or collection.tsv (.gz accepted)")
    p.add_argument("--format", choices=("jsonl", "beir", "tsv"), default=None, help="default: from the path")
    p.add_argument("--upsert", action="store_true", help="replace documents whose id is already in the index")
    p.add_argument("--batch-size", type=int, default=32, help="texts per encoder batch (default: 32)")
    p.add_argument("--encode-cache", metavar="DIR", default=None,
                   help="keep encoded documents here (keyed on content) to resume an interrupted add")
    p.add_argument("--json", action="store_true", help="print what was done as JSON")
    p.add_argument("--device", default=None)

    p = sub.add_parser("delete", help="delete documents from an index by id",
                       description="Delete documents by id in one atomic commit. Unknown ids are reported and, "
                                   "unless --ignore-missing, nothing is deleted.")
    p.add_argument("index", metavar="DIR")
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument("--ids-file", metavar="FILE", default=None, help="one id per line (- for standard input)")
    p.add_argument("--ignore-missing", action="store_true", help="delete the known ids and report the unknown ones")
    p.add_argument("--json", action="store_true", help="print what was done as JSON")

    p = sub.add_parser("compact", help="merge an index's segments and drop deleted documents",
                       description="Merge all segments into one and drop deleted documents (nothing is "
                                   "re-encoded). Searches are as fast as after a fresh build, and BM25 statistics "
                                   "equal a fresh build's.")
    p.add_argument("index", metavar="DIR")
    p.add_argument("--migrate", action="store_true",
                   help="also rewrite segments of older formats (bit-plane learned sparse, BM25 in tantivy) in the "
                        "current one, and write later segments in it (nothing is re-encoded)")
    p.add_argument("--json", action="store_true", help="print what was done as JSON")

    p = sub.add_parser("eval", help="evaluate a method on judged queries (nDCG@10, MRR@10, Recall@100)")
    _add_eval_args(p)
    p.add_argument("--method", default="hybrid", choices=METHOD_CHOICES)
    p.add_argument("--metrics", nargs="+", default=["ndcg@10", "mrr@10", "recall@100"],
                   help="ndcg@K, mrr@K, recall@K, precision@K, map (default: ndcg@10 mrr@10 recall@100)")
    p.add_argument("-k", type=int, default=100, help="depth of each ranking (default: 100)")
    p.add_argument("--save-run", metavar="FILE", default=None,
                   help="also write the ranking as a TREC run file (trec_eval / ranx / pyserini can read it)")

    p = sub.add_parser("tune", help="grid-search fusion and GQR settings; store the best in the index")
    _add_eval_args(p)
    p.add_argument("--metric", default="ndcg@10", help="metric to maximise (default: ndcg@10)")
    p.add_argument("--dry-run", action="store_true", help="report only; do not store the best setting")

    p = sub.add_parser("info", help="describe an index (--check: verify every file)")
    p.add_argument("index", metavar="DIR")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--check", action="store_true",
                   help="verify every file against the checksums written with it, and the values inside "
                        "(reads the whole index; exit 1 when anything is wrong)")

    p = sub.add_parser("demo", help="index the bundled sample corpus and run a few queries")
    p.add_argument("-o", "--output", default="indexes/sample", metavar="DIR", help="default: indexes/sample")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index at DIR")
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--device", default=None)

    p = sub.add_parser("train", help="train a joint dense + sparse (hybrid) encoder contrastively",
                       description="Train a dual hybrid encoder (dense mean-pooled vector + SPLADE sparse vector "
                                   "from one masked-LM backbone) with InfoNCE and FLOPS regularisation. The output "
                                   "folder loads with `index --joint-model DIR` (also with --separate towers).")
    p.add_argument("--data", required=True, help="triples JSONL ({query, positive, negatives}) or a BEIR folder")
    p.add_argument("--split", default="train", help="qrels split of a BEIR folder (default: train)")
    p.add_argument("--model", default="splade-tiny",
                   help="start from a *ForMaskedLM checkpoint or a plain encoder (gets a new MLM head); default splade-tiny")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="model folder to write")
    p.add_argument("--steps", type=int, default=1000, help="optimiser steps (default: 1000)")
    p.add_argument("--batch-size", type=int, default=16, help="queries per micro-batch (default: 16)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (default: 1)")
    p.add_argument("--lr", type=float, default=2e-5, help="peak learning rate (default: 2e-5)")
    p.add_argument("--warmup-steps", type=int, default=100, help="linear LR warm-up (default: 100)")
    p.add_argument("--negatives", type=int, default=4, help="hard negatives per query (default: 4)")
    p.add_argument("--flops-query", type=float, default=3e-4, help="FLOPS weight on queries (default: 3e-4)")
    p.add_argument("--flops-doc", type=float, default=1e-4, help="FLOPS weight on documents (default: 1e-4)")
    p.add_argument("--flops-warmup", type=int, default=0, help="steps of quadratic FLOPS-weight ramp (default: 0)")
    p.add_argument("--separate", action="store_true", help="separate query and document towers (default: shared)")
    p.add_argument("--projection-dim", type=int, default=None, help="add a linear projection of the dense vector")
    p.add_argument("--distill", default=None, metavar="TEACHER",
                   help="margin-MSE distillation from 'paired' (packaged MiniLM + SPLADE-tiny) or a TREC run file")
    p.add_argument("--distill-weight", type=float, default=1.0)
    p.add_argument("--max-length", type=int, default=256, help="max tokens per text (default: 256)")
    p.add_argument("--checkpoint-every", type=int, default=500, help="steps between checkpoints (default: 500)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in DIR")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-amp", action="store_true", help="no mixed precision on CUDA")
    p.add_argument("--device", default=None)

    p = sub.add_parser("mine-negatives", help="write training triples with hard negatives mined from an index")
    p.add_argument("index", metavar="INDEX_DIR")
    p.add_argument("--queries", required=True, help="BEIR queries.jsonl or a TSV of qid<TAB>text")
    p.add_argument("--qrels", required=True, help="BEIR qrels TSV or TREC qrels")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="triples JSONL to write")
    p.add_argument("-k", type=int, default=30, help="sample negatives from this many top hits (default: 30)")
    p.add_argument("-n", type=int, default=4, help="negatives per query (default: 4)")
    p.add_argument("--method", default="hybrid", choices=METHOD_CHOICES, help="ranking to mine from (default: hybrid)")
    p.add_argument("--skip-top", type=int, default=0, help="skip this many best non-relevant hits (default: 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    return parser


METHOD_CHOICES = ("hybrid", "dense", "sparse", "bm25", "linear", "rrf", "gqr")  # == searcher.METHODS (tested)


def _add_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("index", metavar="DIR")
    p.add_argument("--queries", required=True, help="BEIR queries.jsonl or a TSV of qid<TAB>text (MS MARCO)")
    p.add_argument("--qrels", required=True, help="BEIR qrels TSV or TREC qrels (qid 0 docid grade)")
    p.add_argument("--relevance-level", type=int, default=1,
                   help="smallest grade counted relevant by binary metrics (TREC DL: 2; default: 1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--device", default=None)


def _setup_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    if not any(getattr(h, "_hybridret_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s" if args.verbose else "%(message)s"))
        handler._hybridret_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)


def _build_retriever(args: argparse.Namespace, **settings: Any) -> Any:
    from .encoders import JointEncoder
    from .retriever import HybridRetriever

    if args.joint_model and (args.dense_model or args.sparse_model):
        raise HybridRetError("--joint-model cannot be combined with --dense-model/--sparse-model")
    backend = getattr(args, "encoder_backend", "torch")  # only `index` has --encoder-backend
    if args.joint_model:
        enc = JointEncoder(args.joint_model, max_length=args.max_length, device=args.device, backend=backend)
        return HybridRetriever(enc, device=args.device, **settings)
    return HybridRetriever.from_models(args.dense_model, args.sparse_model, device=args.device,
                                       max_length=args.max_length, backend=backend, **settings)


def _cmd_index(args: argparse.Namespace) -> int:
    from .data import CorpusReader

    if args.ray:
        from .distributed.cli import index_ray

        return index_ray(args)

    out = Path(args.output)
    _check_output(out, args.overwrite)
    reader = CorpusReader(args.corpus, format=args.format, on_empty=args.on_empty)
    total = _count_records(reader.file)  # before the models load: a corrupt file fails fast
    retriever = _build_retriever(args, faiss_factory=args.faiss, sparse_scheme=args.sparse_scheme,
                                 sparse_bits=args.sparse_bits, sparse_max_weight=args.sparse_max_weight,
                                 bm25=not args.no_bm25, store_text=not args.no_text)
    import shutil
    import time

    cache = None if args.no_encode_cache else Path(args.encode_cache or out / "encode-cache")
    if cache is not None and (cache / "cache.json").is_file():
        logger.info("resuming: reusing encoded chunks from %s", cache)
    start = time.perf_counter()
    with _NamingPath(out, retriever):
        retriever.index(reader, batch_size=args.batch_size, chunk_size=args.chunk_size, workdir=out,
                        total=total, encode_cache=cache, overwrite=True,
                        source={"path": str(args.corpus), "format": reader.format})
    if cache is not None and args.encode_cache is None:
        shutil.rmtree(cache, ignore_errors=True)  # the default cache lives inside the finished index
    took = time.perf_counter() - start
    logger.info("indexed %d documents into %s in %.1f s (%.1f docs/s)", retriever.num_docs, out, took,
                retriever.num_docs / max(took, 1e-9))
    return 0


def _count_records(path: Path) -> int | None:
    """Non-blank lines of a corpus file, for the progress bar's total and ETA (a quick pre-pass).

    Only for regular files: a pipe or standard input can be read once (``None``, no total). The
    pass uses the readers' line splitting, so an over-long line, invalid UTF-8 or a truncated gzip
    file raises :class:`CorpusFormatError` here, before any model is loaded.
    """
    import stat

    from .data import _iter_lines, is_stream

    if is_stream(path):
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except OSError:
        return None
    return sum(1 for _, text in _iter_lines(path) if text.strip())


def _check_output(out: Path, overwrite: bool) -> None:
    """Fail before any model loads when ``out`` cannot become an index folder."""
    import errno

    from .errors import IndexExistsError
    from .index.manifest import MANIFEST

    if out.exists() and not out.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory (the index output must be a folder)",
                                 str(out))
    if (out / MANIFEST).exists() and not overwrite:
        raise IndexExistsError(f"an index already exists at {out}; pass --overwrite to replace it")
    existing = out.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is not a directory, so the index folder cannot be made in it",
                                 str(existing))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "no permission to write here", str(existing))


class _NamingPath:
    """Around a write into ``path``: give an ``OSError`` raised without a file name (a failed
    ``write()``: disk full, file too large) the index folder, so that the error names it. (The
    library removes its unfinished segment itself; the previous index stays as it was.)"""

    def __init__(self, path: Path, retriever: Any) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError) and exc.filename is None:
            if exc.errno is not None:
                raise OSError(exc.errno, f"{exc.strerror or exc} (while writing the index)", str(self.path)) from exc
            # a short write without an errno (numpy's tofile): the disk or a file-size limit is full
            raise OSError(f"{self.path}: {exc} (while writing the index: disk full or file size limit?)") from exc
        return False


def _print_hits(hits: Any, i: int, *, width: int = 100) -> None:
    print(f"\nquery: {hits.queries[i]}   [{hits.method}]")
    view = hits[i]
    if not view:
        print("  (no hits)")
    for hit in view:
        parts = " ".join(f"{name} {value:.3f}" for name, value in hit.scores.items() if value == value)
        print(f"{hit.rank:>3}. {hit.id}  score {hit.score:.4f}  ({parts})")
        body = f"{hit.title}: {hit.text}" if hit.title else hit.text
        print(textwrap.indent(textwrap.shorten(body, width=width, placeholder=" ..."), "     "))
        if hit.matched_terms:
            terms = ", ".join(f"{m.term}{'*' if m.expansion else ''} {m.contribution:.2f}"
                              for m in hit.matched_terms[:10])
            print(f"     matched: {terms}")
    if any(m.expansion for hit in view for m in hit.matched_terms):
        print("     (* = expansion term: matched through the sparse model, absent from the document text)")


def _cmd_search(args: argparse.Namespace) -> int:
    from .retriever import HybridRetriever

    if args.candidates is not None and args.method in ("dense", "sparse", "bm25"):
        raise HybridRetError(f"--candidates sets the per-retriever depth of fused methods; --method {args.method} "
                             "is a single retriever (use -k for its depth)")
    from .filters import parse_filter

    filt = parse_filter(args.filter)  # a malformed filter fails before any model loads
    if args.ray or (Path(args.index) / "shards.json").is_file():
        from .distributed.cli import search_ray

        if args.query and args.queries is not None:
            raise HybridRetError("give a query or --queries FILE, not both")
        if not args.query and args.queries is None:
            raise HybridRetError("a sharded index is searched with a query or --queries FILE")
        return search_ray(args, filt)
    if args.queries is not None:
        if args.query:
            raise HybridRetError("give a query or --queries FILE, not both")
        return _search_batch(args, filt)
    if args.output or args.trec:
        raise HybridRetError("--output and --trec go with --queries FILE")
    if not args.query:
        if not sys.stdin.isatty():
            raise HybridRetError("no query given: pass a query, --queries FILE (one per line or JSONL; - reads "
                                 "standard input), or run on a terminal for an interactive prompt")
        return _search_prompt(args, filt)
    _search_one_query(HybridRetriever.load(args.index, device=args.device), args, filt)
    return 0


def _search_one_query(searcher: Any, args: argparse.Namespace, filt: Any) -> None:
    """Search the command line's query with any searcher and print the hits (or JSON)."""
    query = " ".join(args.query)
    hits = searcher.search([query], k=args.k, method=args.method, candidates=args.candidates, filter=filt)
    if args.json:
        print(json.dumps({"query": query, "method": args.method, "resolved": hits.method,
                          "hits": [h.to_dict() for h in hits[0]]}, ensure_ascii=False, indent=2))
    else:
        _print_hits(hits, 0)


def _read_batch_queries(path: str) -> list[tuple[str, str]]:
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


def _search_batch(args: argparse.Namespace, filt: Any) -> int:
    from .retriever import HybridRetriever

    if args.batch_size < 1:
        raise HybridRetError(f"--batch-size must be positive, got {args.batch_size}")
    if args.output and args.trec:
        raise HybridRetError("--output writes JSON lines and --trec a run file: choose one")
    queries = _read_batch_queries(args.queries)  # bad input fails before the models load
    retriever = HybridRetriever.load(args.index, device=args.device)
    run: dict[str, dict[str, float]] = {}
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    method = args.method
    try:
        for start in range(0, len(queries), args.batch_size):
            chunk = queries[start:start + args.batch_size]
            hits = retriever.search([t for _, t in chunk], k=args.k, method=args.method, candidates=args.candidates,
                                    filter=filt)
            method = hits.method
            for i, (qid, text) in enumerate(chunk):
                view = hits[i]
                if args.trec:
                    run[qid] = {h.id: h.score for h in view if h.score == h.score and abs(h.score) != float("inf")}
                else:
                    out.write(json.dumps({"query_id": qid, "query": text, "method": args.method,
                                          "resolved": hits.method, "hits": [h.to_dict() for h in view]},
                                         ensure_ascii=False) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    if args.trec:
        from .runs import write_run

        write_run(run, args.trec, tag=f"hybridret-{method}".replace(" ", "_"))
    logger.info("searched %d queries (%s)%s", len(queries), method,
                f"; run written to {args.trec}" if args.trec else f"; hits written to {args.output}" if args.output else "")
    return 0


def _search_prompt(args: argparse.Namespace, filt: Any) -> int:
    """A small interactive prompt: one query per line, an empty line or EOF quits."""
    from .retriever import HybridRetriever

    retriever = HybridRetriever.load(args.index, device=args.device, warm=True)
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
        hits = retriever.search([query], k=args.k, method=args.method, candidates=args.candidates, filter=filt)
        _print_hits(hits, 0)


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .serve.app import ServeConfig, serve
    except ImportError as exc:
        raise HybridRetError(f"serving needs FastAPI and uvicorn: pip install 'hybridret[serve]' ({exc})") from None
    from .serve.auth import read_api_key

    if args.protect_reads and not args.api_key_file:
        raise HybridRetError("--protect-reads needs --api-key-file")
    if not 1 <= args.port <= 65535 and args.port != 0:
        raise HybridRetError(f"--port must be 1..65535, got {args.port}")
    if args.max_batch < 1 or args.batch_window_ms < 0:
        raise HybridRetError("--max-batch must be >= 1 and --batch-window-ms >= 0")
    if args.refresh_every is not None and args.refresh_every <= 0:
        raise HybridRetError(f"--refresh-every must be positive, got {args.refresh_every}")
    key = read_api_key(args.api_key_file) if args.api_key_file else None
    config = ServeConfig(api_key=key, protect_reads=args.protect_reads, batching=not args.no_batching,
                         batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                         refresh_every=args.refresh_every)
    from .serve.backends import ShardedBackend, is_sharded

    if args.ray or is_sharded(args.index):
        index: Any = ShardedBackend.open(args.index, address=args.ray_address, device=args.device)
    elif args.ray_address:
        raise HybridRetError(f"--ray-address is for a sharded index, and {args.index} has no shards.json "
                             "(build one with: hybridret index CORPUS -o DIR --ray)")
    elif args.device:
        from .retriever import HybridRetriever

        index = HybridRetriever.load(args.index, device=args.device, warm=True)
    else:
        index = args.index
    serve(index, host=args.host, port=args.port, config=config,
          log_level="debug" if args.verbose else "warning" if args.quiet else "info")
    return 0


def _judged(args: argparse.Namespace) -> tuple[Any, dict[str, str], dict[str, dict[str, int]]]:
    from .data import load_qrels, load_queries
    from .retriever import HybridRetriever

    retriever = HybridRetriever.load(args.index, device=args.device)
    queries = load_queries(args.queries)
    qrels = load_qrels(args.qrels)
    judged = {q: t for q, t in queries.items() if qrels.get(q)}
    if not judged:
        raise HybridRetError(f"none of the {len(queries)} queries in {args.queries} has judgments in {args.qrels}")
    return retriever, judged, qrels


def _cmd_eval(args: argparse.Namespace) -> int:
    from .eval import evaluate, run_from_hits

    retriever, queries, qrels = _judged(args)
    qids = list(queries)
    hits = retriever.search([queries[q] for q in qids], k=args.k, method=args.method)
    run = run_from_hits(hits, qids)
    metrics = evaluate(run, qrels, args.metrics, relevance_level=args.relevance_level)
    if args.save_run:
        from .runs import write_run

        write_run(run, args.save_run, tag=f"hybridret-{hits.method}".replace(" ", "_"))
        logger.info("wrote the %s run to %s", hits.method, args.save_run)
    if args.json:
        print(json.dumps({"method": args.method, "resolved": hits.method, "metrics": metrics, "queries": len(qids)}))
    else:
        print(f"{hits.method} on {len(qids)} queries: " + "  ".join(f"{m} {v:.4f}" for m, v in metrics.items()))
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from .tune import tune

    retriever, queries, qrels = _judged(args)
    best, table = tune(retriever, queries, qrels, metric=args.metric, relevance_level=args.relevance_level)
    ranked = sorted(table, key=lambda r: -r[args.metric])
    if not args.dry_run:
        retriever.set_fusion(best, {"queries": str(args.queries), "qrels": str(args.qrels), "metric": args.metric,
                                    "value": ranked[0][args.metric], "n_queries": len(queries)})
    if args.json:
        print(json.dumps({"best": best.to_dict(), "metric": args.metric, "value": ranked[0][args.metric],
                          "stored": not args.dry_run, "results": ranked}))
        return 0
    print(f"{'rank':>4}  {args.metric:>9}  setting")
    for i, row in enumerate(ranked[:10], 1):
        cfg = row["config"]
        detail = {k: cfg[k] for k in ("retrievers", "weights", "normalisation")} if cfg["method"] == "linear" else \
            {"retrievers": cfg["retrievers"], "rrf_k": cfg["rrf_k"]} if cfg["method"] == "rrf" else \
            {"guide": cfg["guide"], "guide_weighting": cfg["guide_weighting"], "alpha": cfg["gqr"]["alpha"],
             "t_dense": cfg["gqr"]["t_dense"], "final_guide": cfg["gqr"]["final_guide"]}
        print(f"{i:>4}  {row[args.metric]:9.4f}  {cfg['method']} {json.dumps(detail)}")
    print("stored as the index's hybrid setting" if not args.dry_run else "(dry run: nothing stored)")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from .retriever import HybridRetriever

    retriever = HybridRetriever.load(args.index)
    info = retriever.info()
    if args.check:
        problems = retriever.check()
        info["check"] = {"ok": not problems, "problems": problems}
        if not args.json:
            for p in problems:
                print(f"problem: {p}")
            print(f"check: {'ok' if not problems else f'{len(problems)} problems'} "
                  f"({len(info.get('segments', []))} segments)")
            return 1 if problems else 0
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 1 if args.check and info["check"]["problems"] else 0
    comps = info.get("components", {})
    print(f"index:      {args.index}")
    print(f"documents:  {info.get('num_docs')} (skipped empty: {info.get('skipped_empty', 0)})")
    print(f"encoder:    {json.dumps(info.get('encoder'))}")
    if "dense" in comps:
        d = comps["dense"]
        print(f"dense:      FAISS {d.get('factory')}, {d.get('dim')}-d, metric {d.get('metric')}")
    if "sparse" in comps:
        s = comps["sparse"]
        print(f"sparse:     tantivy, vocab {s.get('vocab_size')}, {s.get('nnz', 0) / max(1, s.get('num_docs', 1)):.1f} "
              f"terms/doc, {s.get('bits')} bit planes, BM25 {'yes' if s.get('bm25') else 'no'}")
    segs = info.get("segments", [])
    print(f"segments:   {len(segs)} ({info.get('num_deleted', 0)} deleted documents not yet compacted)")
    print(f"on disk:    {info.get('bytes_on_disk', 0) / 1e6:.1f} MB")
    print(f"format:     {info.get('format_version')} (saved {info.get('saved_at')}, hybridret "
          f"{info.get('libraries', {}).get('hybridret')})")
    return 0


def _print_result(result: Any, args: argparse.Namespace, what: str) -> None:
    if args.json:
        print(json.dumps(result.to_dict()))
        return
    done = {k: v for k, v in result.to_dict().items() if k in ("added", "updated", "unchanged", "deleted",
                                                              "skipped_empty") and v}
    parts = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in done.items()) or "nothing changed"
    print(f"{what} {args.index}: {parts}" + (f" (commit {result.commit})" if result.commit is not None else ""))


def _cmd_add(args: argparse.Namespace) -> int:
    from .data import CorpusReader
    from .retriever import HybridRetriever

    reader = CorpusReader(args.corpus, format=args.format)
    retriever = HybridRetriever.load(args.index, device=args.device)
    write = retriever.upsert if args.upsert else retriever.add
    with _NamingPath(Path(args.index), retriever):
        result = write(reader, batch_size=args.batch_size, total=_count_records(reader.file),
                       encode_cache=args.encode_cache)
    _print_result(result, args, "upserted into" if args.upsert else "added to")
    return 0


def _read_ids(args: argparse.Namespace) -> list[str]:
    ids = list(args.ids)
    if args.ids_file:
        fh = sys.stdin if args.ids_file == "-" else open(args.ids_file, encoding="utf-8")
        with fh:
            ids += [line.rstrip("\r\n") for line in fh if line.strip()]
    if not ids:
        raise HybridRetError("no ids to delete: give them as arguments or with --ids-file")
    return ids


def _cmd_delete(args: argparse.Namespace) -> int:
    from .retriever import HybridRetriever

    ids = _read_ids(args)
    retriever = HybridRetriever.load(args.index)
    with _NamingPath(Path(args.index), retriever):
        result = retriever.delete(ids, missing="ignore" if args.ignore_missing else "error")
    if result.missing:
        shown = ", ".join(result.missing[:20]) + (" ..." if len(result.missing) > 20 else "")
        logger.warning("%d ids were not in the index: %s", len(result.missing), shown)
    _print_result(result, args, "deleted from")
    return 0


def _cmd_compact(args: argparse.Namespace) -> int:
    from .retriever import HybridRetriever

    quiet = logging.getLogger("hybridret.retriever")
    level = quiet.level
    if args.migrate:  # the load's "run compact --migrate" hint is what is being done
        quiet.setLevel(logging.WARNING)
    try:
        retriever = HybridRetriever.load(args.index)
    finally:
        quiet.setLevel(level)
    before = len(retriever.searcher.snapshot.segments)
    with _NamingPath(Path(args.index), retriever):
        result = retriever.compact(migrate=args.migrate)
    if args.json:
        print(json.dumps(result.to_dict()))
    elif result.commit is None:
        print(f"{args.index}: nothing to compact ({before} segment, no deleted documents"
              + (", already in the current format)" if args.migrate else ")"))
    else:
        snap = retriever.searcher.snapshot
        print(f"compacted {before} segments of {args.index} into {len(snap.segments)} ({snap.num_docs} documents) "
              f"(commit {result.commit})")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .data import CorpusReader, load_queries
    from .retriever import HybridRetriever

    corpus = SAMPLE_DIR / "corpus.jsonl"
    out = Path(args.output)
    _check_output(out, args.overwrite)
    reader = CorpusReader(corpus)
    retriever = HybridRetriever.from_models(device=args.device)
    with _NamingPath(out, retriever):
        retriever.index(reader, workdir=out, total=_count_records(reader.file), overwrite=True)
    logger.info("indexed the %d-passage sample corpus into %s", retriever.num_docs, out)
    queries = load_queries(SAMPLE_DIR / "queries.jsonl")
    hits = retriever.search([queries[q] for q in DEMO_QUERIES], k=args.k)
    for i in range(len(hits)):
        _print_hits(hits, i)
    print(f"\nTry: hybridret search {out} \"your question\" --method sparse")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from .train import examples_from_beir, read_triples
    from .train.trainer import TrainConfig, train

    data = Path(args.data)
    if not data.exists():
        raise FileNotFoundError(f"training data not found: {data}")
    examples = examples_from_beir(data, split=args.split) if data.is_dir() else read_triples(data)
    config = TrainConfig(
        model=args.model, output_dir=args.output, steps=args.steps, batch_size=args.batch_size,
        grad_accum=args.grad_accum, lr=args.lr, warmup_steps=args.warmup_steps, n_negatives=args.negatives,
        flops_query=args.flops_query, flops_doc=args.flops_doc, flops_warmup_steps=args.flops_warmup,
        shared=not args.separate, projection_dim=args.projection_dim, teacher=args.distill,
        distill_weight=args.distill_weight, max_length=args.max_length, checkpoint_every=args.checkpoint_every,
        seed=args.seed, device=args.device, amp=not args.no_amp,
        data=f"{data}" + (f" (split {args.split})" if data.is_dir() else ""),
    )
    out = train(config, examples, resume=args.resume)
    print(f"model written to {out}; index with: hybridret index CORPUS -o INDEX --joint-model {out}")
    return 0


def _cmd_mine(args: argparse.Namespace) -> int:
    from .train import mine_negatives, write_triples

    retriever, queries, qrels = _judged(args)
    examples = mine_negatives(retriever, queries, qrels, k=args.k, n=args.n, method=args.method,
                              skip_top=args.skip_top, seed=args.seed)
    n = write_triples(examples, args.output)
    logger.info("wrote %d training triples for %d queries to %s", n, len(queries), args.output)
    return 0


def _error_line(exc: BaseException) -> str:
    """One line for an expected failure; an ``OSError`` leads with the path(s) it concerns."""
    if isinstance(exc, OSError) and exc.strerror:
        paths = [str(f) for f in (exc.filename, exc.filename2) if f is not None]
        return f"{' -> '.join(paths)}: {exc.strerror}" if paths else str(exc.strerror)
    if isinstance(exc, UnicodeError):
        return f"text that is not valid Unicode (a lone surrogate, or bytes in another encoding?): {exc}"
    return str(exc).replace("\n", " ")


def _check_text_args(args: argparse.Namespace) -> None:
    """Free text on the command line (a search query) must be valid Unicode. Bytes that are not
    UTF-8 reach Python as lone surrogates; paths may hold those, query text may not."""
    words = getattr(args, "query", None)
    for word in words if isinstance(words, list) else []:
        try:
            word.encode("utf-8")
        except UnicodeEncodeError:
            raise HybridRetError(f"the query {word!r} is not valid UTF-8 text (check the terminal's or "
                                 "script's encoding)") from None


def _stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):  # stderr itself is gone (closed pipe): nothing left to tell
        pass


def _stdout_gone() -> int:
    """stdout's reader went away (``| head``): exit quietly, like other Unix tools. Later writes,
    including the interpreter's flush at exit, go to /dev/null (see the Python docs on SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a tool the broken pipe stopped


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 error, 2 usage, 130 interrupted, 141 output pipe
    closed). Expected failures (bad input, missing or unwritable files, a full disk, text that is
    not valid Unicode) print one ``hybridret: error: ...`` line; ``--debug`` shows the traceback."""
    # torch and FAISS each bring an OpenMP runtime; with spinning idle threads (the default) one
    # starves the other, and query encoding after a FAISS search ran ~15x slower on 2 cores.
    # This must be set before either library loads, which the CLI does lazily, below.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = _parser()
    parser.add_argument("--debug", action="store_true", help="show the full traceback of any error")
    args = parser.parse_args(argv)
    _setup_logging(args)
    commands = {"index": _cmd_index, "search": _cmd_search, "info": _cmd_info, "demo": _cmd_demo,
                "eval": _cmd_eval, "tune": _cmd_tune, "train": _cmd_train, "mine-negatives": _cmd_mine,
                "add": _cmd_add, "delete": _cmd_delete, "compact": _cmd_compact, "serve": _cmd_serve}
    try:
        _check_text_args(args)
        code = commands[args.command](args)
        sys.stdout.flush()  # here, so that a closed pipe is seen now and not at interpreter exit
        return code
    except BrokenPipeError:
        return _stdout_gone()
    except (HybridRetError, OSError, UnicodeError) as exc:
        if args.debug:
            raise
        _stderr(f"hybridret: error: {_error_line(exc)}")
        return 1
    except KeyboardInterrupt:
        _stderr("hybridret: interrupted")
        return 130
    except Exception:
        if not args.debug:
            _stderr("hybridret: internal error, please report it with the traceback below:")
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
