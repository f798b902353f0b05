"""MS MARCO passage ranking: hybridret and its peers, from the official files or a BEIR-format pool.

    # the TREC DL 2019 pool shipped in ../shared (default; BEIR layout, graded qrels)
    python benchmarks/msmarco.py
    # the official files (collection.tsv is 8.8M passages; .gz accepted everywhere)
    python benchmarks/msmarco.py --collection collection.tsv \\
        --queries queries.dev.small.tsv --qrels qrels.dev.small.tsv \\
        --dl19-queries msmarco-test2019-queries.tsv --dl19-qrels 2019qrels-pass.txt \\
        --dl20-queries msmarco-test2020-queries.tsv --dl20-qrels 2020qrels-pass.txt \\
        --faiss IVF65536_HNSW32,PQ64 --no-peers

Reports MRR@10 and Recall@1000 (dev-small, binary qrels), nDCG@10 (TREC DL, graded; binary metrics
count grade >= 2), index size on disk, build time and queries/s for every method and peer. The build
streams the collection (one chunk of --chunk-size passages in memory) with a progress bar and ETA,
and is resumable: encoded chunks are kept in <index>.encode-cache until the build completes, so
rerunning the same command after an interruption re-encodes only what is missing.

At the end it projects the full 8.8M-passage collection from the measured bytes per passage and
build rate (docs/benchmarks.md has the plan for a GPU machine).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED, machine, write_json  # noqa: E402
from _suite import Collection, Topics, add_common_args, results_path, run_collection, setup_run, tables  # noqa: E402

from hybridret import CorpusReader, load_beir, load_qrels, load_queries  # noqa: E402

FULL = 8_841_823  # passages in the official collection.tsv


def _count_lines(path: Path) -> int | None:
    if str(path).endswith(".gz"):
        return None
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def collection_from_args(args: argparse.Namespace) -> Collection:
    if args.collection is None:
        corpus, queries, qrels = load_beir(args.beir)
        return Collection(args.name or args.beir.name, lambda: CorpusReader(args.beir, format="beir"),
                          [Topics("dl19" if "dl19" in args.beir.name else "test", queries, qrels, level=2)],
                          num_docs=_count_lines(corpus.file),
                          notes=[f"{args.beir}: BEIR layout; graded qrels, binary metrics count grade >= 2"])
    topics = []
    for name, q, r, level in (("dev-small", args.queries, args.qrels, 1), ("dl19", args.dl19_queries, args.dl19_qrels, 2),
                              ("dl20", args.dl20_queries, args.dl20_qrels, 2)):
        if (q is None) != (r is None):
            raise SystemExit(f"{name}: give both the queries and the qrels file")
        if q is not None:
            topics.append(Topics(name, load_queries(q), load_qrels(r), level))
    if not topics:
        raise SystemExit("give at least one query set (--queries/--qrels, --dl19-*, --dl20-*)")
    path = args.collection
    return Collection(args.name or "msmarco-passage", lambda: CorpusReader(path, format="tsv"), topics,
                      num_docs=_count_lines(path))


def projection(result: dict) -> dict:
    """What the full collection would need, scaled linearly from this run (an estimate, not a measurement)."""
    b = result["build"]["hybridret"]
    n = result["docs"]
    per_doc = {k: v / n for k, v in b["bytes_on_disk"].items()}
    out = {"passages": FULL, "bytes_on_disk_flat_fp32": {k: v * FULL for k, v in per_doc.items()},
           "dense_bytes_ivfpq64": FULL * (64 + 8), "dense_bytes_sqfp16": FULL * 384 * 2}
    if b.get("docs_per_s"):
        out["cpu_build_hours_at_measured_rate"] = FULL / b["docs_per_s"] / 3600
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beir", type=Path, default=SHARED / "msmarco-dl19-pool", help="a BEIR-format MS MARCO folder")
    ap.add_argument("--collection", type=Path, help="official collection.tsv (pid<TAB>passage)")
    ap.add_argument("--queries", type=Path, help="queries.dev.small.tsv")
    ap.add_argument("--qrels", type=Path, help="qrels.dev.small.tsv")
    ap.add_argument("--dl19-queries", type=Path)
    ap.add_argument("--dl19-qrels", type=Path)
    ap.add_argument("--dl20-queries", type=Path)
    ap.add_argument("--dl20-qrels", type=Path)
    ap.add_argument("--name", help="name for the index and results (default: from the folder)")
    ap.add_argument("--faiss", default="Flat", help="FAISS factory (default Flat; IVF65536_HNSW32,PQ64 or SQfp16 for 8.8M)")
    ap.add_argument("--batch-size", type=int, default=32)
    add_common_args(ap, depth=1000)
    args = ap.parse_args(argv)
    setup_run(args)
    coll = collection_from_args(args)
    out = results_path(coll.name) if args.results is None else args.results / f"peers-{coll.name}.json"
    res = run_collection(coll, args.index_root / f"bench-{coll.name}", depth=args.depth, use_peers=not args.no_peers,
                         rebuild=args.rebuild, build_sample=args.build_sample, deep_fused=True,
                         settings={"faiss_factory": args.faiss}, batch_size=args.batch_size)
    res["machine"] = machine()
    res["kind"] = "msmarco"
    res["projection_full_collection"] = projection(res)
    print("\n" + tables(res, "msmarco"))
    p = res["projection_full_collection"]
    print(f"\nprojected for {FULL:,} passages (linear scaling of this run): "
          + ", ".join(f"{k} {v / 1e9:.1f} GB" for k, v in p["bytes_on_disk_flat_fp32"].items())
          + f"; dense as IVF-PQ64 {p['dense_bytes_ivfpq64'] / 1e9:.1f} GB, as SQfp16 {p['dense_bytes_sqfp16'] / 1e9:.1f} GB"
          + (f"; CPU build {p['cpu_build_hours_at_measured_rate']:.0f} h at this machine's rate"
             if "cpu_build_hours_at_measured_rate" in p else ""))
    write_json(out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
