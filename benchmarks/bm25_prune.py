"""Pruned vs exhaustive top-k of the BM25 posting store (``index/bm25.py``), one thread.

    python benchmarks/bm25_prune.py                 # 300,000 documents per corpus
    python benchmarks/bm25_prune.py --docs 20000    # a quick run

Two corpora of ``--docs`` documents, each written as one store:

* ``zipf``: synthetic, a Zipf vocabulary (200,000 tokens, exponent 1.07), lognormal lengths
  (median 30 tokens);
* ``msmarco-mix``: the real passages of ``../shared/data/msmarco-dl19-pool`` analysed with the
  store's analyzer (tantivy's: stop words out, stemmed); each document mixes the tokens of two random
  real passages (shuffled, the mean of their lengths kept), so the vocabulary and its skew are real
  and df grows with the corpus.

Queries: 500 of 3-6 distinct tokens drawn from random documents of the corpus; for
``msmarco-mix`` also the 43 DL19 queries through the analyzer. Figures: queries/s of one batched
call on one thread for ``prune=True`` and ``prune=False`` (the thread's CPU time, best of 5 rounds
taken in turn: steadier than wall time on a shared machine), their ratio, and what the pruned
kernel did per query: the share of the query terms' postings it read, its row look-ups and the rows
it rescored. Every run checks that both return the same rows and float32 scores. Also the time
to make the tf factors of an avgdl with and without their block maxima (``TfFactors.of``).
Writes ``benchmarks/results/bm25-prune.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from _common import RESULTS, SHARED, table, write_json  # noqa: E402

from hybridret.index import _bm25_kernels  # noqa: E402
from hybridret.index._tantivy import bm25_analyzer  # noqa: E402
from hybridret.index.bm25 import K1, BM25Store, BM25StoreBuilder, QueryTerms, SegmentQueries, TfFactors, idf  # noqa: E402

POOL = SHARED / "msmarco-dl19-pool"


class Pretokenized:
    """The analyzer of a corpus given as token lists: each document is its own tokens."""

    def analyze(self, tokens: list[str]) -> list[str]:
        return tokens


def zipf_corpus(n: int, rng: np.random.Generator, vocab: int = 200_000, s: float = 1.07) -> list[list[str]]:
    p = 1.0 / np.arange(1, vocab + 1) ** s
    lengths = np.maximum(1, rng.lognormal(np.log(30), 0.6, n).astype(np.int64))
    ids = rng.choice(vocab, size=int(lengths.sum()), p=p / p.sum())
    words = np.array([f"t{i}" for i in range(vocab)], dtype=object)
    return [list(words[d]) for d in np.split(ids, np.cumsum(lengths)[:-1])]


def real_passages() -> list[list[str]]:
    analyzer = bm25_analyzer()
    with (POOL / "corpus.jsonl").open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    return [toks for toks in (list(analyzer.analyze(t)) for t in texts) if toks]


def mixed_corpus(n: int, rng: np.random.Generator, passages: list[list[str]]) -> list[list[str]]:
    docs = []
    pairs = rng.integers(len(passages), size=(n, 2))
    for a, b in pairs:
        toks = passages[a] + passages[b]
        keep = rng.permutation(len(toks))[:(len(passages[a]) + len(passages[b]) + 1) // 2]
        docs.append([toks[i] for i in keep])
    return docs


def sampled_queries(docs: list[list[str]], rng: np.random.Generator, count: int = 500) -> list[list[str]]:
    out: list[list[str]] = []
    while len(out) < count:
        uniq = list(dict.fromkeys(docs[int(rng.integers(len(docs)))]))
        if len(uniq) >= 3:
            out.append([uniq[i] for i in rng.choice(len(uniq), size=min(len(uniq), int(rng.integers(3, 7))),
                                                     replace=False)])
    return out


def dl19_queries() -> list[list[str]]:
    analyzer = bm25_analyzer()
    with (POOL / "queries.jsonl").open(encoding="utf-8") as f:
        return [list(analyzer.analyze(json.loads(line)["text"])) for line in f]


def own_queries(store: BM25Store, tokens: list[list[str]]) -> SegmentQueries:
    qt = QueryTerms.of(tokens)
    local = store.lookup(qt.tokens)
    w = qt.count * (1.0 + K1) * idf(store._df_pad[local], store.num_docs)[qt.tok]
    return qt.restrict(local, w)


def best_of(fns: list[Any], rounds: int = 5) -> list[float]:
    """Each function's least thread CPU time over ``rounds``, the functions taken in turn."""
    for fn in fns:
        fn()  # warm: compiled, buffers made
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t = time.thread_time()
            fn()
            best[i] = min(best[i], time.thread_time() - t)
    return best


def measure(store: BM25Store, name: str, tokens: list[list[str]], k: int) -> dict[str, Any]:
    q = own_queries(store, tokens)
    fac = store.tf_factors(store.own_avgdl)
    nq = len(q.ptr) - 1
    got = store.search(q, store.own_avgdl, k, fac=fac, prune=True)
    want = store.search(q, store.own_avgdl, k, fac=fac, prune=False)
    same = bool((got[0] == want[0]).all() and (got[1].view(np.int32) == want[1].view(np.int32)).all())
    t_prune, t_full = best_of([lambda: store.search(q, store.own_avgdl, k, fac=fac, prune=True),
                               lambda: store.search(q, store.own_avgdl, k, fac=fac, prune=False)])
    work = np.zeros(3, np.int64)  # the kernel's counts: postings read, look-ups, rescored rows
    _bm25_kernels.topk_pruned(q.ptr, q.term, q.weight, store.indptr, store.docs, fac.fac, store.block_ptr,
                              fac.block_max, fac.term_max, np.zeros(store.num_docs), np.empty(store.num_docs, np.int32),
                              np.zeros(0, np.bool_), k, np.full((nq, k), -1, np.int64), np.full((nq, k), -np.inf),
                              work)
    postings = int(store.df[q.term].sum())
    return {"queries": name, "k": k, "n": nq, "qps_pruned": nq / t_prune, "qps_exhaustive": nq / t_full,
            "speedup": t_full / t_prune, "postings_per_query": postings / nq,
            "postings_read": work[0] / max(1, postings), "lookups_per_query": work[1] / nq,
            "rescored_per_query": work[2] / nq, "identical": same}


def corpus(name: str, docs: list[list[str]], root: Path) -> BM25Store:
    t = time.perf_counter()
    b = BM25StoreBuilder(root / name, Pretokenized())
    for i in range(0, len(docs), 50_000):
        b.add(docs[i:i + 50_000])
    b.close()
    store = BM25Store(root / name)
    print(f"{name}: {store.num_docs:,} documents, {len(store.docs):,} postings, {len(store.vocab):,} terms "
          f"({time.perf_counter() - t:.0f} s to write)", flush=True)
    return store


def factor_cost(store: BM25Store) -> dict[str, float]:
    """ms to make the tf factors of an avgdl (not the store's own: not kept), and their maxima alone."""
    avgdl = store.own_avgdl * 1.01
    t_all, t_max = best_of([lambda: store.tf_factors(avgdl),
                            lambda: TfFactors.of(store, avgdl, store.tf_factors(store.own_avgdl).fac)], rounds=3)
    return {"tf_factors_ms": t_all * 1e3, "maxima_ms": t_max * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=300_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "bm25-prune.json")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rows: list[dict[str, Any]] = []
    stores: dict[str, dict[str, Any]] = {}
    root = Path(tempfile.mkdtemp(prefix="bm25-prune-"))
    try:
        sets: list[tuple[str, list[list[str]], list[tuple[str, list[list[str]]]]]] = []
        zipf = zipf_corpus(args.docs, rng)
        sets.append(("zipf", zipf, [("sampled 3-6", sampled_queries(zipf, rng))]))
        if (POOL / "corpus.jsonl").exists():
            mix = mixed_corpus(args.docs, rng, real_passages())
            sets.append(("msmarco-mix", mix, [("sampled 3-6", sampled_queries(mix, rng)), ("dl19", dl19_queries())]))
        for name, docs, queries in sets:
            store = corpus(name, docs, root)
            stores[name] = {"docs": store.num_docs, "postings": len(store.docs), "terms": len(store.vocab),
                            **factor_cost(store)}
            print(stores[name], flush=True)
            for qname, toks in queries:
                for k in (10, 100):
                    rows.append({"corpus": name, "docs": store.num_docs, **measure(store, qname, toks, k)})
                    print(table(rows[-1:], list(rows[-1])), flush=True)
            del store
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cols = ["corpus", "queries", "k", "qps_pruned", "qps_exhaustive", "speedup", "postings_per_query", "postings_read",
            "lookups_per_query", "rescored_per_query", "identical"]
    print("\n" + table(rows, cols))
    write_json(args.out, {"docs": args.docs, "seed": args.seed, "stores": stores, "rows": rows})


if __name__ == "__main__":
    main()
