"""``hybridret train`` (a joint dense + sparse encoder, contrastively) and ``hybridret
mine-negatives`` (training triples with hard negatives mined from an index)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import add_method_arg, judged, logger

__all__ = ["add_parsers", "run_mine", "run_train"]


def add_parsers(sub: Any) -> None:
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
    p.set_defaults(run=run_train)

    p = sub.add_parser("mine-negatives", help="write training triples with hard negatives mined from an index")
    p.add_argument("index", metavar="INDEX_DIR")
    p.add_argument("--queries", required=True, help="BEIR queries.jsonl or a TSV of qid<TAB>text")
    p.add_argument("--qrels", required=True, help="BEIR qrels TSV or TREC qrels")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="triples JSONL to write")
    p.add_argument("-k", type=int, default=30, help="sample negatives from this many top hits (default: 30)")
    p.add_argument("-n", type=int, default=4, help="negatives per query (default: 4)")
    add_method_arg(p, help="ranking to mine from (default: hybrid)")
    p.add_argument("--skip-top", type=int, default=0, help="skip this many best non-relevant hits (default: 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    p.set_defaults(run=run_mine)


def run_train(args: argparse.Namespace) -> int:
    from ..train import examples_from_beir, read_triples
    from ..train.trainer import TrainConfig, train

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


def run_mine(args: argparse.Namespace) -> int:
    from ..train import mine_negatives, write_triples

    retriever, queries, qrels = judged(args)
    examples = mine_negatives(retriever, queries, qrels, k=args.k, n=args.n, method=args.method,
                              skip_top=args.skip_top, seed=args.seed)
    n = write_triples(examples, args.output)
    logger.info("wrote %d training triples for %d queries to %s", n, len(queries), args.output)
    return 0
