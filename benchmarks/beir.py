"""hybridret and its peers on BEIR-format folders: quality, queries/s ratios, build throughput, memory.

    python benchmarks/beir.py [FOLDER ...] [--no-peers] [--depth 1000] [--rebuild]

FOLDER defaults to every collection in ../shared/data. Each folder needs corpus.jsonl, queries.jsonl
and qrels/test.tsv. hybridret's index is built once into indexes/bench-<name> (resumable: encoded
chunks are cached beside it until the build completes). Peers, built fresh in the same run on the
same documents: bm25s; pyserini BM25 and impact search over hybridret's own SPLADE vectors when
pyserini and Java 21+ are present (skipped with the reason otherwise); FAISS IndexFlatIP and
sentence-transformers semantic_search on hybridret's own dense vectors; ranx RRF / min-max fusion.
Folders whose name starts with "limit" are reported with Recall@2, Recall@100 and nDCG@10.
Writes benchmarks/results/peers-<name>.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED, machine, write_json  # noqa: E402
from _suite import Collection, Topics, add_common_args, results_path, run_collection, setup_run, tables  # noqa: E402

from hybridret import CorpusReader, load_beir  # noqa: E402


def beir_collection(folder: Path) -> Collection:
    corpus, queries, qrels = load_beir(folder)
    n = sum(1 for line in open(corpus.file, "rb") if line.strip()) if not str(corpus.file).endswith(".gz") else None
    level = 2 if "msmarco" in folder.name else 1
    return Collection(folder.name, lambda: CorpusReader(folder, format="beir"),
                      [Topics("test", queries, qrels, level)], num_docs=n)


def irds_collection(dataset_id: str) -> Collection:
    """An ir_datasets id whose files are already on this machine (nothing is downloaded)."""
    from hybridret import load_ir_dataset

    _, queries, qrels = load_ir_dataset(dataset_id)
    level = 2 if any(g >= 2 for d in qrels.values() for g in d.values()) and "msmarco" in dataset_id else 1
    return Collection(dataset_id.replace("/", "_"), lambda: load_ir_dataset(dataset_id)[0],
                      [Topics("test", queries, qrels, level)], notes=[f"ir_datasets {dataset_id}"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path)
    ap.add_argument("--irds", nargs="+", default=[], metavar="ID",
                    help="also run ir_datasets ids whose data is already local (e.g. beir/scifact/test)")
    add_common_args(ap, depth=100)
    args = ap.parse_args(argv)
    setup_run(args)
    folders = args.folders or ([] if args.irds else sorted(p for p in SHARED.iterdir() if (p / "corpus.jsonl").is_file()))
    if not folders and not args.irds:
        print(f"no BEIR folders given and none found in {SHARED}", file=sys.stderr)
        return 2
    for folder in folders:
        if not (folder / "corpus.jsonl").is_file() and not (folder / "corpus.jsonl.gz").is_file():
            print(f"{folder}: not a BEIR folder (no corpus.jsonl)", file=sys.stderr)
            return 2
    for coll in [*(beir_collection(f) for f in folders), *(irds_collection(i) for i in args.irds)]:
        out = results_path(coll.name) if args.results is None else args.results / f"peers-{coll.name}.json"
        res = run_collection(coll, args.index_root / f"bench-{coll.name}", depth=args.depth,
                             use_peers=not args.no_peers, rebuild=args.rebuild, build_sample=args.build_sample)
        res["machine"] = machine()
        res["kind"] = "limit" if coll.name.startswith("limit") else "beir"
        print("\n" + tables(res, res["kind"]))
        write_json(out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
