"""BM25 at scale, BM25 only: the v2 store's block-max top-k against today's paths and bm25s, one core.

    taskset -c 1 python benchmarks/bm25_scale.py --size 1M --workdir /work/bench [--windows 15,16,17] [--rounds 3]

Corpus: ``--size`` passages resampled from the MS MARCO DL19 pool's texts (``../shared/data/
msmarco-dl19-pool``) exactly as ``_resample.py`` mixes texts (A's words kept with p 0.7, then B's
with p 0.3), so lengths and term skew are real; no encoder is needed (BM25 only), so this runs
without the encoded pool index that ``scale_sparse.py`` resamples from. Kept under ``--workdir``
(``bm25-<size>/``) and reused. Queries: the real query texts of every shared collection (up to
``--queries``, the same list as scale_sparse.py).

Paths (top-10, ``threads=1``, one batched call over the query set per round, ``--rounds`` rounds
after a warm-up, round-robin; ms/query median and min-max):

* ``store exhaustive``: ``BM25Store.search(prune=False)``, every posting (today's reference);
* ``v1 pruned``: today's MaxScore with block maxima of the float64 tf factors (the factors made
  once before timing, as the retriever keeps them per snapshot);
* ``v2 impacts (2**s-row windows)``: the v2 store's pruned top-k over u8 impacts (windowed
  MaxScore, exact re-scoring), one per ``--windows`` value (the first is the library default);
* ``bm25s-numba``: bm25s 0.2 (Lucene BM25, k1 1.2, b 0.75, its own tokenizer and stemmer),
  pre-tokenised queries.

Every v2 path's rows and float32 scores are checked bit-identical to the exhaustive path's, under
the store's own statistics and under drifted ones (avgdl x 3, N x 2: the bound's drift factor).
Writes ``benchmarks/results/bm25-scale-<size>.json``.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import _resample as rs  # noqa: E402
from _common import RESULTS, SHARED, write_json  # noqa: E402

from hybridret.index.bm25 import K1, BM25Store, BM25StoreBuilder, QueryTerms, idf  # noqa: E402
import hybridret.index.bm25_impacts as impacts  # noqa: E402

logger = logging.getLogger("bench")
POOL = SHARED / "msmarco-dl19-pool"
K = 10


def parse_size(text: str) -> int:
    t = text.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000}.get(t[-1], 1)
    return int(float(t[:-1] if t[-1] in "km" else t) * mult)


def pool_texts() -> list[str]:
    out = []
    with open(POOL / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            title, text = d.get("title") or "", d.get("text") or ""
            out.append(f"{title.strip()} {text.strip()}".strip() if title.strip() else text.strip())
    return out


def corpus(size: int, seed: int) -> list[str]:
    """``size`` texts mixed from the pool's (the real pool when ``size`` is its own)."""
    src = pool_texts()
    if size == len(src):
        return src
    n = len(src)
    res = rs.Resampler(rs.Source(sp.csr_matrix((n, 1), dtype=np.float32), np.zeros((n, 1), np.float32), src,
                                 [str(i) for i in range(n)], {}, POOL), seed)
    out: list[str] = []
    for c in range((size + rs.CHUNK - 1) // rs.CHUNK):
        rng = np.random.default_rng([seed, size, c])
        a, b = res.pairs(rng, min(rs.CHUNK, size - c * rs.CHUNK))
        out += res.texts(a, b, rng)
    return out


def build(work: Path, texts: list[str]) -> Path:
    """The v2 store of ``texts`` (kept; a store left by an earlier run is reused)."""
    from hybridret.index._tantivy import bm25_analyzer

    root = work / "store"
    if not (root / "meta.json").is_file():
        shutil.rmtree(root, ignore_errors=True)
        t = time.perf_counter()
        b = BM25StoreBuilder(root, bm25_analyzer(), impacts=True)
        for i in range(0, len(texts), 50_000):
            b.add(texts[i:i + 50_000])
        b.close()
        logger.info("built %s in %.0f s", root, time.perf_counter() - t)
    return root


def weights(store: BM25Store, tokens: list[list[str]], n_mult: float) -> Any:
    qt = QueryTerms.of(tokens)
    local = store.lookup(qt.tokens)
    w = qt.count * (1.0 + K1) * idf(store._df_pad[local], store.num_docs * n_mult)[qt.tok] if len(qt.tok) else \
        np.zeros(0)
    return qt.restrict(local, w)


def race(plans: dict[str, Callable[[], Any]], rounds: int, nq: int) -> dict[str, dict[str, float]]:
    for fn in plans.values():
        fn()  # warm-up (numba load, page cache)
    times: dict[str, list[float]] = {k: [] for k in plans}
    for _ in range(rounds):
        for name, fn in plans.items():
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1e3 / nq)
    return {k: {"median": float(np.median(v)), "min": float(min(v)), "max": float(max(v)), "rounds": v}
            for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1M")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--windows", default="16", help="accumulator windows as powers of two, comma-separated")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-bm25s", action="store_true")
    ap.add_argument("--no-v1", action="store_true", help="skip today's pruned path (its factors: 8 B/posting)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    os.environ.setdefault("HYBRIDRET_NUMBA", "1")
    size = parse_size(args.size)
    windows = [int(s) for s in args.windows.split(",")]
    work = args.workdir / f"bm25-{args.size}"
    work.mkdir(parents=True, exist_ok=True)
    texts: list[str] | None = None
    if not (work / "store" / "meta.json").is_file() or not args.no_bm25s:
        texts = corpus(size, args.seed)
    base = BM25Store(build(work, texts or []))
    if base.impacts is None:
        raise SystemExit(f"{base.root} is not a v2 store")
    qtexts = rs.query_texts(SHARED, POOL, args.queries)
    tokens = [list(base.analyzer.analyze(t)) for t in qtexts]
    out: dict[str, Any] = {"size": size, "docs": base.num_docs, "queries": len(qtexts), "postings": len(base.docs),
                           "k": K, "paths": {}}
    own = weights(base, tokens, 1.0)
    out["postings_per_query"] = float(np.mean([sum(int(base.df[t]) for t in own.term[own.ptr[q]:own.ptr[q + 1]])
                                               for q in range(len(qtexts))]))
    out["terms_per_query"] = float(np.mean(np.diff(own.ptr)))
    v1_bytes = (base.docs.nbytes + base.tfs.nbytes) / len(base.docs)
    out["bytes_per_posting_on_disk"] = {"v1 files (docs int32 + tf uint16)": v1_bytes,
                                        "v2 impacts (uint8)": base.impacts.imp.nbytes / len(base.docs),
                                        "v2 total": v1_bytes + base.impacts.imp.nbytes / len(base.docs)}

    def v2(shift: int, q: Any, avgdl: float) -> Any:
        impacts.WINDOW_SHIFT = shift
        try:
            return base.search(q, avgdl, K, prune=True, threads=1)
        finally:
            impacts.WINDOW_SHIFT = windows[0]

    # exactness first: own statistics and drifted ones
    for label, a_mult, n_mult in (("own", 1.0, 1.0), ("drift avgdl x3, N x2", 3.0, 2.0),
                                  ("drift avgdl x0.5", 0.5, 1.0)):
        q = weights(base, tokens, n_mult)
        avgdl = base.own_avgdl * a_mult
        r0, s0 = base.search(q, avgdl, K, prune=False, threads=1)
        for w in windows:
            r1, s1 = v2(w, q, avgdl)
            same = bool((r1 == r0).all() and (s1.view(np.int32) == s0.view(np.int32)).all())
            out.setdefault("identical_to_exhaustive", {})[f"v2 w{w} ({label})"] = same
            if not same:
                logger.error("v2 (window 2**%d) differs from the exhaustive path (%s)", w, label)
    plans: dict[str, Callable[[], Any]] = {"store exhaustive": lambda: base.search(own, base.own_avgdl, K, prune=False,
                                                                                  threads=1)}
    if not args.no_v1:
        v1 = copy.copy(base)
        v1.impacts = None  # the same postings searched as a v1 store: today's MaxScore over float64 factors
        fac = v1.tf_factors(base.own_avgdl)
        plans["v1 pruned"] = lambda: v1.search(own, base.own_avgdl, K, prune=True, threads=1, fac=fac)
    for w in windows:
        plans[f"v2 impacts ({1 << w}-row windows)"] = (lambda w=w: v2(w, own, base.own_avgdl))
    if not args.no_bm25s and texts is not None:
        import bm25s
        import Stemmer

        stem = Stemmer.Stemmer("english")
        t = time.perf_counter()
        model = bm25s.BM25(method="lucene", k1=1.2, b=0.75, backend="numba")
        model.index(bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False), show_progress=False)
        out["bm25s_build_s"] = time.perf_counter() - t
        out["bm25s_version"] = getattr(bm25s, "__version__", "?")
        pre = [x if x else ["<empty>"] for x in bm25s.tokenize(qtexts, stopwords="en", stemmer=stem,
                                                               show_progress=False, return_ids=False)]
        plans["bm25s-numba (pre-tokenised)"] = lambda: model.retrieve(pre, k=K, show_progress=False, n_threads=1)
    del texts
    out["paths"] = race(plans, args.rounds, len(qtexts))
    peer = out["paths"].get("bm25s-numba (pre-tokenised)")
    for name, r in out["paths"].items():
        if peer:
            r["x_bm25s"] = peer["median"] / r["median"]
        print(f"{name:34s} {r['median']:.3f} ms/query ({r['min']:.3f}-{r['max']:.3f})"
              + (f"  {r['x_bm25s']:.2f}x bm25s" if peer else ""))
    print(json.dumps({k: v for k, v in out.items() if k != "paths"}, indent=1))
    write_json(RESULTS / f"bm25-scale-{args.size}.json", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
