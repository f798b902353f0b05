"""Regenerate docs/benchmarks.md from the JSON results in benchmarks/results/.

    python benchmarks/report.py

Reads peers-*.json (beir.py, msmarco.py), scale.json (scale.py), living.json (living.py), core-*.json (core.py),
sparse-exact.json (sparse_exact.py), train-*.json (train_eval.py), gqr-sensitivity.json and
fusion.json; whatever is missing is skipped. Also draws docs/img/*.png (matplotlib).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, table  # noqa: E402
from _suite import tables  # noqa: E402

IMG = ROOT / "docs" / "img"
PAIRS = {("bm25s", "BM25"): "BM25", ("pyserini", "BM25"): "BM25",
         ("pyserini", "learned sparse (impact, same SPLADE vectors ×100)"): "learned sparse (SPLADE-tiny)",
         ("FAISS IndexFlatIP (direct)", "dense (same vectors)"): "dense (MiniLM)",
         ("sentence-transformers semantic_search", "dense (same vectors)"): "dense (MiniLM)"}


def _peer_results() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RESULTS.glob("peers-*.json"))]


def _first_topics(r: dict) -> tuple[str, dict]:
    name = next(iter(r["topics"]))
    return name, r["topics"][name]


def headline(results: list[dict]) -> str:
    """nDCG@10 of every system/method (rows) on every collection (columns)."""
    cols, rows = [], {}
    for r in results:
        _, t = _first_topics(r)
        cols.append(r["collection"])
        for row in t["rows"]:
            key = f"{row['system']}: {row['method']}"
            rows.setdefault(key, {"system / method": key})[r["collection"]] = row["ndcg@10"]
    for row in rows.values():
        vals = [row[c] for c in cols if c in row]
        row["avg"] = sum(vals) / len(vals) if len(vals) == len(cols) else None
    return table(list(rows.values()), ["system / method", *cols, "avg"])


def ratios(results: list[dict]) -> tuple[str, list[dict]]:
    """hybridret ÷ peer queries/s per collection, and rows for the ahead/behind summary."""
    out = []
    for r in results:
        _, t = _first_topics(r)
        for row in t["rows"]:
            if row["system"] == "hybridret" or row.get("hybridret ÷ peer, all cores") is None:
                continue
            out.append({"collection": r["collection"], "docs": r["docs"], "peer": f"{row['system']}: {row['method']}",
                        "÷ 1 thread": row.get("hybridret ÷ peer, 1 thread"),
                        "÷ all cores": row.get("hybridret ÷ peer, all cores")})
    return table(out, ["peer", "collection", "docs", "÷ 1 thread", "÷ all cores"]), out


def summary(rows: list[dict], results: list[dict]) -> str:
    """Per peer: geometric-mean speed ratio over the collections, and the quality difference."""
    import math

    by: dict[str, list[dict]] = {}
    for row in rows:
        by.setdefault(row["peer"], []).append(row)
    quality: dict[str, list[float]] = {}
    for r in results:
        _, t = _first_topics(r)
        ours = {row["method"]: row for row in t["rows"] if row["system"] == "hybridret"}
        for row in t["rows"]:
            mine = ours.get(PAIRS.get((row["system"], row["method"]), ""))
            if row["system"] != "hybridret" and mine is not None and row.get("ndcg@10") is not None:
                quality.setdefault(f"{row['system']}: {row['method']}", []).append(mine["ndcg@10"] - row["ndcg@10"])
    out = []
    for peer, rs in by.items():
        def gm(key: str) -> float | None:
            vals = [x[key] for x in rs if x.get(key)]
            return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None
        g1, ga = gm("÷ 1 thread"), gm("÷ all cores")
        dq = quality.get(peer)
        ref = [g for g in (g1, ga) if g]
        verdict = ("ahead" if all(g > 1.1 for g in ref) else "behind" if all(g < 0.9 for g in ref)
                   else "on par / mixed")
        out.append({"peer": peer, "collections": len(rs), "speed ÷, 1 thread (geo-mean)": g1,
                    "speed ÷, all cores (geo-mean)": ga, "hybridret speed": verdict,
                    "nDCG@10 hybridret − peer (mean)": sum(dq) / len(dq) if dq else None})
    return table(out, list(out[0].keys())) if out else ""


def plots(results: list[dict], scale: dict | None) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    IMG.mkdir(parents=True, exist_ok=True)
    made = []
    n = len(results)
    if n:
        cols = min(3, n)
        fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(5 * cols, 4 * ((n + cols - 1) // cols)), squeeze=False)
        for ax, r in zip(axes.flat, results):
            _, t = _first_topics(r)
            metric = "ndcg@10"
            for row in t["rows"]:
                qps = row.get("q/s all cores")
                if not qps or row.get(metric) is None or row["system"].startswith("ranx"):
                    continue
                ax.scatter(1e3 / qps, row[metric], marker="o" if row["system"] == "hybridret" else "x")
                ax.annotate(f"{row['system'].split()[0]}: {row['method'].split(' (')[0]}", (1e3 / qps, row[metric]),
                            fontsize=7)
            ax.set_xscale("log")
            ax.set_title(f"{r['collection']} ({r['docs']:,} docs)")
            ax.set_xlabel("ms per query (all cores, pre-encoded queries)")
            ax.set_ylabel(metric)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(IMG / "quality-vs-latency.png", dpi=110)
        plt.close(fig)
        made.append("quality-vs-latency.png")
    if scale:
        made += scale_plots(scale, plt)
    return made


SCALE_COLS = ["size", "index", "build_s", "docs/s", "disk_MB", "rss_MB", "build_peak_MB", "ms_median", "ms_p95",
              "qps_all", "x_ref", "recall10", "exact_top10"]


def scale_plots(scale: dict, plt: Any) -> list[str]:
    series: dict[str, list[dict]] = {}
    for row in scale["results"]:
        series.setdefault(row["index"], []).append(row)
    made = []
    for key, ylabel, fname in (("ms_median", "median ms per query, 1 thread", "scale-latency.png"),
                               ("rss_MB", "resident memory of the loaded index, MB", "scale-memory.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, rows in series.items():
            pts = [(r["size"], r[key]) for r in rows if r.get(key) is not None]
            if len(pts) > 0 and all(v > 0 for _, v in pts):
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("documents (synthetic vectors)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(IMG / fname, dpi=110)
        plt.close(fig)
        made.append(fname)
    return made


def scale_section(scale: dict, images: list[str]) -> str:
    parts = ["## Scale curve (synthetic vectors)\n",
             f"`python benchmarks/scale.py`: **synthetic** dense and learned-sparse vectors whose statistics were fitted "
             f"from {scale['fitted_from']} (not encoded text: encoding 1M passages would take days on 2 cores). "
             f"{scale['queries']} queries, k={scale['k']}; ms = one thread; q/s = all cores; rss_MB = resident memory "
             "added by loading the index; x_ref = hybridret's median latency ÷ the reference's (FAISS called directly "
             "for dense, scipy `q @ D.T` one query at a time for sparse).\n"]
    for sk in scale.get("skipped", []):
        parts.append(f"Size {sk['size']:,} skipped: it would have taken about {sk['estimated_minutes']:.0f} minutes.\n")
    parts.append(table(scale["results"], [c for c in SCALE_COLS if any(c in r for r in scale["results"])]) + "\n")
    for img in ("scale-latency.png", "scale-memory.png"):
        if img in images:
            parts.append(f"![{img[:-4]}](img/{img})\n")
    return "\n".join(parts)


def living_section(res: dict) -> str:
    """The living-index benchmark (living.py): add, many segments vs compacted, filters."""
    from living import tables as living_tables

    cmd = res.get("command")
    if cmd is None:  # results written before living.py kept its command line
        cmd = "python benchmarks/living.py"
        if res["collection"] != "msmarco-dl19-pool":
            cmd += f" --data {res['collection']}"
        elif res["docs"] != 30005:
            cmd += f" --docs {res['docs']}"
        if res["add"]["docs_added"] != max(1, round(res["docs"] * 0.01)):
            cmd += f" --add {res['add']['docs_added']}"
    return (f"## Living index: add, segments, compaction, filters\n\n`{cmd}`"
            + f": {res['docs']:,} passages of {res['collection']} ({res['base_docs']:,} built, the last "
            f"{res['add']['docs_added']} added), {res['queries']} queries, k={res['k']}. Times are wall-clock on this "
            "machine; ratios come from the same run.\n\n" + living_tables(res) + "\n")


SPEED_FILES = (
    ("query-path.json", "The query path, pre-encoded: today's code beside an older revision and the peers",
     "python benchmarks/query_path.py --baseline REV --baseline-index DIR ..."),
    ("bm25-speed.json", "BM25: posting store against tantivy's path and bm25s", "python benchmarks/bm25_speed.py"),
    ("encode-speed.json", "CPU encoding: backends, memory, quality", "python benchmarks/encode_speed.py"),
    ("ray-scale.json", "Ray: distributed build and sharded search on this machine", "python benchmarks/ray_scale.py"),
    ("rag.json", "RAG: documents made of chunks (grouping, reranker cost)", "python benchmarks/rag.py"),
)


def generic_section(r: dict, title: str, cmd: str) -> str:
    """Every list of flat records in a result file as a table (the script's own printout is the reference)."""
    out = [f"## {title}\n", f"`{cmd}` (the JSON has every number; "
           f"{r.get('machine', {}).get('cpus', '?')} CPUs).\n"]
    for key, rows in r.items():
        if isinstance(rows, list) and rows and all(isinstance(x, dict) for x in rows):
            cols = list(dict.fromkeys(c for x in rows for c, v in x.items() if not isinstance(v, (dict, list))))
            if key == "table" and isinstance(r.get("columns"), list):  # the script's own column order
                cols = [c for c in r["columns"] if c in cols]
            if cols:
                out.append(f"**{key}**\n\n" + table(rows, cols[:12]) + "\n")
        elif isinstance(rows, dict) and rows and all(isinstance(v, dict) for v in rows.values()):
            flat = [{"": k, **{c: v for c, v in val.items() if not isinstance(v, (dict, list))}} for k, val in rows.items()]
            cols = list(dict.fromkeys(c for x in flat for c in x))
            if len(cols) > 1:
                out.append(f"**{key}**\n\n" + table(flat, cols[:12]) + "\n")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    global RESULTS, IMG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="JSON folder (default benchmarks/results)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md", help="markdown to write")
    args = ap.parse_args(argv)
    RESULTS, IMG = args.results, args.out.parent / "img"
    parts = ["# Benchmarks\n", "Generated by `python benchmarks/report.py` from `benchmarks/results/*.json`. All runs on the "
             "project's CPU machine (2 cores, no GPU): absolute times are for comparison within a table only; "
             "ratios (hybridret ÷ peer, above 1 = hybridret faster) were measured in the same run on the same data.\n"]
    results = _peer_results()
    scale_file = RESULTS / "scale.json"
    scale = json.loads(scale_file.read_text()) if scale_file.is_file() else None
    images = plots(results, scale)
    if results:
        parts.append("## hybridret and its peers: quality (nDCG@10)\n")
        parts.append("`python benchmarks/beir.py` (every folder in ../shared/data) and `python benchmarks/msmarco.py`. "
                     "Each system searched the same corpus with the same query texts; dense peers searched hybridret's own "
                     "vectors and pyserini impact search hybridret's own SPLADE vectors (weights × 100, rounded), so "
                     "differences there come from the engine, not the model.\n")
        parts.append(headline(results) + "\n")
        if "quality-vs-latency.png" in images:
            parts.append("![quality vs latency](img/quality-vs-latency.png)\n")
        rt, ratio_rows = ratios(results)
        parts.append("## Speed: hybridret ÷ peer, queries per second\n")
        parts.append("Pre-encoded queries, k=10, best of 3 timed rounds. Above 1: hybridret is faster. ranx rows compare "
                     "the fusion step alone (hybridret's `fuse()` on the same candidates). Summary over the collections "
                     "(the nDCG@10 difference is against the hybridret method doing the same job):\n")
        parts.append(summary(ratio_rows, results) + "\n")
        parts.append("<details><summary>every collection</summary>\n\n" + rt + "\n\n</details>\n")
        parts.append("## Per collection\n")
        for r in results:
            parts.append(tables(r, r.get("kind", "beir")) + "\n")
            if "projection_full_collection" in r:
                p = r["projection_full_collection"]
                parts.append("Projected for the full 8.8M passages (linear in this run's bytes per passage): "
                             + ", ".join(f"{k} {v / 1e9:.1f} GB" for k, v in p["bytes_on_disk_flat_fp32"].items())
                             + f"; dense as IVF-PQ64 {p['dense_bytes_ivfpq64'] / 1e9:.1f} GB, as SQfp16 "
                             f"{p['dense_bytes_sqfp16'] / 1e9:.1f} GB.\n")
    if scale:
        parts.append(scale_section(scale, images))
    living_file = RESULTS / "living.json"
    if living_file.is_file():
        parts.append(living_section(json.loads(living_file.read_text())))
    for path in sorted(RESULTS.glob("core-*.json")):
        r = json.loads(path.read_text())
        parts.append(f"## Core engine: {r['collection']}\n")
        parts.append("`python benchmarks/core.py --data ../shared/data/" + r["collection"] + "`. Quality from "
                     "pytrec_eval over each method's top-100; q/s end-to-end includes query encoding (both models); "
                     "'index' columns use pre-encoded queries.\n")
        if "build" in r:
            b = r["build"]
            note = " (measured while other jobs shared the CPU)" if b.get("from_an_earlier_run") else ""
            parts.append(f"Index build: {b['docs']:,} documents in {b['seconds']:.0f} s = {b['docs_per_s']:.1f} docs/s "
                         f"(dense + sparse encoding, FAISS Flat, tantivy){note}; "
                         f"{r['index']['bytes_on_disk'] / 1e6:.0f} MB on disk.\n")
        if "build_sample" in r:
            b = r["build_sample"]
            parts.append(f"Fresh build of the first {b['docs']:,} documents on an otherwise idle machine: "
                         f"**{b['docs_per_s']:.1f} docs/s**.\n")
        parts.append(f"Query encoding: {r['query_encoding_qps']:.0f} queries/s (MiniLM + SPLADE-tiny).\n")
        cols = ["method", "ndcg@10", "mrr@10", "recall@100", "q/s end-to-end", "q/s index, 1 thread", "q/s index, all threads"]
        parts.append(table(r["methods"], cols) + "\n")
    path = RESULTS / "sparse-exact.json"
    if path.is_file():
        r = json.loads(path.read_text())
        parts.append("## Exact learned-sparse top-k\n")
        parts.append(f"`python benchmarks/sparse_exact.py`: {r['docs']:,} documents, {r['queries']} real queries, "
                     f"k={r['k']}, one thread unless noted; 'exact' = share of queries whose top-k scores equal "
                     "brute force.\n")
        res = r["results"]
        cols = [c for c in ("approach", "exact", "q/s", "q/s all threads", "postings/doc-term", "mean depth", "1 round",
                            "tantivy queries/query", "brute-force fallbacks") if any(c in x for x in res)]
        parts.append(table(res, cols) + "\n")
    for path in sorted(RESULTS.glob("train-*.json")):
        r = json.loads(path.read_text())
        a = r["args"]
        parts.append(f"## Training: {path.stem}\n")
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in sorted(a.items())
                         if k not in ("data", "models", "device", "tag") and v not in ("None", ""))
        parts.append(f"`python benchmarks/train_eval.py --data {a['data']} --models {' '.join(ast.literal_eval(a['models']))} "
                     f"{flags}` "
                     f"({r['train_queries']} training / {r['test_queries']} test queries; test nDCG@10).\n")
        cols = ["model", "stage", "dense nDCG@10", "sparse nDCG@10", "hybrid nDCG@10", "terms/query", "terms/doc",
                "ms/doc", "train s"]
        parts.append(table(r["rows"], cols) + "\n")
    path = RESULTS / "gqr-sensitivity.json"
    if path.is_file():
        rows = json.loads(path.read_text())["rows"]
        parts.append("## GQR sensitivity\n\n`python benchmarks/gqr_sensitivity.py`: one GQR setting varied at a time "
                     "around the default (alpha 0.5, 50 steps, lr 1e-3, T_dense 0.1, z-scored guide with T 1, depth 100; "
                     "guide = learned sparse + BM25); nDCG@10.\n")
        parts.append(table(rows, list(rows[0].keys())) + "\n")
    for name, title, cmd in SPEED_FILES:
        path = RESULTS / name
        if path.is_file():
            parts.append(generic_section(json.loads(path.read_text()), title, cmd))
    fusion = ROOT / "docs" / "fusion.md"
    if fusion.is_file():
        parts.append("## Fusion\n\nSee [fusion.md](fusion.md) (`python benchmarks/fusion.py`).\n")
    out = args.out
    out.write_text("\n".join(parts))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
