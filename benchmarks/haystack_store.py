"""Haystack DocumentStore: HybridRetDocumentStore against Haystack's InMemoryDocumentStore.

    python benchmarks/haystack_store.py                      # CISI from ../shared (1,460 documents)
    python benchmarks/haystack_store.py --docs 300           # the first 300 only
    python benchmarks/haystack_store.py --data DIR           # another BEIR folder

Every document gets ``meta = {"bucket": crc32(id) % 1000, "year": 1950 + crc32(id) % 70}``. Measured,
on the same Haystack Documents:

* ``write``: ``write_documents`` of every document into an empty store (hybridret encodes them with
  its packaged models and commits, after a warm-up write to another store that compiles its index
  kernels; the in-memory store keeps them and its BM25 statistics), then an
  ``OVERWRITE`` of 1% of them with their meta changed only (hybridret re-encodes nothing);
* ``filter_documents`` and ``count_documents_by_filter`` at ~50%, ~5% and ~0.1% selectivity, and
  ``filter_documents()`` of everything: median ms over repeats, in-process and (hybridret) through
  ``hybridret serve`` on loopback; each hybridret result checked equal to the in-memory store's.

Writes ``benchmarks/results/haystack_store.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, SHARED, machine, table, write_json  # noqa: E402

FILTERS = {
    "~50%": {"field": "meta.bucket", "operator": "<", "value": 500},
    "~5%": {"operator": "AND", "conditions": [{"field": "meta.bucket", "operator": "<", "value": 50},
                                              {"field": "meta.year", "operator": ">=", "value": 1950}]},
    "~0.1%": {"field": "meta.bucket", "operator": "==", "value": 7},  # 1 in 1,000
}


def documents(folder: Path, limit: int | None) -> list[Any]:
    from haystack import Document

    out = []
    with open(folder / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            h = zlib.crc32(str(d["_id"]).encode())
            text = (d.get("text") or "").strip() or d.get("title") or "(empty)"
            out.append(Document(id=str(d["_id"]), content=text,
                                meta={"title": d.get("title") or "", "bucket": h % 1000, "year": 1950 + h % 70}))
            if limit and len(out) >= limit:
                break
    return out


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` on a free loopback port, in a thread, until the block ends."""
    import socket
    import threading

    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def median_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    out, times = None, []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=SHARED / "cisi")
    ap.add_argument("--docs", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not (args.data / "corpus.jsonl").is_file():
        sys.exit(f"no corpus.jsonl in {args.data}")

    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.document_stores.types import DuplicatePolicy

    from hybridret import HybridRetriever
    from hybridret.integrations import HybridRetDocumentStore

    docs = documents(args.data, args.docs)
    n = len(docs)
    scratch = Path(tempfile.mkdtemp(prefix="bench-haystack-"))
    retriever = HybridRetriever.from_models()
    retriever.encoder.warm()
    warm = HybridRetDocumentStore(HybridRetriever(retriever.encoder))  # compiles the index kernels (once per process)
    warm.write_documents(docs[:2])
    mine = HybridRetDocumentStore(retriever)
    theirs = InMemoryDocumentStore()
    rows: list[dict[str, Any]] = []

    def write(store: Any) -> float:
        t = time.perf_counter()
        store.write_documents(docs)
        return time.perf_counter() - t

    w_mine, w_theirs = write(mine), write(theirs)
    changed = [type(d)(id=d.id, content=d.content, meta={**d.meta, "year": 2024}) for d in docs[: max(1, n // 100)]]
    t = time.perf_counter()
    mine.write_documents(changed, policy=DuplicatePolicy.OVERWRITE)
    w_meta = time.perf_counter() - t
    theirs.write_documents(changed, policy=DuplicatePolicy.OVERWRITE)
    rows.append({"operation": f"write_documents ({n} docs)", "hybridret ms": round(w_mine * 1000, 1),
                 "hybridret via server ms": "", "in-memory ms": round(w_theirs * 1000, 1),
                 "matches": "", "docs/s hybridret": round(n / w_mine, 1)})
    rows.append({"operation": f"OVERWRITE {len(changed)} docs, meta changed", "hybridret ms": round(w_meta * 1000, 1),
                 "hybridret via server ms": "", "in-memory ms": "", "matches": "", "docs/s hybridret": ""})

    from hybridret.serve.app import create_app

    retriever.save(scratch / "idx")
    served = HybridRetriever.load(scratch / "idx", encoder=retriever.encoder)
    with serving(create_app(served)) as url:
        remote = HybridRetDocumentStore(url)
        cases = {**{f"filter_documents {k}": ("filter_documents", f) for k, f in FILTERS.items()},
                 "filter_documents (all)": ("filter_documents", None),
                 **{f"count_documents_by_filter {k}": ("count_documents_by_filter", f) for k, f in FILTERS.items()}}
        for name, (method, flt) in cases.items():
            a_ms, a = median_ms(lambda m=method, f=flt: getattr(mine, m)(f), args.repeats)
            r_ms, r = median_ms(lambda m=method, f=flt: getattr(remote, m)(f), args.repeats)
            b_ms, b = median_ms(lambda m=method, f=flt: getattr(theirs, m)(f) if f is not None or m != "count_documents_by_filter"
                                else theirs.count_documents(), args.repeats)
            if method == "filter_documents":
                same = sorted(d.id for d in a) == sorted(d.id for d in b) == sorted(d.id for d in r)
                count = len(a)
            else:
                same, count = a == b == r, a
            rows.append({"operation": f"{name} [{count}]", "hybridret ms": round(a_ms, 2),
                         "hybridret via server ms": round(r_ms, 2), "in-memory ms": round(b_ms, 2),
                         "matches": "yes" if same else "NO", "docs/s hybridret": ""})
        remote.close()
    cols = ["operation", "hybridret ms", "hybridret via server ms", "in-memory ms", "matches", "docs/s hybridret"]
    print(table(rows, cols))
    out = RESULTS / "haystack_store.json"
    write_json(out, {"machine": machine(), "data": str(args.data), "docs": n, "repeats": args.repeats, "rows": rows})
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
