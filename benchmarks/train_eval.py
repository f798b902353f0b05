"""Training benchmark: fine-tune dual hybrid encoders on half of a BEIR collection's queries and
score the other half, before and after, for dense, sparse and hybrid retrieval.

    python benchmarks/train_eval.py [--data ../shared/data/cranfield] [--steps 200] [--models splade-tiny minilm]

Queries with judgments are split 50/50 by a seeded shuffle. Each start model -- (a) splade-tiny,
(b) all-MiniLM-L6-v2 with a new tied MLM head -- is saved untrained ("before") and trained
("after"); each is indexed as a JointEncoder. Hard negatives are mined once with BM25 from the
first "before" index. Reports test nDCG@10, average non-zero sparse terms per query and per
document, and encoding ms per document. Writes benchmarks/results/train-<name>.json.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, SHARED, machine, table, write_json  # noqa: E402

from hybridret import HybridRetriever  # noqa: E402
from hybridret.data import CorpusReader, load_beir  # noqa: E402
from hybridret.encoders import JointEncoder  # noqa: E402
from hybridret.eval import evaluate, run_from_hits  # noqa: E402
from hybridret.train import examples_from_beir, mine_negatives  # noqa: E402
from hybridret.train.model import HybridModel  # noqa: E402
from hybridret.train.trainer import TrainConfig, train  # noqa: E402

MODELS = {"splade-tiny": "splade-tiny", "minilm": "all-MiniLM-L6-v2"}
METHODS = ("dense", "sparse", "hybrid")


def measure(folder: Path, data: Path, work: Path, queries: dict[str, str], qrels: dict, max_length: int) -> dict:
    enc = JointEncoder(str(folder), max_length=max_length)
    r = HybridRetriever(enc)
    r.index(CorpusReader(data), workdir=work)
    r.save(work, overwrite=True)
    r = HybridRetriever.load(work, encoder=enc)
    qids = sorted(queries)
    texts = [queries[q] for q in qids]
    row: dict = {}
    for m in METHODS:
        hits = r.search(texts, k=100, method=m)
        row[f"{m} nDCG@10"] = evaluate(run_from_hits(hits, qids), qrels, ["ndcg@10"])["ndcg@10"]
    sparse_meta = r.info()["components"]["sparse"]
    row["terms/query"] = float(enc.encode_queries(texts).sparse.getnnz(axis=1).mean())
    row["terms/doc"] = sparse_meta.get("nnz", 0) / max(1, sparse_meta.get("num_docs", 1))
    sample = [d.full_text for _, d in zip(range(200), CorpusReader(data))]
    start = time.perf_counter()
    enc.encode_documents(sample, show_progress=False)
    row["ms/doc"] = 1000 * (time.perf_counter() - start) / max(1, len(sample))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SHARED / "cranfield")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=200, help="training steps per model (default: 200)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--negatives", type=int, default=1, help="hard negatives per query (default: 1)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--flops-query", type=float, default=3e-4)
    ap.add_argument("--flops-doc", type=float, default=1e-4)
    ap.add_argument("--teacher", default=None, help="'paired' (the packaged models' scores) or a TREC run file")
    ap.add_argument("--distill-weight", type=float, default=1.0)
    ap.add_argument("--dense-weight", type=float, default=1.0)
    ap.add_argument("--sparse-weight", type=float, default=1.0)
    ap.add_argument("--tag", default="", help="suffix for the results file and work folders (e.g. distill)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    name = args.data.name
    corpus, queries, qrels = load_beir(args.data, "test")
    judged = sorted(q for q in queries if any(g > 0 for g in qrels.get(q, {}).values()))
    order = np.random.default_rng(args.seed).permutation(len(judged))
    half = len(judged) // 2
    train_q = {judged[i]: queries[judged[i]] for i in order[:half]}
    test_q = {judged[i]: queries[judged[i]] for i in order[half:]}
    tag = f"-{args.tag}" if args.tag else ""
    work = ROOT / "indexes" / f"train-{name}{tag}"
    print(f"{name}: {len(train_q)} training / {len(test_q)} test queries, {args.steps} steps")
    rows, negatives = [], None
    for key in args.models:
        before = work / f"{key}-before-model"
        HybridModel.from_pretrained(MODELS[key], max_length=args.max_length, device="cpu").save(before)
        row = {"model": key, "stage": "before", **measure(before, args.data, work / f"{key}-before", test_q, qrels,
                                                          args.max_length)}
        rows.append(row)
        print(table([row], list(row)))
        if negatives is None and args.negatives:
            r = HybridRetriever.load(work / f"{key}-before", encoder=JointEncoder(str(before), max_length=args.max_length))
            mined = mine_negatives(r, train_q, qrels, k=30, n=args.negatives, method="bm25", seed=args.seed)
            negatives = {ex.query_id: ex.negative_ids for ex in mined}
        examples = examples_from_beir(corpus, train_q, qrels, negatives=negatives)
        config = TrainConfig(model=MODELS[key], output_dir=str(work / f"{key}-trained"), steps=args.steps,
                             batch_size=args.batch_size, n_negatives=args.negatives, lr=args.lr,
                             warmup_steps=max(1, args.steps // 10), max_length=args.max_length,
                             flops_query=args.flops_query, flops_doc=args.flops_doc, teacher=args.teacher,
                             distill_weight=args.distill_weight, dense_weight=args.dense_weight,
                             sparse_weight=args.sparse_weight,
                             checkpoint_every=max(args.steps, 1), seed=args.seed, device=args.device,
                             data=f"{args.data} (train half, seed {args.seed})")
        start = time.perf_counter()
        trained = train(config, examples, resume=(Path(config.output_dir) / "checkpoints").is_dir())
        took = time.perf_counter() - start
        row = {"model": key, "stage": f"after {args.steps}", **measure(trained, args.data, work / f"{key}-after",
                                                                        test_q, qrels, args.max_length),
               "train s": took}
        rows.append(row)
        print(table([row], list(row)))
    cols = ["model", "stage", *[f"{m} nDCG@10" for m in METHODS], "terms/query", "terms/doc", "ms/doc", "train s"]
    print("\n" + table(rows, cols))
    write_json(RESULTS / f"train-{name}{tag}.json", {"data": str(args.data), "args": {k: str(v) for k, v in vars(args).items()},
                                               "train_queries": len(train_q), "test_queries": len(test_q),
                                               "rows": rows, "machine": machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
