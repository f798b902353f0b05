"""``hybridret index CORPUS -o DIR``: encode and index a corpus (``--ray``: a sharded index on Ray)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import HybridRetError

# hybridret.encoders.backends.BACKENDS (not imported here: the parser stays light; a test keeps them equal)
ENCODER_BACKENDS = ("auto", "onnx", "onnx-int8", "numpy", "torch", "torch-bf16", "torch-int8")
from ._common import (NamingPath, add_corpus_args, add_encoder_args, add_ray_args, build_retriever, check_output,
                      corpus_reader, corpus_total, logger)
from ._rag import add_chunk_args, chunk_kwargs

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("index", help="encode and index a corpus",
                       description="Index a JSONL file, a BEIR folder, an MS MARCO collection.tsv or Parquet (a "
                                   "file or a folder of them). Documents whose title and text are both empty are "
                                   "skipped and counted.")
    add_corpus_args(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="index directory to write")
    p.add_argument("--faiss", default="auto", metavar="FACTORY",
                   help="the dense part: auto (default: exact Flat for segments under 100,000 vectors, above that "
                        "a compressed IVF-RaBitQ index tuned to recall@10 0.995 whose candidates are re-scored "
                        "exactly), Flat (always exact), or any FAISS factory string (e.g. HNSW32,Flat)")
    p.add_argument("--batch-size", type=int, default=32, help="texts per encoder batch (default: 32)")
    p.add_argument("--encoder-backend", choices=ENCODER_BACKENDS, default="auto",
                   help="what runs the models: onnx (ONNX Runtime, float32, no torch: pip install 'hybridret[onnx]'), "
                        "onnx-int8 (int8 matrix products: faster, small quality cost), numpy (float32, no torch "
                        "needed; BERT models such as the defaults), torch (float32; fp16 on CUDA), torch-bf16 "
                        "(near-lossless, needs avx512_bf16/AMX) or torch-int8; the torch ones need pip install "
                        "'hybridret[torch]'. Default auto: onnx where onnxruntime is installed, else torch where "
                        "installed, else numpy; HYBRIDRET_ENCODER_BACKEND=onnx|numpy|torch overrides")
    p.add_argument("--chunk-size", type=int, default=1024, help="documents per indexing chunk (default: 1024)")
    p.add_argument("--sparse-scheme", choices=("impact", "tfgrid", "planes", "buckets"), default="impact",
                   help="how learned weights are indexed: impact (default: impact-layered postings, pruned exact "
                        "search in numba), tfgrid (tantivy, weights on its tf curve) or the format-1 planes/buckets; "
                        "results are exact either way")
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
    add_chunk_args(p, build=True)
    add_ray_args(p, build=True)
    add_encoder_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import shutil
    import time

    from ..indexer import count_words
    rag = chunk_kwargs(args)
    if args.ray:
        from .sharded import index_ray

        if rag:
            raise HybridRetError("--chunk-tokens and --ttl are not supported with --ray yet")
        return index_ray(args)

    out = Path(args.output)
    check_output(out, args.overwrite)
    reader = corpus_reader(args, on_empty=args.on_empty)
    total = corpus_total(reader)  # before the models load: a corrupt file fails fast
    retriever = build_retriever(args, faiss_factory=args.faiss, sparse_scheme=args.sparse_scheme,
                                sparse_bits=args.sparse_bits, sparse_max_weight=args.sparse_max_weight,
                                bm25=not args.no_bm25, store_text=not args.no_text)
    cache = None if args.no_encode_cache else Path(args.encode_cache or out / "encode-cache")
    if cache is not None and (cache / "cache.json").is_file():
        logger.info("resuming: reusing the encodings kept in %s", cache)
    start = time.perf_counter()
    with NamingPath(out):
        retriever.index(reader, batch_size=args.batch_size, chunk_size=args.chunk_size, workdir=out,
                        total=total, encode_cache=cache, overwrite=True,
                        source={"path": str(args.corpus), "format": reader.format}, **rag)
    if cache is not None and args.encode_cache is None:
        shutil.rmtree(cache, ignore_errors=True)  # the default cache lives inside the finished index
    elif cache is not None:
        logger.info("the encoding cache %s is kept (--encode-cache); remove it when no later build needs it", cache)
    took = time.perf_counter() - start
    documents, chunks = retriever.document_counts()
    rows = retriever.num_docs
    unit = "chunks" if chunks else "docs"
    logger.info("indexed %s into %s in %.1f s (%.1f %s/s)", count_words(documents, chunks if chunks else None), out,
                took, rows / max(took, 1e-9), unit)
    return 0
