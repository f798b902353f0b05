"""Write the small legacy indexes that tests/test_legacy_format.py opens.

Run with the hybridret release whose format is to be frozen, e.g. for format 2 (commit 853a81f):

    git worktree add /tmp/hybridret-f2 853a81f
    cd /tmp/hybridret-f2 && HF_HUB_OFFLINE=1 python /path/to/tests/data/make_legacy_indexes.py /path/to/tests/data/legacy

It writes ``format2/`` (two segments, tombstones, metadata), ``format1-planes/`` (sparse format 1: bit planes,
BM25 through tantivy's text field, no BM25 posting store) and ``expected.json`` (each method's top-10 ids and
scores for the sample queries, as that release computed them).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import hybridret
from hybridret import HybridRetriever
from hybridret.encoders import PairedEncoder

SAMPLE = Path(hybridret.__file__).parent / "resources" / "sample"
METHODS = ("dense", "sparse", "bm25", "hybrid", "rrf", "linear")


def main(out: Path) -> None:
    docs = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").open()]
    docs = [{"id": d["_id"], "title": d.get("title", ""), "text": d["text"],
             "metadata": {"n": i, "parity": "even" if i % 2 == 0 else "odd"}} for i, d in enumerate(docs)]
    queries = [json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").open()][:10]
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    enc = PairedEncoder.from_names()
    expected: dict[str, dict[str, dict[str, list]]] = {}

    r = HybridRetriever(enc).index(docs[:40], workdir=out / "format2")
    r.add(docs[40:50])
    r.delete([docs[3]["id"], docs[17]["id"], docs[44]["id"]])
    expected["format2"] = _results(r, queries)

    p = HybridRetriever(enc, sparse_scheme="planes").index(docs[:30], workdir=out / "format1-planes")
    p.add(docs[30:36])
    p.delete([docs[5]["id"]])
    for seg in p.searcher.snapshot.segments:  # as written before the BM25 posting store existed
        shutil.rmtree(seg.root / "sparse" / "bm25")
        info = json.loads((seg.root / "segment.json").read_text())
        info["files"] = {k: v for k, v in info["files"].items() if not k.startswith("sparse/bm25/")}
        (seg.root / "segment.json").write_text(json.dumps(info))
    p = HybridRetriever.load(out / "format1-planes", encoder=enc)
    expected["format1-planes"] = _results(p, queries)
    for folder in ("format2", "format1-planes"):
        shutil.rmtree(out / folder / "leases", ignore_errors=True)
        (out / folder / "write.lock").unlink(missing_ok=True)
    (out / "expected.json").write_text(json.dumps({"queries": queries, "results": expected}, indent=1) + "\n")


def _results(r: HybridRetriever, queries: list[str]) -> dict[str, dict[str, list]]:
    out = {}
    for m in METHODS:
        hits = r.search(queries, k=10, method=m)
        out[m] = {"ids": hits.ids.tolist(), "scores": [[float(x) for x in row] for row in hits.scores]}
    return out


if __name__ == "__main__":
    main(Path(sys.argv[1]))
