"""Search cost against corpus size on one core, for every search path, on corpora resampled from
real encoded passages (issue #20's scale benchmark).

    python benchmarks/scale_sparse.py [--sizes 30k,1M] [--index DIR] [--queries 1000] [--out JSON]
    python benchmarks/scale_sparse.py --smoke     # one 10k size, a few queries, in-process (CI, < 1 min)

Source: an index of real passages (default ``indexes/bench-msmarco-dl19-pool``: the 30,005 MS MARCO
passages of the TREC DL19 pool with MiniLM dense and SPLADE-tiny learned-sparse vectors; built here
with the packaged models when absent, ~10 minutes; ``--smoke`` then encodes only ``--smoke-docs``
passages). Sizes: the size of the source (``30k`` for the pool, or ``real``) is the real corpus
itself; any other size is resampled from it (see ``_resample.py``: two real passages mixed per
synthetic one, real term weights and posting skew). Queries: real query texts, encoded once by the
index's encoder and cached beside it (``<index>.query-path.npz``, shared with query_path.py): the
pool's 43 TREC DL19 queries, then every other ``../shared/data/*/queries.jsonl`` text, up to
``--queries``. MS MARCO dev queries are not available offline; the 43 DL19 queries are reported
separately as the MS MARCO subset.

Per size, each step in a fresh process (so ``ru_maxrss`` is that step's own peak; ``--smoke`` runs
in-process and says so): generate the corpus; build a real hybridret index from it (IndexWriter,
default settings: seconds and disk per part, peak RSS); build the pruned learned-sparse part alone
when the index does not already have it; then four search groups, each pinned to one CPU with every
library at one thread, paths timed round-robin (best of ``--repeats`` after a warm-up), top-10
checked against an independent reference:

* learned sparse exact: ``ImpactIndex`` (pruned), ``LearnedIndex`` (tantivy, today), a numpy
  inverted index (peer), scipy brute force (the reference: share of queries whose top-10 scores
  equal it, rtol 1e-5, from the true scores of the rows returned); approx: ``ImpactIndex``
  mode="approx" with its recall@10;
* BM25: ``BM25Store`` exhaustive (today) and pruned (when ``search`` has ``prune=``), bm25s numba;
* dense: hybridret's Flat part, the same FAISS ``IndexFlatIP`` called directly, numpy matmul, in
  batch and one query at a time;
* hybrid: the default (``Searcher.fusion_config("hybrid")`` through the search plan), its stages,
  and each retriever's library path, pre-encoded, ``threads=1``.

Writes the JSON (default benchmarks/results/scale-sparse.json), a log-log plot of ms/query against
size (docs/img/scale-sparse.png) and a power-law extrapolation of each path and of each part's
memory to MS MARCO's 8,841,823 passages.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # every search here is one core; builds' tantivy threads are its own
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before FAISS / torch load (see _common.py)

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # this checkout's code
import _resample as rs  # noqa: E402
import _scale_paths as paths  # noqa: E402
from _common import RESULTS, ROOT, SHARED, machine, table, write_json  # noqa: E402

logger = logging.getLogger("bench")
MSMARCO = 8_841_823
POOL = SHARED / "msmarco-dl19-pool"
SAMPLE = ROOT / "hybridret" / "resources" / "sample"
# a priori growth of each step's peak RSS per passage (bytes; measured 30k -> 100k), until two sizes are measured
PRIOR_BYTES = {"generate": 1500, "build": 4000, "learned": 4500, "bm25": 1200, "dense": 4200, "hybrid": 11500}
PRIOR_BASE_MB = 700
LEARNED_S_PER_DOC = 0.8e-3  # tantivy tf-grid build, ~22-26 s per 30k passages measured
GROUPS = ("learned", "bm25", "dense", "hybrid")
PLOTTED = ("windows-exact", "windows-approx", "impact-exact", "impact-approx", "tantivy-exact", "numpy-inverted",
           "scipy-brute", "bm25-store",
           "bm25-store-pruned", "bm25-store-v1-pruned", "bm25-store-v2", "bm25-store-v3", "bm25s-numba", "dense-hybridret", "dense-faiss", "dense-numpy",
           "hybrid-default", "hybrid-default-today")


# --------------------------------------------------------------------------- steps (run in a child process)
def _load_queries(spec: dict[str, Any]) -> tuple[list[str], np.ndarray, sp.csr_matrix, np.ndarray]:
    z = np.load(spec["queries"])
    Q = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(z["shape"]))
    return [str(t) for t in z["texts"]], np.asarray(z["dense"], np.float32), Q, z["msmarco"].astype(bool)


def _pin_one_core() -> int:
    cpus = sorted(os.sched_getaffinity(0))
    try:
        import psutil

        load = psutil.cpu_percent(interval=0.2, percpu=True)
        cpu = min(cpus, key=lambda c: load[c] if c < len(load) else 0.0)
    except ImportError:
        cpu = cpus[0]
    os.sched_setaffinity(0, {cpu})
    return cpu


def step(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    from _scale_build import build_index, build_part

    if name == "generate":
        t0 = time.perf_counter()
        src = rs.load_source(Path(spec["source_index"]))
        info = rs.write_corpus(rs.Resampler(src, spec["seed"]), spec["size"], Path(spec["data"]))
        return {**info, "seconds": time.perf_counter() - t0, "peak_rss_MB": paths.peak_rss_mb(),
                "disk_bytes": sum(f.stat().st_size for f in Path(spec["data"]).iterdir())}
    if name == "build":
        return build_index(spec)
    if name == "build-part":
        return build_part(spec)
    cpu = _pin_one_core() if not spec.get("in_process") else None
    texts, qd, Q, ms = _load_queries(spec)
    if name == "learned":
        out = paths.group_learned(spec, Q, ms)
    elif name == "bm25":
        out = paths.group_bm25(spec, texts, ms)
    elif name == "dense":
        out = paths.group_dense(spec, qd, ms)
    elif name == "hybrid":
        out = paths.group_hybrid(spec, texts, qd, Q)
    else:
        raise SystemExit(f"unknown step {name!r}")
    out["cpu"] = cpu
    return out


def run_step(name: str, spec: dict[str, Any], work: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    if spec.get("in_process"):
        out = step(name, spec)
    else:
        spec_file, out_file = work / f"{name}.spec.json", work / f"{name}.out.json"
        spec_file.write_text(json.dumps(spec))
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", name, str(spec_file), str(out_file)],
                       check=True, env=env, cwd=str(ROOT))
        out = json.loads(out_file.read_text())
    out["step_s"] = time.perf_counter() - t0
    logger.info("  %s: %.1f s, peak RSS %.0f MB", name, out["step_s"], out.get("peak_rss_MB", 0))
    return out


# --------------------------------------------------------------------------- planning
def parse_sizes(text: str, src_n: int) -> list[int]:
    out = []
    for tok in text.split(","):
        tok = tok.strip().lower()
        if tok in ("real", "pool", "source"):
            out.append(src_n)
            continue
        mult = {"k": 1_000, "m": 1_000_000}.get(tok[-1:], 1)
        n = int(float(tok[:-1] if mult > 1 else tok) * mult)
        out.append(src_n if abs(n - src_n) <= 0.01 * src_n else n)  # "30k" is the real 30,005-passage pool
    return sorted(set(out))


def predict_peaks(n: int, done: list[dict[str, Any]]) -> dict[str, float]:
    """Peak RSS (MB) each step would need at ``n`` passages: a line through the two largest measured
    sizes (one size: its peak plus the a-priori bytes per passage; none: the a-priori figures;
    the generator holds one chunk whatever the size)."""
    out = {}
    for st in ("generate", "build", *GROUPS):
        pts = [(d["size"], d[st]["peak_rss_MB"]) for d in done if isinstance(d.get(st), dict) and "peak_rss_MB" in d[st]]
        if st == "generate" and pts and n > rs.CHUNK:  # holds one chunk at a time, whatever the size
            out[st] = max(m for _, m in pts)
        elif len(pts) >= 2:
            (n0, m0), (n1, m1) = pts[-2], pts[-1]
            slope = max(0.0, (m1 - m0) / max(1, n1 - n0))
            out[st] = m1 + slope * (n - n1)
        elif pts:  # one size measured: its peak plus the a-priori growth
            n1, m1 = pts[-1]
            out[st] = m1 + PRIOR_BYTES[st] * max(0, n - n1) / 2**20
        else:
            out[st] = PRIOR_BASE_MB + PRIOR_BYTES[st] * n / 2**20
    return out


def available_mb() -> float:
    import psutil

    return psutil.virtual_memory().available / 2**20


# --------------------------------------------------------------------------- one size
def run_size(n: int, args: argparse.Namespace, work: Path, qfile: Path, done: list[dict[str, Any]]) -> dict[str, Any]:
    d = work / f"n{n}"
    d.mkdir(parents=True, exist_ok=True)
    base = {"size": n, "seed": args.seed, "data": str(d / "data"), "index": str(d / "index"),
            "source_index": str(args.index), "queries": str(qfile), "repeats": args.repeats,
            "single_queries": max(5, min(args.single_queries, int(args.single_queries * 100_000 / n))),
            "hybrid_queries": args.hybrid_queries, "in_process": args.smoke}
    res: dict[str, Any] = {"size": n, "resampled": n != args.src_n}
    kept = reused_folder(n, args.reuse)
    if kept is not None:  # a kept size from an earlier run (--reuse): its corpus, index and their figures
        d = kept
        base.update(data=str(d / "data"), index=str(d / "index"))
        res["reused"] = str(d)
        for st in ("generate", "build"):
            res[st] = json.loads((d / f"{st}.out.json").read_text())
        logger.info("  reusing the corpus and index kept in %s", d)
    else:
        res["generate"] = run_step("generate", base, d)
        res["build"] = run_step("build", base, d)
    parts = res["build"]["parts"]
    by_class = {p["class"]: p for p in parts.values()}
    spec = dict(base)
    for cls, key in (("DenseIndex", "dense_dir"), ("BM25Store", "bm25_dir")):
        spec[key] = by_class[cls]["dir"] if cls in by_class else None
    if "WindowImpactIndex" in by_class:
        spec["windows_dir"] = by_class["WindowImpactIndex"]["dir"]
    if "ImpactIndex" in by_class:
        spec["impact_dir"] = by_class["ImpactIndex"]["dir"]
    elif isinstance(paths.impact_class(), Exception):
        spec["impact_reason"] = f"hybridret.index.impact not importable ({paths.impact_class()})"
    elif kept is not None and (d / "build-part.out.json").is_file() and (d / "impact" / "meta.json").is_file():
        res["impact_standalone"] = json.loads((d / "build-part.out.json").read_text())
        spec["impact_dir"] = str(d / "impact")
    else:
        res["impact_standalone"] = run_step("build-part", {**base, "dir": str(d / "impact")}, d)
        spec["impact_dir"] = str(d / "impact")
    if "LearnedIndex" in by_class:
        spec["learned_dir"] = by_class["LearnedIndex"]["dir"]
    else:  # the same corpus with the tantivy tf-grid part, as hybridret built it before issue #20
        prev = [x["build_today"] for x in done if "build_today" in x]
        rate = prev[-1]["parts"]["sparse"]["build_s"] / prev[-1]["docs"] if prev else LEARNED_S_PER_DOC
        if rate * n > args.learned_max_minutes * 60:
            spec["learned_reason"] = spec["today_reason"] = (
                f"skipped: the tantivy tf-grid build would take ~{rate * n / 60:.0f} min (> --learned-max-minutes "
                f"{args.learned_max_minutes:g})")
        else:
            today = {**base, "index": str(d / "index-today"), "settings": {"sparse_scheme": "tfgrid"}}
            res["build_today"] = run_step("build", today, d)
            spec["index_today"] = today["index"]
            spec["learned_dir"] = next(p["dir"] for p in res["build_today"]["parts"].values()
                                       if p["class"] == "LearnedIndex")
    for g in GROUPS:
        if g not in args.groups:
            earlier = d / f"{g}.out.json"
            if kept is not None and earlier.is_file():  # the figures of the run that last timed it there
                res[g] = {**json.loads(earlier.read_text()), "reused_from": str(earlier)}
            else:
                res[g] = {"paths": {}, "skipped": "not asked for (--groups)"}
            continue
        if g == "bm25" and not spec["bm25_dir"] or g == "dense" and not spec["dense_dir"]:
            res[g] = {"paths": {}, "skipped": "the index has no such part"}
            continue
        if g in getattr(args, "over", {}):
            res[g] = {"paths": {}, "skipped": args.over[g]}
            logger.info("  %s: skipped (%s)", g, args.over[g])
            continue
        try:
            res[g] = run_step(g, spec, d)
        except subprocess.CalledProcessError as exc:  # e.g. killed for memory: the other groups still run
            why = f"the step failed (exit status {exc.returncode}{', killed: out of memory?' if exc.returncode < 0 else ''})"
            res[g] = {"paths": {}, "skipped": why}
            logger.info("  %s: %s", g, why)
    if not args.keep and kept is None:
        shutil.rmtree(d, ignore_errors=True)
    return res


def reused_folder(n: int, dirs: list[Path]) -> Path | None:
    """The folder of size ``n`` kept by an earlier ``--keep`` run in one of ``dirs`` (the first that
    has its generated corpus, its index and both steps' figures), or ``None``."""
    for w in dirs:
        d = Path(w) / f"n{n}"
        if all((d / f).exists() for f in ("generate.out.json", "build.out.json", "data", "index/manifest.json")):
            return d
    return None


# --------------------------------------------------------------------------- report
def path_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for g in GROUPS:
        for key, p in (res.get(g) or {}).get("paths", {}).items():
            row = {"size": res["size"], "path": key, "label": paths.LABELS.get(key, key)}
            if not p.get("available"):
                row["note"] = "not available: " + p.get("reason", "")
            else:
                row.update({c: p.get(c) for c in ("ms_per_query", "ms_median", "cpu_ms_per_query", "top10_exact",
                                                  "recall_at_10", "recall_at_10_msmarco", "same_top10_as_default",
                                                  "top10_overlap_with_store", "queries_timed")})
                if "msmarco" in p:
                    row["msmarco_ms"] = p["msmarco"]["ms_per_query"]
            rows.append(row)
    return rows


def ratios(res: dict[str, Any]) -> dict[str, float | None]:
    ms = {r["path"]: r.get("ms_per_query") for r in path_rows(res)}

    def over(a: str, b: str) -> float | None:
        return ms[b] / ms[a] if ms.get(a) and ms.get(b) else None

    return {"windows exact vs numpy inverted (x faster)": over("windows-exact", "numpy-inverted"),
            "windows approx vs numpy inverted (x faster)": over("windows-approx", "numpy-inverted"),
            "windows exact vs impact (v1) exact (x faster)": over("windows-exact", "impact-exact"),
            "impact exact vs numpy inverted (x faster)": over("impact-exact", "numpy-inverted"),
            "impact approx vs numpy inverted (x faster)": over("impact-approx", "numpy-inverted"),
            "tantivy exact vs numpy inverted (x faster)": over("tantivy-exact", "numpy-inverted"),
            "impact exact vs tantivy exact (x faster)": over("impact-exact", "tantivy-exact"),
            "bm25 pruned vs bm25s numba (x faster)": over("bm25-store-pruned", "bm25s-numba"),
            "bm25 exhaustive vs bm25s numba (x faster)": over("bm25-store", "bm25s-numba"),
            "bm25 pruned vs exhaustive (x faster)": over("bm25-store-pruned", "bm25-store"),
            "bm25 v1 pruned vs bm25s numba (x faster)": over("bm25-store-v1-pruned", "bm25s-numba"),
            "bm25 v3 vs bm25s numba (x faster)": over("bm25-store-v3", "bm25s-numba") or (
                over("bm25-store-pruned", "bm25s-numba") if res.get("bm25", {}).get("store_format", "").endswith("v3")
                else None),
            "bm25 v3 vs v2 (x faster)": over("bm25-store-v3", "bm25-store-pruned") or over("bm25-store-pruned",
                                                                                         "bm25-store-v2"),
            "dense hybridret vs faiss direct (x faster)": over("dense-hybridret", "dense-faiss"),
            "dense hybridret vs numpy (x faster)": over("dense-hybridret", "dense-numpy"),
            "hybrid default ms/query": ms.get("hybrid-default"),
            "hybrid default vs today's (x faster)": over("hybrid-default", "hybrid-default-today"),
            **build_ratios(res)}


def build_ratios(res: dict[str, Any]) -> dict[str, float | None]:
    """What the pruned part costs at build time: its seconds against the whole build of the same
    corpus with the tf-grid part (the issue's "<= 10 % of today's build"), and the two builds."""
    b, t = res.get("build") or {}, res.get("build_today") or {}
    sparse = (b.get("parts") or {}).get("sparse") or {}
    if not t or sparse.get("class") not in ("ImpactIndex", "WindowImpactIndex"):
        return {}
    return {"impact part build / today's whole build": (sparse.get("build_s") or 0) / t["build_s"],
            "whole build / today's whole build": b["build_s"] / t["build_s"]}


def extrapolate(results: list[dict[str, Any]], in_process: bool) -> dict[str, Any]:
    """ms/query at 8.8M per path (power law through the measured sizes), and memory per part."""
    out: dict[str, Any] = {"passages": MSMARCO, "ms_per_query": {}, "fit": "log ms = a + b log N, least squares "
                           "over the measured sizes (two sizes: the line through them)"}
    series: dict[str, list[tuple[int, float]]] = {}
    resampled = [r for r in results if r["resampled"]]
    fitted = resampled if len(resampled) >= 2 else results  # the real corpus differs from resampled ones
    out["fitted_sizes"] = [r["size"] for r in fitted]
    for res in fitted:
        for r in path_rows(res):
            if r.get("ms_per_query"):
                series.setdefault(r["path"], []).append((res["size"], r["ms_per_query"]))
    for key, pts in series.items():
        if len(pts) < 2:
            continue
        x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
        b, a = np.polyfit(x, y, 1)
        out["ms_per_query"][key] = {"exponent": float(b), "ms_at_8.8M": float(np.exp(a + b * np.log(MSMARCO)))}
    if results:
        big = max(results, key=lambda r: r["size"])
        n = big["size"]
        per = {name: p["disk_bytes"] / n for name, p in big["build"]["parts"].items()}
        per["docstore"] = big["build"]["docstore_disk_bytes"] / n
        if "impact_standalone" in big:
            per["impact (standalone)"] = big["impact_standalone"]["disk_bytes"] / n
        out["disk_bytes_per_passage"] = per
        out["disk_GB_at_8.8M"] = {k: v * MSMARCO / 1e9 for k, v in per.items()}
        if len(results) >= 2 and not in_process:
            peaks = predict_peaks(MSMARCO, results)
            out["peak_rss_GB_at_8.8M"] = {k: v / 1024 for k, v in peaks.items()}
        out["memory_note"] = ("disk per part = bytes/passage at the largest size x 8.8M (parts are memory-mapped: "
                              "what a search touches must stay in the page cache); peak RSS per step: a line "
                              "through the two largest sizes")
    return out


def plot(results: list[dict[str, Any]], extra: dict[str, Any], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no plot: matplotlib is not installed ({exc})"
    series: dict[str, list[tuple[int, float]]] = {}
    for res in results:
        for r in path_rows(res):
            if r.get("ms_per_query") and r["path"] in PLOTTED:
                series.setdefault(r["path"], []).append((res["size"], r["ms_per_query"]))
    fig, ax = plt.subplots(figsize=(12.5, 6.5))
    colours = plt.get_cmap("tab20").colors
    for i, key in enumerate(k for k in PLOTTED if k in series):
        pts = sorted(series[key])
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="osD^v<>"[i % 7], color=colours[i % 20],
                        label=paths.LABELS.get(key, key))
        fit = extra.get("ms_per_query", {}).get(key)
        if fit:
            ax.plot([pts[-1][0], MSMARCO], [pts[-1][1], fit["ms_at_8.8M"]], ls=":", color=line.get_color())
    ax.axvline(MSMARCO, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("passages (dotted: power-law extrapolation to MS MARCO's 8.8M)")
    ax.set_ylabel("ms / query, one core")
    ax.set_title("search cost against corpus size (resampled MS MARCO passages)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def print_report(results: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    cols = ["path", "ms_per_query", "ms_median", "cpu_ms_per_query", "top10_exact", "recall_at_10",
            "recall_at_10_msmarco", "same_top10_as_default", "top10_overlap_with_store", "msmarco_ms", "queries_timed", "note"]
    for res in results:
        print(f"\n## {res['size']:,} passages ({'resampled' if res['resampled'] else 'the real corpus'}), one core")
        print(table(path_rows(res), cols))
        b = res["build"]
        build_rows = [{"part": name, "format": p["format"], "build_s": p["build_s"], "disk_MB": p["disk_bytes"] / 1e6}
                      for name, p in b["parts"].items()]
        build_rows.append({"part": "docstore, keys, metadata", "build_s": b["docstore_and_rest_s"],
                           "disk_MB": b["docstore_disk_bytes"] / 1e6})
        if "impact_standalone" in res:
            build_rows.append({"part": "impact (standalone)", "build_s": res["impact_standalone"]["build_s"],
                               "disk_MB": res["impact_standalone"]["disk_bytes"] / 1e6})
        if "build_today" in res:
            bt = res["build_today"]
            build_rows += [{"part": f"{name} (tf-grid index)", "format": p["format"], "build_s": p["build_s"],
                            "disk_MB": p["disk_bytes"] / 1e6} for name, p in bt["parts"].items() if name == "sparse"]
            print(f"the same corpus with the tantivy tf-grid sparse part (today): {bt['build_s']:.1f} s in all, "
                  f"peak RSS {bt['peak_rss_MB']:.0f} MB")
        print(f"\nbuild: {b['build_s']:.1f} s in all, peak RSS {b['peak_rss_MB']:.0f} MB; search peak RSS per group: "
              + ", ".join(f"{g} {res[g].get('peak_rss_MB', 0):.0f} MB" for g in GROUPS))
        print(table(build_rows, ["part", "format", "build_s", "disk_MB"]))
        print("ratios: " + "; ".join(f"{k} {v:.2f}" for k, v in ratios(res).items() if v is not None))
        bpp = res["learned"].get("windows_bytes_per_posting")
        if bpp:
            print(f"learned-sparse part (v2) bytes per posting: resident {bpp['resident']:.2f}, disk {bpp['disk']:.2f}; "
                  f"approx answers certified exact: {res['learned'].get('windows_approx_certified_share') or 0:.1%}")
        if res["hybrid"].get("hybrid_stages_ms"):
            print("hybrid stages, ms/query: " + ", ".join(f"{k} {v:.2f}" for k, v in res["hybrid"]["hybrid_stages_ms"].items()))
    if extra.get("ms_per_query"):
        print(f"\n## extrapolated to {MSMARCO:,} passages")
        print(table([{"path": k, "exponent": v["exponent"], "ms_at_8.8M": v["ms_at_8.8M"]}
                     for k, v in extra["ms_per_query"].items()], ["path", "exponent", "ms_at_8.8M"]))
    if extra.get("disk_GB_at_8.8M"):
        print("disk / page cache per part at 8.8M, GB: " + ", ".join(f"{k} {v:.1f}" for k, v in extra["disk_GB_at_8.8M"].items()))
    if extra.get("peak_rss_GB_at_8.8M"):
        print("peak RSS per step at 8.8M, GB: " + ", ".join(f"{k} {v:.1f}" for k, v in extra["peak_rss_GB_at_8.8M"].items()))


# --------------------------------------------------------------------------- main
def prepare_source(args: argparse.Namespace) -> Any:
    """The source index (built when absent) and the retriever if it was built here."""
    if (args.index / "manifest.json").is_file():
        return None
    corpus = args.corpus if (args.corpus / "corpus.jsonl").is_file() else SAMPLE
    limit = args.smoke_docs if args.smoke else None
    print(f"no index at {args.index}: encoding {limit or 'every'} passage(s) of {corpus} with the packaged models")
    return rs.build_source(args.index, corpus, limit)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=Path, default=None,
                    help="source index of real passages (default indexes/bench-msmarco-dl19-pool; built if absent)")
    ap.add_argument("--corpus", type=Path, default=POOL, help="what to encode when --index is absent (BEIR folder)")
    ap.add_argument("--sizes", default="30k,1M", help="comma-separated: 30k (the real pool), 100k, 1M, 4M, ...")
    ap.add_argument("--groups", type=lambda t: tuple(g.strip() for g in t.split(",") if g.strip()), default=GROUPS,
                    help=f"search groups to run (default: all of {','.join(GROUPS)})")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--single-queries", type=int, default=100,
                    help="queries timed one at a time (dense), scaled down as 100k / size, at least 5")
    ap.add_argument("--hybrid-queries", type=int, default=200, help="queries of the hybrid group")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (best kept)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--learned-max-minutes", type=float, default=15.0,
                    help="skip a standalone tantivy build predicted to take longer")
    ap.add_argument("--max-minutes", type=float, default=240.0, help="skip a size predicted to overrun this in all")
    ap.add_argument("--memory-share", type=float, default=0.8, help="of the memory available now a step may need")
    ap.add_argument("--workdir", type=Path, default=None, help="where corpora and indexes go (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep each size's corpus and index")
    ap.add_argument("--reuse", type=Path, action="append", default=[],
                    help="a work folder kept by an earlier --keep run (repeatable): a size found there is searched "
                         "again without generating or building it (its build figures are the earlier run's); a "
                         "group not asked for (--groups) reports the figures it last wrote there")
    ap.add_argument("--smoke", action="store_true", help="one 10k size, 40 queries, in-process (CI)")
    ap.add_argument("--smoke-docs", type=int, default=200, help="--smoke without an index: passages to encode")
    ap.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/scale-sparse.json)")
    ap.add_argument("--plot", type=Path, default=None, help="plot (default docs/img/scale-sparse.png)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = set(args.groups) - set(GROUPS)
    if unknown:
        ap.error(f"--groups: unknown group(s) {sorted(unknown)}; known: {', '.join(GROUPS)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.child:
        name, spec_file, out_file = args.child
        Path(out_file).write_text(json.dumps(step(name, json.loads(Path(spec_file).read_text())), default=float))
        return 0
    t_start, load0 = time.perf_counter(), os.getloadavg()[0]
    if args.smoke:
        args.sizes, args.queries, args.repeats = "10k", min(args.queries, 40), 1
        args.single_queries, args.hybrid_queries = 10, 40
    default_name = "bench-msmarco-dl19-pool" + (f"-smoke{args.smoke_docs}" if args.smoke else "")
    args.index = (args.index or ROOT / "indexes" / default_name).resolve()
    out = args.out or (Path(tempfile.gettempdir()) / "scale-sparse-smoke.json" if args.smoke
                       else RESULTS / "scale-sparse.json")
    plot_path = args.plot or (out.with_suffix(".png") if args.smoke else ROOT / "docs" / "img" / "scale-sparse.png")
    built = prepare_source(args)
    src = rs.load_source(args.index)
    args.src_n = src.n
    texts, qd, Q, how = rs.encoded_queries(args.index, rs.query_texts(SHARED, POOL if (POOL / "queries.jsonl").is_file()
                                                                      else SAMPLE, args.queries), built)
    pool_q = set(rs.query_texts(SHARED, POOL, 10**9)[:43]) if (POOL / "queries.jsonl").is_file() else set()
    ms = np.array([t in pool_q for t in texts], dtype=bool)
    sizes = parse_sizes(args.sizes, src.n)
    print(f"source {args.index}: {src.n:,} real passages ({src.sparse.nnz / src.n:.0f} terms/passage); "
          f"{len(texts)} queries ({int(ms.sum())} MS MARCO DL19), {how}; sizes {sizes}; "
          f"load average {load0:.2f}; {'in-process (--smoke): RSS figures are not per step' if args.smoke else ''}")
    del src
    work = Path(tempfile.mkdtemp(prefix="scale-sparse-", dir=args.workdir))
    qfile = work / "queries.npz"
    np.savez(qfile, texts=np.array(texts, dtype=object).astype(str), dense=qd, data=Q.data, indices=Q.indices,
             indptr=Q.indptr, shape=np.array(Q.shape), msmarco=ms)
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    try:
        for n in sizes:
            builds = ("generate", "build") if reused_folder(n, args.reuse) is None else ()
            peaks = predict_peaks(n, results)
            need = {k: v for k, v in peaks.items() if k in builds} or {"nothing to build": 0.0}
            have = available_mb() * args.memory_share
            args.over = {g: (f"predicted peak RSS ~{peaks[g] / 1024:.1f} GB, {have / 1024:.1f} GB usable now "
                             f"({args.memory_share:.0%} of available; --memory-share to try anyway)")
                         for g in args.groups if peaks.get(g, 0.0) > have}
            spent = time.perf_counter() - t_start
            eta = (results[-1]["seconds"] * n / results[-1]["size"]) if results else 0.0
            if max(need.values()) > have:
                why = (f"needs ~{max(need.values()) / 1024:.1f} GB in its largest step ({max(need, key=need.get)}), "
                       f"{have / 1024:.1f} GB usable now ({args.memory_share:.0%} of available)")
            elif spent + eta > args.max_minutes * 60:
                why = f"predicted ~{eta / 60:.0f} min (linear in size) would overrun --max-minutes {args.max_minutes:g}"
            else:
                why = ""
            if why:
                print(f"SKIPPED {n:,} passages: {why}")
                skipped.append({"size": n, "reason": why, "predicted_peak_rss_MB": need})
                continue
            print(f"\n== {n:,} passages (predicted peak RSS per step, MB: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in need.items()) + ")")
            t0 = time.perf_counter()
            res = run_size(n, args, work, qfile, results)
            res["seconds"] = time.perf_counter() - t0
            res["ratios"] = ratios(res)
            results.append(res)
    finally:
        if args.keep:
            print(f"kept the corpora, indexes and queries in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    extra = extrapolate(results, args.smoke)
    print_report(results, extra)
    plotted = plot(results, extra, plot_path)
    print(f"plot: {plotted}")
    import hybridret

    doc = {"machine": machine(), "hybridret": hybridret.__version__, "k": paths.K, "one_core": True,
           "method": rs.METHOD, "source": {"index": str(args.index), "passages": args.src_n},
           "queries": {"count": len(texts), "msmarco_dl19": int(ms.sum()), "encodings": how,
                       "note": "real query texts: the 43 TREC DL19 queries of the pool, then the other shared "
                               "collections' queries; MS MARCO dev queries are not available offline"},
           "settings": {k: ([str(x) for x in v] if isinstance(v, list) else str(v) if isinstance(v, Path) else v)
                        for k, v in vars(args).items() if k != "child"},
           "in_process": args.smoke, "labels": paths.LABELS, "exact_paths": list(paths.EXACT),
           "sizes": {str(r["size"]): r for r in results}, "skipped": skipped, "extrapolation": extra,
           "plot": plotted, "total_s": time.perf_counter() - t_start,
           "load_average_start_end": [load0, os.getloadavg()[0]]}
    write_json(out, json.loads(json.dumps(doc, default=float)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
