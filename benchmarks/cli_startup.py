"""Wall-clock time of each CLI command, start-up included: what a person waits for at the prompt.

    python benchmarks/cli_startup.py                     # the bundled 300-passage sample index, 5 runs each
    python benchmarks/cli_startup.py --runs 3 --baseline main   # also the hybridret of a git ref, same machine

Each command runs in a fresh interpreter (``python -m hybridret -q ...``), its median over ``--runs``
runs is reported. Writes go to a fresh copy of the index per run. The target (issue 21): BM25 search
and every write except add/upsert (which encode documents) within 1.5 s on this machine.
``--baseline REF`` times the same commands with ``git archive REF hybridret`` (run from a temporary
folder), so the figures before and after a change come from one run.

Writes benchmarks/results/cli-startup.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, ROOT, table, write_json  # noqa: E402

TARGET_S = 1.5
# (name, argv after `hybridret -q`, writes to the index?, held to the target?)
COMMANDS: list[tuple[str, list[str], bool, bool]] = [
    ("--help", ["--help"], False, True),
    ("info", ["info", "{idx}"], False, True),
    ("get", ["get", "{idx}", "s0001", "s0002"], False, True),
    ("search --method bm25", ["search", "{idx}", "why do stars explode", "--method", "bm25", "-k", "5"], False, True),
    ("eval --run", ["eval", "--run", "{run}", "--qrels", "{qrels}"], False, True),
    ("delete", ["delete", "{idx}", "s0003"], True, True),
    ("compact", ["compact", "{idx}"], True, True),
    ("search (hybrid)", ["search", "{idx}", "why do stars explode", "-k", "5"], False, False),
    ("search --method sparse", ["search", "{idx}", "why do stars explode", "--method", "sparse", "-k", "5"], False,
     False),
    ("add (1 document)", ["add", "{idx}", "{doc}"], True, False),
    ("upsert (1 document)", ["add", "{idx}", "{doc}", "--upsert"], True, False),
]


# Commands that need an optional package: skipped (and said so) where it is not installed
NEEDS = {"eval --run": ("pytrec_eval", "eval")}


def missing_extra(name: str) -> str | None:
    """The extra a command needs and this environment lacks, else ``None``."""
    import importlib.util

    module, extra = NEEDS.get(name, (None, None))
    return extra if module is not None and importlib.util.find_spec(module) is None else None


def build_index(out: Path) -> None:
    from hybridret import HybridRetriever
    from hybridret.data import CorpusReader

    sample = ROOT / "hybridret" / "resources" / "sample" / "corpus.jsonl"
    HybridRetriever.from_models().index(CorpusReader(sample), workdir=out, overwrite=True, show_progress=False)


def fixtures(tmp: Path) -> dict[str, str]:
    run = tmp / "run.trec"
    run.write_text("".join(f"q{i} Q0 s{j:04d} {r} {10 - r}.0 bench\n" for i in range(1, 31)
                           for r, j in enumerate(range(i, i + 10), 1)), encoding="utf-8")
    qrels = tmp / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\ts{i + 2:04d}\t1\n" for i in range(1, 31)),
                     encoding="utf-8")
    doc = tmp / "doc.jsonl"
    doc.write_text('{"_id": "bench-new", "title": "Benchmarks", "text": "A document added by the start-up '
                   'benchmark, short enough to encode in a moment."}\n', encoding="utf-8")
    return {"run": str(run), "qrels": str(qrels), "doc": str(doc)}


def time_command(argv: list[str], env: dict[str, str], cwd: Path, strict: bool) -> float | None:
    """Seconds of one run; a failed command stops the benchmark (``strict``) or is ``None`` (a baseline
    without that command)."""
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "hybridret", "-q", *argv], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=600)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        if not strict:
            return None
        raise SystemExit(f"hybridret {' '.join(argv)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return seconds


def measure(code: Path, index: Path, files: dict[str, str], runs: int, tmp: Path, *,
            strict: bool = True) -> list[dict[str, Any]]:
    """Median seconds per command with the hybridret package found in ``code``."""
    env = dict(os.environ, PYTHONPATH=str(code), HF_HUB_OFFLINE="1")
    env.pop("OMP_WAIT_POLICY", None)  # as a user's shell has it: the CLI sets it itself
    rows = []
    for name, template, writes, held in COMMANDS:
        extra = missing_extra(name)
        if extra is not None:
            print(f"  {name:<24} (skipped: needs pip install 'hybridret[{extra}]')", flush=True)
            rows.append({"command": f"hybridret {name}", "median_s": None, "skipped": f"needs the {extra} extra"})
            continue
        times = []
        for _ in range(runs):
            target = index
            if writes:
                target = tmp / "write-copy"
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(index, target)
            argv = [a.format(idx=target, **files) for a in template]
            seconds = time_command(argv, env, tmp, strict)
            if seconds is None:
                break
            times.append(seconds)
        if not times:
            print(f"  {name:<24} (not available)", flush=True)
            rows.append({"command": f"hybridret {name}", "median_s": None})
            continue
        med = statistics.median(times)
        rows.append({"command": f"hybridret {name}", "median_s": round(med, 3), "min_s": round(min(times), 3),
                     "runs": runs, "target_s": TARGET_S if held else None,
                     "met": (med <= TARGET_S) if held else None})
        print(f"  {name:<24} median {med:6.2f} s  (min {min(times):.2f} s)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="runs per command (default: 5)")
    ap.add_argument("--baseline", default=None, metavar="REF", help="also time the hybridret of this git ref")
    ap.add_argument("-o", "--output", type=Path, default=RESULTS / "cli-startup.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hybridret-cli-") as name:
        tmp = Path(name)
        index = tmp / "sample-index"
        print("building the sample index ...", flush=True)
        build_index(index)
        files = fixtures(tmp)
        print("this checkout:", flush=True)
        now = measure(ROOT, index, files, args.runs, tmp)
        before = None
        if args.baseline:
            code = tmp / "baseline"
            code.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline, "hybridret"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(code)], input=archive, check=True)
            print(f"baseline {args.baseline}:", flush=True)
            before = measure(code, index, files, args.runs, tmp, strict=False)
    columns = ["command", "median_s", "min_s", "target_s", "met"]
    if before is not None:
        base = {r["command"]: r["median_s"] for r in before}
        for r in now:
            r["baseline_median_s"] = base.get(r["command"])
        columns.insert(2, "baseline_median_s")
    print()
    print(table(now, columns))
    import platform

    write_json(args.output, {"runs": args.runs, "target_s": TARGET_S, "baseline": args.baseline,
                             "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                         "platform": platform.platform()},
                             "results": now, "baseline_results": before})


if __name__ == "__main__":
    main()
