"""Fusion benchmark: every single retriever, every fusion candidate, today's default (GQR with fixed
sparse + BM25 guide weights) and the new default ``hybrid`` (``hybrid.HYBRID_DEFAULT``: GQR with
agreement-weighted guides, ranking by the refined dense score plus a quarter of the guide), on
every BEIR-format collection given; the "never below the best single retriever" rule per collection;
paired significance against today's default; the choice of default by leave-one-collection-out
cross-validation; the headroom (upper bounds chosen on the test queries, and a combiner learned
leave-one-collection-out: ``_learned_fusion.py``); the cost per query. bm25+rm3
(``retrievers/rm3.py``, not registered) is measured alone, as a GQR guide, and in RRF / linear
fusion; indexes whose segments predate the BM25 store get
one built from their stored texts into indexes/bench-<name>.bm25-store (attached in memory).

    python benchmarks/fusion.py [DATA_DIR ...]     (default: every folder in ../shared/data)

Each retriever contributes its top-100 (depth 100); every candidate gets every retriever's exact
score. Metrics from pytrec_eval over each method's top-100 (TREC DL binary metrics count grade >= 2).
Query encodings are cached in indexes/bench-<name>.queries.npz. Indexes are built once into
indexes/bench-<name>. Writes benchmarks/results/fusion.json and docs/fusion.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _learned_fusion as LF  # noqa: E402
from _common import RESULTS, ROOT, SHARED, encode_queries, machine, table, write_json  # noqa: E402
from scipy.stats import ttest_rel  # noqa: E402

from hybridret import CorpusReader, HybridRetriever, load_qrels, load_queries  # noqa: E402
from hybridret.eval import per_query, run_from_rows  # noqa: E402
from hybridret.fusion.builtin import HYBRID_DEFAULT
from hybridret.fusion.config import FusionConfig, GQRConfig, fuse
from hybridret.fusion.gather import gather_candidates
from hybridret.fusion.gqr import adaptive_guide, agreement, agreement_weights, gqr_refine, gqr_scores, guide_weights, masked_softmax, top_mask
from hybridret.fusion.scores import candidate_union, linear_fusion, normalise, rrf_fusion  # noqa: E402
from hybridret.fusion.scores import Candidates, select
from hybridret.index.bm25 import BM25Store, BM25StoreBuilder  # noqa: E402
from hybridret.retrievers import REGISTRY, QueryBatch, Retriever, score_rows, search_rows, vectors_of  # noqa: E402
from hybridret.retrievers.bm25 import bm25_tokens  # noqa: E402
from hybridret.retrievers.rm3 import RM3Retriever  # noqa: E402
from hybridret.search.run import fused_search  # noqa: E402

METRICS = ("ndcg@10", "mrr@10", "recall@100")
LIMIT5K = ROOT / "indexes" / "data" / "limit-5k"
R3 = ("dense", "sparse", "bm25")
TODAY = FusionConfig("gqr", guide={"sparse": 0.5, "bm25": 0.5})  # the default before issue #13
AGREE = FusionConfig("gqr", guide={"sparse": 0.5, "bm25": 0.5}, guide_weighting="agreement")  # refined dense alone
NEW = HYBRID_DEFAULT  # AGREE, ranking by z(refined dense) + 0.25 z(guide)
TOL = 0.005
LOCO_RM3_LABEL = "LOCO-selected, bm25+rm3 variants too (held-out)"
TODAY_LABEL, NEW_LABEL = "today's default: GQR, fixed guide", "new default (hybrid): GQR, agreement guide, + 0.25 guide"
AGREE_LABEL = "GQR agreement guide, refined dense alone"


def build(folder: Path) -> HybridRetriever:
    out = ROOT / "indexes" / f"bench-{folder.name}"
    if not (out / "manifest.json").exists():
        r = HybridRetriever.from_models()
        r.index(CorpusReader(folder), workdir=out)
        r.save(out, overwrite=True)
    r = HybridRetriever.load(out)
    attach_bm25_stores(r, ROOT / "indexes" / f"bench-{folder.name}.bm25-store")
    return r


def attach_bm25_stores(r: HybridRetriever, cache: Path) -> None:
    """Segments written before the BM25 store existed get one, built from their stored texts into
    ``cache`` (outside the index) and attached in memory: bm25+rm3 needs weighted BM25 queries, which
    only the store scores (its BM25 equals tantivy's, so the plain bm25 rows do not change)."""
    snap = r.searcher.snapshot
    for seg in snap.segments:
        part = seg.part("bm25")
        if part is None or isinstance(part, BM25Store):
            continue
        root = cache / seg.root.name
        if not (root / "meta.json").is_file():
            if root.exists():
                import shutil

                shutil.rmtree(root)
            builder = BM25StoreBuilder(root, part.analyzer)
            texts = []
            for row in range(seg.num_docs):
                title, text = seg.docs.get(row)
                texts.append(f"{title.strip()} {text.strip()}".strip() if title.strip() else text.strip())
            builder.add(texts)
            builder.close()
        seg.parts["bm25"] = BM25Store(root)


def cached_queries(r: HybridRetriever, name: str, texts: list[str]) -> QueryBatch:
    """Encoded queries, cached next to the index (keyed by the texts and the encoder config)."""
    path = ROOT / "indexes" / f"bench-{name}.queries.npz"
    key = hashlib.sha1(json.dumps([texts, r.searcher.snapshot.manifest.get("encoder")], sort_keys=True,
                                  default=str).encode()).hexdigest()
    if path.is_file():
        z = np.load(path, allow_pickle=False)
        if str(z["key"]) == key:
            qs = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(z["shape"]))
            return QueryBatch(texts, dense=z["dense"], sparse=qs)
    q = encode_queries(r, texts)
    s = q.sparse.tocsr()
    np.savez(path, key=key, dense=q.dense, data=s.data, indices=s.indices, indptr=s.indptr, shape=np.array(s.shape))
    return q


# -- fusion candidates (computed on gathered candidates; the two defaults go through fuse()) --------
def _linear_agreement(c: Candidates, exact: dict[str, np.ndarray]) -> np.ndarray:
    w = agreement_weights({r: 1.0 for r in R3}, agreement(c.exact, c.listed, R3))
    return np.where(c.valid, sum(w[r][:, None] * normalise(exact[r], c.valid, "zscore") for r in R3), -np.inf)


def _gqr_then_linear(c: Candidates, q: QueryBatch) -> np.ndarray:
    _, refined, _ = gqr_scores(GQRConfig(), {"sparse": 0.5, "bm25": 0.5}, c.exact, c.valid, q.dense, c.vectors)
    return linear_fusion({**c.exact, "dense": refined}, c.valid, None, "zscore")


def restrict(c: Candidates, depth: int) -> Candidates:
    """The candidates a gather at a smaller ``depth`` per retriever would give (each retriever's
    top ``depth`` by its exact score, within its own list)."""
    listed = {r: top_mask(c.exact[r], c.listed[r], depth) for r in c.listed}
    keep = np.logical_or.reduce(list(listed.values()))
    return Candidates(np.where(keep, c.rows, -1), c.exact, listed, c.vectors)


CANDIDATES: dict[str, Callable[[Candidates, QueryBatch], np.ndarray]] = {
    "RRF(dense, sparse, BM25)": lambda c, q: fuse(FusionConfig("rrf", R3), c, 100, None, q)[0],
    "linear(dense, sparse) minmax": lambda c, q: fuse(FusionConfig("linear", ("dense", "sparse")), c, 100, None, q)[0],
    "linear(3) z-score, equal": lambda c, q: fuse(FusionConfig("linear", R3, normalisation="zscore"), c, 100, None, q)[0],
    "linear(3) z-score, agreement weights": lambda c, q: select(c.rows, _linear_agreement(c, c.exact), {}, 100)[0],
    "GQR fixed, then linear(3) z-score": lambda c, q: select(c.rows, _gqr_then_linear(c, q), {}, 100)[0],
    TODAY_LABEL: lambda c, q: fuse(TODAY, c, 100, None, q)[0],
    "GQR agreement guide, depth 30": lambda c, q: fuse(AGREE, restrict(c, 30), 100, None, q)[0],
    "GQR agreement guide, depth 10": lambda c, q: fuse(AGREE, restrict(c, 10), 100, None, q)[0],
    AGREE_LABEL: lambda c, q: fuse(AGREE, c, 100, None, q)[0],
    **{f"GQR agreement guide, + {w} guide": (lambda c, q, w=w: fuse(NEW.with_(gqr=GQRConfig(final_guide=w)), c, 100, None, q)[0])
       for w in (0.1, 0.5, 1.0)},
    NEW_LABEL: lambda c, q: fuse(NEW, c, 100, None, q)[0],
}


RM3 = RM3Retriever()  # pyserini's bm25+rm3 defaults: fb_docs 10, fb_terms 10, original query weight 0.5
R4 = (*R3, RM3.name)
BENCH_RETRIEVERS: dict[str, Retriever] = {**REGISTRY, RM3.name: RM3}


def gather4(depth: int, snap: object, q: QueryBatch) -> Candidates:
    """:func:`gather_candidates` over dense, sparse, BM25 and bm25+rm3 (not in the registry): the
    union's first part is exactly the dense/sparse/BM25 union, in the same order."""
    ctx = {n: BENCH_RETRIEVERS[n].prepare(snap, q) for n in R4}  # type: ignore[arg-type]
    lists = {n: search_rows(BENCH_RETRIEVERS[n], snap, q, depth, None, ctx[n])[0] for n in R4}  # type: ignore[arg-type]
    union = candidate_union(*lists.values())
    exact = {n: score_rows(BENCH_RETRIEVERS[n], snap, q, union, ctx[n]) for n in R4}  # type: ignore[arg-type]
    exact["dense"] = np.where(union >= 0, exact["dense"], -np.inf).astype(np.float32)
    listed = {n: np.array([np.isin(u, r[r >= 0]) & (u >= 0) for u, r in zip(union, rows)]).reshape(union.shape)
              for n, rows in lists.items()}
    return Candidates(union, exact, listed, vectors_of(snap, union))  # type: ignore[arg-type]


def subset(c: Candidates, names: tuple[str, ...]) -> Candidates:
    """The union of only ``names``' lists (other rows masked out, positions kept)."""
    keep = np.logical_or.reduce([c.listed[n] for n in names])
    return Candidates(np.where(keep, c.rows, -1), {n: c.exact[n] for n in names},
                      {n: c.listed[n] & keep for n in names}, c.vectors)


def gqr_with(c: Candidates, q: QueryBatch, guide: dict[str, float], agreement_weighting: bool = True) -> np.ndarray:
    """GQR over ``c`` exactly as :func:`fuse` runs it (FusionConfig only accepts registered retrievers)."""
    names = tuple(c.exact)
    w = adaptive_guide(guide, c.exact, c.listed, names) if agreement_weighting else dict(guide)
    _, refined, _ = gqr_scores(GQRConfig(), w, c.exact, c.valid, q.dense, c.vectors)
    return select(c.rows, refined, {}, 100)[0]


_RM3_NO_BM25 = ("dense", "sparse", RM3.name)
RM3_CANDIDATES: dict[str, Callable[[Candidates, QueryBatch], np.ndarray]] = {
    "RRF(dense, sparse, bm25+rm3)": lambda c, q: select(
        (s := subset(c, _RM3_NO_BM25)).rows, rrf_fusion(s.exact, s.listed, 60.0, None), {}, 100)[0],
    "RRF(dense, sparse, BM25, bm25+rm3)": lambda c, q: select(c.rows, rrf_fusion(c.exact, c.listed, 60.0, None), {}, 100)[0],
    "linear(dense, sparse, bm25+rm3) z-score": lambda c, q: select(
        (s := subset(c, _RM3_NO_BM25)).rows, linear_fusion(s.exact, s.valid, None, "zscore"), {}, 100)[0],
    "linear(4) z-score, equal": lambda c, q: select(c.rows, linear_fusion(c.exact, c.valid, None, "zscore"), {}, 100)[0],
    "GQR fixed guide {sparse, bm25+rm3}": lambda c, q: gqr_with(subset(c, _RM3_NO_BM25), q,
                                                                {"sparse": 0.5, RM3.name: 0.5}, False),
    "GQR agreement guide {sparse, bm25+rm3}": lambda c, q: gqr_with(subset(c, _RM3_NO_BM25), q,
                                                                    {"sparse": 0.5, RM3.name: 0.5}),
    "GQR agreement guide {sparse, BM25, bm25+rm3}": lambda c, q: gqr_with(c, q, {"sparse": 1.0, "bm25": 1.0, RM3.name: 1.0}),
    "GQR agreement guide {sparse, BM25}, bm25+rm3 in the union": lambda c, q: gqr_with(c, q, {"sparse": 0.5, "bm25": 0.5}),
}


def single_rows(c: Candidates, name: str) -> np.ndarray:
    """A retriever's own top-100: its listed candidates by its exact score."""
    return select(np.where(c.listed[name], c.rows, -1), c.exact[name], {}, 100)[0]


def randomisation_p(a: np.ndarray, b: np.ndarray, trials: int = 10000, seed: int = 0) -> float:
    """Two-sided paired randomisation (sign-flip) test of mean(a - b) over queries."""
    d = np.asarray(a) - np.asarray(b)
    if not np.any(d):
        return 1.0
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(trials, len(d)))
    return float((np.abs((signs * d).mean(1)) >= abs(d.mean()) - 1e-12).mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="*", type=Path)
    ap.add_argument("--no-costs", action="store_true", help="skip the timing part")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    folders = args.data or sorted(p for p in SHARED.iterdir() if (p / "corpus.jsonl").is_file())
    if not args.data and (LIMIT5K / "corpus.jsonl").is_file():
        folders.append(LIMIT5K)  # generated by benchmarks/limit.py (make bench); issue #13 names it
    shared = [f.name for f in folders if f.resolve().parent == SHARED.resolve()]
    names = [f.name for f in folders]
    perq: dict[str, dict[str, dict[str, np.ndarray]]] = {}  # method -> collection -> metric -> per query
    costs: dict[str, dict[str, float]] = {}
    rm3_cost: dict[str, dict[str, float]] = {}
    depth_rows = []
    grid: dict[tuple[int, ...], dict[str, dict[str, np.ndarray]]] = {}  # linear weights -> collection -> metric
    learn: dict[str, tuple] = {}  # collection -> (candidate features, query features, grades, valid, rows, scorer)
    for folder in folders:
        r = build(folder)
        queries, qrels = load_queries(folder / "queries.jsonl"), load_qrels(folder / "qrels" / "test.tsv")
        qids = [q for q in queries if qrels.get(q)]
        texts = [queries[q] for q in qids]
        level = 2 if "msmarco" in folder.name else 1
        q = cached_queries(r, folder.name, texts)
        snap = r.searcher.snapshot
        c = gather_candidates(R3, 100, snap, q, vectors=True)

        score = scorer(r.docs.ids, qids, qrels, level)

        for name in R3:
            perq.setdefault(name, {})[folder.name] = score(single_rows(c, name))
        for label, fn in CANDIDATES.items():
            perq.setdefault(label, {})[folder.name] = score(fn(c, q))
        t0 = time.perf_counter()
        c4 = gather4(100, snap, q)
        rm3_cost[folder.name] = {"gather ms (3 retrievers + bm25+rm3)": (time.perf_counter() - t0) / len(qids) * 1e3,
                                 **_rm3_costs(snap, q)}
        if not np.array_equal(c4.exact["bm25"][:, :c.rows.shape[1]], c.exact["bm25"]):
            logging.warning("%s: BM25 scores differ between the two gathers", folder.name)
        perq.setdefault(RM3.name, {})[folder.name] = score(single_rows(c4, RM3.name))
        for label, fn in RM3_CANDIDATES.items():
            perq.setdefault(label, {})[folder.name] = score(fn(c4, q))
        for depth in (10, 30, 100):  # candidate depth per retriever, for both defaults
            cd = gather_candidates(R3, depth, snap, q, vectors=True)
            depth_rows.append({"collection": folder.name, "depth": depth, "union": float(cd.valid.sum(1).mean()),
                               **{lab: float(score(fuse(cfg, cd, 100, None, q)[0])["ndcg@10"].mean())
                                  for lab, cfg in (("today nDCG@10", TODAY), ("new nDCG@10", NEW))}})
        # headroom: a linear weight grid, and the features of the learned combiner (trained below, LOCO)
        z = LF.signals(c, gqr_scores(GQRConfig(), guide_weights(NEW, c), c.exact, c.valid, q.dense, c.vectors)[1], R3)
        for w, fused in LF.linear_grid(z, c.valid).items():
            grid.setdefault(w, {})[folder.name] = score(select(c.rows, fused, {}, 100)[0])
        learn[folder.name] = (*LF.features(c, z, R3), LF.grades_of(c.rows, r.docs.ids, qids, qrels), c.valid, c.rows, score)
        costs[folder.name] = _costs(r, c, q, folder.name) if not args.no_costs else {}
        print(f"{folder.name}: done ({len(qids)} queries)", flush=True)

    singles = list(R3)
    methods = [*singles, RM3.name, *CANDIDATES, *RM3_CANDIDATES]
    mean = {m: {n: {k: float(v.mean()) for k, v in perq[m][n].items()} for n in names} for m in methods}
    # the rule: never below the best single retriever (tolerance TOL) in nDCG@10 and MRR@10
    best_single = {n: {k: max(mean[s][n][k] for s in singles) for k in METRICS} for n in names}

    best_single4 = {n: {k: max(mean[s][n][k] for s in (*singles, RM3.name)) for k in METRICS} for n in names}

    def rule(m: str, n: str, best: dict[str, dict[str, float]] = best_single) -> bool:
        return all(mean[m][n][k] >= best[n][k] - TOL for k in ("ndcg@10", "mrr@10"))

    def rule4(m: str, n: str) -> bool:
        return rule(m, n, best_single4)

    # leave-one-collection-out choice among the fusion candidates (by mean nDCG@10 on the others)
    def loco_pick(fusions: list[str]) -> dict[str, str]:
        return {n: max(fusions, key=lambda m: np.mean([mean[m][x]["ndcg@10"] for x in names if x != n])) for n in names}

    loco = loco_pick(list(CANDIDATES))
    loco_rm3 = loco_pick([*CANDIDATES, *RM3_CANDIDATES])
    for label, pick in (("LOCO-selected fusion (held-out)", loco), (LOCO_RM3_LABEL, loco_rm3)):
        perq[label] = {n: perq[pick[n]][n] for n in names}
        mean[label] = {n: mean[pick[n]][n] for n in names}
        methods.append(label)

    tables = {}
    for k in METRICS:
        rows = []
        for m in methods:
            row = {"method": m, **{n: mean[m][n][k] for n in names}, "avg": float(np.mean([mean[m][n][k] for n in names]))}
            if shared != names:
                row["avg shared"] = float(np.mean([mean[m][n][k] for n in shared]))
            if m not in singles:
                row["never below best single"] = "yes" if all(rule(m, n) for n in names) else \
                    "no: " + ", ".join(n for n in names if not rule(m, n))
                row["... or bm25+rm3"] = "yes" if all(rule4(m, n) for n in names) else \
                    "no: " + ", ".join(n for n in names if not rule4(m, n))
            rows.append(row)
        tables[k] = table(rows, ["method", *names, "avg", *(["avg shared"] if shared != names else []),
                                 "never below best single", "... or bm25+rm3"])
        print(f"\n{k} (top-100 runs; rule = within {TOL} of the best single retriever in nDCG@10 and MRR@10)\n"
              + tables[k])
    sig_rows = []
    for n in names:
        a, b = perq[NEW_LABEL][n], perq[TODAY_LABEL][n]
        row = {"collection": n, "queries": len(a["ndcg@10"])}
        for k in ("ndcg@10", "mrr@10"):
            row[f"delta {k}"] = float((a[k] - b[k]).mean())
            row[f"p rand {k}"] = randomisation_p(a[k], b[k])
            row[f"p t {k}"] = float(ttest_rel(a[k], b[k]).pvalue) if np.any(a[k] - b[k]) else 1.0
        c_ = perq[AGREE_LABEL][n]
        for k in ("ndcg@10", "mrr@10"):
            row[f"delta {k} vs agreement alone"] = float((a[k] - c_[k]).mean())
            row[f"p rand {k} vs agreement alone"] = randomisation_p(a[k], c_[k])
        row["rule new"] = "yes" if rule(NEW_LABEL, n) else "no"
        row["rule today"] = "yes" if rule(TODAY_LABEL, n) else "no"
        row["LOCO pick"] = loco[n]
        row["LOCO pick, bm25+rm3 variants too"] = loco_rm3[n]
        sig_rows.append(row)
    sig_md = table(sig_rows, list(sig_rows[0]))
    print("\nNew default vs today's default: paired tests over queries (randomisation 10k, t-test)\n" + sig_md)
    rm3_rows = []
    for m in (RM3.name, *RM3_CANDIDATES):
        row = {"method": m}
        for n in names:
            a, b = perq[m][n]["ndcg@10"], perq[NEW_LABEL][n]["ndcg@10"]
            row[n] = f"{(a - b).mean():+.3f} (p {randomisation_p(a, b):.2f})"
        row["avg"] = f"{np.mean([(perq[m][n]['ndcg@10'] - perq[NEW_LABEL][n]['ndcg@10']).mean() for n in names]):+.3f}"
        rm3_rows.append(row)
    rm3_md = table(rm3_rows, list(rm3_rows[0]))
    print("\nbm25+rm3 variants vs the new default: delta nDCG@10 (paired randomisation p)\n" + rm3_md)
    rm3_cost_md = table([{"collection": n, **v} for n, v in rm3_cost.items()], ["collection", *next(iter(rm3_cost.values()))])
    print("\nbm25+rm3 cost (ms per query)\n" + rm3_cost_md)
    depth_md = table(depth_rows, list(depth_rows[0]))
    print("\nCandidate depth per retriever (GQR, nDCG@10)\n" + depth_md)
    cost_rows = [{"collection": n, **c} for n, c in costs.items()]
    cost_md = table(cost_rows, list(cost_rows[0]))
    print("\nCost (ms per query, pre-encoded queries)\n" + cost_md)
    head_rows, learned = _headroom(names, shared, perq, grid, learn)
    head_md = table(head_rows, list(head_rows[0]))
    print("\nHeadroom: upper bounds (chosen on the test queries) and held-out (LOCO) numbers, nDCG@10 / MRR@10\n" + head_md)
    write_json(RESULTS / "fusion.json", {
        "headroom": head_rows, "learned_combiner_weights": learned,
        "machine": machine(), "metrics": mean, "best_single": best_single, "loco": loco, "loco_with_rm3": loco_rm3,
        "significance": sig_rows, "depth": depth_rows, "costs": costs, "rm3_costs": rm3_cost,
        "best_single_with_rm3": best_single4,
        "ndcg_recall": {m: {n: {k: mean[m][n][k] for k in ("ndcg@10", "recall@100")} for n in names} for m in methods}})
    _write_doc(tables, sig_md, depth_md, cost_md, rm3_md, rm3_cost_md, head_md)
    return 0


def scorer(ids: list[str], qids: list[str], qrels: dict[str, dict[str, int]], level: int
           ) -> Callable[[np.ndarray], dict[str, np.ndarray]]:
    """Per-query metrics of a ``(nq, 100)`` row array, for one collection."""
    def score(rows: np.ndarray) -> dict[str, np.ndarray]:
        pq = per_query(run_from_rows(rows, ids, qids), qrels, METRICS, relevance_level=level)
        return {m: np.array([pq[m][x] for x in qids]) for m in METRICS}
    return score


HEAD_METHODS = (TODAY_LABEL, NEW_LABEL)
L2S = (0.01, 0.1, 1.0)


def _headroom(names: list[str], shared: list[str], perq: dict[str, dict[str, dict[str, np.ndarray]]],
              grid: dict[tuple[int, ...], dict[str, dict[str, np.ndarray]]], learn: dict[str, tuple]
              ) -> tuple[list[dict[str, object]], dict[str, list[list[float]]]]:
    """How far above the default any fusion of these scores could go, and how much of it a
    combiner learned on the other collections gets (see benchmarks/_learned_fusion.py)."""
    def m(pq: dict[str, np.ndarray], k: str) -> float:
        return float(pq[k].mean())

    fusions = [x for x in perq if x not in (*R3, RM3.name) and not x.startswith("LOCO")]
    rows_by: dict[str, dict[str, tuple[float, float]]] = {}
    for label in HEAD_METHODS:
        rows_by[label] = {n: (m(perq[label][n], "ndcg@10"), m(perq[label][n], "mrr@10")) for n in names}
    best_w = {n: max(grid, key=lambda w: m(grid[w][n], "ndcg@10")) for n in names}
    rows_by["best linear weights per collection (upper bound)"] = {
        n: (m(grid[best_w[n]][n], "ndcg@10"), m(grid[best_w[n]][n], "mrr@10")) for n in names}
    loco_w = {n: max(grid, key=lambda w: np.mean([m(grid[w][x], "ndcg@10") for x in names if x != n])) for n in names}
    rows_by["linear weights chosen LOCO (held-out)"] = {
        n: (m(grid[loco_w[n]][n], "ndcg@10"), m(grid[loco_w[n]][n], "mrr@10")) for n in names}
    best_f = {n: max(fusions, key=lambda f: m(perq[f][n], "ndcg@10")) for n in names}
    rows_by["best fusion candidate per collection (upper bound)"] = {
        n: (m(perq[best_f[n]][n], "ndcg@10"), m(perq[best_f[n]][n], "mrr@10")) for n in names}
    pool = (*R3, NEW_LABEL)
    rows_by["per-query oracle: dense, sparse, BM25 or new default (upper bound)"] = {
        n: tuple(float(np.max(np.stack([perq[p][n][k] for p in pool]), 0).mean()) for k in ("ndcg@10", "mrr@10"))
        for n in names}  # type: ignore[misc]
    learned: dict[str, list[list[float]]] = {}
    for l2 in L2S:
        label = f"learned combiner, l2 {l2} (LOCO, held-out)"
        res = {}
        for n in names:
            W = LF.train_combiner([learn[x][:4] for x in names if x != n], l2)
            cand, query, _, valid, rows, score = learn[n]
            pq = score(select(rows, LF.combine(W, cand, query, valid), {}, 100)[0])
            res[n] = (m(pq, "ndcg@10"), m(pq, "mrr@10"))
        rows_by[label] = res
        learned[f"l2 {l2}, all collections"] = LF.train_combiner([learn[x][:4] for x in names], l2).round(4).tolist()
    out: list[dict[str, object]] = []
    for label, vals in rows_by.items():
        row: dict[str, object] = {"method": label, **{n: f"{vals[n][0]:.3f} / {vals[n][1]:.3f}" for n in names}}
        for col, over in (("", names), (" shared", shared)) if shared != names else (("", names),):
            avg = float(np.mean([vals[n][0] for n in over]))
            row[f"avg{col} nDCG@10"] = avg
            row[f"vs today{col}"] = f"{avg - np.mean([rows_by[TODAY_LABEL][n][0] for n in over]):+.4f}"
        out.append(row)
    return out, learned


def _einsum_refine(q0: np.ndarray, D: np.ndarray, valid: np.ndarray, guide: np.ndarray, cfg: GQRConfig) -> np.ndarray:
    """GQR as hybridret ran it before issue #12 (one einsum over the whole batch per step): the
    baseline the blocked implementation is timed and checked against in the same run."""
    q = q0.astype(np.float32).copy()
    D = D.astype(np.float32)
    g = normalise(guide, valid, cfg.guide_norm)
    s0 = np.einsum("nd,nmd->nm", q, D)
    target = ((1 - cfg.alpha) * masked_softmax(s0 / cfg.t_dense, valid) + cfg.alpha * masked_softmax(g / cfg.t_guide, valid))
    target = target.astype(np.float32)
    m, v = np.zeros_like(q), np.zeros_like(q)
    for step in range(1, cfg.steps + 1):
        p = masked_softmax(np.einsum("nd,nmd->nm", q, D) / cfg.t_dense, valid)
        grad = np.einsum("nm,nmd->nd", p - target, D) / cfg.t_dense
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad * grad
        q -= cfg.lr * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
    return q


def _costs(r: HybridRetriever, c: Candidates, q: QueryBatch, name: str) -> dict[str, float]:
    """GQR step alone (blocked vs the previous einsum loop, same run), fusion, and the whole hybrid
    search from encoded queries."""
    snap, n = r.searcher.snapshot, len(q)
    g = c.exact["sparse"]
    cfg = GQRConfig()
    out: dict[str, float] = {"union": float(c.valid.sum(1).mean())}
    new = old = None

    def run_new() -> None:
        nonlocal new
        new = gqr_refine(q.dense, c.vectors, c.valid, g, cfg)

    def run_old() -> None:
        nonlocal old
        old = _einsum_refine(q.dense, c.vectors, c.valid, g, cfg)

    t_new = min(_t(run_new) for _ in range(3)) / n
    t_old = min(_t(run_old) for _ in range(3)) / n
    rank = {}
    for lab, qq in (("new", new), ("old", old)):
        rank[lab] = select(c.rows, np.where(c.valid, np.matmul(c.vectors, qq[:, :, None])[:, :, 0], -np.inf), {}, 100)[0]
    out["gqr step ms (blocked)"] = t_new * 1e3
    out["gqr step ms (previous einsum)"] = t_old * 1e3
    out["speed-up"] = t_old / t_new
    out["top-10 identical"] = float((rank["new"][:, :10] == rank["old"][:, :10]).all(1).mean())
    out["top-100 identical"] = float((rank["new"] == rank["old"]).all(1).mean())
    out["max |dq|"] = float(np.abs(new - old).max())  # type: ignore[operator]
    out["fuse ms, new default"] = min(_t(lambda: fuse(NEW, c, 10, None, q)) for _ in range(3)) / n * 1e3
    out["gather ms"] = min(_t(lambda: gather_candidates(R3, 100, snap, q)) for _ in range(2)) / n * 1e3
    out["hybrid search ms (batched)"] = min(_t(lambda: fused_search(NEW, 10, snap, q)) for _ in range(2)) / n * 1e3
    few = min(n, 50)
    out["hybrid search ms (one query at a time)"] = _t(lambda: [fused_search(NEW, 10, snap, q.slice(i, i + 1))
                                                                 for i in range(few)]) / few * 1e3
    return out


def _rm3_costs(snap: object, q: QueryBatch) -> dict[str, float]:
    """bm25 top-100 vs bm25+rm3 (first pass, feedback texts, relevance model, second pass) top-100."""
    n = len(q)
    bm25 = REGISTRY["bm25"]
    out = {"bm25 top-100 ms": min(_t(lambda: search_rows(bm25, snap, q, 100)) for _ in range(2)) / n * 1e3}  # type: ignore[arg-type]
    out["bm25+rm3 prepare ms"] = min(_t(lambda: RM3.prepare(snap, q)) for _ in range(2)) / n * 1e3  # type: ignore[arg-type]
    out["bm25+rm3 top-100 ms"] = min(_t(lambda: search_rows(RM3, snap, q, 100)) for _ in range(2)) / n * 1e3  # type: ignore[arg-type]
    ctx = RM3.prepare(snap, q)  # type: ignore[arg-type]
    out["expanded terms per query"] = float(np.mean([len(w) for w in ctx.weights]))
    out["query terms per query"] = float(np.mean([len(set(t)) for t in bm25_tokens(snap, q.texts)]))  # type: ignore[arg-type]
    return out


def _t(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


MARK = "<!-- generated by benchmarks/fusion.py: everything below this line is rewritten -->"


def _write_doc(tables: dict[str, str], sig_md: str, depth_md: str, cost_md: str, rm3_md: str, rm3_cost_md: str,
               head_md: str) -> None:
    """Rewrite the measured part of docs/fusion.md (below :data:`MARK`); the text above stays."""
    doc = ROOT / "docs" / "fusion.md"
    old = doc.read_text() if doc.is_file() else "# Fusion\n\n"
    head = old.split(MARK)[0].rstrip() + "\n\n"
    doc.write_text(
        head + MARK + "\n\n## Measured\n\n"
        f"Each retriever's top-100, exact scores on the union, pytrec_eval over each method's top-100; the rule column "
        f"checks nDCG@10 and MRR@10 within {TOL} of the best single retriever on every collection. "
        "LOCO row: for each collection, the fusion candidate with the best mean nDCG@10 on the *other* collections "
        "(the second LOCO row also chooses among the bm25+rm3 variants). bm25+rm3 rows: "
        "the union of dense, sparse, BM25 and bm25+rm3 lists (each top-100), restricted to the lists named.\n\n"
        "### nDCG@10\n\n" + tables["ndcg@10"] + "\n\n### MRR@10\n\n" + tables["mrr@10"] +
        "\n\n### Recall@100\n\n" + tables["recall@100"] +
        "\n\n### New default vs today's default (paired, per query)\n\n" + sig_md +
        "\n\n### bm25+rm3 variants vs the new default (delta nDCG@10, paired randomisation p)\n\n" + rm3_md +
        "\n\n### bm25+rm3 cost (ms per query, this machine)\n\n" + rm3_cost_md +
        "\n\n### Candidate depth per retriever (nDCG@10)\n\n" + depth_md +
        "\n\n### Headroom: upper bounds and a learned combiner (nDCG@10 / MRR@10)\n\n"
        "Rows marked upper bound choose on the collection's own test queries; LOCO rows choose or train on the other "
        "collections only. Linear weights: z-score fusion of dense, sparse, BM25 and the new default's refined dense "
        "score, each weight in {0, 1, 2}. Learned combiner: benchmarks/_learned_fusion.py.\n\n" + head_md +
        "\n\n### Cost (ms per query, pre-encoded queries, this machine)\n\n" + cost_md + "\n")
    print(f"wrote {doc}")


if __name__ == "__main__":
    sys.exit(main())
