"""GQR sensitivity: vary one setting at a time around the ``hybrid`` default (GQR with
agreement-weighted guides) and report avg nDCG@10.

    python benchmarks/gqr_sensitivity.py      (uses the indexes built by benchmarks/fusion.py)

Checks the paper's defaults (alpha 0.5, 25 steps, lr 1e-3) against the score scales here, and each
temperature. Writes benchmarks/results/gqr-sensitivity.json.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, SHARED, machine, table, write_json  # noqa: E402
from fusion import NEW, cached_queries  # noqa: E402

from hybridret import HybridRetriever, load_qrels, load_queries  # noqa: E402
from hybridret.eval import evaluate, run_from_rows  # noqa: E402
from hybridret.fusion.config import fuse
from hybridret.fusion.gather import gather_candidates  # noqa: E402

SWEEP = {"steps": [10, 25, 50, 100], "lr": [3e-4, 1e-3, 3e-3], "alpha": [0.3, 0.5, 0.7, 0.9],
         "t_dense": [0.05, 0.1, 0.2], "t_guide": [0.5, 1.0, 2.0]}


def main() -> int:
    base = NEW
    folders = sorted(p for p in SHARED.iterdir() if (ROOT / "indexes" / f"bench-{p.name}" / "manifest.json").exists())
    if not folders:
        print("no indexes: run benchmarks/fusion.py first", file=sys.stderr)
        return 2
    settings = [("default", base)]
    for name, values in SWEEP.items():
        for v in values:
            if v != getattr(base.gqr, name):
                settings.append((f"{name}={v:g}", base.with_(gqr=replace(base.gqr, **{name: v}))))
    for depth in (10, 30):
        settings.append((f"depth={depth}", base.with_(depth=depth)))
    settings.append(("fixed guide weights (gqr)", base.with_(guide_weighting="fixed")))
    scores = {label: [] for label, _ in settings}
    for folder in folders:
        r = HybridRetriever.load(ROOT / "indexes" / f"bench-{folder.name}")
        queries, qrels = load_queries(folder / "queries.jsonl"), load_qrels(folder / "qrels" / "test.tsv")
        qids = [q for q in queries if qrels.get(q)]
        texts = [queries[q] for q in qids]
        q = cached_queries(r, folder.name, texts)
        snap = r.searcher.snapshot
        level = 2 if "msmarco" in folder.name else 1
        cache = {}
        for label, cfg in settings:
            if cfg.depth not in cache:
                cache[cfg.depth] = gather_candidates(cfg.union_retrievers, cfg.depth, snap, q)
            rows, _, _ = fuse(cfg, cache[cfg.depth], 100, snap, q)
            scores[label].append(evaluate(run_from_rows(rows, r.docs.ids, qids), qrels, ("ndcg@10",),
                                          relevance_level=level)["ndcg@10"])
        print(f"{folder.name}: done", flush=True)
    rows = [{"setting": label, **{f.name: v for f, v in zip(folders, vals)}, "avg": float(np.mean(vals))}
            for label, vals in scores.items()]
    print(table(rows, ["setting", *[f.name for f in folders], "avg"]))
    write_json(RESULTS / "gqr-sensitivity.json", {"machine": machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
