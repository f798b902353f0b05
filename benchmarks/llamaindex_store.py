"""The LlamaIndex vector store end to end on a BEIR collection: what the LlamaIndex path costs and
whether it retrieves as well as hybridret used directly.

Three ways to index the same collection with the packaged models (one shared encoder):

* ``hybridret docs``: ``HybridRetriever.index`` of the whole documents (title + text);
* ``hybridret chunks``: ``index(..., chunk_tokens=N)``, searched with ``group_by="parent_id"``;
* ``llamaindex store``: ``IngestionPipeline([SentenceSplitter(chunk_size=N), NoEmbedding()],
  vector_store=HybridRetLlamaIndexVectorStore(...))`` (the title in the node metadata, encoded
  with the text as LlamaIndex embeds metadata), searched through
  ``VectorStoreIndex.from_vector_store(store).as_retriever(similarity_top_k=depth)``; a document's
  rank is that of its best node (``node.ref_doc_id``).

Per way: build seconds (for the store: the LlamaIndex transformations, i.e. splitting and
NoEmbedding, apart from the store's writes), nodes indexed, document-level nDCG@10 and recall@10 of
the hybrid method, and milliseconds per query, one query at a time, hits read (``search(q, 10)[0]``;
for the store, a LlamaIndex ``retrieve`` of ``--depth`` nodes, and over the same index a
``search(q, depth).plain(0)``, what the store reads: the difference is the cost of LlamaIndex
nodes; and ``search(q, depth)[0]``, hit views with matched terms and snippets, which the store
skips). Prints a table and writes ``benchmarks/results/llamaindex-store-DATASET.json``.

    python benchmarks/llamaindex_store.py                      # adi (82 documents, ~1 minute)
    python benchmarks/llamaindex_store.py --dataset cranfield  # 1,398 documents
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import RESULTS, SHARED, machine, table, write_json  # noqa: E402


def doc_run(ranked: dict[str, list[str]], k: int) -> dict[str, dict[str, float]]:
    """``{qid: {doc: score}}`` from per-query document ids in rank order (first occurrence wins)."""
    out = {}
    for qid, ids in ranked.items():
        docs = list(dict.fromkeys(i for i in ids if i is not None))[:k]
        out[qid] = {d: float(len(docs) - j) for j, d in enumerate(docs)}
    return out


def per_query_ms(fn: Any, queries: list[str]) -> float:
    start = time.perf_counter()
    for q in queries:
        fn(q)
    return 1000 * (time.perf_counter() - start) / len(queries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="adi", help="a folder of ../shared/data, or a path (BEIR format)")
    ap.add_argument("--chunk-size", type=int, default=200, help="LlamaIndex SentenceSplitter chunk_size and "
                                                                  "hybridret chunk_tokens")
    ap.add_argument("--depth", type=int, default=30, help="nodes / chunks retrieved per query before "
                                                           "documents are ranked by their best one")
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/llamaindex-store-DATASET.json")
    args = ap.parse_args()

    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.node_parser import SentenceSplitter

    from hybridret import HybridRetriever
    from hybridret.data import load_beir
    from hybridret.encoders import PairedEncoder
    from hybridret.eval import evaluate
    from hybridret.integrations.llamaindex import HybridRetLlamaIndexVectorStore, NoEmbedding

    folder = Path(args.dataset) if Path(args.dataset).is_dir() else SHARED / args.dataset
    name = folder.name
    corpus, queries, qrels = load_beir(folder)
    docs = list(corpus)
    qids = [q for q in queries if q in qrels]
    texts = [queries[q] for q in qids]
    encoder = PairedEncoder.from_names()
    HybridRetriever(encoder).index(docs[:4])  # compile and warm once, outside the timings
    rows = []

    def score(ranked: dict[str, list[str]]) -> dict[str, float]:
        return evaluate(doc_run(ranked, 10), qrels, ["ndcg@10", "recall@10"])

    # 1. whole documents
    r = HybridRetriever(encoder)
    t = time.perf_counter()
    r.index(docs, show_progress=False)
    build = time.perf_counter() - t
    hits = r.search(texts, 10)
    m = score({q: [h.id for h in hits[i]] for i, q in enumerate(qids)})
    rows.append({"way": "hybridret docs", "nodes": r.num_docs, "build_s": build, "nDCG@10": m["ndcg@10"],
                 "R@10": m["recall@10"], "ms/query": per_query_ms(lambda q: r.search(q, 10)[0], texts)})

    # 2. hybridret's own chunks, grouped by document
    c = HybridRetriever(encoder)
    t = time.perf_counter()
    c.index(docs, chunk_tokens=args.chunk_size, show_progress=False)
    build = time.perf_counter() - t
    hits = c.search(texts, 10, group_by="parent_id", group_size=1)
    m = score({q: [h.group for h in hits[i]] for i, q in enumerate(qids)})
    rows.append({"way": "hybridret chunks", "nodes": c.num_docs, "build_s": build, "nDCG@10": m["ndcg@10"],
                 "R@10": m["recall@10"],
                 "ms/query": per_query_ms(lambda q: c.search(q, 10, group_by="parent_id", group_size=1)[0], texts)})

    # 3. LlamaIndex: IngestionPipeline into the store, VectorStoreIndex retriever
    store = HybridRetLlamaIndexVectorStore(HybridRetriever(encoder))
    li_docs = [Document(id_=d.id, text=d.text, metadata={"title": d.title} if d.title else {}) for d in docs]
    pipeline = IngestionPipeline(transformations=[SentenceSplitter(chunk_size=args.chunk_size, chunk_overlap=0),
                                                  NoEmbedding()])
    t = time.perf_counter()
    nodes = pipeline.run(documents=li_docs)
    transform = time.perf_counter() - t
    t = time.perf_counter()
    store.add(nodes)
    write = time.perf_counter() - t
    retriever = VectorStoreIndex.from_vector_store(store, embed_model=NoEmbedding()).as_retriever(
        similarity_top_k=args.depth)
    ranked = {q: [n.node.ref_doc_id for n in retriever.retrieve(text)] for q, text in zip(qids, texts)}
    m = score(ranked)
    backend = store.client
    rows.append({"way": "llamaindex store", "nodes": backend.num_docs, "build_s": transform + write,
                 "transform_s": transform, "nDCG@10": m["ndcg@10"], "R@10": m["recall@10"],
                 "ms/query": per_query_ms(retriever.retrieve, texts),
                 "search_ms/query": per_query_ms(lambda q: backend.search(q, args.depth).plain(0), texts),
                 "views_ms/query": per_query_ms(lambda q: backend.search(q, args.depth)[0], texts)})

    cols = ["way", "nodes", "build_s", "transform_s", "nDCG@10", "R@10", "ms/query", "search_ms/query",
            "views_ms/query"]
    print(f"{name}: {len(docs)} documents, {len(qids)} judged queries, chunk size {args.chunk_size}, "
          f"depth {args.depth}, method hybrid")
    print(table(rows, cols))
    out = args.out or RESULTS / f"llamaindex-store-{name}.json"
    write_json(out, {"dataset": name, "documents": len(docs), "queries": len(qids),
                          "chunk_size": args.chunk_size, "depth": args.depth, "rows": rows, "machine": machine()})


if __name__ == "__main__":
    main()
